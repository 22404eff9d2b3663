"""Before the first step: one batch through the model for its output shape, the parameter
counts, and an epoch-time estimate from a few timed steps, all on copies, so the run's own
weights, optimizer and random state are untouched."""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from zoo.errors import TrainingError, UsageError, first_line
from zoo.profile import count_params
from zoo.train.build import RunParts, loader
from zoo.train.console import say
from zoo.train.strategy import set_phase


def phases(
    strategy: str, freeze_epochs: int, epochs: int, start: int = 0
) -> list[tuple[bool, int]]:
    """The run's remaining epochs (from ``start``) by phase: ``(backbone frozen, epochs)``,
    in order, phases without epochs left out. A frozen step costs less (no backbone
    gradients), so the time estimate prices each phase with its own step."""
    left = max(0, epochs - start)
    frozen = (
        left
        if strategy == "linear"
        else min(left, max(0, freeze_epochs - start))
        if strategy == "gradual"
        else 0
    )
    return [(f, n) for f, n in ((True, frozen), (False, left - frozen)) if n > 0]


def preflight(parts: RunParts) -> dict[str, Any]:
    """Check the output shape and estimate the run's time.

    Returns:
        ``params``, ``trainable`` (parameter counts now), ``step_s`` and
        ``epoch_estimate_s`` (compute per step and per epoch of the current phase),
        ``phases`` (each remaining phase: ``frozen``, ``epochs``, ``step_s``, the faster of
        two timed steps, and ``epoch_s``) and ``total_estimate_s``; recorded in
        ``report.json``.

    Raises:
        TrainingError: the model's output is not (batch, number of classes).
        UsageError: the model cannot take images of ``--image-size`` (layers sized for its
            own input size).
    """
    cfg, device, state = parts.cfg, parts.device, parts.state
    strategy = cfg.strategy or "full"
    n_classes = len(parts.data.classes)
    set_phase(parts.groups, strategy, cfg.freeze_epochs, state.epoch)
    total = count_params(parts.model)
    trainable = count_params(parts.model, trainable_only=True)
    first = [(i, 0) for i in range(min(len(parts.train_set), cfg.batch_size))]
    x, _, _ = next(iter(loader(parts.train_set, first, cfg.batch_size, 0, cfg.seed, device)))
    x = parts.model_input(x.to(device))
    plan = phases(strategy, cfg.freeze_epochs, cfg.epochs, state.epoch)
    timed = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for frozen, epochs in plan or [(strategy == "linear", 0)]:
            # the phase's first epoch sets requires_grad on the parts; the copy inherits it
            set_phase(parts.groups, strategy, cfg.freeze_epochs, 0 if frozen else cfg.epochs)
            step = _time_step(parts, x, n_classes)
            epoch_s = step * parts.steps_per_epoch
            timed.append({"frozen": frozen, "epochs": epochs, "step_s": step, "epoch_s": epoch_s})
    set_phase(parts.groups, strategy, cfg.freeze_epochs, state.epoch)  # as the run starts
    step, est = timed[0]["step_s"], timed[0]["epoch_s"]
    total_s = sum(t["epoch_s"] * t["epochs"] for t in timed)
    say(
        f"model: {parts.info.name} → {n_classes} classes, {total:,} parameters "
        f"({trainable:,} trainable now), output ({x.shape[0]}, {n_classes}); strategy "
        f"{cfg.strategy}"
    )
    if state.epoch:  # resumed: the checkpoint's weights replaced the built model's
        say(f"weights: the run's checkpoint after epoch {state.epoch}")
    elif parts.load_report:
        say(f"weights: {parts.load_report.summary()}")
    priced = ", ".join(
        f"{t['epochs']} {'frozen-backbone' if t['frozen'] else 'full'} epoch(s) at "
        f"{t['step_s'] * 1000:.0f} ms/step → ~{t['epoch_s']:.0f}s each"
        for t in timed
        if len(timed) > 1
    )
    say(
        f"estimate: {priced}; {total_s / 60:.1f} min for {cfg.epochs - state.epoch} epochs "
        "(compute only)"
        if priced
        else f"estimate: {step * 1000:.0f} ms/step (compute only) → ~{est:.0f}s per epoch, "
        f"{total_s / 60:.1f} min for {max(0, cfg.epochs - state.epoch)} epochs"
    )
    return {
        "params": total,
        "trainable": trainable,
        "step_s": step,
        "epoch_estimate_s": est,
        "phases": timed,
        "total_estimate_s": total_s,
    }


def _time_step(parts: RunParts, x: torch.Tensor, n_classes: int) -> float:
    """Check the output shape, then time two training steps of a copy of what trains (its
    backbone frozen or not, as ``parts.groups`` are now: the copy keeps ``requires_grad``);
    the faster one, in seconds."""
    model = copy.deepcopy(parts.trained)
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad] or [nn.Parameter(torch.zeros(1))]
    )
    try:
        out = model(x)
    except RuntimeError as e:  # a layer sized for other images (a flatten → Linear head)
        if "shape" not in str(e) and "size" not in str(e):
            raise
        native = parts.parent[0].info.input_size
        raise UsageError(
            f"{parts.info.arch} cannot take {x.shape[-2]}×{x.shape[-1]} images: its layers are "
            f"sized for {native[-2]}×{native[-1]} ({first_line(e)}); pass "
            f"--image-size {native[-1]} or leave --image-size out",
            param_hint="--image-size",
        ) from None
    if out.shape != (x.shape[0], n_classes):
        raise TrainingError(f"Model output {tuple(out.shape)} ≠ (batch, {n_classes} classes).")
    times = []
    for _ in range(2):  # each costs a training step on the user's clock: two, not more
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).float().logsumexp(1).mean().backward()
        opt.step()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)
