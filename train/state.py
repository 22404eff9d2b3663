"""Where a run is: the loop's counters and bookkeeping, saved in every checkpoint beside the
weights (``loop.snapshot`` / ``loop.restore``, through :meth:`LoopState.saved` and
:meth:`LoopState.load`: the fields are listed once, here)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
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
    # not saved: a restored state starts a fresh count
    consecutive_nonfinite: int = field(default=0, metadata={"saved": False})
    epoch_stats: dict[str, Any] = field(default_factory=zero_stats)
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per finished epoch

    def saved(self, epoch_stats: list[dict[str, Any]]) -> dict[str, Any]:
        """The state as a checkpoint holds it, in field order.

        Args:
            epoch_stats: every rank's running sums of the epoch (gathered by the caller).
        """
        return {
            f.name: epoch_stats if f.name == "epoch_stats" else getattr(self, f.name)
            for f in fields(self)
            if f.metadata.get("saved", True)
        }

    def load(self, saved: dict[str, Any], epoch_stats: dict[str, Any]) -> None:
        """Take the state a checkpoint holds, in place (the scheduler reads :attr:`lr_scale`
        from this object).

        Args:
            saved: the checkpoint (:meth:`saved`'s keys; ``stopped`` may be missing from one
                written before early stopping was committed).
            epoch_stats: this rank's share of the saved running sums.

        Raises:
            KeyError: the checkpoint lacks a field.
        """
        for f in fields(self):
            if not f.metadata.get("saved", True):
                setattr(self, f.name, f.default)
            elif f.name == "epoch_stats":
                self.epoch_stats = epoch_stats
            elif f.name == "history":
                self.history = list(saved["history"])
            elif f.name == "stopped":
                self.stopped = bool(saved.get("stopped", False))
            else:
                setattr(self, f.name, saved[f.name])

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
