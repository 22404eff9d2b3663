"""What a tracked run folder keeps for its MLflow server while the server does not answer, so
that ``zoo runs sync RUN`` sends it later (:mod:`zoo.tracking`): the MLflow run not created yet
(:data:`~zoo.tracking.PENDING_FILE`, written before the run is asked for, removed once
``tracking.json`` names it) and the later stages' logs that did not arrive
(:data:`~zoo.tracking.QUEUE_FILE`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zoo import durable
from zoo.tracking import PENDING_FILE, QUEUE_FILE, TrackingRecord
from zoo.tracking_stages import Stage, StageLog, log_stage


@dataclass(frozen=True)
class PendingRun:
    """An MLflow run to create: where, named how, nested under which run, in which experiment.

    Attributes:
        uri: the tracking URI (None: MLflow's own choice where ``zoo runs sync`` runs).
        run_name: the MLflow run's name.
        parent_run_id: the run to nest it under, if any.
        tags: the caller's tags (the run's own are made again from its folder).
        experiment: ``MLFLOW_EXPERIMENT_ID``/``_NAME`` as they were at the start.
    """

    uri: str | None
    run_name: str
    parent_run_id: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    experiment: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PendingRun:
        return cls(
            d.get("uri"),
            str(d["run_name"]),
            d.get("parent_run_id"),
            dict(d.get("tags", {})),
            dict(d.get("experiment", {})),
        )


def write_pending(run: Path, pending: PendingRun) -> None:
    """Record, before the server is asked, the MLflow run ``run`` will have."""
    durable.write_json(Path(run) / PENDING_FILE, asdict(pending), label=None)


def read_pending(run: Path) -> PendingRun | None:
    """The MLflow run still to create for ``run`` (None: created, or never tracked)."""
    path = Path(run) / PENDING_FILE
    return PendingRun.from_dict(json.loads(path.read_text())) if path.is_file() else None


def clear_pending(run: Path) -> None:
    """The MLflow run exists (``tracking.json`` names it): nothing is pending. Not a durable
    write (the tracker's thread, at no fixed place among the run's writes): a file that comes
    back after a crash is harmless, ``tracking.json`` wins over it."""
    (Path(run) / PENDING_FILE).unlink(missing_ok=True)


def queued(run: Path) -> list[Stage]:
    """The stages that did not reach the run's MLflow run, oldest first."""
    path = Path(run) / QUEUE_FILE
    return [Stage.from_dict(d) for d in json.loads(path.read_text())] if path.is_file() else []


def queue(run: Path, stage: Stage) -> None:
    """Keep ``stage`` in the run folder for ``zoo runs sync`` (its files stay where they are)."""
    items = [s.to_dict() for s in queued(run)] + [stage.to_dict()]
    durable.write_json(Path(run) / QUEUE_FILE, items, label=None)


def send_queued(run: Path, record: TrackingRecord) -> list[StageLog]:
    """Send the queued stages in order; those that failed stay queued (returned with the
    rest: a :class:`StageLog` each)."""
    logs = [log_stage(record, s) for s in queued(run)]
    left = [s.to_dict() for s, log in zip(queued(run), logs, strict=True) if log.error]
    path = Path(run) / QUEUE_FILE
    if left:
        durable.write_json(path, left, label=None)
    elif path.exists():
        durable.remove(path, label="tracking.queue")
    return logs


__all__ = [
    "PendingRun",
    "clear_pending",
    "queue",
    "queued",
    "read_pending",
    "send_queued",
    "write_pending",
]
