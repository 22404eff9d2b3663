"""What a new user met with ``--track mlflow`` (issue #30), against a real ``mlflow server`` on
loopback: a registered version's bytes never change, an outage before the MLflow run exists
or during ``zoo export`` loses nothing (``zoo runs sync`` sends it), and ``--register`` is
checked before any work, with one clear line when the server is down."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import file_sha256, run_zoo
from tests.mlflow_server import MlflowServer

pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[mlflow]'")
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.serve, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    s = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def run(server: MlflowServer, four_digits: Path, tmp_path_factory) -> Path:
    """A tracked 1-epoch mlp fine-tune on four real digit classes."""
    root = tmp_path_factory.mktemp("faults")
    r = run_zoo("finetune", "mlp", "--data", str(four_digits), "--epochs", "1", "--no-progress",
                "--num-workers", "0", "--name", "m", "--track", "mlflow", cwd=root,
                env={"MLFLOW_TRACKING_URI": server.uri})  # fmt: skip
    assert r.returncode == 0, r.stderr
    return root / "runs" / "m"


def zoo(server: MlflowServer, *args: str, cwd: Path):
    return run_zoo(*args, cwd=cwd, env={"MLFLOW_TRACKING_URI": server.uri})


def test_register_is_checked_before_any_work(server: MlflowServer, run: Path) -> None:
    for bad in ("", "a/b", " x"):
        r = zoo(server, "export", str(run), "--register", bad, cwd=run.parent)
        assert r.returncode == 2 and "--register" in r.stderr, (bad, r.stderr)
    k = zoo(server, "export", str(run), "--format", "kserve", "--register", "x", cwd=run.parent)
    assert k.returncode == 2 and "register the ONNX file" in k.stderr
    assert not list((run / "model").glob("*.onnx")) and not (run / "kserve").exists()


def test_a_registered_version_never_changes_and_says_its_precision(
    server: MlflowServer, run: Path
) -> None:
    out = run.parent / "out" / "model.onnx"  # both exports: the same file name
    e1 = zoo(server, "export", str(run), "--register", "faults", "-o", str(out), cwd=run.parent)
    assert e1.returncode == 0, e1.stderr
    first = file_sha256(out)
    e2 = zoo(server, "export", str(run), "--register", "faults", "--static-batch", "4",
             "-o", str(out), cwd=run.parent)  # fmt: skip
    assert e2.returncode == 0 and "registered faults version 2" in e2.stderr, e2.stderr
    assert file_sha256(out) != first  # the same name, other bytes
    c = MlflowClient(server.uri)
    v1, v2 = c.get_model_version("faults", "1"), c.get_model_version("faults", "2")
    assert v1.source != v2.source and v1.source.endswith(f"/export/{first[:12]}/model.onnx")
    got = Path(
        c.download_artifacts(
            v1.run_id, v1.source.removeprefix(f"runs:/{v1.run_id}/"), str(run.parent / "v1")
        )
    )
    assert file_sha256(got) == first
    assert v1.tags["zoo.format"] == "onnx" and v1.tags["zoo.precision"] == "fp32"


def test_an_outage_during_export_is_queued_and_synced(server: MlflowServer, run: Path) -> None:
    rid = json.loads((run / "tracking.json").read_text())["run_id"]
    server.stop()
    try:
        e = zoo(server, "export", str(run), cwd=run.parent)
        assert e.returncode == 0, e.stderr
        assert f"zoo runs sync {run}" in e.stderr and (run / "tracking.queue.json").is_file()
        assert "WARNING" not in e.stderr and "Connection refused" in e.stderr
        reg = zoo(server, "export", str(run), "--register", "faults", cwd=run.parent)
        assert reg.returncode == 1 and "export without --register" in reg.stderr
        assert "drop --track mlflow" not in reg.stderr and "Connection refused" in reg.stderr
        down = zoo(server, "runs", "sync", str(run), cwd=run.parent)
        assert down.returncode == 1 and f"run `zoo runs sync {run}` again" in down.stderr
    finally:
        server.start()
    sent = file_sha256(run / "model" / "model.onnx")
    s = zoo(server, "runs", "sync", str(run), cwd=run.parent)
    assert s.returncode == 0 and "everything logged" in s.stderr, s.stderr
    assert not (run / "tracking.queue.json").exists()
    exported = {f.path for f in MlflowClient(server.uri).list_artifacts(rid, f"export/{sent[:12]}")}
    assert exported == {f"export/{sent[:12]}/model.onnx"}


def test_server_down_before_the_run_is_created_is_synced(
    server: MlflowServer, four_digits: Path, tmp_path: Path
) -> None:
    """The start-up check passes, then the server stops before the MLflow run exists."""
    from zoo.train.config import TrainConfig
    from zoo.train.tracking import MlflowTracker
    from zoo.train.trainer import fit

    cfg = TrainConfig(model="mlp", data=str(four_digits), epochs=2, runs_root=str(tmp_path),
                      name="early", progress=False, num_workers=0)  # fmt: skip
    tracker = MlflowTracker(uri=server.uri)
    tracker.check()
    server.stop()
    try:
        done = fit(cfg, observers=[tracker])
        summary = tracker.close(1)
    finally:
        server.start()
    assert done is not None and not summary.complete and "the run's start" in summary.unsent
    assert f"zoo runs sync {done}" in summary.line()
    assert (done / "tracking.pending.json").is_file() and not (done / "tracking.json").exists()
    s = run_zoo("runs", "sync", str(done), cwd=tmp_path)  # the recorded URI, no variable
    assert s.returncode == 0 and "everything logged" in s.stderr, s.stderr
    rid = json.loads((done / "tracking.json").read_text())["run_id"]
    c = MlflowClient(server.uri)
    assert sorted(m.step for m in c.get_metric_history(rid, "val/loss")) == [1, 2]
    assert c.get_run(rid).info.status == "FINISHED" and c.get_run(rid).info.run_name == "early"
    assert not (done / "tracking.pending.json").exists()


def test_a_tracker_process_that_dies_never_stops_training(
    server: MlflowServer, four_digits: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MLflow runs in a process of its own (it loads while torch does); killed, the run
    trains on and its last line says what was lost and how to send it."""
    import os
    import signal

    from zoo.train.config import TrainConfig
    from zoo.train.tracking_process import TrackerProcess
    from zoo.train.trainer import fit

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    cfg = TrainConfig(model="mlp", data=str(four_digits), epochs=2, runs_root=str(tmp_path),
                      name="orphan", progress=False, num_workers=0)  # fmt: skip
    tracker = TrackerProcess()
    tracker.ready()
    os.kill(tracker.pid, signal.SIGKILL)
    done = fit(cfg, observers=[tracker])
    summary = tracker.close()
    assert done is not None and (done / "model" / "model.safetensors").is_file()
    assert not summary.complete and "the tracking process" in summary.line(), summary.line()
    assert f"zoo runs sync {done}" in summary.line()
    s = run_zoo("runs", "sync", str(done), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": server.uri})
    assert s.returncode == 0 and "everything logged" in s.stderr, s.stderr
    rid = json.loads((done / "tracking.json").read_text())["run_id"]
    steps = [m.step for m in MlflowClient(server.uri).get_metric_history(rid, "val/loss")]
    assert sorted(steps) == [1, 2]
