"""Before the first step: one batch through the model for its output shape, the parameter
counts, and an epoch-time estimate from a few timed steps, all on copies, so the run's own
weights, optimizer and random state are untouched."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from zoo.errors import TrainingError
from zoo.profile import count_params
from zoo.train.build import RunParts, loader
from zoo.train.console import say
from zoo.train.strategy import set_phase


def preflight(parts: RunParts) -> dict[str, Any]:
    """Check the output shape and estimate the run's time.

    Returns:
        ``params``, ``trainable`` (parameter counts), ``step_s`` (compute per step, the
        faster of two after the shape check's warm-up pass) and ``epoch_estimate_s``; recorded in ``report.json``.

    Raises:
        TrainingError: the model's output is not (batch, number of classes).
    """
    cfg, device = parts.cfg, parts.device
    n_classes = len(parts.data.classes)
    set_phase(parts.groups, cfg.strategy or "full", cfg.freeze_epochs, parts.state.epoch)
    total = count_params(parts.model)
    trainable = count_params(parts.model, trainable_only=True)
    first = [(i, 0) for i in range(min(len(parts.train_set), cfg.batch_size))]
    x, _, _ = next(iter(loader(parts.train_set, first, cfg.batch_size, 0, cfg.seed, device)))
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = copy.deepcopy(parts.trained)
        opt = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad] or [nn.Parameter(torch.zeros(1))]
        )
        x = x.to(device)
        out = model(x)
        if out.shape != (x.shape[0], n_classes):
            raise TrainingError(f"Model output {tuple(out.shape)} ≠ (batch, {n_classes} classes).")
        times = []
        for _ in range(2):  # each costs a training step on the user's clock: two, not more
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            model(x).float().logsumexp(1).mean().backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    step = min(times)
    est = step * parts.steps_per_epoch
    say(
        f"model: {parts.info.name} → {n_classes} classes, {total:,} parameters "
        f"({trainable:,} trainable now), output {tuple(out.shape)}; strategy {cfg.strategy}"
    )
    if parts.load_report:
        say(f"weights: {parts.load_report.summary()}")
    say(
        f"estimate: {step * 1000:.0f} ms/step (compute only) → ~{est:.0f}s per epoch, "
        f"{est * cfg.epochs / 60:.1f} min for {cfg.epochs} epochs"
    )
    return {"params": total, "trainable": trainable, "step_s": step, "epoch_estimate_s": est}
