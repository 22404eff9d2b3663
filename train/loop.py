"""One epoch of training, one validation pass, the commit that follows each epoch, and the
checkpoint they write and restore: the steps ``trainer.fit`` repeats. Everything they change
lives in ``parts.state`` (and the modules' and optimizer's own state)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from zoo.device import move_to
from zoo.errors import TrainingError
from zoo.train.build import RunParts
from zoo.train.checkpoint import load_checkpoint
from zoo.train.console import say
from zoo.train.epoch_row import TrainPass
from zoo.train.evaluate import collect_logits, gather_by_index
from zoo.train.metrics import summarize, summarize_multilabel
from zoo.train.recipes import batch_seed
from zoo.train.resume import own_epoch_stats
from zoo.train.rng import get_rng_state, set_rng_state
from zoo.train.run_dir import RunDir
from zoo.train.strategy import set_phase, train_mode


def forward(parts: RunParts, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``, under autocast with ``--amp``."""
    amp = parts.cfg.amp
    if amp:
        dtype = torch.bfloat16 if amp == "bf16" else torch.float16
        with torch.autocast(parts.device.type, dtype=dtype):
            return module(x)
    return module(x)


def commit(parts: RunParts, run: RunDir) -> None:
    """Commit the run's state to ``last.pt`` (best/top-k/metrics follow from it at an epoch's
    end). Every rank calls it at the same step; only rank 0 writes."""
    stats = parts.comm.gather_stats(parts.state.epoch_stats)
    if parts.comm.is_main:
        run.commit(snapshot(parts, stats))


def train_epoch(parts: RunParts, run: RunDir, progress: Any) -> TrainPass | None:
    """Train from the state's position to the epoch's end.

    Returns:
        The epoch's training metrics; None when non-finite losses rolled the run back to its
        last checkpoint (the state is then that checkpoint's: the caller starts over).

    Raises:
        TrainingError: non-finite losses persist after ``--max-rollbacks`` rollbacks.
    """
    cfg, comm, s = parts.cfg, parts.comm, parts.state
    frozen = set_phase(parts.groups, cfg.strategy or "full", cfg.freeze_epochs, s.epoch)
    train_mode(parts.trained, parts.groups, frozen)
    if cfg.distill is not None and cfg.distill.qat:
        parts.trained.eval()  # BatchNorm folded and frozen, no dropout (train/qat.py)
    parts.train_sampler.set_epoch(s.epoch)
    parts.train_sampler.set_position(s.step_in_epoch)
    if hasattr(parts.train_set, "set_epoch"):
        parts.train_set.set_epoch(s.epoch)
    task = (
        progress.add_task(
            f"epoch {s.epoch + 1}/{cfg.epochs}",
            total=parts.steps_per_epoch,
            completed=s.step_in_epoch,
            info="",
        )
        if progress is not None
        else None
    )
    s.consecutive_nonfinite = 0
    wait = compute = 0.0
    seen = 0
    t_epoch = t_ready = time.perf_counter()
    for x, y, idx in parts.train_loader:
        t_got = time.perf_counter()
        wait += t_got - t_ready
        x, y = move_to((x, y), parts.device, non_blocking=True)
        if cfg.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        if parts.recipe is not None:  # erasing, mixing: seeded by the step, so a resume replays
            x, y = parts.recipe(x, y, batch_seed(cfg.seed, s.global_step, comm.rank))
        parts.optimizer.zero_grad(set_to_none=True)
        logits = forward(parts, parts.train_forward, parts.model_input(x))
        loss = parts.loss_fn(logits.float(), y)
        if parts.distill is not None:  # the teacher's soft targets beside the hard labels
            loss = parts.distill.loss(logits.float(), loss, x, idx)
        parts.scaler.scale(loss).backward()
        # One host sync per step, after backward is queued: loss, correct count, finiteness.
        if cfg.multi_label:
            hits = ((logits > 0) == (y > 0.5)).all(1)
        else:  # mixed targets: against each image's larger share
            hits = logits.argmax(1) == (y.argmax(1) if y.ndim == 2 else y)
        loss_v, correct = torch.stack([loss.detach(), hits.sum().float()]).tolist()
        if not comm.all_finite(loss_v):  # skip the step: NaN/inf never reaches the weights
            if _nonfinite(parts, run, idx):
                if task is not None:
                    progress.remove_task(task)
                return None
        else:
            s.consecutive_nonfinite = 0
            if cfg.clip_grad_norm:
                parts.scaler.unscale_(parts.optimizer)
                nn.utils.clip_grad_norm_(parts.model.parameters(), cfg.clip_grad_norm)
            if cfg.log_grad_norms and comm.is_main and s.global_step % 50 == 0:
                run.log_grad_norms(parts.model, s.global_step)
            parts.scaler.step(parts.optimizer)
            parts.scaler.update()
            if parts.ema is not None:
                parts.ema.update(parts.model, s.global_step + 1)
            s.epoch_stats["loss"] += loss_v * len(y)  # a float: no graph kept alive
            s.epoch_stats["correct"] += int(correct)
            s.epoch_stats["n"] += len(y)
        parts.scheduler.step()
        s.global_step += 1
        s.step_in_epoch += 1
        seen += len(y)
        t_ready = time.perf_counter()
        compute += t_ready - t_got
        if cfg.save_every_steps and s.global_step % cfg.save_every_steps == 0:
            commit(parts, run)
        if task is not None:
            n = max(1, s.epoch_stats["n"])
            progress.update(
                task,
                advance=1,
                info=f"loss {s.epoch_stats['loss'] / n:.4f} acc {s.epoch_stats['correct'] / n:.3f} "
                f"{seen * comm.world / max(1e-9, t_ready - t_epoch):.0f} img/s data-wait "
                f"{wait / max(1e-9, wait + compute):.0%}",
            )
    # Logged for the whole global batch, not rank 0's shard.
    loss_sum, correct_sum, n_sum = comm.sum(
        [s.epoch_stats["loss"], float(s.epoch_stats["correct"]), float(s.epoch_stats["n"])]
    )
    n = max(1.0, n_sum)
    epoch_s = time.perf_counter() - t_epoch
    return TrainPass(
        loss=loss_sum / n,
        acc=correct_sum / n,
        data_wait=wait / max(1e-9, wait + compute),
        img_per_s=seen * comm.world / max(1e-9, epoch_s),
        epoch_s=epoch_s,
    )


def validate(parts: RunParts, module: nn.Module | None = None) -> dict[str, Any]:
    """Metrics of the current weights (``module``: other weights of what trains, e.g. the
    EMA's) on the validation split (every rank's shard, gathered)."""
    module = module if module is not None else parts.trained
    parts.comm.broadcast_buffers(module)  # every shard judged with rank 0's (saved) BN stats
    was = module.training
    module.eval()
    try:
        # The plain module, not the DDP wrapper: its forward is a collective, and ranks may
        # hold different numbers of validation batches.
        logits, targets = gather_by_index(
            *collect_logits(
                lambda x: forward(parts, module, x),
                parts.val_loader,
                parts.device,
                channels_last=parts.cfg.channels_last,
            )
        )
    finally:
        module.train(was)
    if parts.cfg.multi_label:  # exact-match accuracy, per-class thresholds tuned on val
        return summarize_multilabel(logits, targets, parts.data.classes)
    return summarize(logits, targets, parts.data.classes)


def _nonfinite(parts: RunParts, run: RunDir, idx: torch.Tensor) -> bool:
    """Count a skipped step; after ``--max-nonfinite`` in a row, roll back to the last
    checkpoint with half the LR. Returns whether it rolled back."""
    cfg, s = parts.cfg, parts.state
    s.nonfinite_skipped += 1
    s.consecutive_nonfinite += 1
    if s.consecutive_nonfinite < cfg.max_nonfinite:
        return False
    files = [str(parts.data.samples["train"][int(i)][0]) for i in idx[:5]]
    where = f"epoch {s.epoch}, step {s.step_in_epoch} (global {s.global_step})"
    if s.rollbacks >= cfg.max_rollbacks or not run.last_path.exists():
        raise TrainingError(
            f"Loss is not finite at {where} after {s.rollbacks} rollback(s) with halved LR. "
            f"Files in the offending batch: {', '.join(files) or 'n/a'}. Try: --lr "
            f"{(cfg.lr if isinstance(cfg.lr, float) else 1e-3) / 10:g} (10× lower), check the labels and that inputs hold no "
            "NaN, --clip-grad-norm 1.0, or --detect-anomaly to find the op that produced it."
        )
    parts.comm.barrier()  # rank 0 has finished writing last.pt
    rollbacks = s.rollbacks + 1
    restore(parts, load_checkpoint(run.last_path), str(run.path))
    if parts.comm.is_main:
        run.drop_pending()  # the replay logs these steps again
    s.rollbacks = rollbacks
    s.lr_scale *= 0.5
    say(
        f"warning: {cfg.max_nonfinite} non-finite losses in a row at {where}: rolled back to "
        f"the last checkpoint with LR × {s.lr_scale:g}"
    )
    return True


def snapshot(parts: RunParts, epoch_stats: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``last.pt`` holds: everything a resume needs (``epoch_stats``: every rank's
    running sums)."""
    return {
        "model": {k: v.detach().cpu() for k, v in parts.model.state_dict().items()},
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": parts.scheduler.state_dict(),
        "scaler": parts.scaler.state_dict(),
        **parts.state.saved(epoch_stats),
        **({"ema": parts.ema.state_dict()} if parts.ema is not None else {}),
        "rng": get_rng_state(),
        "world_size": parts.comm.world,
        "global_batch": parts.cfg.batch_size * parts.comm.world,
    }


def restore(parts: RunParts, saved: dict[str, Any], where: str) -> None:
    """Load a checkpoint into the parts and their :class:`LoopState` (in place: the scheduler
    reads the LR scale from it). ``where``: the run folder, for the message."""
    parts.model.load_state_dict(saved["model"])
    parts.optimizer.load_state_dict(saved["optimizer"])
    parts.scheduler.load_state_dict(saved["scheduler"])
    parts.scaler.load_state_dict(saved["scaler"])
    if parts.ema is not None:
        parts.ema.load_state_dict(saved["ema"])
    s, comm, batch = parts.state, parts.comm, parts.cfg.batch_size
    s.load(saved, own_epoch_stats(saved["epoch_stats"], comm.rank, comm.world))
    set_rng_state(saved["rng"])
    saved_world = int(saved.get("world_size", 1))
    if saved_world != comm.world and s.step_in_epoch:
        # Same samples seen so far, counted in this run's global batches.
        seen = s.step_in_epoch * int(saved.get("global_batch", batch * saved_world))
        s.step_in_epoch = min(parts.steps_per_epoch, round(seen / (batch * comm.world)))
        say(
            f"warning: this run was saved with {saved_world} process(es) and resumes with "
            f"{comm.world}: the rest of epoch {s.epoch + 1} is reshuffled across ranks, so the "
            "result is not bitwise equal to an uninterrupted run"
        )
    # epochs counted from 1, as the epoch lines count them: "epoch 4/10" is the fourth
    within = (
        f", in epoch {s.epoch + 1} at step {s.step_in_epoch}/{parts.steps_per_epoch}"
        if s.step_in_epoch
        else ""
    )
    say(
        f"resumed {where} after {s.epoch} of {parts.cfg.epochs} epochs{within} "
        f"(global step {s.global_step})"
    )
