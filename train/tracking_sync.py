"""``zoo runs sync RUN``: what a tracked run's MLflow run lacks after an outage, sent from the
run folder (:mod:`zoo.train.tracking`, :mod:`zoo.tracking_pending`)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from zoo import tracking, tracking_pending
from zoo.errors import TrackingError
from zoo.train.tracking import MlflowTracker, TrackingSummary


def sync(run: Path, timeout: float | None = None) -> TrackingSummary:
    """Send a tracked run's epochs and files that its MLflow run lacks (after an outage that
    outlasted the run), creating the MLflow run if it never was, then the later stages'
    queued logs (``zoo export``/``quantize``/``bench``): what ``zoo runs sync RUN`` does.
    ``MLFLOW_TRACKING_URI``, when set, wins over the run's recorded URI (a note says so).

    Raises:
        TrackingError: the run is not tracked, or its server does not answer.
    """
    from zoo.train.config import TrainConfig
    from zoo.train.console import say
    from zoo.train.epoch_row import EpochRow

    fallback = f"start it and run `zoo runs sync {run}` again (the run folder keeps it all)"
    record = tracking.read_record(run)
    pending = tracking_pending.read_pending(run) if record is None else None
    if record is not None:
        record, note = tracking.effective(record)
        if note:
            say(note)
        tracker = MlflowTracker(uri=record.uri)
    elif pending is not None:  # the server went down before the MLflow run was created
        for k, v in pending.experiment.items():
            os.environ.setdefault(k, v)
        tracker = MlflowTracker(
            uri=os.environ.get("MLFLOW_TRACKING_URI") or pending.uri,
            parent_run_id=pending.parent_run_id,
            run_name=pending.run_name,
            tags=pending.tags,
        )
    else:
        raise TrackingError(
            f"{run} has no {tracking.RECORD_FILE}: it was not trained with --track mlflow."
        )
    tracker.check(run, fallback)
    cfg = TrainConfig.from_dict(json.loads((run / "config.json").read_text()))
    rows = (
        (run / "metrics.jsonl").read_text().splitlines()
        if (run / "metrics.jsonl").is_file()
        else []
    )
    tracker.run_started(run, cfg, [EpochRow.from_dict(json.loads(r)) for r in rows if r])
    if (run / "report.json").is_file():
        tracker.run_ended(run, "done")
        if (run / "report.html").is_file():
            tracker.log_file(run / "report.html")
    summary = tracker.close(timeout)
    if summary.record is None or summary.unsent:
        return summary
    at = record or summary.record  # the URI in use (MLFLOW_TRACKING_URI may win)
    failed = [log for log in tracking_pending.send_queued(run, at) if log.error]
    return replace(
        summary,
        unsent=tuple(f"the {log.stage}" for log in failed),
        down=failed[0].error if failed else None,
    )


__all__ = ["sync"]
