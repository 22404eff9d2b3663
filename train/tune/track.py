"""``zoo tune --track mlflow``: the search is a parent MLflow run, each trial's run (an
:class:`~zoo.train.tracking.MlflowTracker` in the trial's process) is nested under it.

The parent gets the search as params (space, scheduler, trials, metric, model, data), and at
the end the best trial (its settings as ``best.<option>`` params, its metric as
``best/<metric>``, its run folder as a tag) and ``tune.json`` as an artifact. The search
folder's ``tracking.json`` names the parent, so ``zoo tune --resume`` continues it. A server
that does not answer at the start stops the search before any trial; an outage later never
stops it (each trial's tracker keeps what it could not send; the parent's end is reported).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from zoo import tracking
from zoo.errors import TrackingError, first_line
from zoo.tracking import TrackingRecord
from zoo.train.tune.book import BOOK, SearchBook, SearchSpec, TrialRecord, metric_value


@dataclass(frozen=True)
class TrialTracking:
    """What a trial needs to nest its run under the search's (plain values: it crosses into
    a Ray worker, where the trial makes its own client)."""

    uri: str
    parent_run_id: str
    experiment_id: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> TrialTracking:
        return cls(d["uri"], d["parent_run_id"], d["experiment_id"])


def recorded(folder: Path) -> bool:
    """Whether the search in ``folder`` is tracked (its ``tracking.json``)."""
    return tracking.read_record(folder) is not None


def check_server() -> None:
    """Refuse an unreachable tracking server before the search folder is written (the
    check ``zoo finetune --track mlflow`` makes).

    Raises:
        TrackingError: MLflow missing, or its server does not answer.
    """
    from zoo.train.tracking import MlflowTracker

    MlflowTracker().check()


def open_parent(book: SearchBook) -> TrackingRecord:
    """The search's parent run: created (params: the search) and recorded in the search
    folder, or, when the folder's ``tracking.json`` names one, reopened.

    Raises:
        TrackingError: the server does not answer, or does not have the recorded run.
    """
    record = tracking.read_record(book.folder)
    if record is not None:
        c = tracking.connect(record.uri)
        try:
            c.update_run(record.run_id, status="RUNNING")
        except Exception as exc:
            raise TrackingError(
                f"{book.folder}/{tracking.RECORD_FILE} names MLflow run {record.run_id}, which "
                f"the server at {record.uri} does not have ({first_line(exc)}). Resume "
                f"against that server, or resume with --track none."
            ) from None
        return record
    record = tracking.start_run(
        name=book.folder.name,
        tags={"zoo.search": str(book.folder), "zoo.kind": "tune"},
    )
    tracking.write_record(book.folder, record)
    from mlflow.entities import Param

    params = [Param(k, v) for k, v in search_params(book.spec).items()]
    c = tracking.client(record.uri)
    for i in range(0, len(params), 100):  # MLflow takes at most 100 params a request
        c.log_batch(record.run_id, params=params[i : i + 100])
    return record


def search_params(spec: SearchSpec) -> dict[str, str]:
    """The search as MLflow params: what it draws from, how it decides, what it trains."""
    out = {
        "trials": str(spec.trials),
        "scheduler": spec.scheduler,
        "metric": spec.metric,
        "max_epochs": str(spec.base.epochs),
        "model": spec.base.model,
        "data": spec.base.data,
        "seed": str(spec.seed),
        "baseline": str(spec.baseline).lower(),  # trial-000 trains with the defaults
        "trial_cpus": f"{spec.trial_cpus:g}",
        "trial_gpus": f"{spec.trial_gpus:g}",
    }
    for key, dim in spec.space.items():
        out[f"space.{key}"] = json.dumps(dim.to_dict())[:6000]
    return out


def close_parent(
    record: TrackingRecord, book: SearchBook, best: TrialRecord | None, status: str
) -> str:
    """End the parent run (``FINISHED``, ``FAILED`` or ``KILLED``), with the best trial and
    ``tune.json`` when it finished; returns the line to print (never raises: the search
    itself is complete, and its record is in the folder)."""
    try:
        c = tracking.client(record.uri)
        if best is not None and status == "FINISHED":
            from mlflow.entities import Metric, Param, RunTag

            spec = book.spec
            row = best.best(spec)
            params = [Param(f"best.{k}", _text(v)) for k, v in best.params.items()]
            metrics = (
                [Metric(f"best/{spec.metric}", metric_value(row, spec.metric), _ms(), 0)]
                if row is not None
                else []
            )
            tags = [
                RunTag("zoo.best.trial", best.name),
                RunTag("zoo.best.run", str(book.run_of(best.name))),
                RunTag("zoo.best.rerun", best.rerun(spec)[:8000]),
            ]
            c.log_batch(record.run_id, metrics=metrics, params=params, tags=tags)
            c.log_artifact(record.run_id, str(book.folder / BOOK))
        c.set_terminated(record.run_id, status)
    except Exception as exc:  # the search is done; tracking only reports
        return (
            f"warning: tracking: the search's end could not be logged to MLflow "
            f"({record.url}): {first_line(exc)}; {book.folder / BOOK} has it"
        )
    return f"tracking: the search and its trials are in MLflow ({record.url})"


def trial_tracking(record: TrackingRecord) -> TrialTracking:
    return TrialTracking(record.uri, record.run_id, record.experiment_id)


def _text(v: Any) -> str:
    return json.dumps(v) if isinstance(v, list | dict) else str(v)


def _ms() -> int:
    import time

    return int(time.time() * 1000)


__all__ = [
    "TrialTracking",
    "check_server",
    "close_parent",
    "open_parent",
    "recorded",
    "search_params",
    "trial_tracking",
]
