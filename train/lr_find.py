"""``zoo lr-find``: the learning-rate range test (L. Smith, "Cyclical Learning Rates for
Training Neural Networks", 2017, section 3.3), made reproducible.

Each sweep trains a copy of the run's model and optimizer for ``steps`` steps on a fixed,
seeded order of training images while the learning rate grows geometrically from ``start`` to
``end``; a sweep stops early once its smoothed loss passes 4x its best. The sweeps (each its
own seeded order) are averaged step by step over the steps they all reached, smoothed, and the
suggestion is **one tenth of the learning rate where that curve is lowest** (the rule printed
with it). The rule needs the point where the loss stops falling, so the curve must turn inside
the range (:func:`check_curve`): when it does not, ``zoo lr-find`` warns and ``--lr auto``
refuses to train with the suggestion. Everything is a function of the options and the seed, so the same command gives the
same suggestion twice; the run's own model and optimizer are never touched.

Written by hand: timm, torchvision and Lightning's tuner either have no range test or tie it to
their own trainer; ours must drive zoo's own parts (strategy phases, feature cache, loss)."""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from zoo.device import move_to
from zoo.errors import TrainingError
from zoo.train.build import RunParts, build_run, loader
from zoo.train.config import TrainConfig
from zoo.train.console import say
from zoo.train.loop import forward
from zoo.train.recipes import batch_seed
from zoo.train.resolve import resolve_config
from zoo.train.strategy import set_phase, train_mode

RULE = "one tenth of the learning rate at the lowest averaged, smoothed loss"
DIVERGED = 4.0  # a sweep stops when its smoothed loss passes this multiple of its best
MIN_STEPS = 5  # fewer steps before the curve ends: no suggestion
BETA = 0.9  # smoothing of the loss curve (exponential moving average, bias-corrected)
TURN = 0.1  # the curve has turned once it rises this share above its lowest point after it


@dataclass(frozen=True)
class LrFindResult:
    lrs: list[float]  # the learning rate of each step reached by every sweep
    loss: list[float]  # averaged over the sweeps, then smoothed
    sweeps: list[list[float]]  # each sweep's raw losses
    suggested: float
    rule: str = RULE
    turned: bool = True  # the curve fell, then rose again: see check_curve
    problem: str | None = None  # why the suggestion is not reliable (turned is False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def lr_schedule(start: float, end: float, steps: int) -> list[float]:
    """``steps`` learning rates from ``start`` to ``end``, evenly spaced in log scale."""
    if not 0 < start < end:
        raise ValueError(f"need 0 < start < end, got {start} and {end}")
    if steps < 2:
        raise ValueError(f"need at least 2 steps, got {steps}")
    ratio = math.log(end / start) / (steps - 1)
    return [start * math.exp(ratio * i) for i in range(steps)]


def smooth(values: list[float], beta: float = BETA) -> list[float]:
    """Bias-corrected exponential moving average (the first value is itself)."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta**i))
    return out


def average(sweeps: list[list[float]]) -> list[float]:
    """Step-wise mean over the steps every sweep reached."""
    n = min(len(s) for s in sweeps)
    return [sum(s[i] for s in sweeps) / len(sweeps) for i in range(n)]


def suggest(lrs: list[float], loss: list[float]) -> float:
    """:data:`RULE`: a tenth of the learning rate at the curve's minimum (first one on ties)."""
    best = min(range(len(loss)), key=lambda i: (loss[i], i))
    return lrs[best] / 10


@dataclass(frozen=True)
class CurveCheck:
    """Whether an averaged, smoothed range-test curve can be trusted to suggest a rate."""

    turned: bool  # its lowest point lies inside the range: the loss fell, then rose again
    problem: str | None = None  # what is wrong with it, quoting the step and rate, if not


def check_curve(lrs: list[float], loss: list[float]) -> CurveCheck:
    """Judge the curve the suggestion is read from (Smith's rule needs the point where the
    loss stops falling, so the curve must turn inside the range).

    Args:
        lrs: the learning rate of each step.
        loss: the averaged, smoothed loss at each step.

    Returns:
        ``turned`` when the loss is lowest after the first step and rises at least
        :data:`TURN` above that lowest value later in the range; otherwise the problem: the
        curve only rose (lowest at the start), or it was still falling or flat at the end.
    """
    best = min(range(len(loss)), key=lambda i: (loss[i], i))
    where = f"step {best + 1} of {len(loss)}, lr {lrs[best]:.3g}"
    if best == 0:
        return CurveCheck(
            False,
            f"the loss was lowest at the start of the range ({where}) and never fell: even "
            "the smallest rate is too high (lower --start)",
        )
    rise = max(loss[best:]) / loss[best] - 1 if loss[best] > 0 else math.inf
    if not rise >= TURN:
        return CurveCheck(
            False,
            f"the loss had not turned up by the end of the range: lowest at {where}, and it "
            f"rose {max(rise, 0.0):.0%} after it (a turn is {TURN:.0%}); the curve was still "
            "falling or flat",
        )
    return CurveCheck(True)


def diverged(smoothed: list[float]) -> bool:
    last = smoothed[-1]
    return not math.isfinite(last) or last > DIVERGED * min(smoothed)


def _sweep(parts: RunParts, lrs: list[float], sweep: int) -> list[float]:
    """One sweep on copies of the run's parts; the raw loss of each step until divergence."""
    cfg = parts.cfg
    frozen = set_phase(parts.groups, cfg.strategy or "full", cfg.freeze_epochs, 0)
    model, opt, groups = copy.deepcopy((parts.trained, parts.optimizer, parts.groups))
    top = max(g["lr"] for g in opt.param_groups)
    scale = [g["lr"] / top for g in opt.param_groups]  # e.g. --backbone-lr-mult kept
    n = len(parts.train_set)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed + 7919 * sweep))
    need = len(lrs) * cfg.batch_size
    keys = [(int(order[i % n]), sweep) for i in range(need)]  # (index, epoch): seeded augment
    batches = loader(parts.train_set, keys, cfg.batch_size, parts.workers, cfg.seed, parts.device)
    train_mode(model, groups, frozen)
    raw: list[float] = []
    cuda = [parts.device] if parts.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # dropout & co. seeded; the run's RNG untouched
        torch.manual_seed(cfg.seed + 7919 * sweep)
        for lr, (x, y, _) in zip(lrs, batches, strict=False):
            for g, s in zip(opt.param_groups, scale, strict=True):
                g["lr"] = lr * s
            opt.zero_grad(set_to_none=True)
            x, y = move_to((x, y), parts.device, non_blocking=True)
            if parts.recipe is not None:  # erased and mixed batches, as the run trains on
                x, y = parts.recipe(x, y, batch_seed(cfg.seed + 7919 * sweep, len(raw), 0))
            loss = parts.loss_fn(forward(parts, model, parts.model_input(x)).float(), y)
            value = float(loss.detach())
            if not math.isfinite(value):  # diverged for good: the curve ends before it
                break
            raw.append(value)
            if diverged(smooth(raw)):
                break
            loss.backward()
            opt.step()
    return raw


def find_lr(
    options: TrainConfig,
    *,
    start: float = 1e-7,
    end: float = 10.0,
    steps: int = 100,
    sweeps: int = 3,
) -> LrFindResult:
    """Run the range test for the model and data ``options`` describe.

    Args:
        options: training options, as for ``zoo finetune`` (those that shape a step count:
            model, data, strategy, batch size, optimizer, loss, augmentation, seed).
        start, end: the learning-rate range, geometric.
        steps: steps per sweep.
        sweeps: how many seeded sweeps are averaged.

    Returns:
        The averaged curve and the suggestion.

    Raises:
        TrainingError: a sweep ended (non-finite or diverged loss) within ``MIN_STEPS``.
        Everything :func:`resolve_config` and :func:`build_run` raise for bad options/data.
    """
    lrs = lr_schedule(start, end, steps)
    parts = build_run(resolve_config(options))
    runs = [_sweep(parts, lrs, s) for s in range(sweeps)]
    if min(len(r) for r in runs) < MIN_STEPS:
        raise TrainingError(
            f"the loss was not finite or diverged within {MIN_STEPS} steps from lr {start:g}: "
            "lower --start; if it already is tiny, check the data and the model"
        )
    loss = smooth(average(runs))
    reached = lrs[: len(loss)]
    check = check_curve(reached, loss)
    result = LrFindResult(
        reached, loss, runs, suggest(reached, loss), turned=check.turned, problem=check.problem
    )
    return result


NEXT_STEP = (
    "run more --steps or a larger --end (or a smaller --start) until the curve turns, "
    "or pick the learning rate yourself (--lr VALUE)"
)


def auto_lr(
    options: TrainConfig,
    *,
    start: float = 1e-7,
    end: float = 10.0,
    steps: int = 100,
    sweeps: int = 3,
) -> tuple[TrainConfig, LrFindResult]:
    """``zoo finetune --lr auto``: the range test (``zoo lr-find``'s defaults) on these
    options, and the options with its suggestion as ``lr``.

    Raises:
        InputError: ``--resume`` (the run keeps its own LR) or several processes (run
            ``zoo lr-find`` once, then pass its suggestion).
        TrainingError: the curve did not turn (:func:`check_curve`), so there is no
            suggestion to train with; the message names ``zoo lr-find`` and ``--lr``.
    """
    import os

    from zoo.errors import InputError

    if options.resume:
        raise InputError("--lr auto starts a new run; a resumed run keeps its own LR")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise InputError(
            "--lr auto runs in one process: run `zoo lr-find` first, then pass --lr VALUE"
        )
    found = find_lr(  # callers skip it for --dry-run
        replace(options, lr=None, dry_run=False), start=start, end=end, steps=steps, sweeps=sweeps
    )
    if not found.turned:
        raise TrainingError(
            f"--lr auto refuses the range test's suggestion ({found.suggested:.3g}): "
            f"{found.problem}. Look at the curve with `zoo lr-find {options.model} --data "
            f"{options.data} --steps {2 * steps} --end {10 * end:g}` (more --steps, a larger "
            "--end), then pass --lr VALUE; or give an explicit --lr."
        )
    say(f"lr auto: {found.suggested:.3g} ({found.rule}; {len(found.sweeps)} sweeps)")
    return replace(options, lr=found.suggested), found


def plot_lr_find(result: LrFindResult, out: Path) -> None:
    from zoo.train.plots import plot_lr_curve

    plot_lr_curve(result.lrs, result.loss, result.suggested, out)
