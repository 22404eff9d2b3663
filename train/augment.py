"""Augmentation of decoded-once images (:mod:`zoo.train.image_cache`), on uint8 tensors, with
its random parameters drawn per sample from (seed, epoch, index) — so ``--resume`` stays exact
and a sample's crop does not depend on where it is finished.

Loader workers do what is per sample: read the stored image, draw the parameters, crop
(random resized crop, antialiased, on torch's uint8 fast path) and flip (:func:`augment_u8`).
They send uint8 batches (a quarter of float32's bytes through shared memory, pinned memory
and a GPU copy); :class:`DeviceBatches` does the rest in batches where the model runs
(:func:`finish_batch`): conversion, colour jitter and normalisation, on the GPU from pinned
memory copied without blocking, or in the main process on a CPU (a few passes, a small share
of a CPU training step). Resampling the crops on the GPU too (``roi_align`` over padded crop
boxes) was measured on the H200 machine and was slower: padded boxes are several times
the bytes of finished crops, through the host twice (docs/benchmarks.md).

The parameter distributions are torchvision's own (``RandomResizedCrop.get_params``,
``ColorJitter.get_params``), drawn in the PIL path's order. The colour jitter is one affine
colour map per sample (:func:`colour_matrix`). The eval view is a centre crop of the stored
image: the same pixels as ``eval_transform``.
Written here because torchvision's v2 ops take one parameter set per call, not one per sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from torchvision import transforms as T
from torchvision.transforms.v2 import functional as F

from zoo.preprocessing import Preprocessing
from zoo.train.data import sample_seed
from zoo.train.image_cache import ImageCache
from zoo.train.recipes import apply_policy, policy
from zoo.train.rng import seeded
from zoo.transforms import interpolation_mode

SCALE = (0.5, 1.0)  # the PIL path's RandomResizedCrop scale (zoo.transforms.train_transform)
RATIO = (3 / 4, 4 / 3)
JITTER = 0.2  # brightness, contrast and saturation, as the PIL path
GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights
# A sample's parameter row: crop height, width, flip, brightness, contrast, saturation, and
# the crop's channel means in [0, 1] (contrast blends towards the mean gray).


@dataclass(frozen=True)
class Augment:
    """What a sample becomes: ``crop`` px, normalised; ``train``: random crop, flip, then
    jitter (RGB only, as the PIL path) or, with ``policy``, timm's auto-augment policy instead
    (``--auto-augment``; no jitter beside it, as timm)."""

    crop: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str
    train: bool
    policy: str | None = None

    @classmethod
    def for_model(cls, pre: Preprocessing, *, train: bool, policy: str | None = None) -> Augment:
        return cls(pre.crop_size, tuple(pre.mean), tuple(pre.std), pre.interpolation, train, policy)


def draw(aug: Augment, image: torch.Tensor) -> tuple[tuple[int, int, int, int], torch.Tensor]:
    """Crop box ``(top, left, h, w)`` and the parameter row, from torch's default generator
    (seeded per sample by the caller), in the PIL path's order: crop, flip, jitter."""
    h, w = image.shape[-2:]
    if not aug.train:
        top, left = round((h - aug.crop) / 2.0), round((w - aug.crop) / 2.0)  # CenterCrop's
        return (top, left, aug.crop, aug.crop), _row(aug.crop, aug.crop, 0.0, (1.0, 1.0, 1.0))
    top, left, ch, cw = T.RandomResizedCrop.get_params(image, list(SCALE), list(RATIO))
    flip = float(torch.rand(1) < 0.5)
    factors = (1.0, 1.0, 1.0)
    if image.shape[0] == 3 and aug.policy is None:
        span = [1 - JITTER, 1 + JITTER]
        _order, b, c, s, _ = T.ColorJitter.get_params(span, span, span, None)
        factors = (float(b), float(c), float(s))
    return (top, left, ch, cw), _row(ch, cw, flip, factors)


def _row(h: int, w: int, flip: float, factors: tuple[float, float, float]) -> torch.Tensor:
    return torch.tensor([h, w, flip, *factors, 0, 0, 0], dtype=torch.float32)


def _set_means(row: torch.Tensor, crop: torch.Tensor) -> torch.Tensor:
    """Put the channel means of a uint8 ``(C, h, w)`` crop into ``row`` (a pass over a few
    hundred kB in the worker, instead of one over the whole batch later)."""
    sums = crop.reshape(crop.shape[0], -1).sum(dim=1).double()  # int64 sums: exact, fast
    row[6 : 6 + min(3, len(sums))] = (sums[:3] / (255.0 * crop[0].numel())).float()
    return row


def colour_matrix(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Brightness ``b``, contrast ``c`` and saturation ``s`` of each sample as one affine colour
    map ``y = A x + o`` of images in [0, 1] (their channel means in ``rows[:, 6:9]``).

    torchvision's formulas: brightness ``b x``; contrast ``c x + (1 - c) m`` with ``m`` the
    mean of the gray image; saturation ``s x + (1 - s) gray(x)``. All three are linear and
    commute (up to the gray weights summing to 0.9999), so their composition is
    ``b (c S x + (1 - c) m)`` with ``S = s I + (1 - s) 1 gray``: the random order torchvision
    draws changes only where an intermediate result would clip; here the result is clipped
    once, after the map.
    """
    w = torch.tensor(GRAY, dtype=rows.dtype, device=rows.device)
    b, c, s = (rows[:, k].view(-1, 1, 1) for k in (3, 4, 5))
    eye = torch.eye(3, dtype=rows.dtype, device=rows.device)
    sat = s * eye + (1 - s) * w.view(1, 1, 3)  # every row of the gray projection is w
    gray_mean = (rows[:, 6:9] * w).sum(dim=1).view(-1, 1, 1)
    return b * c * sat, (b * (1 - c) * gray_mean).expand(-1, 3, 1)


def _normalise(x: torch.Tensor, aug: Augment) -> torch.Tensor:
    mean = torch.tensor(aug.mean, device=x.device).view(-1, 1, 1)
    std = torch.tensor(aug.std, device=x.device).view(-1, 1, 1)
    return x.sub_(mean).div_(std)


def augment_u8(
    aug: Augment, image: torch.Tensor, box: tuple[int, int, int, int], row: torch.Tensor
) -> torch.Tensor:
    """In a loader worker: one stored uint8 ``(C, H, W)`` image → its crop at the output size
    (antialiased; the eval view: the centre crop), flipped, still uint8."""
    top, left, h, w = box
    if not aug.train:
        return image[:, top : top + h, left : left + w].contiguous()
    x = F.resized_crop(  # the stored HWC array seen as CHW is channels-last: uint8 fast path
        image,
        top,
        left,
        h,
        w,
        [aug.crop, aug.crop],
        interpolation=interpolation_mode(aug.interpolation),
        antialias=True,
    )
    x = (x.flip(-1) if row[2] > 0 else x).contiguous()
    if aug.policy is not None:
        x = apply_policy(policy(aug.policy, aug.crop, aug.mean, aug.interpolation), x)
    return x


def finish_batch(
    aug: Augment,
    x: torch.Tensor,
    rows: torch.Tensor,
    *,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """uint8 batch ``(B, C, crop, crop)`` + parameter rows → normalised float32, every op
    batched on ``x``'s device: the colour jitter (:func:`colour_matrix`) and the model's
    normalisation.
    ``scratch``: a float32 buffer at least ``x``'s size for the conversion (a fresh
    allocation of a whole batch costs page faults on every CPU batch)."""
    if not aug.train or x.shape[1] != 3:
        return _normalise(x.float().div_(255), aug)  # as ToTensor and Normalize: eval is exact
    if scratch is not None and scratch.numel() >= x.numel():
        xf = scratch.view(-1)[: x.numel()].view(x.shape).copy_(x)
    else:
        xf = x.float()
    # the colour map, the scaling to [0, 1] and the normalisation folded into one affine map,
    # then the clip to [0, 1] in normalised units, a channel at a time (scalar bounds)
    a, o = colour_matrix(rows)
    mean = torch.tensor(aug.mean, device=x.device).view(1, -1, 1)
    std = torch.tensor(aug.std, device=x.device).view(1, -1, 1)
    out = torch.baddbmm((o - mean) / std, a / (255 * std), xf.flatten(2)).view(xf.shape)
    for ch, (m, sd) in enumerate(zip(aug.mean, aug.std, strict=True)):
        out[:, ch].clamp_(-m / sd, (1 - m) / sd)
    return out


class CachedImageDataset(Dataset[tuple[Any, Any, int]]):
    """Samples from the image cache, as ``((uint8 crop, param row), label, index)``, finished
    by :class:`DeviceBatches`; keys as :class:`zoo.train.data.ImageFolderDataset` (``index``
    or ``(index, epoch)``)."""

    def __init__(
        self,
        samples: Sequence[tuple[Path, Any]],
        cache: ImageCache,
        aug: Augment,
        *,
        seed: int = 0,
    ) -> None:
        self.samples = list(samples)
        self.cache, self.aug, self.seed = cache, aug, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.samples)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[Any, Any, int]:
        i, epoch = key if isinstance(key, tuple) else (key, self.epoch)
        path, label = self.samples[i]
        image = torch.from_numpy(self.cache.get(path)).permute(2, 0, 1)
        with seeded(sample_seed(self.seed, epoch, i)):  # the policy draws from random/NumPy
            box, row = draw(self.aug, image)
            crop = augment_u8(self.aug, image, box, row)
        return (crop, _set_means(row, crop) if self.aug.train else row), label, i


class DeviceBatches:
    """A loader of :class:`CachedImageDataset` batches that yields finished ``(x, y, idx)`` batches
    on ``device`` (timm's prefetch loader does the same for normalisation): uint8 copied from
    pinned memory without blocking, then :func:`finish_batch` there."""

    def __init__(self, loader: Any, dataset: CachedImageDataset, device: torch.device) -> None:
        self.loader, self.dataset, self.device = loader, dataset, device

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, Any, Any]]:
        scratch = None
        for (x, rows), y, idx in self.loader:
            x = x.to(self.device, non_blocking=True)
            rows = rows.to(self.device, non_blocking=True)
            if self.device.type == "cpu" and (scratch is None or scratch.numel() < x.numel()):
                scratch = torch.empty(x.shape)
            yield finish_batch(self.dataset.aug, x, rows, scratch=scratch), y, idx
