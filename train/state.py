"""Where a run is: the loop's counters and bookkeeping, saved in every checkpoint beside the
weights (``loop.snapshot`` / ``loop.restore``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
