"""``--track mlflow``: a training run logged to MLflow as it trains (a
:class:`~zoo.train.observe.RunObserver`).

What the MLflow run gets: the resolved config as params; each epoch's row
(:meth:`EpochRow.scalars`) at ``step = epoch``; tags linking the run folder, the data (its
fingerprint and classes) and the system (zoo and torch versions, device); at the end
``metrics.csv``, ``report.json``, the plots and the model folder (and ``report.html`` when the
CLI writes it, :meth:`MlflowTracker.log_file`). The run folder's ``tracking.json`` names the
MLflow run (:mod:`zoo.tracking`), so ``--resume`` continues it (only the epochs it lacks are
sent: no step twice) and ``zoo export``/``quantize``/``bench`` log into it.

Training never waits for the server: every request is made by one background thread, in
order, from an outbox. When the server is down the outbox keeps what it could not send and
retries (backoff up to 10 s) until the server is back, and at the end waits for it at most
``ZOO_TRACK_FLUSH_S`` seconds (default 60); :meth:`MlflowTracker.close` then says what, if
anything, did not arrive (``zoo runs sync RUN`` sends it later: :mod:`zoo.train.tracking_sync`). Hand-written because MLflow's
own asynchronous logging drops a batch whose request fails.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo import tracking, tracking_pending
from zoo.errors import TrackingError, first_line
from zoo.tracking import TrackingRecord
from zoo.train.config import RUNTIME_KEYS

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from zoo.train.config import TrainConfig
    from zoo.train.epoch_row import EpochRow
    from zoo.train.observe import RunStatus

FLUSH_ENV = "ZOO_TRACK_FLUSH_S"
_END_FILES = ("metrics.csv", "metrics.jsonl", "report.json", "curves.png", "confusion_matrix.png")
_STATUS = {"done": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}


@dataclass(frozen=True)
class _Op:
    """One request (or a few) for the server, retried as a whole until it goes through."""

    what: str  # for people: "epoch 3", "the model folder"
    send: Callable[[MlflowClient], None]
    epoch: int | None = None


@dataclass(frozen=True)
class TrackingSummary:
    """What reached MLflow, for the run's last line.

    Attributes:
        record: the MLflow run (None: it was never created, the server never answered).
        run: the run folder.
        unsent: what could not be logged (empty: everything arrived).
        down: the server's last error while it did not answer.
        errors: what the server refused (a 4xx), with its reason.
    """

    record: TrackingRecord | None
    run: Path | None = None
    unsent: tuple[str, ...] = ()
    down: str | None = None
    errors: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "record": self.record.to_dict() if self.record else None,
            "run": str(self.run) if self.run else None,
            "unsent": list(self.unsent),
            "down": self.down,
            "errors": list(self.errors),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrackingSummary:
        record = d.get("record")
        return cls(
            TrackingRecord.from_dict(record) if record else None,
            Path(d["run"]) if d.get("run") else None,
            tuple(d.get("unsent", ())),
            d.get("down"),
            tuple(d.get("errors", ())),
        )

    @property
    def complete(self) -> bool:
        return self.record is not None and not self.unsent and not self.errors

    def line(self) -> str:
        """``tracking: …``: where the run is, or what is missing and how to send it."""
        if self.complete and self.record is not None:
            return f"tracking: everything logged to MLflow ({self.record.url})"
        missing = [*self.unsent, *self.errors]
        later = f"; send it later with: zoo runs sync {self.run}" if self.run else ""
        where = self.record.url if self.record else "MLflow"
        return (
            f"warning: tracking: {len(missing)} item(s) could not be logged to {where} "
            f"({', '.join(missing[:6])}{', …' if len(missing) > 6 else ''})"
            + (f": {self.down}" if self.down else "")
            + f"; the run folder keeps them{later}"
        )


class _Outbox:
    """Operations sent in order by one daemon thread; a failed one is retried (with backoff)
    until it goes through, a refused one (a 4xx: it never will) is dropped and reported."""

    def __init__(self, connect: Callable[[], MlflowClient]) -> None:
        self._connect = connect
        self._client: MlflowClient | None = None
        self._ops: deque[_Op] = deque()
        self._cond = threading.Condition()
        self._closing = self._abandoned = False
        self._thread: threading.Thread | None = None
        self.down: str | None = None
        self.errors: list[str] = []

    def put(self, op: _Op) -> None:
        with self._cond:
            self._ops.append(op)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zoo-mlflow", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        delay = 0.5
        while True:
            with self._cond:
                while not self._ops and not self._closing:
                    self._cond.wait()
                if not self._ops or self._abandoned:
                    return
                op = self._ops[0]
            try:
                if self._client is None:
                    self._client = self._connect()
                op.send(self._client)
            except Exception as exc:
                if not _transient(exc):  # a refusal (or our bug): sending again will not help
                    self._done(op, error=f"{op.what} ({first_line(exc)})")
                    continue
                self.down = first_line(exc)
                with self._cond:
                    self._cond.wait(timeout=delay)
                delay = min(2 * delay, 10.0)
                continue
            delay, self.down = 0.5, None
            self._done(op)

    def _done(self, op: _Op, error: str | None = None) -> None:
        with self._cond:
            self._ops.popleft()
            if error is not None:
                self.errors.append(error)
            self._cond.notify_all()

    def close(self, timeout: float, on_wait: Callable[[str], None]) -> list[_Op]:
        """Send what is left within ``timeout`` seconds; returns what was not sent."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            told = False
            while self._ops and (left := deadline - time.monotonic()) > 0:
                if self.down and not told:
                    on_wait(f"{len(self._ops)} item(s) not logged yet: {self.down}")
                    told = True
                self._cond.wait(timeout=min(left, 1.0))
            self._abandoned = True
            self._cond.notify_all()
            return list(self._ops)


class MlflowTracker:
    """Logs a training run to MLflow; pass it to :func:`zoo.train.trainer.fit` as an observer.

    Args:
        uri: the tracking URI (default: MLflow's own choice, ``MLFLOW_TRACKING_URI`` or its
            local store).
        parent_run_id: nest the run under this MLflow run (a search's trial under the search:
            create the parent with :func:`zoo.tracking.start_run`).
        run_name: the MLflow run's name (default: the run folder's).
        tags: more tags for the MLflow run.

    Call :meth:`check` before training (it refuses an unreachable server), and
    :meth:`close` at the end (it waits for what is still on its way).
    """

    def __init__(
        self,
        *,
        uri: str | None = None,
        parent_run_id: str | None = None,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        self._uri = uri
        self._parent = parent_run_id
        self._name = run_name
        self._tags = dict(tags or {})
        self._outbox = _Outbox(lambda: tracking.client(self._uri))
        self._logged: set[int] = set()  # epochs the MLflow run has
        self._experiment = tracking.experiment_env()
        self.record: TrackingRecord | None = None
        self.run: Path | None = None

    def check(self, run: Path | None = None, fallback: str = tracking.NO_TRACKING) -> None:
        """Make sure the server answers (and, resuming ``run``, has its MLflow run) before
        any work: an ``http(s)://`` server is asked over plain HTTP, so that MLflow itself
        loads in the background while the run trains; any other store is opened here.

        ``fallback`` ends the message of a server that does not answer: how to go on.

        Raises:
            TrackingError: MLflow is not installed, the server does not answer, or the run's
                ``tracking.json`` names an MLflow run the server does not have.
        """
        record = tracking.read_record(run) if run is not None else None
        if record is not None:
            self._uri = self._uri or record.uri
            c = tracking.connect(self._uri, fallback)
            try:
                c.get_run(record.run_id)
            except Exception as exc:
                raise TrackingError(
                    f"{run}/tracking.json names MLflow run {record.run_id}, which the server at "
                    f"{self._uri} does not have ({tracking.reason(exc)}). Use that run's "
                    f"server, or {fallback}."
                ) from None
            return
        uri = self._uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri.startswith(("http://", "https://")):
            tracking.probe(uri, fallback=fallback)
            self._uri = uri
        else:
            self._uri = tracking.connect(self._uri, fallback).tracking_uri

    # ------------------------------------------------------------------ the observer
    def run_started(self, run: Path, cfg: TrainConfig, history: Sequence[EpochRow]) -> None:
        """Create (or, resumed, reopen) the MLflow run and send the epochs it lacks."""
        self.begin(run, cfg, history, run_tags(run, cfg))

    def begin(
        self, run: Path, cfg: TrainConfig, history: Sequence[EpochRow], tags: Mapping[str, str]
    ) -> None:
        """:meth:`run_started` with the run's tags (:func:`run_tags`) given: the tracker may
        live in a process without torch (:mod:`zoo.train.tracking_process`)."""
        self.run = run
        if tracking.read_record(run) is None:  # kept first: a start that never arrives is synced
            pending = tracking_pending.PendingRun(
                self._uri or os.environ.get("MLFLOW_TRACKING_URI") or None,
                self._name or run.name,
                self._parent,
                self._tags,
                self._experiment,
            )
            tracking_pending.write_pending(run, pending)
        self._outbox.put(_Op("the run's start", lambda c: self._start(c, run, cfg, dict(tags))))
        for row in history:
            self.epoch_ended(run, row)

    def epoch_ended(self, run: Path, row: EpochRow) -> None:
        """Queue the epoch's scalars at ``step = row.epoch`` (never twice)."""
        scalars, epoch = row.scalars(), row.epoch
        self._outbox.put(
            _Op(f"epoch {epoch}", lambda c: self._log_epoch(c, epoch, scalars), epoch=epoch)
        )

    def run_ended(self, run: Path, status: RunStatus) -> None:
        """Queue the run's files (``done``) and the MLflow run's end status."""
        if status == "done":
            for name in _END_FILES:
                if (run / name).is_file():
                    self.log_file(run / name)
            model = run / "model"
            files = [p for p in sorted(model.iterdir()) if p.is_file()] if model.is_dir() else []
            for p in files:
                self.log_file(p, "model")
        self._outbox.put(_Op(f"the run's end ({status})", lambda c: self._end(c, _STATUS[status])))

    # ------------------------------------------------------------------ beyond the hook
    def log_file(self, path: Path, artifact_path: str | None = None) -> None:
        """Queue a file for the MLflow run's artifacts (e.g. ``report.html``)."""
        self._outbox.put(
            _Op(path.name, lambda c: c.log_artifact(self._run_id(), str(path), artifact_path))
        )

    def close(self, timeout: float | None = None) -> TrackingSummary:
        """Wait (at most ``timeout``, default ``ZOO_TRACK_FLUSH_S`` or 60 s) for what is still
        queued; returns what reached the server."""
        from zoo.train.console import say

        limit = float(os.environ.get(FLUSH_ENV, "60")) if timeout is None else timeout
        unsent = self._outbox.close(
            limit, lambda why: say(f"tracking: waiting up to {limit:.0f}s for MLflow ({why})")
        )
        return TrackingSummary(
            self.record,
            self.run,
            tuple(op.what for op in unsent),
            self._outbox.down if unsent else None,
            tuple(self._outbox.errors),
        )

    # ------------------------------------------------------------------ requests (thread)
    def _run_id(self) -> str:
        if self.record is None:
            raise RuntimeError("the MLflow run was not created")
        return self.record.run_id

    def _start(
        self, c: MlflowClient, run: Path, cfg: TrainConfig, facts: Mapping[str, str]
    ) -> None:
        from mlflow.entities import Param, RunTag

        record = tracking.read_record(run)
        params = _params(cfg)
        if record is None:  # a new run (or a resume of one killed before its record)
            tags = {**self._tags, **facts}
            if self._parent:
                tags["mlflow.parentRunId"] = self._parent
            eid = tracking.experiment_id(c, self._experiment)
            created = c.create_run(eid, run_name=self._name or run.name, tags=tags)
            record = TrackingRecord(c.tracking_uri, created.info.run_id, eid, self._parent)
            tracking.write_record(run, record)
            tracking_pending.clear_pending(run)
            have: dict[str, str] = {}
        else:  # --resume: the same MLflow run, only what it lacks
            c.update_run(record.run_id, status="RUNNING")
            have = c.get_run(record.run_id).data.params
            self._logged |= {m.step for m in c.get_metric_history(record.run_id, "val/loss")}
        self.record = record
        new = [Param(k, v) for k, v in params.items() if k not in have]
        changed = [RunTag(f"zoo.changed.{k}", v) for k, v in params.items() if have.get(k, v) != v]
        for i in range(0, len(new), 100):  # MLflow takes at most 100 params a request
            c.log_batch(record.run_id, params=new[i : i + 100])
        if changed:  # params never change: a resume's new values (--extend) are tags
            c.log_batch(record.run_id, tags=changed)

    def _log_epoch(self, c: MlflowClient, epoch: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        if epoch in self._logged:
            return
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, epoch) for k, v in scalars.items()]
        c.log_batch(self._run_id(), metrics=metrics)
        self._logged.add(epoch)

    def _end(self, c: MlflowClient, status: str) -> None:
        c.set_terminated(self._run_id(), status)


def _params(cfg: TrainConfig) -> dict[str, str]:
    """The resolved config as MLflow params (runtime options left out: not the run's)."""
    return {
        k: (json.dumps(v) if isinstance(v, list | dict) else str(v))[:6000]
        for k, v in cfg.to_dict().items()
        if k not in RUNTIME_KEYS and k != "track"
    }


def run_tags(run: Path, cfg: TrainConfig) -> dict[str, str]:
    """What links the MLflow run to its folder, its data and the machine (read in the training
    process: it needs torch)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import torch

    from zoo.device import pick_device
    from zoo.train.data import Splits

    split = json.loads((run / "split.json").read_text()) if (run / "split.json").is_file() else None
    try:
        zoo_version = version("zoo")
    except PackageNotFoundError:
        zoo_version = "unknown"
    tags = {
        "zoo.run": str(run.resolve()),
        "zoo.model": cfg.model,
        "zoo.data": cfg.data,
        "zoo.version": zoo_version,
        "zoo.torch": torch.__version__,
        "zoo.device": str(pick_device(cfg.device)),
        "zoo.python": platform.python_version(),
        "zoo.host": platform.node(),
    }
    if split is not None:
        tags["zoo.data.fingerprint"] = Splits.from_json(split).fingerprint()
        tags["zoo.data.classes"] = json.dumps(split["classes"])[:8000]
        tags["zoo.data.layout"] = str(split["layout"])
    return tags


def _transient(exc: Exception) -> bool:
    """A failure that sending again may mend: no connection, a timeout, a 5xx or a 429 (MLflow
    reports a refused connection as its ``INTERNAL_ERROR``, a 500); a 4xx never will."""
    status = getattr(exc, "get_http_status_code", lambda: None)()
    if isinstance(status, int):
        return status >= 500 or status == 429
    return isinstance(exc, OSError)


__all__ = ["FLUSH_ENV", "MlflowTracker", "TrackingSummary", "run_tags"]
