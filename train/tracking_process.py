"""``zoo finetune --track mlflow``'s tracker in a process of its own.

MLflow takes over a second of CPU to import. In the training process that second is taken
from training: the import holds the GIL, and a thread cannot move it elsewhere. In a process
of its own it loads on the core the training's start-up leaves idle (one thread importing
torch, reading the data). That process runs an ordinary
:class:`~zoo.train.tracking.MlflowTracker`; this module is the pipe between the two: each
observer call is one JSON line on the process's stdin, and the two answers (the check before
any work, the summary at the end) come back on a pipe of their own (stdout stays the
libraries'). A tracker process that dies never stops training: the summary says what was lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from zoo import tracking, tracking_pending
from zoo.errors import TrackingError
from zoo.train.tracking import MlflowTracker, TrackingSummary, run_tags

if TYPE_CHECKING:
    from zoo.train.config import TrainConfig
    from zoo.train.epoch_row import EpochRow
    from zoo.train.observe import RunStatus

EOF_FLUSH_S = 5.0
"""The training process ended without a word (killed): what is queued gets this long."""


class TrackerProcess:
    """A :class:`~zoo.train.observe.RunObserver` whose MLflow work runs in a child process.

    Args:
        resume: the run folder being resumed (its MLflow run must exist on the server).
        fallback: how to go on without the server (the end of the refusal's message).

    Call :meth:`ready` before any work (it raises the check's refusal) and :meth:`close` at
    the end.
    """

    def __init__(self, resume: Path | None = None, fallback: str = tracking.NO_TRACKING) -> None:
        answers, self._w = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "zoo.train.tracking_process", str(self._w)],
            stdin=subprocess.PIPE,
            stdout=2,  # a library's print never reaches the command's data (stdout)
            pass_fds=(self._w,),
            text=True,
        )
        os.close(self._w)
        self._answers: IO[str] = os.fdopen(answers)
        self._run: Path | None = None
        self._lost: str | None = None
        self._checked = False
        self._send({"op": "check", "run": str(resume) if resume else None, "fallback": fallback})

    def ready(self) -> None:
        """Wait for the check made before any work.

        Raises:
            TrackingError: MLflow is missing, or the server does not answer (or lacks the
                resumed run's MLflow run).
        """
        if self._checked:
            return
        answer = self._answer()
        self._checked = True
        if "ok" not in answer:
            self._proc.wait()
            raise TrackingError(
                answer.get("error")
                or f"the tracking process ended before its check ({self._lost}); "
                f"{tracking.NO_TRACKING}."
            )

    @property
    def pid(self) -> int:
        """The tracker process's id."""
        return self._proc.pid

    # ------------------------------------------------------------------ the observer
    def run_started(self, run: Path, cfg: TrainConfig, history: Sequence[EpochRow]) -> None:
        self._run = run
        self._send(
            {
                "op": "begin",
                "run": str(run),
                "cfg": cfg.to_dict(),
                "history": [row.to_dict() for row in history],
                "tags": run_tags(run, cfg),
            }
        )

    def epoch_ended(self, run: Path, row: EpochRow) -> None:
        self._send({"op": "epoch", "run": str(run), "row": row.to_dict()})

    def run_ended(self, run: Path, status: RunStatus) -> None:
        self._send({"op": "end", "run": str(run), "status": status})

    def log_file(self, path: Path, artifact_path: str | None = None) -> None:
        """Queue a file for the MLflow run's artifacts (e.g. ``report.html``)."""
        self._send({"op": "file", "path": str(path), "artifact_path": artifact_path})

    def close(self, timeout: float | None = None) -> TrackingSummary:
        """Wait for what is still queued (:meth:`MlflowTracker.close`); what reached MLflow."""
        self._send({"op": "close", "timeout": timeout})
        answer = self._answer() if self._lost is None else {}
        self._proc.wait()
        if "summary" in answer:
            return TrackingSummary.from_dict(answer["summary"])
        run = self._run
        record = tracking.read_record(run) if run is not None else None
        if run is not None and record is None and tracking_pending.read_pending(run) is None:
            # it died before it asked for the MLflow run: `zoo runs sync` creates it
            pending = tracking_pending.PendingRun(
                os.environ.get("MLFLOW_TRACKING_URI") or None,
                run.name,
                experiment=tracking.experiment_env(),
            )
            tracking_pending.write_pending(run, pending)
        why = self._lost or f"it ended with exit code {self._proc.returncode}"
        return TrackingSummary(record, run, ("what followed",), f"the tracking process: {why}")

    def _send(self, message: dict[str, Any]) -> None:
        if self._lost is not None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except OSError as exc:  # it died: training goes on, the summary says so
            self._lost = f"it ended ({exc.strerror or exc}, exit code {self._proc.poll()})"
        if message["op"] == "close" and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def _answer(self) -> dict[str, Any]:
        line = self._answers.readline()
        if line:
            return json.loads(line)
        self._lost = self._lost or f"it ended with exit code {self._proc.wait()}"
        return {}


def tracker_for(cfg: TrainConfig, explicit: frozenset[str]) -> TrackerProcess | None:
    """The tracker ``zoo finetune`` runs with, its check under way (None: no tracking):
    ``--track mlflow`` (or ``ZOO_TRACK``); a ``--resume`` of a tracked run goes on logging to
    its MLflow run unless ``--track none`` is typed. A ``--dry-run`` writes nothing, tracks
    nothing. Call :meth:`TrackerProcess.ready` before any work.
    """
    resume = Path(cfg.resume) if cfg.resume else None
    tracked_before = resume is not None and tracking.read_record(resume) is not None
    on = cfg.track == "mlflow" or (tracked_before and "track" not in explicit)
    if not on or cfg.dry_run:
        return None
    return TrackerProcess(resume)


# ---------------------------------------------------------------------- the child process
def _serve(answers: IO[str]) -> int:
    from zoo.train.config import TrainConfig
    from zoo.train.epoch_row import EpochRow

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    tracker = MlflowTracker()
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg["op"]
        if op == "check":
            try:
                tracker.check(Path(msg["run"]) if msg["run"] else None, msg["fallback"])
            except TrackingError as exc:
                answer({"error": str(exc)})
                return 1
            answer({"ok": True})
        elif op == "begin":
            history = [EpochRow.from_dict(row) for row in msg["history"]]
            cfg = TrainConfig.from_dict(msg["cfg"])
            tracker.begin(Path(msg["run"]), cfg, history, msg["tags"])
        elif op == "epoch":
            tracker.epoch_ended(Path(msg["run"]), EpochRow.from_dict(msg["row"]))
        elif op == "end":
            tracker.run_ended(Path(msg["run"]), msg["status"])
        elif op == "file":
            tracker.log_file(Path(msg["path"]), msg["artifact_path"])
        elif op == "close":
            answer({"summary": tracker.close(msg["timeout"]).to_dict()})
            return 0
    tracker.close(EOF_FLUSH_S)  # the training process was killed: send what is queued
    return 0


def _preload() -> None:
    with contextlib.suppress(ImportError):  # the check says so, with what to do
        import mlflow.tracking  # noqa: F401  (while the training process starts up)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    threading.Thread(target=_preload, daemon=True).start()
    with os.fdopen(int(sys.argv[1]), "w") as out:
        sys.exit(_serve(out))
