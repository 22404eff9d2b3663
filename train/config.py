"""The trainer's configuration: one frozen dataclass, written to ``config.json`` in the run.

The CLI (or a caller) builds it with ``None`` for "choose for me"; :func:`zoo.train.resolve.
resolve_config` returns the resolved copy, the only one the run reads. Nothing changes it
afterwards: a change is a new value (``dataclasses.replace``).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Literal

from zoo.calibration import DEFAULT_ACCEPTANCE, RejectMode
from zoo.errors import ConfigError, InputError, UsageError
from zoo.tracking import Track

Strategy = Literal["linear", "full", "gradual"]
"""Which parameters train and when (see ``strategy.py``)."""
OptimizerName = Literal["adamw", "sgd"]
ScheduleName = Literal["cosine", "onecycle", "constant"]
AmpDtype = Literal["bf16", "fp16"]
Monitor = Literal["val/acc", "val/loss", "val/macro_f1", "val/balanced_acc"]
"""What picks the best checkpoint and drives early stopping."""
ClassWeights = Literal["none", "auto"]
"""``auto``: the loss weighs each class by n_samples / (n_classes × its count) ("balanced")."""
ImageCacheMode = Literal["auto", "on", "off"]
"""The decode-once image cache (``image_cache.py``); ``auto``: on when it fits half the free disk."""
SamplerName = Literal["shuffle", "balanced"]
"""``balanced``: each epoch draws as many images, every class equally likely (with replacement)."""
TuneScheduler = Literal["asha", "fifo"]
"""``zoo tune``: ``asha`` stops weak trials at epoch ends; ``fifo`` runs every trial to the end."""
TeacherLogits = Literal["auto", "cached", "online"]
"""Distillation: the teacher's logits computed once per image (``cached``: deterministic training
views) or on every training view (``online``: random augmentation); ``auto`` decides."""
QatWeights = Literal["auto", "8", "7"]
"""``zoo distill --qat-weights``: the int8 weights' bits QAT trains for (auto: this CPU's)."""

# Keys that may differ between a run and its --resume without changing the result.
RUNTIME_KEYS = frozenset(
    {
        "num_workers",
        "resume",
        "dry_run",
        "extend",
        "run_dir",
        "runs_root",
        "name",
        "progress",
        "log_grad_norms",
        "detect_anomaly",
        "track",
    }
)


@dataclass(frozen=True)
class DistillConfig:
    """``zoo distill``: the student learns from ``teacher``'s logits (Hinton et al.): loss =
    α·T²·KL(softmax(teacher/T) ‖ softmax(student/T)) + (1 − α)·the run's hard-label loss.
    ``logits`` and ``teacher_sha256`` are decided by :func:`zoo.train.distill.resolve_teacher`."""

    teacher: str  # a run, model folder or registry entry
    temperature: float = 4.0
    alpha: float = 0.5
    logits: TeacherLogits = "auto"
    teacher_sha256: str | None = None  # the teacher's weights; a resume refuses other weights
    qat: bool = False  # --qat: the student is the teacher itself, trained through int8 rounding
    # --qat: the int8 weights' bits it trains for (zoo.system.int8_weight_bits: 7 where the CPU
    # zoo quantize runs on has no VNNI); 8 in runs from before zoo recorded it
    weight_bits: int = 8
    unlabelled: bool = False  # --unlabelled: the teacher's top-1 answers are the data's labels

    @property
    def kind(self) -> str:
        """What the run is, in words: ``quantization-aware`` or ``distill``."""
        return "quantization-aware" if self.qat else "distill"

    def __post_init__(self) -> None:
        if self.weight_bits not in (7, 8):
            raise ConfigError(f"distill.weight_bits must be 8 or 7, not {self.weight_bits!r}.")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DistillConfig:
        """Read what the run's config.json holds.

        Raises:
            ConfigError: a key this version does not know (a run written by a newer zoo), or
                a value out of range.
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(
                f"Unknown distill config key {unknown[0]!r} (a run's config.json written by a "
                f"newer zoo?). Known keys: {', '.join(sorted(names))}."
            )
        return cls(**d)


@dataclass(frozen=True)
class TrainConfig:
    model: str
    data: str
    weights: str | None = None  # None: the entry's own; "none": random init
    strategy: Strategy | None = None  # default_strategy: gradual for pretrained, else full
    epochs: int = 5
    freeze_epochs: int = 1
    batch_size: int = 32
    lr: float | Literal["auto"] | None = None  # head LR; default 1e-3 (AdamW) / 0.1 (SGD)
    backbone_lr_mult: float | None = None  # default_backbone_lr_mult: 0.1 (1: a cut network)
    weight_decay: float = 0.05
    optimizer: OptimizerName = "adamw"
    momentum: float = 0.9
    schedule: ScheduleName = "cosine"
    warmup_epochs: float = 0.5
    label_smoothing: float = 0.0
    class_weights: ClassWeights = "none"
    sampler: SamplerName = "shuffle"
    clip_grad_norm: float | None = None
    amp: AmpDtype | None = None
    channels_last: bool = False
    compile: bool = False
    multi_label: bool = False
    val_fraction: float = 0.2
    seed: int = 0
    device: str = "auto"
    num_workers: int | None = None
    augment: bool = True
    # timm's recipes (recipes.py): a policy on each crop, erasing and mixing on each batch
    auto_augment: str | None = None  # randaugment | trivialaugment | a timm policy string
    random_erasing: float = 0.0  # probability per image
    mixup: float = 0.0  # Beta(α, α) of Mixup; 0: off
    cutmix: float = 0.0  # Beta(α, α) of CutMix; 0: off (both on: one or the other per batch)
    ema: bool = False  # timm's ModelEmaV3, validated beside the model; shipped when better
    ema_decay: float = 0.9998
    layer_decay: float | None = None  # backbone layer i of L: LR × backbone_lr_mult × d^(L-1-i)
    cache_features: bool = False
    image_cache: ImageCacheMode = "auto"
    patience: int | None = None
    # best checkpoint / early stopping; default: val/acc, or val/macro_f1 with --multi-label
    monitor: Monitor | None = None
    save_every_steps: int | None = None
    top_k_checkpoints: int = 0
    # at the end: temperature always; --reject fits an "unknown" threshold (zoo/calibration.py)
    reject: RejectMode = "off"
    acceptance: float = DEFAULT_ACCEPTANCE  # --reject: the share of validation images accepted
    strict_data: bool = False
    max_nonfinite: int = 3
    max_rollbacks: int = 2
    image_size: int | None = None
    sync_bn: bool = False
    detect_anomaly: bool = False
    log_grad_norms: bool = False
    dry_run: bool = False
    progress: bool = True
    track: Track = "none"  # also log to an experiment tracker (zoo/tracking.py)
    runs_root: str = "runs"
    name: str | None = None
    resume: str | None = None
    extend: int = 0
    run_dir: str | None = None
    # the LR schedule as segments ({from_step, epochs, kind[, peak_scale]}); --extend appends one
    schedule_segments: tuple[dict[str, Any], ...] = ()
    distill: DistillConfig | None = None  # set by ``zoo distill``

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schedule_segments"] = list(d["schedule_segments"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Read what :meth:`to_dict` wrote (or the CLI's options).

        Raises:
            ConfigError: a key is not a field of TrainConfig (named, with the near miss), or
                a required one (``model``, ``data``) is missing.
        """
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            close = difflib.get_close_matches(unknown[0], names, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"Unknown training config key {unknown[0]!r}.{hint} Known keys: "
                f"{', '.join(names)}. (A run's config.json written by a newer zoo?)"
            )
        missing = [k for k in ("model", "data") if k not in d]
        if missing:
            raise ConfigError(f"The training config lacks the required key {missing[0]!r}.")
        distill = DistillConfig.from_dict(d["distill"]) if d.get("distill") else None
        return cls(
            **{
                **d,
                "schedule_segments": tuple(d.get("schedule_segments", ())),
                "distill": distill,
            }
        )


@dataclass(frozen=True)
class Bounds:
    """The numbers an option may take: finite, from ``low`` to ``high`` (``None``: no end;
    ``*_open``: that end itself refused), whole numbers only with ``whole``; ``hint`` gives
    usual values for the message (``in [0, 1) (usually 0.1)``)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    hint: str = ""
    whole: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` is in bounds (NaN, infinities, bools and, for ``whole``, any
        fraction never are)."""
        if isinstance(value, bool) or (self.whole and not isinstance(value, int)):
            return False
        try:
            if not math.isfinite(value):
                return False
        except OverflowError:  # an int beyond any float
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or not (
            value > self.high or (self.high_open and value == self.high)
        )

    def rule(self, *, hint: bool = True) -> str:
        """The bounds in words: ``in (0, 1)``, ``a whole number ≥ 1``, ``finite and above 0``
        (``hint``: with the usual values)."""
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            where = (
                f"in {'(' if self.low_open else '['}{lo:g}, {hi:g}{')' if self.high_open else ']'}"
            )
        elif lo is not None:
            where = f"above {lo:g}" if self.low_open else f"≥ {lo:g}"
        elif hi is not None:
            where = f"below {hi:g}" if self.high_open else f"≤ {hi:g}"
        else:
            where = "any"
        kind = "a whole number" if self.whole else ("finite and" if hi is None else "")
        usual = f" (usually {self.hint})" if hint and self.hint else ""
        return " ".join(filter(None, [kind, where])) + usual


def whole(low: float) -> Bounds:
    """A whole number from ``low`` up (a count: epochs, images, steps)."""
    return Bounds(low, whole=True)


BOUNDS: dict[str, Bounds] = {
    "epochs": whole(1),
    "freeze_epochs": whole(0),
    "batch_size": whole(1),
    "lr": Bounds(0, low_open=True, hint="1e-3 with AdamW, 0.1 with SGD"),
    "backbone_lr_mult": Bounds(0, hint="0.01-1"),
    "weight_decay": Bounds(0, hint="0.05 with AdamW, 1e-4 with SGD"),
    "momentum": Bounds(0, 1, high_open=True, hint="0.9"),
    "warmup_epochs": Bounds(0),
    "label_smoothing": Bounds(0, 1, high_open=True, hint="0.1"),
    "clip_grad_norm": Bounds(0, low_open=True, hint="1.0"),
    "val_fraction": Bounds(0, 1, low_open=True, high_open=True, hint="0.2"),
    "num_workers": whole(0),
    "random_erasing": Bounds(0, 1, hint="0.25: a probability per image"),
    "mixup": Bounds(0, hint="0.2-0.8; 0 is off"),
    "cutmix": Bounds(0, hint="1.0; 0 is off"),
    "ema_decay": Bounds(0, 1, low_open=True, high_open=True, hint="0.9998"),
    "layer_decay": Bounds(0, 1, low_open=True, hint="0.65-0.85"),
    "patience": whole(1),
    "save_every_steps": whole(1),
    "top_k_checkpoints": whole(0),
    "acceptance": Bounds(0, 1, low_open=True, hint="0.95: the share of validation images accepted"),
    "max_nonfinite": whole(1),
    "max_rollbacks": whole(0),
    "image_size": whole(1),
    "extend": whole(0),
}
"""The numeric options' ranges: :func:`check_bounds` holds a config to them, ``zoo tune``
holds a search space to them, the CLI's options check and show them (``in_range``)."""


def option_flag(name: str) -> str:
    """The CLI's spelling of a TrainConfig field (``batch_size`` → ``--batch-size``)."""
    return "--" + name.replace("_", "-")


def check_option(name: str, value: Any) -> None:
    """One option's value within :data:`BOUNDS` (``None`` and ``lr='auto'``: chosen later).

    Raises:
        UsageError: out of range (or not a number), named with its flag, value and range.
    """
    bounds = BOUNDS[name]
    if value is None or (name == "lr" and value == "auto"):
        return
    if not isinstance(value, int | float) or not bounds.holds(value):
        flag = option_flag(name)
        raise UsageError(
            f"{flag} {value!r} is out of range: it must be {bounds.rule()}.", param_hint=flag
        )


def check_bounds(cfg: TrainConfig) -> None:
    """Every numeric option of ``cfg`` within :data:`BOUNDS` (:func:`check_option`).

    Raises:
        UsageError: the first option out of range.
    """
    for name in BOUNDS:
        check_option(name, getattr(cfg, name))
    check_places(cfg)


def check_places(cfg: TrainConfig) -> None:
    """``--name`` is one folder name under ``--runs``, which is (or can become) a folder.

    Raises:
        UsageError: ``--name`` holds a path (``../x``, ``a/b``) or is ``.``/``..``.
        InputError: ``--runs`` is a file, or lies under one.
    """
    from pathlib import Path

    from zoo import durable

    name = cfg.name
    if name is not None and (name in ("", ".", "..") or "/" in name or "\\" in name):
        raise UsageError(
            f"--name {name!r}: give a folder name, not a path (the run goes to "
            f"{cfg.runs_root}/NAME; choose the parent folder with --runs).",
            param_hint="--name",
        )
    runs = Path(cfg.runs_root)
    if runs.exists() and not runs.is_dir():
        raise InputError(f"--runs {runs} is a file: give a folder for the runs (made if absent).")
    durable.refuse_file_above(runs, flag="--runs")


def default_lr(optimizer: OptimizerName) -> float:
    """The head's learning rate when none is given: 1e-3 with AdamW, 0.1 with SGD."""
    return 1e-3 if optimizer == "adamw" else 0.1


def default_strategy(pretrained: bool, cut_short: bool = False) -> Strategy:
    """How a model trains when no strategy is given: ``gradual`` from pretrained weights,
    ``full`` from random ones and for a network cut short (:attr:`ModelInfo.cut_short`,
    mobilenet_v2_s16): its last blocks end in mid-level features that must learn to feed a
    head, and frozen first, then at a tenth of the head's LR, they did not (mobilenet_v2_s16 on
    the photo patches of bench/distill_photos.py at 44 px, 20 epochs, one seed, a one-off
    probe: 96.2 % trained whole at the head's LR, 82.0 % by the gradual default)."""
    return "full" if cut_short or not pretrained else "gradual"


def default_backbone_lr_mult(cut_short: bool) -> float:
    """The backbone's LR as a multiple of the head's when none is given: 0.1, and 1 for a
    network cut short (see :func:`default_strategy`)."""
    return 1.0 if cut_short else 0.1


def option_defaults() -> dict[str, Any]:
    """Each option's default (``None``: zoo chooses, see :func:`resolve_config`): the CLI's
    options read theirs from here."""
    return {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
