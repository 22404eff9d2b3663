"""Who else hears about a run: experiment trackers (MLflow), a hyper-parameter search's
reporter (Ray Tune). :func:`zoo.train.trainer.fit` calls each observer on rank 0 only, at
three points where the run folder is consistent:

- :meth:`RunObserver.run_started`: the run folder exists (a resumed run's earlier epochs are
  in ``history``: an observer that logged them before does not log them again);
- :meth:`RunObserver.epoch_ended`: after the epoch's commit, so ``last.pt`` holds it;
- :meth:`RunObserver.run_ended`: after ``finish_run`` wrote ``model/`` and ``report.json``
  (``status="done"``), or when the run stops on Ctrl-C (``"interrupted"``) or an error
  (``"failed"``; the run folder keeps its last checkpoint either way).

An observer must not stop training by failing: the trainer reports an observer's exception as a
warning and goes on (a tracker that wants to refuse a run checks before :func:`fit`). Only
:class:`StopRun` raised from :meth:`RunObserver.epoch_ended` ends the run early, as early
stopping does (a scheduler's decision: the run finishes normally with its best epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from zoo.train.console import say

if TYPE_CHECKING:
    from zoo.train.config import TrainConfig
    from zoo.train.epoch_row import EpochRow

RunStatus = Literal["done", "interrupted", "failed"]


class StopRun(Exception):
    """Raised by an observer's :meth:`RunObserver.epoch_ended` to end the run after this
    epoch (e.g. ASHA's early stop); the run then finishes as early stopping does."""


class RunObserver(Protocol):
    def run_started(self, run: Path, cfg: TrainConfig, history: Sequence[EpochRow]) -> None:
        """The run folder ``run`` is open; ``history``: epochs a resumed run already has."""

    def epoch_ended(self, run: Path, row: EpochRow) -> None:
        """Epoch ``row.epoch`` is committed to ``run/last.pt``."""

    def run_ended(self, run: Path, status: RunStatus) -> None:
        """The run stopped; with ``"done"`` its ``model/`` and ``report.json`` are written."""


def notify(observers: Sequence[RunObserver], event: str, *args: object) -> bool:
    """Call ``event`` on every observer; a failure is a warning, never the run's end.

    Returns:
        Whether an observer asked to stop (:class:`StopRun`).
    """
    stop = False
    for observer in observers:
        try:
            getattr(observer, event)(*args)
        except StopRun:
            stop = True
        except Exception as e:  # an observer never ends training
            say(f"warning: {type(observer).__name__}.{event} failed: {type(e).__name__}: {e}")
    return stop


__all__ = ["RunObserver", "RunStatus", "StopRun", "notify"]
