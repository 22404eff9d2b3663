"""The trials on Ray Tune: a local Ray (or a cluster's, ``--address``), each trial an actor
with explicit resources, ASHA or FIFO deciding at each epoch, and a callback that keeps the
search's ``tune.json`` at every event. Imported only by ``zoo tune`` (Ray is the ``tune``
extra)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from zoo.errors import InputError, UsageError
from zoo.train.console import say
from zoo.train.tune.book import SearchBook, SearchSpec, TrialRecord
from zoo.train.tune.track import TrialTracking
from zoo.train.tune.trial import RANK, VERDICTS, Verdicts, ZooTrial

# passed on to the trials' processes on a cluster whose nodes started without them
PASSED_ENV = (
    "ZOO_CACHE", "ZOO_OFFLINE", "HF_HUB_OFFLINE", "HF_HOME", "TORCH_HOME", "ZOO_TRACK_FLUSH_S",
    "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_INSECURE_TLS",
)  # fmt: skip


@contextlib.contextmanager
def session(address: str | None, spec: SearchSpec) -> Iterator[None]:
    """Ray for a search's length: joined (``address``) or started here, and checked to have
    what one trial asks for, before the caller writes anything; shut down at the end if
    started here. Inside an initialised Ray (a caller's own), that Ray is used and kept.

    Raises:
        InputError: the cluster at ``address`` cannot be reached.
        UsageError: a trial asks for more CPUs or GPUs than the cluster has.
    """
    started = not ray.is_initialized()
    if started:
        _init_ray(address)
    elif address:  # the caller's Ray runs the trials, wherever it is
        say(f"Ray is already initialised in this process: --address {address} is not used")
    try:
        _check_resources(spec)
        yield
    finally:
        if started:
            ray.shutdown()


def _init_ray(address: str | None) -> None:
    from zoo.system import available_cpus

    if address:
        _probe(address)
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    try:
        ray.init(
            address=address,
            num_cpus=None if address else available_cpus(),
            num_gpus=None if address else _local_gpus(),
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,  # the trials' own logs stay in Ray's; the driver says each epoch
            runtime_env={"env_vars": env} if env else None,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise InputError(
            f"Cannot reach the Ray cluster at {address!r}: {exc}. Start one with "
            "`ray start --head`, or drop --address for a local Ray."
        ) from exc


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a ``HOST:PORT`` (or ``ray://HOST:PORT``) that takes no TCP connection. By hand:
    ``ray.init`` retries such an address for minutes, logging, and has no timeout to pass."""
    import socket

    host, sep, port = address.removeprefix("ray://").rstrip("/").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", "local" and the like: Ray's own lookup
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except TimeoutError:
        why = f"no answer within {timeout_s:g} s"
    except OSError as exc:
        why = exc.strerror or str(exc)
    else:
        return
    raise InputError(
        f"Cannot reach the Ray cluster at {address!r}: {host}:{port}: {why}. Start one with "
        "`ray start --head` (it prints the address), or drop --address for a local Ray."
    )


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _check_resources(spec: SearchSpec) -> None:
    """A trial that asks for more than the cluster has would wait forever: refuse it now."""
    have = ray.cluster_resources()
    asks = (("CPU", spec.trial_cpus, "--trial-cpus"), ("GPU", spec.trial_gpus, "--trial-gpus"))
    for key, need, flag in asks:
        if need > have.get(key, 0):
            raise UsageError(
                f"{flag} {need:g}: the Ray cluster has {have.get(key, 0):g} {key}(s) in all; "
                "ask for at most that",
                param_hint=flag,
            )


def run_trials(
    book: SearchBook, todo: list[TrialRecord], tracked: TrialTracking | None = None
) -> None:
    """Run ``todo`` (each an ordinary zoo run in the search folder) to their ends, in the Ray
    of :func:`session`; with ``tracked``, each trial's run is an MLflow run nested under the
    search's."""
    spec = book.spec
    verdicts = Verdicts.options(name=VERDICTS).remote()  # type: ignore[attr-defined]
    scheduler = (
        _Asha(verdicts, time_attr="epoch", max_t=spec.base.epochs, grace_period=1,
              reduction_factor=2)
        if spec.scheduler == "asha"
        else FIFOScheduler()
    )  # fmt: skip
    plans = [
        {
            "trial": t.name,
            "options": t.config(spec, book.folder).to_dict(),
            "metric": spec.metric,
            "track": tracked.to_dict() if tracked else None,
        }
        for t in todo
    ]
    storage = tempfile.mkdtemp(prefix="zoo-tune-ray-")  # Ray's own files; the record is ours
    try:
        tuner = tune.Tuner(
            tune.with_resources(ZooTrial, {"cpu": spec.trial_cpus, "gpu": spec.trial_gpus}),
            param_space={"plan": tune.grid_search(plans)},
            tune_config=tune.TuneConfig(
                metric=RANK,
                mode="max",
                scheduler=scheduler,
                max_concurrent_trials=spec.max_concurrent,
                trial_name_creator=lambda trial: trial.config["plan"]["trial"],
                trial_dirname_creator=lambda trial: trial.config["plan"]["trial"],
            ),
            run_config=tune.RunConfig(
                storage_path=storage, name="ray", verbose=0, callbacks=[_Keeper(book)]
            ),
        )
        # Tune's own tables: off (its old output engine honours verbose=0), and never on stdout,
        # which carries results only
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        with contextlib.redirect_stdout(sys.stderr):
            tuner.fit()
    finally:
        ray.kill(verdicts)
        shutil.rmtree(storage, ignore_errors=True)


class _Asha(ASHAScheduler):
    """ASHA, each stop recorded where the stopped trial's actor reads it; the trial then
    ends itself: its next step tells the run to stop, and the run finishes with the epochs it
    has (model folder, report) and reports ``done``. Tune is told to continue, not to stop:
    an actor that Tune stops gets 10 s to clean up at the experiment's end before it is
    killed, and a loaded machine's finishing step took longer (the run was left without its
    report, and the search ended "interrupted")."""

    def __init__(self, verdicts: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._verdicts = verdicts

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        action = super().on_trial_result(tune_controller, trial, result)
        if action == TrialScheduler.STOP and not result.get("done"):
            ray.get(self._verdicts.stop.remote(trial.config["plan"]["trial"]))
            return str(TrialScheduler.CONTINUE)
        return str(action)


class _Keeper(tune.Callback):
    """In the driver: every trial event into ``tune.json``, a line on stderr per epoch."""

    def __init__(self, book: SearchBook) -> None:
        self.book = book
        self.reported: dict[str, int] = {}  # trial → the last epoch it reported to this driver

    def on_trial_start(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
        self.book.update(_name(trial), status="running", error=None)

    def on_trial_result(
        self, iteration: int, trials: Any, trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        name, spec = _name(trial), self.book.spec
        if self.reported.get(name) == result["epoch"]:  # the run's end repeats its last epoch
            return
        rec = self.book.trials[name]
        attempts = rec.attempts
        if name not in self.reported:  # this attempt's first result
            attempts = (*attempts, int(result["resumed_from"]))
        self.reported[name] = int(result["epoch"])
        self.book.update(
            name, threads=int(result["threads"]), node=result["node"], attempts=attempts
        )
        say(
            f"{name} epoch {result['epoch']}/{spec.base.epochs}: "
            f"{spec.metric} {result[spec.metric]:.4f}"
        )

    def on_trial_complete(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
        rec = self.book.finished(_name(trial))
        say(f"{rec.name}: {rec.status} after {len(rec.epochs)} epoch(s)")

    def on_trial_error(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
        rec = self.book.update(_name(trial), status="failed", error=_error_line(trial))
        say(f"{rec.name}: failed: {rec.error}")


def _name(trial: Any) -> str:
    return str(trial.config["plan"]["trial"])


def _error_line(trial: Any) -> str:
    """The last line of the trial's traceback (``ConfigError: …``), from Ray's error file."""
    try:
        lines = Path(trial.error_file).read_text().strip().splitlines()
    except (OSError, TypeError):
        return "failed (Ray recorded no error)"
    return lines[-1] if lines else "failed"


__all__ = ["run_trials", "session"]
