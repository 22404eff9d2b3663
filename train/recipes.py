"""timm's training recipes, wired into the trainer's seeded data path: an auto-augment policy
on each training crop (timm's transform factory), Random Erasing and Mixup/CutMix on each
batch (``timm.data.RandomErasing`` and ``timm.data.Mixup``, as timm's own prefetching loader
and training script apply them).

timm draws their randomness from Python's ``random`` and NumPy's global generators; here every
draw happens inside :func:`zoo.train.rng.seeded` — per sample (seed, epoch, index) for the
policy, per batch (seed, global step, rank) for erasing and mixing — so ``--resume`` is exact
and every DDP rank mixes its own shard differently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from PIL import Image

from zoo.errors import InputError
from zoo.train.config import TrainConfig
from zoo.train.rng import seeded

AUTO_AUGMENT = {
    "randaugment": "rand-m9-mstd0.5-inc1",  # timm's ImageNet recipe
    # TrivialAugment: one op per image at a magnitude drawn uniformly (mstd > 100)
    "trivialaugment": "rand-n1-m10-mstd101-inc1",
}


EMA_DECAY = next(f.default for f in fields(TrainConfig) if f.name == "ema_decay")


def policy_string(name: str) -> str:
    """``--auto-augment``'s value as timm's policy string (a shorthand, or one as given)."""
    return AUTO_AUGMENT.get(name, name)


@lru_cache(maxsize=4)
def policy(
    name: str, crop: int, mean: tuple[float, ...], interpolation: str
) -> Callable[[Image.Image], Image.Image]:
    """The PIL transform of an auto-augment policy: the "secondary" stage of timm's
    ``transforms_imagenet_train`` (no colour jitter beside it, as timm does).

    Raises:
        InputError: timm does not know the policy string.
    """
    from timm.data.transforms_factory import transforms_imagenet_train

    try:
        _, secondary, _ = transforms_imagenet_train(
            crop,
            hflip=0.0,
            color_jitter=None,  # type: ignore[arg-type]  # timm checks for None itself
            auto_augment=policy_string(name),
            interpolation=interpolation,
            mean=mean,
            separate=True,
        )
    except (AssertionError, KeyError, ValueError, IndexError) as exc:
        raise InputError(
            f"--auto-augment {name!r} is not a timm policy ({exc or type(exc).__name__}). Use "
            f"{' or '.join(AUTO_AUGMENT)}, or a timm string such as 'rand-m9-mstd0.5-inc1', "
            "'augmix-m5-w4-d2' or 'original'."
        ) from None
    for op in _ops(secondary):
        if getattr(op, "name", "").startswith("Posterize") and op.level_fn is not None:
            op.level_fn = AtLeastOneBit(op.level_fn)
    return secondary


def _ops(transform: Any) -> list[Any]:
    """The ``AugmentOp``s of a timm policy (RandAugment's and AugMix's ``ops``, AutoAugment's
    sub-policies), inside the factory's ``Compose``."""
    found = []
    for t in getattr(transform, "transforms", [transform]):
        found += list(getattr(t, "ops", []))
        found += [op for sub in getattr(t, "policy", []) for op in sub]
    return found


class AtLeastOneBit:
    """A posterize level that keeps at least one bit. timm's RandAugment posterizes to 0 bits
    at some magnitudes (a black image), which Pillow ≥ 13 refuses with an error mid-training;
    1 bit is the nearest image Pillow allows. A class, so a policy pickles to loader workers."""

    def __init__(self, level_fn: Callable[..., tuple[int]]) -> None:
        self.level_fn = level_fn

    def __call__(self, level: float, hparams: dict[str, Any]) -> tuple[int]:
        (bits,) = self.level_fn(level, hparams)
        return (max(1, bits),)


def apply_policy(
    transform: Callable[[Image.Image], Image.Image], crop: torch.Tensor
) -> torch.Tensor:
    """A uint8 ``(C, H, W)`` crop through a PIL policy, back to a uint8 ``(C, H, W)`` tensor."""
    hwc = crop.permute(1, 2, 0).numpy()
    out = transform(Image.fromarray(hwc[..., 0] if hwc.shape[-1] == 1 else hwc))
    x = torch.from_numpy(np.array(out, copy=True))
    return (x.unsqueeze(0) if x.ndim == 2 else x.permute(2, 0, 1)).contiguous()


def batch_seed(seed: int, step: int, rank: int) -> int:
    """The seed of one batch's erasing and mixing (what a resume replays, per rank)."""
    return ((seed * 1_000_033 + rank) * 10_000_079 + step) % 2**63


@dataclass
class BatchRecipe:
    """What happens to a finished training batch: Random Erasing, then Mixup/CutMix (targets
    become soft, label smoothing included)."""

    erase: Any | None  # timm.data.RandomErasing
    mix: Any | None  # timm.data.Mixup

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, seed: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with seeded(seed, device=x.device):
            if self.erase is not None:
                x = self.erase(x)
            if self.mix is not None:
                x, y = self.mix(x, y)
        return x, y


def batch_recipe(cfg: TrainConfig, n_classes: int, device: torch.device) -> BatchRecipe | None:
    """The run's :class:`BatchRecipe`, or None when it has neither erasing nor mixing."""
    if not (cfg.random_erasing or mixes(cfg)):
        return None
    from timm.data import Mixup
    from timm.data.random_erasing import RandomErasing

    erase = (
        RandomErasing(cfg.random_erasing, mode="pixel", device=device)
        if cfg.random_erasing
        else None
    )
    mix = (
        Mixup(
            mixup_alpha=cfg.mixup,
            cutmix_alpha=cfg.cutmix,
            label_smoothing=cfg.label_smoothing,
            num_classes=n_classes,
        )
        if mixes(cfg)
        else None
    )
    return BatchRecipe(erase, mix)


def mixes(cfg: TrainConfig) -> bool:
    """Whether targets are mixed (soft): Mixup or CutMix on."""
    return cfg.mixup > 0 or cfg.cutmix > 0


def check_recipes(cfg: TrainConfig, *, pretrained: bool, strategy: str) -> None:
    """Refuse the combinations the recipes cannot honour, each with the way out.

    Raises:
        InputError: a recipe with ``--cache-features`` or ``--no-augment``, mixing with
            ``--multi-label`` or an odd batch, an out-of-range value, or ``--layer-decay``
            without a pretrained backbone that trains.
    """
    on = [
        flag
        for flag, used in (
            ("--auto-augment", cfg.auto_augment),
            ("--random-erasing", cfg.random_erasing),
            ("--mixup", cfg.mixup),
            ("--cutmix", cfg.cutmix),
        )
        if used
    ]
    verb = "augments" if len(on) == 1 else "augment"
    if on and cfg.cache_features:
        raise InputError(
            f"{' and '.join(on)} {verb} images, but --cache-features computes each image's "
            "features once, unaugmented: no recipe can change them. Drop --cache-features "
            f"(the head then trains on augmented images) or drop {on[0]}."
        )
    if on and not cfg.augment:
        raise InputError(
            f"{on[0]} is online augmentation, which --no-augment turns off. Drop one of them."
        )
    if mixes(cfg) and cfg.multi_label:
        raise InputError(
            "--mixup/--cutmix mix one-hot targets of single-label classes (timm's Mixup); "
            "with --multi-label use --auto-augment or --random-erasing instead."
        )
    if mixes(cfg) and cfg.batch_size % 2:
        raise InputError(
            f"--mixup/--cutmix pair each image with another of its batch, so --batch-size must "
            f"be even (got {cfg.batch_size}): use {cfg.batch_size + 1}."
        )
    # the ranges of --mixup, --cutmix, --random-erasing, --ema-decay and --layer-decay:
    # zoo.train.config.BOUNDS, checked before this
    if not cfg.ema and cfg.ema_decay != EMA_DECAY:
        raise InputError("--ema-decay sets the average's decay: add --ema, or drop it.")
    if cfg.layer_decay is not None and (not pretrained or strategy == "linear"):
        raise InputError(
            "--layer-decay lowers the LR of a pretrained backbone layer by layer; this run "
            + (
                "has random weights. Drop --layer-decay."
                if not pretrained
                else "freezes the backbone (--strategy linear). Use full or gradual."
            )
        )
    if cfg.auto_augment:
        policy(cfg.auto_augment, 32, (0.5, 0.5, 0.5), "bilinear")  # an unknown string: now
