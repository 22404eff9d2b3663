"""``--track mlflow`` against a real MLflow tracking server (``mlflow server`` on loopback, a
SQLite store and a local artifact root, as users run it), read back through ``MlflowClient``:
the tracked fine-tune, the chain export → quantize → bench → register under the same run,
``--resume``, an outage mid-run (the server stopped and started again on the same store), an
unreachable server at start, and a search's nested runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ZOO, finetune_here, run_zoo, zoo_here
from tests.mlflow_server import MlflowServer, free_port

pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[mlflow]'")
from mlflow.tracking import MlflowClient

pytestmark = [pytest.mark.serve, pytest.mark.slow]

EPOCHS = ("--epochs", "2", "--no-progress", "--num-workers", "0")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    s = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    s.start()
    yield s
    s.stop()


def tracked(
    server: MlflowServer, *args: str, cwd: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """``zoo …`` with the server as MLFLOW_TRACKING_URI."""
    return run_zoo(*args, cwd=cwd, env={"MLFLOW_TRACKING_URI": server.uri, **env})


def record(run: Path) -> dict:
    return json.loads((run / "tracking.json").read_text())


def steps(client: MlflowClient, run_id: str, key: str = "val/loss") -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def tracked_run(server: MlflowServer, small_digits: Path, tmp_path_factory) -> tuple[Path, str]:
    """A tracked simple_cnn fine-tune on the real digits, with its report (2 epochs)."""
    root = tmp_path_factory.mktemp("tracked")
    r = tracked(
        server, "finetune", "simple_cnn", "--data", str(small_digits), *EPOCHS, "--report",
        "--name", "cnn", "--track", "mlflow", cwd=root,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return root / "runs" / "cnn", r.stderr


def test_a_tracked_finetune_is_in_mlflow(server: MlflowServer, tracked_run) -> None:
    run, stderr = tracked_run
    rec = record(run)
    assert rec["uri"] == server.uri and rec["backend"] == "mlflow"
    assert stderr.strip().splitlines()[-1].startswith("tracking: everything logged to MLflow")
    c = MlflowClient(server.uri)
    mrun = c.get_run(rec["run_id"])
    assert mrun.info.status == "FINISHED" and mrun.info.run_name == "cnn"
    assert mrun.data.params["model"] == "simple_cnn" and mrun.data.params["epochs"] == "2"
    assert "resume" not in mrun.data.params  # runtime options are not the run's config
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for key in ("val/acc", "val/loss", "train/loss", "lr"):
        history = sorted(c.get_metric_history(rec["run_id"], key), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [
            (row["epoch"], pytest.approx(row[key])) for row in rows
        ], key
    model_cfg = json.loads((run / "model" / "config.json").read_text())
    tags = mrun.data.tags
    assert tags["zoo.run"] == str(run.resolve())
    assert tags["zoo.data.fingerprint"] == model_cfg["data"]["fingerprint"]
    assert json.loads(tags["zoo.data.classes"]) == model_cfg["class_names"]
    assert tags["zoo.device"] == "cpu" and tags["zoo.torch"]
    top = {f.path for f in c.list_artifacts(rec["run_id"])}
    assert {"report.html", "report.json", "metrics.csv", "curves.png", "model"} <= top
    model = {f.path for f in c.list_artifacts(rec["run_id"], "model")}
    assert model == {"model/model.safetensors", "model/config.json", "model/README.md"}
    # the artifact is the file the run wrote, byte for byte
    local = c.download_artifacts(rec["run_id"], "model/model.safetensors", str(run.parent))
    assert Path(local).read_bytes() == (run / "model" / "model.safetensors").read_bytes()


def test_export_quantize_bench_and_register_log_into_the_same_run(
    server: MlflowServer, tracked_run
) -> None:
    run, _ = tracked_run
    rid = record(run)["run_id"]
    e = tracked(server, "export", str(run), "--register", "digits-cnn", "--json", cwd=run.parent)
    assert e.returncode == 0, e.stderr
    export = json.loads(e.stdout)
    assert "tracking: export logged to MLflow" in e.stderr
    q = tracked(server, "quantize", str(run / "model" / "model.onnx"), "--json", cwd=run.parent)
    assert q.returncode == 0, q.stderr
    quant = json.loads(q.stdout)
    b = tracked(
        server, "bench", str(run), "--backends", "eager,ort_fp32", "--batch-sizes", "1",
        "--seconds", "0.1", "--json", cwd=run.parent,
    )  # fmt: skip
    assert b.returncode == 0, b.stderr
    bench = json.loads(b.stdout)

    c = MlflowClient(server.uri)
    metrics = c.get_run(rid).data.metrics
    assert (
        metrics["export/model.onnx/parity_agreement"]
        == export["parity"]["predictions"]["agreement"]
    )
    assert metrics["export/model.onnx/parity_max_abs"] == pytest.approx(
        export["parity"]["tensors"]["max_abs"]
    )
    int8 = Path(quant["path"]).stem
    assert metrics[f"quantize/{int8}/top1_agreement"] == quant["top1_agreement"]
    assert metrics[f"quantize/{int8}/size_mb_int8"] == quant["size_mb"]["int8"]
    for row in bench["rows"]:
        key = f"bench/{row['backend']}/{row['device']}/b{row['batch']}/p50_ms"
        assert metrics[key] == pytest.approx(row["p50_ms"])
    exported = {f.path for f in c.list_artifacts(rid, "export")}
    onnx_sha = hashlib.sha256((run / "model" / "model.onnx").read_bytes()).hexdigest()[:12]
    assert {f"export/{onnx_sha}", "export/model.onnx.json"} <= exported  # a folder by content
    onnx = c.download_artifacts(rid, f"export/{onnx_sha}/model.onnx", str(run.parent / "dl"))
    assert Path(onnx).read_bytes() == (run / "model" / "model.onnx").read_bytes()
    assert f"quantize/{int8}.json" in {f.path for f in c.list_artifacts(rid, "quantize")}
    assert "bench/bench.json" in {f.path for f in c.list_artifacts(rid, "bench")}

    version = c.get_model_version("digits-cnn", "1")
    assert version.run_id == rid and version.source == f"runs:/{rid}/export/{onnx_sha}/model.onnx"
    model_cfg = json.loads((run / "model" / "config.json").read_text())
    report = json.loads((run / "report.json").read_text())
    assert version.tags["zoo.data.fingerprint"] == model_cfg["data"]["fingerprint"]
    assert version.tags["zoo.parent_weights"] == model_cfg["parent_weights"]
    assert version.tags["zoo.weights_sha256"] == report["weights_sha256"]
    assert version.tags["zoo.run"] == str(run.resolve())
    # a second export registers version 2 of the same model
    e2 = tracked(server, "export", str(run), "--register", "digits-cnn", cwd=run.parent)
    assert e2.returncode == 0, e2.stderr
    assert "registered digits-cnn version 2" in e2.stderr


def test_register_needs_a_tracked_run_and_says_so_before_exporting(
    four_digits: Path, tmp_path: Path, server: MlflowServer
) -> None:
    """An untracked run (trained in this process: its command is not what is tested)."""
    finetune_here(four_digits, tmp_path / "runs", "m", model="mlp", epochs=1)
    e = tracked(server, "export", "runs/m", "--register", "x", cwd=tmp_path)
    assert e.returncode == 1
    assert "not a run trained with --track mlflow" in e.stderr
    assert not (tmp_path / "runs" / "m" / "model" / "model.onnx").exists()


def test_resume_continues_the_same_mlflow_run_without_duplicate_steps(
    server: MlflowServer, four_digits: Path, tmp_path: Path
) -> None:
    args = ("finetune", "mlp", "--data", str(four_digits), *EPOCHS, "--name", "r")
    r = tracked(server, *args, "--track", "mlflow", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "runs" / "r"
    first = record(run)
    # no --track: a tracked run's resume goes on logging to its MLflow run
    again = tracked(server, "finetune", "--resume", str(run), "--extend", "1", "--no-progress",
                    cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert record(run) == first
    c = MlflowClient(server.uri)
    assert steps(c, first["run_id"]) == [1, 2, 3]
    assert steps(c, first["run_id"], "val/acc") == [1, 2, 3]
    mrun = c.get_run(first["run_id"])
    assert mrun.info.status == "FINISHED"
    assert mrun.data.params["epochs"] == "2" and mrun.data.tags["zoo.changed.epochs"] == "3"
    assert len(c.search_runs([first["experiment_id"]], "tags.`zoo.run` LIKE '%/r'")) == 1


def test_an_unreachable_server_stops_the_run_before_any_work(
    four_digits: Path, tmp_path: Path
) -> None:
    """The commands in this process (their start-up is not what is tested; the tracker's
    check runs in its own process as ever)."""
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = zoo_here("finetune", "mlp", "--data", str(four_digits), "--track", "mlflow",
                 cwd=tmp_path, env={"MLFLOW_TRACKING_URI": uri})  # fmt: skip
    assert r.returncode == 1
    assert f"The MLflow tracking server at {uri} does not answer" in r.stderr
    assert "train without tracking: drop --track mlflow" in r.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started
    env = {"MLFLOW_TRACKING_URI": uri, "ZOO_TRACK": "mlflow"}  # the variable, the same check
    r = zoo_here("finetune", "mlp", "--data", str(four_digits), cwd=tmp_path, env=env)
    assert r.returncode == 1 and "does not answer" in r.stderr
    r = zoo_here("finetune", "mlp", "--data", str(four_digits), "--track", "wandb", cwd=tmp_path)
    assert r.returncode == 2 and "mlflow" in r.stderr


class Outage:
    """An observer after the tracker: once epoch ``down_after`` has reached the server, the
    server stops; at epoch ``up_at`` (if any) it starts again on the same store and port."""

    def __init__(self, server: MlflowServer, down_after: int, up_at: int | None) -> None:
        self.server, self.down_after, self.up_at = server, down_after, up_at

    def run_started(self, run: Path, cfg: object, history: object) -> None:
        pass

    def epoch_ended(self, run: Path, row) -> None:
        if row.epoch == self.down_after:
            client, deadline = MlflowClient(self.server.uri), time.monotonic() + 120
            while not (
                (run / "tracking.json").is_file()
                and self.down_after in steps(client, record(run)["run_id"])
            ):
                assert time.monotonic() < deadline, "epoch 1 never reached the server"
                time.sleep(0.1)
            self.server.stop()
        if row.epoch == self.up_at:
            self.server.start()

    def run_ended(self, run: Path, status: str) -> None:
        pass


def _train_through_an_outage(
    server: MlflowServer, data: Path, root: Path, *, up_at: int | None, flush_s: float
):
    """A tracked 4-epoch run (in this process, so that the outage follows the epochs)."""
    from zoo.train.config import TrainConfig
    from zoo.train.tracking import MlflowTracker
    from zoo.train.trainer import fit

    cfg = TrainConfig(model="mlp", data=str(data), epochs=4, runs_root=str(root), name="o",
                      progress=False, num_workers=0)  # fmt: skip
    tracker = MlflowTracker(uri=server.uri)
    tracker.check()
    try:
        run = fit(cfg, observers=[tracker, Outage(server, down_after=1, up_at=up_at)])
        return run, tracker.close(flush_s)
    finally:
        if server.proc is None:
            server.start()  # the next tests need it


def test_an_outage_mid_run_loses_nothing(
    server: MlflowServer, four_digits: Path, tmp_path: Path
) -> None:
    run, summary = _train_through_an_outage(server, four_digits, tmp_path, up_at=3, flush_s=240)
    assert summary.complete, summary.line()
    assert summary.line().startswith("tracking: everything logged")
    rid = record(run)["run_id"]
    c = MlflowClient(server.uri)
    assert steps(c, rid) == [1, 2, 3, 4] and steps(c, rid, "train/acc") == [1, 2, 3, 4]
    assert c.get_run(rid).info.status == "FINISHED"
    assert "model/model.safetensors" in {f.path for f in c.list_artifacts(rid, "model")}


def test_an_outage_past_the_end_is_named_and_synced_later(
    server: MlflowServer, four_digits: Path, tmp_path: Path
) -> None:
    run, summary = _train_through_an_outage(server, four_digits, tmp_path, up_at=None, flush_s=1)
    last = summary.line()  # what `zoo finetune` prints last
    assert not summary.complete and last.startswith("warning: tracking:")
    assert "could not be logged" in last and "epoch 2, epoch 3, epoch 4" in last
    assert f"zoo runs sync {run}" in last
    rid = record(run)["run_id"]
    c = MlflowClient(server.uri)
    assert steps(c, rid) == [1]  # the rest is in the run folder
    s = run_zoo("runs", "sync", str(run), cwd=tmp_path)
    assert s.returncode == 0, s.stderr
    assert "everything logged" in s.stderr
    assert steps(c, rid) == [1, 2, 3, 4]
    assert c.get_run(rid).info.status == "FINISHED"
    assert "model/model.safetensors" in {f.path for f in c.list_artifacts(rid, "model")}
    again = run_zoo("runs", "sync", str(run), cwd=tmp_path)  # nothing twice
    assert again.returncode == 0 and steps(c, rid) == [1, 2, 3, 4]


def test_a_search_nests_its_trials_under_a_parent_run(
    server: MlflowServer, four_digits: Path, tmp_path: Path
) -> None:
    """The library API a search uses (``zoo tune``): a parent run, one nested run a trial."""
    from zoo.tracking import end_run, start_run
    from zoo.train.config import TrainConfig
    from zoo.train.tracking import MlflowTracker
    from zoo.train.trainer import fit

    parent = start_run(uri=server.uri, name="search")
    cfg = TrainConfig(model="mlp", data=str(four_digits), epochs=1, runs_root=str(tmp_path),
                      progress=False, num_workers=0, name="trial")  # fmt: skip
    tracker = MlflowTracker(uri=server.uri, parent_run_id=parent.run_id, tags={"trial": "0"})
    tracker.check()
    run = fit(cfg, observers=[tracker])
    summary = tracker.close()
    end_run(parent)
    assert summary.complete and run is not None
    child = MlflowClient(server.uri).get_run(record(run)["run_id"])
    assert child.data.tags["mlflow.parentRunId"] == parent.run_id
    assert child.data.tags["trial"] == "0" and record(run)["parent_run_id"] == parent.run_id
    assert steps(MlflowClient(server.uri), child.info.run_id) == [1]


def test_without_a_tracking_uri_runs_go_to_mlflows_local_store(
    four_digits: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    r = subprocess.run(
        [ZOO, "finetune", "mlp", "--data", str(four_digits), "--epochs", "1", "--no-progress",
         "--name", "local", "--track", "mlflow"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rec = record(tmp_path / "runs" / "local")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"  # MLflow 3's default: the working folder
    assert rec["uri"] == store
    assert steps(MlflowClient(store), rec["run_id"]) == [1]


@pytest.mark.parametrize(
    "error",
    [
        "<urlopen error [Errno 111] Connection refused>",  # urllib (the start-up probe)
        "Max retries exceeded (Caused by NewConnectionError('<urllib3.connection.HTTPConnection "
        "object at 0x7f>: Failed to establish a new connection: [Errno 111] Connection refused'))",
    ],
)
def test_an_unreachable_server_is_said_in_a_few_words(error: str) -> None:
    from zoo.tracking import reason

    assert reason(ConnectionError(error)) == "Connection refused"
