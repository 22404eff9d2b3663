"""One trial of a search: an ordinary :func:`zoo.train.trainer.fit` in a Ray Tune actor.

``fit`` runs in a thread of the actor; a :class:`Reporter` (a
:class:`~zoo.train.observe.RunObserver`) hands each committed epoch to :meth:`ZooTrial.step`,
which returns it to Tune as the iteration's result, and waits for Tune's verdict:

- Tune calls ``step`` again: the next epoch trains, unless the scheduler stopped the trial
  (ASHA, recorded in :class:`Verdicts`; Tune is told to continue): then ``step`` tells the
  reporter, which raises :class:`~zoo.train.observe.StopRun`, the run finishes as early
  stopping does (model folder, report) and ``step`` reports ``done``;
- the actor is stopped for any other reason (Ctrl-C, the end of the experiment): ``cleanup``
  finishes a run the scheduler stopped, else the thread is left where it waits, at an epoch's
  commit; ``zoo tune --resume`` continues the run from its ``last.pt``, as a killed search
  does.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
import torch
from ray import tune

from zoo.train.config import TrainConfig
from zoo.train.epoch_row import EpochRow
from zoo.train.observe import RunObserver, StopRun
from zoo.train.tune.book import rank

if TYPE_CHECKING:
    from zoo.train.tracking import MlflowTracker

RANK = "zoo/rank"  # the key ASHA and Tune decide by (book.rank)
VERDICTS = "zoo-tune-verdicts"  # a search's named Verdicts actor (one Ray namespace per search)


@ray.remote(num_cpus=0)
class Verdicts:
    """The trials the scheduler stopped, recorded by the driver before Tune stops their
    actors: a trial's ``cleanup`` asks here whether to finish its run."""

    def __init__(self) -> None:
        self._stopped: set[str] = set()

    def stop(self, name: str) -> None:
        self._stopped.add(name)

    def stopped(self, name: str) -> bool:
        return name in self._stopped


def result(row: EpochRow, metric: str, run: Path, resumed_from: int) -> dict[str, Any]:
    """A trial's result for Tune: the epoch (ASHA's clock), the metric and the rank ASHA
    goes by, where the run is."""
    return {
        "epoch": row.epoch,
        metric: float(getattr(row.val, metric.split("/", 1)[1])),
        RANK: rank(row, metric),
        "run": str(run),
        "resumed_from": resumed_from,
        "threads": torch.get_num_threads(),
        "node": ray.get_runtime_context().get_node_id(),
    }


class Reporter:
    """The observer in the trial's ``fit``: each committed epoch goes to ``events``; then it
    waits for ``go`` (train on) or ``stop`` (finish the run now) from ``verdicts``."""

    def __init__(self, metric: str, events: queue.Queue[Any], verdicts: queue.Queue[str]):
        self.metric, self.events, self.verdicts = metric, events, verdicts
        self.epochs = 0
        self.resumed_from = 0

    def run_started(self, run: Path, cfg: TrainConfig, history: Sequence[EpochRow]) -> None:
        self.epochs, self.resumed_from = cfg.epochs, len(history)
        if history:  # a resumed run with nothing left to train still reports where it is
            self.events.put(("last", result(history[-1], self.metric, run, len(history))))

    def epoch_ended(self, run: Path, row: EpochRow) -> None:
        self.events.put(("row", result(row, self.metric, run, self.resumed_from)))
        if self.verdicts.get() == "stop" and row.epoch < self.epochs:
            raise StopRun

    def run_ended(self, run: Path, status: str) -> None:
        pass


def _tracker(name: str, track: dict[str, str] | None) -> MlflowTracker | None:
    """The trial's MLflow tracker, nested under the search's run (None: not tracked). Not
    checked here: a server that went down after the search started never stops a trial (the
    tracker keeps what it could not send)."""
    if track is None:
        return None
    import os

    from zoo.train.tracking import MlflowTracker
    from zoo.train.tune.track import TrialTracking

    t = TrialTracking.from_dict(track)
    os.environ["MLFLOW_EXPERIMENT_ID"] = t.experiment_id  # the trial's run: the search's experiment
    return MlflowTracker(
        uri=t.uri, parent_run_id=t.parent_run_id, run_name=name, tags={"zoo.tune.trial": name}
    )


class ZooTrial(tune.Trainable):
    """A Tune trainable whose iterations are a zoo run's epochs (see the module's notes).

    ``config["plan"]``: ``{"trial": name, "options": TrainConfig.to_dict(), "metric": …,
    "track": TrialTracking.to_dict() | None}``.
    """

    def setup(self, config: dict[str, Any]) -> None:
        plan = config["plan"]
        self.name: str = plan["trial"]
        self.events: queue.Queue[Any] = queue.Queue()
        self.verdicts: queue.Queue[str] = queue.Queue()
        self.waiting = False  # the reporter waits for a verdict on the last row
        self.last: dict[str, Any] | None = None
        options = TrainConfig.from_dict(plan["options"])
        reporter = Reporter(plan["metric"], self.events, self.verdicts)
        tracker = _tracker(self.name, plan.get("track"))
        self.thread = threading.Thread(
            target=self._fit, args=(options, reporter, tracker), daemon=True
        )
        self.thread.start()

    def _fit(self, options: TrainConfig, reporter: Reporter, tracker: MlflowTracker | None) -> None:
        from zoo.train.console import say
        from zoo.train.trainer import fit

        observers: list[RunObserver] = [reporter] if tracker is None else [tracker, reporter]
        try:
            event: tuple[str, Any] = ("done", str(fit(options, observers=observers)))
        except BaseException as exc:  # the trial's failure, raised in step() for Tune
            event = ("error", exc)
        if tracker is not None:  # sent before the trial ends; what did not arrive, in its log
            say(f"{self.name}: {tracker.close().line()}")
        self.events.put(event)

    def step(self) -> dict[str, Any]:
        if self.waiting:
            self.verdicts.put("stop" if self._stopped() else "go")
            self.waiting = False
        while True:
            kind, value = self.events.get()
            if kind == "last":
                self.last = value
            elif kind == "row":
                self.waiting, self.last = True, value
                return value
            elif kind == "done":
                if self.last is None:
                    raise RuntimeError(f"{value}: the run finished without an epoch")
                return {**self.last, "done": True}
            else:
                raise value

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Nothing for Tune to keep: the trial's run folder holds its checkpoints."""

    def load_checkpoint(self, checkpoint: Any) -> None:
        """Never called: a trial resumes from its run folder's ``last.pt``."""

    def _stopped(self) -> bool:
        """Whether the scheduler stopped this trial."""
        return bool(ray.get(ray.get_actor(VERDICTS).stopped.remote(self.name)))

    def cleanup(self) -> None:
        if not self.waiting:  # finished, failed, or stopped mid-epoch: nothing to hand over
            return
        if self._stopped():
            self.verdicts.put("stop")  # the run finishes with the epochs it has
            self.thread.join()
        # else: left waiting at its commit; the actor's end ends it (resumable from last.pt)
