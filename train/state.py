"""Where a run is: the loop's counters and what a checkpoint records, written and restored in
one place (``last.pt`` holds exactly :func:`snapshot`; see ``run_dir.py`` for the commit)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zoo.train.console import say
from zoo.train.resume import own_epoch_stats
from zoo.train.rng import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from zoo.train.build import RunParts


def zero_stats() -> dict[str, Any]:
    """An epoch's running sums on this rank, before its first step."""
    return {"loss": 0.0, "correct": 0, "n": 0}


@dataclass
class LoopState:
    """The loop's position and bookkeeping: everything a checkpoint holds besides the weights,
    optimizer, scheduler, scaler and RNG."""

    epoch: int = 0  # epochs finished
    global_step: int = 0
    step_in_epoch: int = 0
    best: float | None = None  # the best monitored value so far (higher is better)
    epochs_since_best: int = 0
    stopped: bool = False  # early stopping: part of the committed state
    lr_scale: float = 1.0  # halved by each rollback after non-finite losses
    nonfinite_skipped: int = 0
    rollbacks: int = 0
    consecutive_nonfinite: int = 0  # not saved: a restored state starts a fresh count
    epoch_stats: dict[str, Any] = field(default_factory=zero_stats)
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per finished epoch

    def end_epoch(self, row: dict[str, Any], metric: float, patience: int | None) -> bool:
        """Record a finished epoch (its metrics ``row``, the monitored ``metric``); returns
        whether it is the best so far. Sets :attr:`stopped` once ``patience`` runs out."""
        self.history.append(row)
        improved = self.best is None or metric > self.best
        if improved:
            self.best, self.epochs_since_best = metric, 0
        else:
            self.epochs_since_best += 1
        self.epoch += 1
        self.step_in_epoch = 0
        self.epoch_stats = zero_stats()
        self.stopped = patience is not None and self.epochs_since_best >= patience
        return improved


def snapshot(parts: RunParts, epoch_stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything a resume needs; ``epoch_stats``: every rank's running sums."""
    s = parts.state
    return {
        "model": {k: v.detach().cpu() for k, v in parts.model.state_dict().items()},
        "optimizer": parts.optimizer.state_dict(),
        "scheduler": parts.scheduler.state_dict(),
        "scaler": parts.scaler.state_dict(),
        "epoch": s.epoch,
        "global_step": s.global_step,
        "step_in_epoch": s.step_in_epoch,
        "best": s.best,
        "epochs_since_best": s.epochs_since_best,
        "stopped": s.stopped,
        "lr_scale": s.lr_scale,
        "nonfinite_skipped": s.nonfinite_skipped,
        "rollbacks": s.rollbacks,
        "epoch_stats": epoch_stats,
        "history": s.history,
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
    s, comm, batch = parts.state, parts.comm, parts.cfg.batch_size
    s.epoch, s.global_step, s.step_in_epoch = (
        saved["epoch"],
        saved["global_step"],
        saved["step_in_epoch"],
    )
    s.best, s.epochs_since_best = saved["best"], saved["epochs_since_best"]
    s.lr_scale, s.nonfinite_skipped = saved["lr_scale"], saved["nonfinite_skipped"]
    s.rollbacks = saved["rollbacks"]
    s.epoch_stats = own_epoch_stats(saved["epoch_stats"], comm.rank, comm.world)
    s.history = list(saved["history"])
    s.stopped = bool(saved.get("stopped", False))
    s.consecutive_nonfinite = 0
    set_rng_state(saved["rng"])
    saved_world = int(saved.get("world_size", 1))
    if saved_world != comm.world and s.step_in_epoch:
        # Same samples seen so far, counted in this run's global batches.
        seen = s.step_in_epoch * int(saved.get("global_batch", batch * saved_world))
        s.step_in_epoch = min(parts.steps_per_epoch, round(seen / (batch * comm.world)))
        say(
            f"warning: this run was saved with {saved_world} process(es) and resumes with "
            f"{comm.world}: the rest of epoch {s.epoch} is reshuffled across ranks, so the "
            "result is not bitwise equal to an uninterrupted run"
        )
    say(
        f"resumed {where} at epoch {s.epoch}, step {s.step_in_epoch}/{parts.steps_per_epoch} "
        f"(global step {s.global_step})"
    )
