"""Experiment tracking in MLflow, the part every layer shares: a run folder's tracking record
(``tracking.json``: which MLflow run holds it), the connection to the tracking server, and the
one-shot logging of a later stage (``zoo export``, ``zoo quantize``, ``zoo bench``) into the
run that trained the model. The training side (metrics per epoch, outages) is
:mod:`zoo.train.tracking`.

MLflow is optional (``pip install 'zoo[mlflow]'``) and imported only here, inside functions.
Where runs go is MLflow's own choice: ``MLFLOW_TRACKING_URI`` (an ``http://`` server), or its
default, a local store in the working folder; ``MLFLOW_EXPERIMENT_NAME`` /
``MLFLOW_EXPERIMENT_ID`` pick the experiment (default: MLflow's ``Default``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from zoo import durable
from zoo.errors import TrackingError

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

RECORD_FILE = "tracking.json"
Track = Literal["none", "mlflow"]
"""``--track`` / ``ZOO_TRACK``: where a run's metrics and artifacts also go."""
NO_TRACKING = "train without tracking: drop --track mlflow (and unset ZOO_TRACK)"

# Our own retry loop (zoo.train.tracking) keeps what a failed request carried; MLflow's
# default (7 retries, backoff 2) would hold a request for minutes. A user's settings win.
_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # stdout is the command's data
}


@dataclass(frozen=True)
class TrackingRecord:
    """Which MLflow run holds a zoo run: the run folder's ``tracking.json``.

    Attributes:
        uri: the tracking URI the run was created at (a resume or an export logs there).
        run_id: the MLflow run's id.
        experiment_id: its experiment.
        parent_run_id: the run it is nested under (a search's trial), if any.
        backend: the tracker (only ``mlflow``).
    """

    uri: str
    run_id: str
    experiment_id: str
    parent_run_id: str | None = None
    backend: Literal["mlflow"] = "mlflow"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrackingRecord:
        return cls(
            uri=str(d["uri"]),
            run_id=str(d["run_id"]),
            experiment_id=str(d["experiment_id"]),
            parent_run_id=d.get("parent_run_id"),
        )

    @property
    def url(self) -> str:
        """Where a person sees the run: the server's page, or the store and id."""
        if self.uri.startswith(("http://", "https://")):
            return f"{self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"
        return f"run {self.run_id} in {self.uri}"


def read_record(run: Path) -> TrackingRecord | None:
    """The tracking record of run folder ``run`` (None: the run is not tracked)."""
    path = Path(run) / RECORD_FILE
    if not path.is_file():
        return None
    return TrackingRecord.from_dict(json.loads(path.read_text()))


def write_record(run: Path, record: TrackingRecord) -> None:
    """Write ``run/tracking.json`` atomically (not a fault point: the tracker's thread writes
    it, at no fixed place among the run's own writes)."""
    durable.write_json(Path(run) / RECORD_FILE, record.to_dict(), label=None)


def client(uri: str | None = None) -> MlflowClient:
    """An MLflow client for ``uri`` (default: MLflow's own choice), with bounded retries.

    Raises:
        TrackingError: MLflow is not installed.
    """
    for name, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise TrackingError(
            f"--track mlflow needs MLflow ({exc}): pip install 'zoo[mlflow]', or {NO_TRACKING}."
        ) from None
    return MlflowClient(uri)


def connect(uri: str | None = None) -> MlflowClient:
    """A client whose server answered: the check made before any work.

    Raises:
        TrackingError: MLflow is missing, or the tracking server does not answer (its URI,
            the reason, and how to go on without tracking).
    """
    c = client(uri)
    try:
        c.search_experiments(max_results=1)
    except Exception as exc:  # MLflow wraps a refused connection, a 5xx, an auth failure alike
        raise TrackingError(_unreachable(c.tracking_uri, first_line(exc))) from None
    return c


def probe(uri: str, timeout: float = 10.0) -> None:
    """Check that the ``http(s)://`` tracking server ``uri`` answers (its ``/health``), over
    plain HTTP: MLflow itself (a second to import) then loads while the run trains.

    Raises:
        TrackingError: MLflow is not installed, or the server does not answer.
    """
    import importlib.util
    import urllib.error
    import urllib.request

    if importlib.util.find_spec("mlflow") is None:
        raise TrackingError(
            f"--track mlflow needs MLflow: pip install 'zoo[mlflow]', or {NO_TRACKING}."
        )
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as r:
            r.read()
    except urllib.error.HTTPError as exc:
        if exc.code < 500:  # it answers (a proxy's 401/404): the requests will say more
            return
        raise TrackingError(_unreachable(uri, f"HTTP {exc.code}")) from None
    except (OSError, ValueError) as exc:
        raise TrackingError(_unreachable(uri, first_line(exc))) from None


def _unreachable(uri: str, why: str) -> str:
    return (
        f"The MLflow tracking server at {uri} does not answer: {why}. Start it (mlflow server "
        f"…), point MLFLOW_TRACKING_URI at one that runs, or {NO_TRACKING}."
    )


def experiment_id(c: MlflowClient) -> str:
    """The experiment MLflow's environment names (``MLFLOW_EXPERIMENT_ID``, or
    ``MLFLOW_EXPERIMENT_NAME``, created when missing), else MLflow's ``Default`` (``0``)."""
    if os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if not name:
        return "0"
    found = c.get_experiment_by_name(name)
    return found.experiment_id if found is not None else c.create_experiment(name)


def start_run(
    *,
    uri: str | None = None,
    name: str | None = None,
    tags: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
) -> TrackingRecord:
    """Create an MLflow run (e.g. the parent of a hyper-parameter search, whose trials are
    :class:`zoo.train.tracking.MlflowTracker` runs with ``parent_run_id`` set).

    Raises:
        TrackingError: MLflow missing or the server unreachable (:func:`connect`).
    """
    c = connect(uri)
    all_tags = dict(tags or {})
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    eid = experiment_id(c)
    run = c.create_run(eid, run_name=name, tags=all_tags)
    return TrackingRecord(c.tracking_uri, run.info.run_id, eid, parent_run_id)


def end_run(record: TrackingRecord, status: str = "FINISHED") -> None:
    """Mark ``record``'s run ended (``FINISHED``, ``FAILED`` or ``KILLED``)."""
    client(record.uri).set_terminated(record.run_id, status)


@dataclass(frozen=True)
class Stage:
    """What a command after training adds to the run's record.

    Attributes:
        stage: ``export``, ``quantize`` or ``bench`` (the prefix of its metrics and artifacts).
        metrics: numbers, logged as ``<stage>/<name>``.
        tags: facts, logged as ``zoo.<stage>.<name>`` (tags, unlike params, may change when
            the command runs again).
        files: files logged under the artifact folder ``<stage>/``.
        document: the command's ``--json`` result, logged as ``<stage>/<document_name>``.
        document_name: the file name of ``document``.
    """

    stage: str
    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    files: tuple[Path, ...] = ()
    document: Mapping[str, Any] | None = None
    document_name: str = "result.json"


@dataclass(frozen=True)
class StageLog:
    """The outcome of :func:`log_stage`: which run, and why nothing was logged if so."""

    record: TrackingRecord
    stage: str
    error: str | None = None

    def line(self) -> str:
        if self.error is None:
            return f"tracking: {self.stage} logged to MLflow ({self.record.url})"
        return (
            f"warning: tracking: the {self.stage} could not be logged to MLflow "
            f"({self.record.url}): {self.error}; the {self.stage} itself is complete"
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
        for f in stage.files:
            c.log_artifact(record.run_id, str(f), stage.stage)
        if stage.document is not None:
            with tempfile.TemporaryDirectory() as tmp:
                doc = Path(tmp) / stage.document_name
                doc.write_text(json.dumps(stage.document, indent=2, default=str) + "\n")
                c.log_artifact(record.run_id, str(doc), stage.stage)
    except Exception as exc:  # the export (or table) is done; tracking only reports
        return StageLog(record, stage.stage, first_line(exc))
    return StageLog(record, stage.stage)


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
    cfg = json.loads((run / "model" / "config.json").read_text())
    report_path = run / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    tags = {
        "zoo.run": str(run.resolve()),
        "zoo.mlflow_run_id": record.run_id,
        "zoo.data.name": str(cfg.get("data", {}).get("name", "")),
        "zoo.data.fingerprint": str(cfg.get("data", {}).get("fingerprint", "")),
        "zoo.base": str(cfg.get("base", "")),
        "zoo.parent_weights": str(cfg.get("parent_weights", "")),
        "zoo.parent_weights_sha256": str(cfg.get("parent_weights_sha256") or ""),
        "zoo.lineage": json.dumps(cfg.get("lineage", [])),
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
            f"Could not register {name!r} in MLflow at {record.uri}: {first_line(exc)}. The "
            "export is written; register it again with the same command once the server answers."
        ) from None
    return ModelVersion(name, str(mv.version), source, dict(mv.tags or tags))


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def first_line(exc: BaseException) -> str:
    """An error's first line, shortened: what a one-line message quotes."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


__all__ = [
    "NO_TRACKING",
    "RECORD_FILE",
    "ModelVersion",
    "Stage",
    "StageLog",
    "Track",
    "TrackingRecord",
    "client",
    "connect",
    "end_run",
    "experiment_id",
    "first_line",
    "lineage_tags",
    "log_stage",
    "probe",
    "read_record",
    "register_model",
    "start_run",
    "tracked_run",
    "write_record",
]
