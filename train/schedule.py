"""Learning-rate schedules stepped once per batch: warmup + cosine, one-cycle, or constant.

The schedule is a pure function of the global step (plus the rollback LR scale), so a
restored scheduler continues exactly. ``--extend N`` appends a segment instead of
stretching the old one; segments are recorded in the run's config.json.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from zoo.train.config import TrainConfig


def _segment_factor(
    seg: dict[str, Any], step: int, steps_per_epoch: int, warmup_steps: int
) -> float:
    total = max(1, int(seg["epochs"] * steps_per_epoch))
    t = min(step - seg["from_step"], total)
    peak = float(seg.get("peak_scale", 1.0))
    kind = seg["kind"]
    if kind == "onecycle":
        warmup_steps = max(1, int(0.3 * total))
    if t < warmup_steps:
        return peak * (0.01 + 0.99 * (t + 1) / warmup_steps)
    if kind == "constant":
        return peak
    progress = (t - warmup_steps) / max(1, total - warmup_steps)
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    steps_per_epoch: int,
    lr_scale: Callable[[], float],
) -> LambdaLR:
    """The run's LR schedule (``cfg.schedule_segments``, as :func:`resolve_config` resolved
    them) as a scheduler stepped once per batch; ``lr_scale``: the rollback factor, read at
    each step."""
    segments = cfg.schedule_segments
    if not segments:
        raise ValueError("internal: build_scheduler needs a resolved config (no segments)")
    warmup = int(cfg.warmup_epochs * steps_per_epoch)

    def factor(step: int) -> float:
        seg = max((s for s in segments if s["from_step"] <= step), key=lambda s: s["from_step"])
        w = warmup if seg is segments[0] else 0
        return lr_scale() * _segment_factor(seg, step, steps_per_epoch, w)

    return LambdaLR(optimizer, factor)
