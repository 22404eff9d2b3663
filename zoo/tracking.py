"""Experiment tracking in MLflow, the part every layer shares: a run folder's tracking record
(``tracking.json``: which MLflow run holds it), the connection to the tracking server, and the
one-shot logging of a later stage (``zoo export``, ``zoo quantize``, ``zoo bench``) into the
run that trained the model. The training side (metrics per epoch, outages) is
:mod:`zoo.train.tracking`; what later commands add (and ``--register``) is
:mod:`zoo.tracking_stages`.

MLflow is optional (``pip install 'zoo[mlflow]'``) and imported only here, inside functions.
Where runs go is MLflow's own choice: ``MLFLOW_TRACKING_URI`` (an ``http://`` server), or its
default, a local store in the working folder; ``MLFLOW_EXPERIMENT_NAME`` /
``MLFLOW_EXPERIMENT_ID`` pick the experiment (default: MLflow's ``Default``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from zoo.errors import TrackingError, first_line

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

RECORD_FILE = "tracking.json"
PENDING_FILE = "tracking.pending.json"
"""What an MLflow run not created yet (its server went down first) needs: ``zoo runs sync``."""
QUEUE_FILE = "tracking.queue.json"
"""What ``zoo export``/``quantize``/``bench`` could not log (an outage): ``zoo runs sync``."""
Track = Literal["none", "mlflow"]
"""``--track`` / ``ZOO_TRACK``: where a run's metrics and artifacts also go."""
NO_TRACKING = "train without tracking: drop --track mlflow (and unset ZOO_TRACK)"
_EXPERIMENT_ENV = ("MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")

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
    from zoo import durable  # here: `zoo --help` imports this module for its Track choices

    durable.write_json(Path(run) / RECORD_FILE, record.to_dict(), label=None)


def client(uri: str | None = None) -> MlflowClient:
    """An MLflow client for ``uri`` (default: MLflow's own choice), with bounded retries.

    Raises:
        TrackingError: MLflow is not installed.
    """
    for name, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    import logging  # here: the CLI's start-up does not pay for it

    # urllib3 logs each retry as a WARNING with its traceback-like text; our one line says it
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise TrackingError(
            f"--track mlflow needs MLflow ({exc}): pip install 'zoo[mlflow]', or {NO_TRACKING}."
        ) from None
    return MlflowClient(uri)


def connect(uri: str | None = None, fallback: str = NO_TRACKING) -> MlflowClient:
    """A client whose server answered: the check made before any work.

    Args:
        uri: the tracking URI (default: MLflow's own choice).
        fallback: how to go on without the server (the message's end; the command's own).

    Raises:
        TrackingError: MLflow is missing, or the tracking server does not answer (its URI,
            the reason, and how to go on without tracking).
    """
    c = client(uri)
    try:
        c.search_experiments(max_results=1)
    except Exception as exc:  # MLflow wraps a refused connection, a 5xx, an auth failure alike
        raise TrackingError(_unreachable(c.tracking_uri, reason(exc), fallback)) from None
    return c


def probe(uri: str, timeout: float = 10.0, fallback: str = NO_TRACKING) -> None:
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
            f"--track mlflow needs MLflow: pip install 'zoo[mlflow]', or {fallback}."
        )
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as r:
            r.read()
    except urllib.error.HTTPError as exc:
        if exc.code < 500:  # it answers (a proxy's 401/404): the requests will say more
            return
        raise TrackingError(_unreachable(uri, f"HTTP {exc.code}", fallback)) from None
    except (OSError, ValueError) as exc:
        raise TrackingError(_unreachable(uri, reason(exc), fallback)) from None


def _unreachable(uri: str, why: str, fallback: str) -> str:
    return (
        f"The MLflow tracking server at {uri} does not answer: {why}. Start it (mlflow server "
        f"…), point MLFLOW_TRACKING_URI at one that runs, or {fallback}."
    )


def reason(exc: BaseException) -> str:
    """Why a request failed, in a few words: the socket's error (``Connection refused``) when
    MLflow's message wraps one in urllib3's retry text, else its first line."""
    found = re.search(r"\[Errno -?\d+\] ([^'\")\]>]+)", str(exc))
    return found.group(1).strip() if found else first_line(exc)


def experiment_env() -> dict[str, str]:
    """The experiment MLflow's environment names now (kept for a run created later)."""
    return {k: os.environ[k] for k in _EXPERIMENT_ENV if os.environ.get(k)}


def experiment_id(c: MlflowClient, env: Mapping[str, str] | None = None) -> str:
    """The experiment MLflow's environment (or ``env``, :func:`experiment_env`) names
    (``MLFLOW_EXPERIMENT_ID``, or ``MLFLOW_EXPERIMENT_NAME``, created when missing), else
    MLflow's ``Default`` (``0``)."""
    env = os.environ if env is None else env
    if env.get("MLFLOW_EXPERIMENT_ID"):
        return env["MLFLOW_EXPERIMENT_ID"]
    name = env.get("MLFLOW_EXPERIMENT_NAME")
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


def effective(record: TrackingRecord) -> tuple[TrackingRecord, str | None]:
    """``record`` at the URI to use: ``MLFLOW_TRACKING_URI``, when set, wins over the URI in
    ``tracking.json`` (the server moved, or a tunnel's address), with a note saying so."""
    env = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not env or env.rstrip("/") == record.uri.rstrip("/"):
        return record, None
    note = (
        f"tracking: MLFLOW_TRACKING_URI ({env}) wins over {record.uri}, the URI in the run's "
        f"{RECORD_FILE}: MLflow run {record.run_id} must be on that server"
    )
    return TrackingRecord(env, record.run_id, record.experiment_id, record.parent_run_id), note


def end_run(record: TrackingRecord, status: str = "FINISHED") -> None:
    """Mark ``record``'s run ended (``FINISHED``, ``FAILED`` or ``KILLED``)."""
    client(record.uri).set_terminated(record.run_id, status)


__all__ = [
    "NO_TRACKING",
    "PENDING_FILE",
    "QUEUE_FILE",
    "RECORD_FILE",
    "Track",
    "TrackingRecord",
    "client",
    "connect",
    "effective",
    "end_run",
    "experiment_env",
    "experiment_id",
    "probe",
    "read_record",
    "reason",
    "start_run",
    "write_record",
]
