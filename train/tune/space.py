"""The search space of ``zoo tune``: which :class:`~zoo.train.config.TrainConfig` fields a
search varies, over which values, and the trials drawn from it.

A space maps a field to a *dimension*, in a YAML or JSON file (``--space FILE``)::

    lr: {loguniform: [1.0e-4, 1.0e-2]}   # low, high
    label_smoothing: {uniform: [0.0, 0.2]}
    freeze_epochs: {randint: [0, 2]}     # both ends included
    strategy: {choice: [gradual, full]}
    mixup: 0.2                           # a plain value: fixed for every trial

The file's keys replace the default space's (:func:`default_space`); ``null`` removes one
(the trainer's default then holds). Every key is a real field of the trainer (``TUNABLE``);
anything else is refused with the valid keys named. Trials are drawn up front with Ray Tune's
samplers from one seeded generator, so a search's trials are known (and written to
``tune.json``) before the first one starts, and the same seed draws the same trials.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from zoo.errors import UsageError
from zoo.train.config import (
    BOUNDS,
    Bounds,
    TrainConfig,
    default_backbone_lr_mult,
    default_lr,
    default_strategy,
)

Kind = Literal["fixed", "choice", "uniform", "loguniform", "randint"]
KINDS: tuple[Kind, ...] = typing.get_args(Kind)

# TrainConfig's fields a search may vary: how a step trains. What a run *is* (model, data,
# seed, epochs: --max-epochs, the run folder) is the search's, the same for every trial.
TUNABLE = (
    "lr", "backbone_lr_mult", "weight_decay", "strategy", "freeze_epochs", "label_smoothing",
    "auto_augment", "random_erasing", "mixup", "cutmix", "optimizer", "momentum", "schedule",
    "warmup_epochs", "batch_size", "layer_decay", "ema", "ema_decay", "clip_grad_norm",
    "class_weights", "sampler", "augment",
)  # fmt: skip
# Only a pretrained backbone gives these a meaning (a random-init model trains fully).
BACKBONE_KEYS = ("strategy", "freeze_epochs", "backbone_lr_mult")


@dataclass(frozen=True)
class Dimension:
    """One field's values in a search: ``fixed`` (one value), ``choice`` (any of ``values``),
    ``uniform``/``loguniform`` (a float in [low, high]) or ``randint`` (an int in [low, high])."""

    key: str
    kind: Kind
    values: tuple[Any, ...]

    @classmethod
    def parse(cls, key: str, spec: Any) -> Dimension:
        """A dimension from its file form (a plain value, or ``{kind: values}``).

        Raises:
            UsageError: an unknown key or kind, a malformed range, or a value the field
                cannot take.
        """
        if key not in TUNABLE:
            close = difflib.get_close_matches(key, TUNABLE, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(
                f"{key!r} is not a tunable option{hint}. Valid keys: {', '.join(TUNABLE)}.",
                param_hint="--space",
            )
        if not isinstance(spec, dict):
            dim = cls(key, "fixed", (_coerce(key, spec),))
        elif len(spec) != 1 or next(iter(spec)) not in KINDS[1:]:
            raise UsageError(
                f"{key}: {spec!r} is not a dimension; give a plain value or one of "
                f"{{{', '.join(f'{k}: [...]' for k in KINDS[1:])}}}.",
                param_hint="--space",
            )
        else:
            kind, values = next(iter(spec.items()))
            if not isinstance(values, list) or not values:
                raise UsageError(
                    f"{key}: {kind} takes a non-empty list; got {values!r}",
                    param_hint="--space",
                )
            dim = cls(key, kind, tuple(_coerce(key, v) for v in values))
        dim._check()
        return dim

    def _check(self) -> None:
        bad = next((v for v in self.values if not _fits(self.key, v)), _OK)
        if bad is not _OK:
            raise UsageError(
                f"{self.key} cannot be {bad!r} (the trainer's {self.key}: "
                f"{_field_types()[self.key]})",
                param_hint="--space",
            )
        bounds = BOUNDS.get(self.key)
        out = next((v for v in self.values if _number(v) and not _within(bounds, v)), _OK)
        if bounds is not None and out is not _OK:
            raise UsageError(
                f"{self.key} {out!r} is out of range: it must be {bounds.rule()}",
                param_hint="--space",
            )
        if self.kind in ("uniform", "loguniform", "randint"):
            low, high = (*self.values, None)[:2]
            ok = len(self.values) == 2 and all(_number(v) for v in self.values) and low < high
            ok = ok and (self.kind != "loguniform" or low > 0)
            ok = ok and (self.kind != "randint" or all(isinstance(v, int) for v in self.values))
            if not ok:
                raise UsageError(
                    f"{self.key}: {self.kind} takes [low, high] with low < high"
                    + (" and low > 0" if self.kind == "loguniform" else "")
                    + (", both integers" if self.kind == "randint" else "")
                    + f"; got {list(self.values)}",
                    param_hint="--space",
                )

    def sample(self, rng: Any) -> Any:
        """One value, drawn with Ray Tune's sampler for this kind from ``rng`` (numpy)."""
        from ray import tune

        low, high = (*self.values, None)[:2]
        domain = {
            "fixed": lambda: None,
            "choice": lambda: tune.choice(list(self.values)),
            "uniform": lambda: tune.uniform(low, high),
            "loguniform": lambda: tune.loguniform(low, high),
            "randint": lambda: tune.randint(low, high + 1),  # Ray's high is excluded
        }[self.kind]()
        if domain is None:
            return self.values[0]
        value = domain.sample(random_state=rng)
        return value.item() if hasattr(value, "item") else value  # numpy → JSON's types

    def to_dict(self) -> Any:
        return self.values[0] if self.kind == "fixed" else {self.kind: list(self.values)}


Space = dict[str, Dimension]


def default_space(pretrained: bool) -> Space:
    """What matters for transfer learning: the head's LR and the backbone's share of it,
    weight decay, how the backbone trains and when it thaws, label smoothing, augmentation
    strength (RandAugment's magnitude, Random Erasing) and Mixup. ``pretrained=False``: a
    random-init model trains fully, so the backbone's dimensions are left out."""
    spec: dict[str, Any] = {
        "lr": {"loguniform": [1e-4, 1e-2]},
        "backbone_lr_mult": {"loguniform": [0.01, 1.0]},
        "weight_decay": {"loguniform": [1e-4, 0.1]},
        "strategy": {"choice": ["linear", "gradual", "full"]},
        "freeze_epochs": {"randint": [0, 2]},
        "label_smoothing": {"uniform": [0.0, 0.2]},
        "auto_augment": {"choice": [None, "rand-m5-mstd0.5", "rand-m9-mstd0.5"]},
        "random_erasing": {"uniform": [0.0, 0.25]},
        "mixup": {"choice": [0.0, 0.2, 0.4]},
    }
    return {
        k: Dimension.parse(k, v) for k, v in spec.items() if pretrained or k not in BACKBONE_KEYS
    }


def read_space(path: Path, base: Space) -> Space:
    """``base`` with the file's dimensions over it (a key set to ``null`` is removed).

    Raises:
        UsageError: the file is missing or not a YAML or JSON mapping, or a key or dimension
            is refused (:meth:`Dimension.parse`); all name ``--space`` (exit code 2).
    """

    def refuse(problem: str) -> UsageError:
        return UsageError(f"{path}: {problem}", param_hint="--space")

    try:
        text = path.read_text()
    except OSError as exc:
        raise refuse(f"cannot read it ({exc.strerror})") from None
    try:
        if path.suffix.lower() == ".json":
            given = json.loads(text)
        else:
            import yaml

            given = yaml.safe_load(text)
    except ValueError as exc:  # json.JSONDecodeError and yaml.YAMLError's parse errors
        raise refuse(f"not valid {path.suffix[1:] or 'YAML'}: {exc}") from None
    except Exception as exc:  # yaml.YAMLError is no ValueError
        raise refuse(f"not valid YAML: {exc}") from None
    if not isinstance(given, dict):
        raise refuse("give a mapping of option → dimension")
    space = dict(base)
    for key, spec in given.items():
        if spec is None and key in TUNABLE:
            space.pop(key, None)
        else:
            space[key] = Dimension.parse(str(key), spec)
    return space


def baseline_params(space: Space, base: TrainConfig | None = None) -> dict[str, Any]:
    """The settings of the search's baseline trial: only the space's fixed values, so every
    varied option keeps the trainer's default (what a plain ``zoo finetune`` trains)."""
    fixed = {key: dim.values[0] for key, dim in space.items() if dim.kind == "fixed"}
    return _prune(fixed, base if base is not None else TrainConfig("", ""))


def sample_trials(
    space: Space,
    n: int,
    seed: int,
    *,
    baseline: bool = False,
    base: TrainConfig | None = None,
    pretrained: bool = True,
    cut_short: bool = False,
) -> list[dict[str, Any]]:
    """``n`` distinct trial settings drawn from ``space`` (the same for the same seed); with
    ``baseline``, the first is :func:`baseline_params` and ``n - 1`` are drawn. Settings are
    told apart by what they train over ``base`` (the options every trial shares) once the
    trainer has filled in its choices for a ``pretrained`` model or not: a drawn
    ``strategy: gradual`` of a pretrained model is the baseline again, and is drawn anew.

    Raises:
        UsageError: the space holds fewer than ``n`` distinct settings.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    shared = base if base is not None else TrainConfig("", "")
    trials: list[dict[str, Any]] = [baseline_params(space, shared)] if baseline else []
    seen = {_identity(t, shared, pretrained, cut_short) for t in trials}
    if len(trials) == n:
        return trials
    for _ in range(100 * n):
        params = _prune({key: dim.sample(rng) for key, dim in space.items()}, shared)
        key = _identity(params, shared, pretrained, cut_short)
        if key not in seen:
            seen.add(key)
            trials.append(params)
            if len(trials) == n:
                return trials
    raise UsageError(
        f"--trials {n}: the space gives only {len(trials)} distinct setting(s); ask for "
        f"--trials {len(trials)} or widen --space",
        param_hint="--trials",
    )


def _prune(params: dict[str, Any], base: TrainConfig) -> dict[str, Any]:
    """``params`` without the options the trial would never read (over ``base``)."""
    params = dict(params)
    strategy = params.get("strategy", base.strategy)
    if strategy not in (None, "gradual"):
        params.pop("freeze_epochs", None)  # only gradual thaws: the rest never read it
    if strategy == "linear":
        params.pop("backbone_lr_mult", None)  # a frozen backbone has no LR
        params.pop("layer_decay", None)  # nor layers to decay it over
    if not params.get("ema", base.ema):
        params.pop("ema_decay", None)  # no average to decay
    return params


def _identity(
    params: dict[str, Any], base: TrainConfig, pretrained: bool, cut_short: bool = False
) -> str:
    """What a trial trains, as a key: every tunable option's value over ``base``, the
    trainer's own choices (strategy, LR) filled in, less what the trial never reads."""
    cfg = dataclasses.replace(base, **params)
    values = {k: getattr(cfg, k) for k in TUNABLE}
    values["strategy"] = cfg.strategy or default_strategy(pretrained, cut_short)
    if cfg.backbone_lr_mult is None:
        values["backbone_lr_mult"] = default_backbone_lr_mult(pretrained and cut_short)
    values["lr"] = cfg.lr if cfg.lr is not None else default_lr(cfg.optimizer)
    return json.dumps(_prune(values, base), sort_keys=True, default=str)


def _within(bounds: Bounds | None, value: float) -> bool:
    return bounds is None or bounds.holds(value)


def _coerce(key: str, value: Any) -> Any:
    """A number YAML left as text (YAML 1.1 reads ``1e-4``, without a dot, as a string)
    for a field that takes no text; anything else unchanged (then checked by ``_check``)."""
    if isinstance(value, str) and not _fits(key, value):
        try:
            number = float(value)
        except ValueError:
            return value
        return number if _fits(key, number) else value
    return value


_OK = object()


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _fits(key: str, value: Any) -> bool:
    """Whether ``value`` is of the type TrainConfig's field ``key`` declares."""
    allowed: list[Any] = []
    todo = [_field_types()[key]]
    while todo:
        t = todo.pop()
        args = typing.get_args(t)
        if typing.get_origin(t) is Literal:
            allowed += [("literal", a) for a in args]
        elif args:
            todo += args
        else:
            allowed.append(t)
    for entry in allowed:
        if isinstance(entry, tuple) and entry == ("literal", value):
            return True
        if entry is type(None) and value is None:
            return True
        if entry is bool and isinstance(value, bool):
            return True
        if entry is float and _number(value):
            return True
        if entry is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if entry is str and isinstance(value, str):
            return True
    return False
