"""What a command after training adds to the MLflow run that trained the model
(:mod:`zoo.tracking`): ``zoo export``, ``zoo quantize`` and ``zoo bench`` log a
:class:`Stage` into it, and ``zoo export --register NAME`` makes the exported file a version of
a registered model, tagged with its lineage."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zoo.errors import TrackingError
from zoo.tracking import QUEUE_FILE, TrackingRecord, client, read_record, reason


@dataclass(frozen=True)
class Stage:
    """What a command after training adds to the run's record.

    Attributes:
        stage: ``export``, ``quantize`` or ``bench`` (the prefix of its metrics and artifacts).
        metrics: numbers, logged as ``<stage>/<name>``.
        tags: facts, logged as ``zoo.<stage>.<name>`` (tags, unlike params, may change when
            the command runs again).
        files: files logged under the artifact folder ``<stage>/`` (``versioned``: under
            ``<stage>/<sha256[:12]>/``, so that a later file of the same name never replaces
            the one a registered model version points at).
        document: the command's ``--json`` result, logged as ``<stage>/<document_name>``.
        document_name: the file name of ``document``.
        version_tags: what a model version registered from ``files[0]`` says of it (its
            format and precision).
        versioned: log ``files`` by content (see ``files``).
    """

    stage: str
    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    files: tuple[Path, ...] = ()
    document: Mapping[str, Any] | None = None
    document_name: str = "result.json"
    version_tags: Mapping[str, str] = field(default_factory=dict)
    versioned: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self) | {"files": [str(f) for f in self.files]}
        return json.loads(json.dumps(d, default=str))  # what its JSON file will hold

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Stage:
        return cls(**{**d, "files": tuple(Path(f) for f in d.get("files", ()))})

    def artifact_paths(self) -> tuple[str, ...]:
        """Where each of ``files`` goes in the run's artifacts (by content if versioned)."""
        if not self.versioned:
            return tuple(f"{self.stage}/{f.name}" for f in self.files)
        return tuple(f"{self.stage}/{_sha256(f)[:12]}/{f.name}" for f in self.files)


@dataclass(frozen=True)
class StageLog:
    """The outcome of :func:`log_stage`: which run, where its files went, and why nothing was
    logged if so (``queued``: kept in the run folder's :data:`QUEUE_FILE` for ``zoo runs
    sync``)."""

    record: TrackingRecord
    stage: str
    error: str | None = None
    artifacts: tuple[str, ...] = ()
    queued: Path | None = None

    def line(self) -> str:
        if self.error is None:
            return f"tracking: {self.stage} logged to MLflow ({self.record.url})"
        later = (
            f"; it is kept in {self.queued / QUEUE_FILE}: send it with: zoo runs sync {self.queued}"
            if self.queued
            else ""
        )
        return (
            f"warning: tracking: the {self.stage} could not be logged to MLflow "
            f"({self.record.url}): {self.error}; the {self.stage} itself is complete{later}"
        )


def tracked_run(artifact: str | os.PathLike[str]) -> tuple[Path, TrackingRecord] | None:
    """The run folder ``artifact`` (a run, its model folder, a file in them) belongs to and
    its tracking record; None when it is no run's or the run is not tracked."""
    from zoo.run_images import find_run

    run = find_run(artifact)
    record = read_record(run) if run is not None else None
    return None if run is None or record is None else (run, record)


def log_stage(record: TrackingRecord, stage: Stage) -> StageLog:
    """Log ``stage`` into ``record``'s run; a failure is reported, never raised (the
    command's own result is complete and written)."""
    import tempfile

    try:
        from mlflow.entities import Metric, RunTag

        c = client(record.uri)
        now = _now_ms()
        c.log_batch(
            record.run_id,
            metrics=[
                Metric(f"{stage.stage}/{k}", float(v), now, 0) for k, v in stage.metrics.items()
            ],
            tags=[RunTag(f"zoo.{stage.stage}.{k}", str(v)[:8000]) for k, v in stage.tags.items()],
        )
        artifacts = stage.artifact_paths()
        for f, where in zip(stage.files, artifacts, strict=True):
            c.log_artifact(record.run_id, str(f), where.rsplit("/", 1)[0])
        if stage.document is not None:
            with tempfile.TemporaryDirectory() as tmp:
                doc = Path(tmp) / stage.document_name
                doc.write_text(json.dumps(stage.document, indent=2, default=str) + "\n")
                c.log_artifact(record.run_id, str(doc), stage.stage)
    except Exception as exc:  # the export (or table) is done; tracking only reports
        return StageLog(record, stage.stage, reason(exc))
    return StageLog(record, stage.stage, artifacts=artifacts)


@dataclass(frozen=True)
class ModelVersion:
    """A registered model version (MLflow Model Registry) and the lineage tags it carries."""

    name: str
    version: str
    source: str
    tags: Mapping[str, str]

    def line(self) -> str:
        return f"registered {self.name} version {self.version} (source {self.source})"


def lineage_tags(run: Path, record: TrackingRecord) -> dict[str, str]:
    """What a registered version says of where it came from: the zoo run, its MLflow run,
    the data fingerprint, the parent weights and the shipped weights' sha256 (from the run's
    ``model/config.json`` and ``report.json``)."""
    from zoo.artifact import read_config

    cfg = read_config(run / "model")
    report_path = run / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    tags = {
        "zoo.run": str(run.resolve()),
        "zoo.mlflow_run_id": record.run_id,
        "zoo.data.name": cfg.data.name or "",
        "zoo.data.fingerprint": cfg.data.fingerprint or "",
        "zoo.base": cfg.base,
        "zoo.parent_weights": cfg.parent_weights or "",
        "zoo.parent_weights_sha256": cfg.parent_weights_sha256 or "",
        "zoo.lineage": json.dumps(list(cfg.lineage)),
        "zoo.weights_sha256": str(report.get("weights_sha256", "")),
    }
    return {k: v for k, v in tags.items() if v}


def register_model(
    record: TrackingRecord, name: str, artifact_path: str, tags: Mapping[str, str]
) -> ModelVersion:
    """Register the run's artifact ``artifact_path`` (e.g. ``export/model.onnx``) as a new
    version of model ``name`` (created when missing), tagged with its lineage.

    Raises:
        TrackingError: the server refused or could not be reached.
    """
    c = client(record.uri)
    try:
        from mlflow.exceptions import MlflowException

        try:
            c.create_registered_model(name)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        source = f"runs:/{record.run_id}/{artifact_path}"
        mv = c.create_model_version(name, source, run_id=record.run_id, tags=dict(tags))
    except Exception as exc:
        raise TrackingError(
            f"Could not register {name!r} in MLflow at {record.uri}: {reason(exc)}. The "
            "export is written; register it again with the same command once the server answers."
        ) from None
    return ModelVersion(name, str(mv.version), source, dict(mv.tags or tags))


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def _sha256(path: Path) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


__all__ = [
    "ModelVersion",
    "Stage",
    "StageLog",
    "lineage_tags",
    "log_stage",
    "register_model",
    "tracked_run",
]
