"""``zoo tune`` on a real Ray runtime with the real digits: the trials are ordinary runs that
differ and re-train bitwise with plain ``zoo finetune``, ASHA stops weak ones as early stopping
does, a SIGKILLed search resumes with every trial once, and a multi-node cluster (``ray start
--head`` plus a worker, on this machine) runs them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ZOO, run_zoo, zoo_here
from tests.crash import TIMING
from zoo.artifact import REQUIRED_FILES
from zoo.train.config import option_defaults

SPACE = "lr: {loguniform: [3.0e-4, 3.0e-3]}\nmixup: 0.0\n"  # over the default space
SEARCH = ["--max-epochs", "3", "--scheduler", "asha", "--max-concurrent", "1"]
# three trials (four took 56 s to 38 s for three on 2 cores): ASHA judges the second and third
# against those before them at epochs 1 and 2, and still stops a weak one
TRIALS = 3


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real digits at 8 px, 30 per class, written by `zoo example` as a user would."""
    root = tmp_path_factory.mktemp("tune")
    r = zoo_here("example", "digits", str(root / "digits"), "--size", "8", "--per-class", "30")
    assert r.returncode == 0, r.stderr
    (root / "space.yaml").write_text(SPACE)
    return root / "digits"


@pytest.fixture(scope="module")
def search(digits: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ASHA search (TRIALS trials × up to 3 epochs, one at a time: ASHA's order is fixed)
    on a local Ray, with a fresh image cache of its own."""
    root = tmp_path_factory.mktemp("search")
    cache = root / "cache"
    r = run_zoo(
        "tune", "simple_cnn", "--data", str(digits), "--trials", str(TRIALS), *SEARCH,
        "--space", str(digits.parent / "space.yaml"), "--runs", str(root), "--name", "s",
        "--json", env={"ZOO_CACHE": str(cache)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return {"record": json.loads(r.stdout), "folder": root / "s", "cache": cache, "log": r.stderr}


def rows(run: Path) -> list[dict[str, Any]]:
    """A run's metrics without the clock's numbers."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in lines]


def rerun(command: str, runs: Path) -> Path:
    """Run a trial's recorded `zoo finetune` command (its thread count in the environment)."""
    env_part, argv = command.split(" zoo ", 1)
    env = dict(kv.split("=", 1) for kv in shlex.split(env_part))
    args = [*shlex.split(argv), "--runs", str(runs), "--name", "again", "--no-progress"]
    r = subprocess.run([ZOO, *args], capture_output=True, text=True, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    return runs / "again"


@pytest.mark.ray
@pytest.mark.slow
def test_trials_are_ordinary_runs_that_differ(search: dict[str, Any]) -> None:
    """Every trial is a complete run folder in the search folder; the settings and the metric
    curves differ from trial to trial; tune.json holds each trial's epochs as its run does."""
    record, folder = search["record"], search["folder"]
    assert record == json.loads((folder / "tune.json").read_text())
    trials = record["trials"]
    assert [t["name"] for t in trials] == [f"trial-{i:03d}" for i in range(TRIALS)]
    settings = [json.dumps(t["params"], sort_keys=True) for t in trials]
    assert len(set(settings)) == TRIALS
    # trial-000 is the baseline: the space's fixed value only, the trainer's defaults for the
    # rest (what a plain `zoo finetune` trains); the others are drawn
    assert [t["baseline"] for t in trials] == [True] + [False] * (TRIALS - 1)
    assert trials[0]["params"] == {"mixup": 0.0}
    base = json.loads((Path(trials[0]["run"]) / "config.json").read_text())
    assert {k: base[k] for k in ("weight_decay", "label_smoothing", "mixup")} == {
        k: option_defaults()[k] for k in ("weight_decay", "label_smoothing", "mixup")
    }
    rerun_flags = set(shlex.split(trials[0]["rerun"]))  # its re-run: a plain zoo finetune
    assert not rerun_flags & {"--lr", "--weight-decay", "--label-smoothing", "--auto-augment",
                              "--random-erasing", "--mixup"}  # fmt: skip
    assert "trial-000: done, " in search["log"] or "trial-000: stopped, " in search["log"]
    assert "| zoo finetune's defaults, mixup=0\n" in search["log"]
    for t in trials[1:]:
        assert set(t["params"]) == {"lr", "weight_decay", "label_smoothing", "auto_augment",
                                    "random_erasing", "mixup"}  # fmt: skip
        assert 3e-4 <= t["params"]["lr"] <= 3e-3 and t["params"]["mixup"] == 0.0
    for t in trials:
        run = Path(t["run"])
        assert run.parent == folder and t["status"] in ("done", "stopped")
        assert {p.name for p in (run / "model").iterdir()} == REQUIRED_FILES
        config = json.loads((run / "config.json").read_text())
        assert {k: config[k] for k in t["params"]} == t["params"]
        assert config["epochs"] == 3 and config["monitor"] == "val/acc"
        assert [{k: v for k, v in r.items() if k not in TIMING} for r in t["epochs"]] == rows(run)
        assert t["attempts"] == [0] and t["threads"] >= 1
    curves = {json.dumps([r["val/loss"] for r in t["epochs"]]) for t in trials}
    assert len(curves) == TRIALS

    def shipped(t: dict[str, Any]) -> tuple[float, float]:  # its run's best epoch (first of
        row = max(t["epochs"], key=lambda r: r["val/acc"])  # equals); equals by the lower loss
        return row["val/acc"], -row["val/loss"]

    best = max(trials, key=shipped)
    assert record["best"]["trial"] == best["name"] and record["best"]["run"] == best["run"]
    said = "the baseline: no drawn setting beat the defaults) → " in search["log"]
    assert said == best["baseline"]
    if not best["baseline"]:  # the best line gives the defaults' figure beside it
        defaults = max(r["val/acc"] for r in trials[0]["epochs"])
        assert f"; the defaults: {defaults:.4f}) → " in search["log"]


@pytest.mark.ray
@pytest.mark.slow
def test_asha_stops_weak_trials_as_early_stopping_does(search: dict[str, Any]) -> None:
    """One trial at a time, ASHA (reduction 2) stops every trial below the median of those
    before it at epoch 1 or 2; a stopped trial's run finished with the epochs it had (its best
    shipped, report written), like a run stopped by --patience."""
    trials = search["record"]["trials"]
    stopped = [t for t in trials if t["status"] == "stopped"]
    assert stopped, "ASHA stopped no trial"
    assert len(trials) == TRIALS and sum(len(t["epochs"]) for t in trials) < TRIALS * 3
    assert all(len(t["epochs"]) == 3 for t in trials if t["status"] == "done")
    for t in stopped:
        n = len(t["epochs"])
        assert n < 3 and f"{t['name']}: stopped after {n} epoch(s)" in search["log"]
        report = json.loads((Path(t["run"]) / "report.json").read_text())
        assert report["epochs"] == n


@pytest.mark.ray
@pytest.mark.slow
def test_the_best_trial_retrains_bitwise_with_plain_finetune(
    search: dict[str, Any], tmp_path: Path
) -> None:
    """The best trial's recorded command (`zoo finetune` with its settings) gives the same
    metrics to the bit on the CPU; the trial's run evaluates like any run."""
    best = search["record"]["best"]
    again = rerun(best["rerun"], tmp_path)
    assert rows(again) == rows(Path(best["run"]))
    e = zoo_here("eval", best["run"], "--json")
    assert e.returncode == 0, e.stderr
    assert json.loads(e.stdout)["acc"] == pytest.approx(best["val/acc"])


@pytest.mark.ray
@pytest.mark.slow
def test_trials_share_one_decode_of_each_image(search: dict[str, Any]) -> None:
    """The search decoded every image once, before the first trial's run folder existed; no
    trial decoded (wrote) an entry again."""
    entries = [p for p in (search["cache"] / "images").rglob("*.npy")]
    assert len(entries) == 300
    first_run = min((Path(t["run"]) / "config.json").stat().st_mtime_ns
                    for t in search["record"]["trials"])  # fmt: skip
    assert max(p.stat().st_mtime_ns for p in entries) < first_run


@pytest.mark.ray
@pytest.mark.slow
def test_a_killed_search_resumes_with_every_trial_once(digits: Path, tmp_path: Path) -> None:
    """SIGKILL of the driver once trial-001 has an epoch (trial-000 finished); `--resume`
    leaves trial-000 alone, continues trial-001 from its run's last checkpoint, and its metrics
    equal an uninterrupted `zoo finetune` of its settings, bitwise."""
    argv = ["tune", "simple_cnn", "--data", str(digits), "--trials", "2", "--max-epochs", "3",
            "--scheduler", "fifo", "--max-concurrent", "1", "--runs", str(tmp_path),
            "--name", "s"]  # fmt: skip
    folder = tmp_path / "s"
    driver = subprocess.Popen(
        [ZOO, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        while driver.poll() is None and not _has_epoch(folder / "tune.json", "trial-001"):
            time.sleep(0.05)  # tune.json is rewritten at every epoch: poll it
        assert driver.poll() is None, "the search ended before it could be killed"
        os.kill(driver.pid, signal.SIGKILL)
    finally:
        driver.wait()
        _kill_group(driver.pid)  # Ray's processes that outlive their driver a moment
    done = folder / "trial-000"
    before = {p: p.stat().st_mtime_ns for p in done.rglob("*") if p.is_file()}
    assert not (folder / "trial-001" / "report.json").exists()
    r = run_zoo("tune", "--resume", str(folder / "tune.json"))  # the record: its folder
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(folder)
    assert json.loads((folder / "tune.json").read_text())["search"]["base"]["runs_root"] == str(
        tmp_path
    )  # --runs, as given
    assert before == {p: p.stat().st_mtime_ns for p in done.rglob("*") if p.is_file()}
    trials = {t["name"]: t for t in json.loads((folder / "tune.json").read_text())["trials"]}
    assert trials["trial-000"]["attempts"] == [0]
    first, resumed_at = trials["trial-001"]["attempts"]
    assert first == 0 and 1 <= resumed_at <= 3
    for t in trials.values():
        assert t["status"] == "done" and [r["epoch"] for r in t["epochs"]] == [1, 2, 3]
    killed = folder / "trial-001"
    assert rows(rerun(trials["trial-001"]["rerun"], tmp_path / "again")) == rows(killed)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A two-node Ray cluster on this machine: `ray start --head` and a worker, 1 CPU each."""
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # loopback only
    common = ["--block", "--num-cpus", "1", "--num-gpus", "0", "--disable-usage-stats"]
    ray = str(Path(ZOO).parent / "ray")
    head = subprocess.Popen(
        [ray, "start", "--head", "--port", str(port), "--include-dashboard=false",
         "--temp-dir", temp, *common],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
    )  # fmt: skip
    nodes = [head]
    try:
        address = f"127.0.0.1:{port}"
        _wait_for_nodes(address, 1, env)
        worker = subprocess.Popen(
            [ray, "start", "--address", address, *common],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
        )  # fmt: skip
        nodes.append(worker)
        _wait_for_nodes(address, 2, env)
        yield address
    finally:
        for p in reversed(nodes):
            _kill_group(p.pid)
            p.wait()
        shutil.rmtree(temp, ignore_errors=True)  # outside the session's folder: ours to remove


@pytest.mark.ray
@pytest.mark.slow
def test_a_search_joins_a_multi_node_cluster(cluster: str, digits: Path, tmp_path: Path) -> None:
    """`--address` joins the cluster; with one CPU per node, the two trials run at once on
    the two nodes, each a complete run in the search folder."""
    r = run_zoo(
        "tune", "simple_cnn", "--data", str(digits), "--trials", "2", "--max-epochs", "1",
        "--scheduler", "fifo", "--address", cluster, "--runs", str(tmp_path), "--name", "c",
        "--no-baseline", "--json", env={"RAY_AUTH_MODE": "disabled"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    trials = json.loads(r.stdout)["trials"]
    assert len({t["node"] for t in trials}) == 2
    # --no-baseline: both trials drawn (each with its own lr), neither the defaults
    assert not any(t["baseline"] for t in trials) and all("lr" in t["params"] for t in trials)
    for t in trials:
        assert t["status"] == "done" and (Path(t["run"]) / "model" / "model.safetensors").exists()


@pytest.mark.ray
@pytest.mark.serve
@pytest.mark.slow
def test_a_tracked_search_is_a_parent_mlflow_run_with_each_trial_nested(
    digits: Path, tmp_path: Path
) -> None:
    """`--track mlflow` against a real `mlflow server`: the search is a parent run (the
    search as params, the best trial at the end, tune.json), each trial's run is nested under
    it with its epochs; `--resume` continues the same parent run; an unreachable server stops
    a search before its folder is written (exit 1)."""
    pytest.importorskip("mlflow", reason="the mlflow extra: pip install -e '.[mlflow]'")
    from mlflow.tracking import MlflowClient

    from tests.mlflow_server import MlflowServer, free_port

    argv = ["tune", "simple_cnn", "--data", str(digits), "--trials", "2", "--max-epochs", "2",
            "--scheduler", "fifo", "--runs", str(tmp_path)]  # fmt: skip
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r = zoo_here(*argv, "--name", "down", "--track", "mlflow", env={"MLFLOW_TRACKING_URI": down})
    assert r.returncode == 1 and f"The MLflow tracking server at {down} does not answer" in r.stderr
    assert not (tmp_path / "down").exists() and not _ray_started()  # (in this process)
    (tmp_path / "mlflow").mkdir()
    server = MlflowServer(tmp_path / "mlflow")
    server.start()
    try:
        env = {"MLFLOW_TRACKING_URI": server.uri, "ZOO_TRACK": "mlflow"}  # the variable
        r = run_zoo(*argv, "--name", "t", "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert "tracking: the search and its trials are in MLflow" in r.stderr
        book, folder = json.loads(r.stdout), tmp_path / "t"
        parent_id = json.loads((folder / "tracking.json").read_text())["run_id"]
        c = MlflowClient(server.uri)
        parent = c.get_run(parent_id)
        assert parent.info.status == "FINISHED"
        p = parent.data.params
        assert p["trials"] == "2" and p["scheduler"] == "fifo" and p["max_epochs"] == "2"
        assert p["baseline"] == "true"
        assert json.loads(p["space.lr"]) == book["search"]["space"]["lr"]
        best = next(t for t in book["trials"] if t["name"] == book["best"]["trial"])
        assert {k: p[f"best.{k}"] for k in best["params"]} == {
            k: str(v) for k, v in best["params"].items()
        }
        assert parent.data.metrics["best/val/acc"] == pytest.approx(book["best"]["val/acc"])
        assert parent.data.tags["zoo.best.run"] == book["best"]["run"]
        assert "tune.json" in {f.path for f in c.list_artifacts(parent_id)}
        children = c.search_runs(
            [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent_id}'"
        )
        assert sorted(ch.info.run_name for ch in children) == ["trial-000", "trial-001"]
        for ch in children:
            trial = next(t for t in book["trials"] if t["name"] == ch.info.run_name)
            run = Path(trial["run"])
            assert json.loads((run / "tracking.json").read_text())["run_id"] == ch.info.run_id
            config = json.loads((run / "config.json").read_text())  # the baseline: the default
            assert ch.info.status == "FINISHED" and ch.data.params["lr"] == str(config["lr"])
            assert trial["baseline"] or config["lr"] == trial["params"]["lr"]  # its draw trained
            history = c.get_metric_history(ch.info.run_id, "val/acc")
            assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
                (e["epoch"], pytest.approx(e["val/acc"])) for e in trial["epochs"]
            ]
        again = run_zoo("tune", "--resume", str(folder), env={"MLFLOW_TRACKING_URI": server.uri})
        assert again.returncode == 0, again.stderr
        assert json.loads((folder / "tracking.json").read_text())["run_id"] == parent_id
        assert c.get_run(parent_id).info.status == "FINISHED"
        assert len(c.search_runs([parent.info.experiment_id])) == 3  # no new run
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("learning_rate: 0.1\n", "'learning_rate' is not a tunable option"),
        ("backbone_lr_mult: {loguniform: [0, 1]}\n", "low > 0"),  # 0 in bounds, not in log
        ("strategy: {choice: [gradual, sideways]}\n", "strategy cannot be 'sideways'"),
        ("strategy: gradual\n", "random weights"),  # simple_cnn has no pretrained weights
    ],
)
def test_a_refused_space_exits_2_naming_the_valid_keys(
    space: str, message: str, digits: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad --space files are usage errors before anything runs: no search folder written, no
    Ray started (the command in this process: its start-up is not what is tested; a Ray
    started and shut down again would leave no trace, so starting one fails the test)."""
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "init", _no_ray)
    (tmp_path / "space.yaml").write_text(space)
    r = zoo_here(
        "tune", "simple_cnn", "--data", str(digits), "--space", str(tmp_path / "space.yaml"),
        "--runs", str(tmp_path / "runs"),
    )  # fmt: skip
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and message in said, r.stderr
    assert "--space: --space" not in said, said  # the option named once
    if "tunable" in message:
        assert "Valid keys: lr, backbone_lr_mult, weight_decay" in said
    assert not (tmp_path / "runs").exists()
    assert not _ray_started()


def test_resume_refuses_new_options_and_a_folder_that_is_no_search(tmp_path: Path) -> None:
    """In this process, as above."""
    r = zoo_here("tune", "mlp", "--resume", str(tmp_path), "--no-baseline", "--max-epochs", "2")
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "drop ARCH, --baseline/--no-baseline, --max-epochs" in said, said
    r = zoo_here("tune", "--resume", str(tmp_path))
    assert r.returncode == 1 and "not a zoo tune search folder" in r.stderr, r.stderr
    r = zoo_here("tune", "--resume", str(tmp_path / "gone"))
    said = " ".join(r.stderr.split())
    assert r.returncode == 1 and f"{tmp_path / 'gone'} does not exist; give the search" in said
    assert not _ray_started()


@pytest.mark.ray
def test_a_cluster_that_cannot_run_the_search_is_refused_before_its_folder(
    digits: Path, tmp_path: Path
) -> None:
    """An address nothing listens on is refused in seconds (ray.init would retry it for
    minutes); a trial asking more CPUs than the (local) Ray has is refused before the search
    folder is written, either way with nothing left behind."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed below: a port nothing listens on
    argv = ["tune", "simple_cnn", "--data", str(digits), "--trials", "2", "--runs",
            str(tmp_path / "runs")]  # fmt: skip
    r = zoo_here(*argv, "--address", f"127.0.0.1:{port}")
    said = " ".join(r.stderr.split())
    assert r.returncode == 1, said
    assert (
        f"Cannot reach the Ray cluster at '127.0.0.1:{port}': 127.0.0.1:{port}: Connection refused"
        in said
    )
    assert not _ray_started() and not (tmp_path / "runs").exists()
    r = run_zoo(*argv, "--trial-cpus", "1000")
    said = " ".join(r.stderr.split())
    assert r.returncode == 2 and "--trial-cpus 1000: the Ray cluster has" in said, said
    assert not (tmp_path / "runs").exists()


def test_trials_are_drawn_distinct_and_the_same_for_a_seed() -> None:
    """In-process: the draws, and a space too small for the trials asked."""
    from zoo.errors import UsageError
    from zoo.train.config import TrainConfig
    from zoo.train.tune.space import TUNABLE, Dimension, default_space, sample_trials

    assert set(TUNABLE) <= set(TrainConfig.__dataclass_fields__)
    space = default_space(pretrained=True)
    a, b = sample_trials(space, 6, seed=3), sample_trials(space, 6, seed=3)
    assert a == b and len({json.dumps(t, sort_keys=True) for t in a}) == 6
    assert sample_trials(space, 6, seed=4) != a
    for t in a:
        assert ("freeze_epochs" in t) == (t["strategy"] == "gradual")
    assert "strategy" not in default_space(pretrained=False)
    small = {"optimizer": Dimension.parse("optimizer", {"choice": ["adamw", "sgd"]})}
    with pytest.raises(UsageError, match="only 2 distinct"):
        sample_trials(small, 3, seed=0)
    # the baseline goes first and leaves the draws as they were; it counts among the trials
    assert sample_trials(space, 6, seed=3, baseline=True) == [{}, *a[:5]]
    # a drawn setting that is the trainer's defaults (adamw) trains the baseline again
    assert sample_trials(small, 2, seed=0, baseline=True) == [{}, {"optimizer": "sgd"}]
    with pytest.raises(UsageError, match="only 2 distinct"):
        sample_trials(small, 3, seed=0, baseline=True)
    fixed = {**small, "mixup": Dimension.parse("mixup", 0.2)}
    assert sample_trials(fixed, 1, seed=0, baseline=True) == [{"mixup": 0.2}]
    # the baseline drops what its strategy never reads, as the draws do
    linear = {
        "strategy": Dimension.parse("strategy", "linear"),
        "freeze_epochs": Dimension.parse("freeze_epochs", 1),
        "backbone_lr_mult": Dimension.parse("backbone_lr_mult", 0.1),
    }
    assert sample_trials(linear, 1, seed=0, baseline=True) == [{"strategy": "linear"}]
    # what a trial trains decides, the trainer's choices filled in: gradual is a pretrained
    # model's default strategy, 1e-3 AdamW's default LR, a shared --batch-size 64 the base's
    from zoo.train.config import TrainConfig

    choices = {
        "strategy": Dimension.parse("strategy", {"choice": ["gradual", "full"]}),
        "lr": Dimension.parse("lr", {"choice": [1e-3, 1e-2]}),
    }
    for pretrained, default in ((True, "gradual"), (False, "full")):
        drawn = sample_trials(choices, 4, seed=0, baseline=True, pretrained=pretrained)
        assert drawn[0] == {} and {"strategy": default, "lr": 1e-3} not in drawn[1:]
        assert len({json.dumps(t, sort_keys=True) for t in drawn[1:]}) == 3
        with pytest.raises(UsageError, match="only 4 distinct"):
            sample_trials(choices, 5, seed=0, baseline=True, pretrained=pretrained)
    sizes = {"batch_size": Dimension.parse("batch_size", {"choice": [32, 64]})}
    base = TrainConfig("mlp", "d", batch_size=64)
    assert sample_trials(sizes, 2, seed=0, baseline=True, base=base) == [{}, {"batch_size": 32}]
    # an option the trial never reads is dropped: ema_decay without ema, layer_decay when linear
    unread = {
        "ema_decay": Dimension.parse("ema_decay", 0.99),
        "layer_decay": Dimension.parse("layer_decay", 0.8),
        "strategy": Dimension.parse("strategy", "linear"),
    }
    assert sample_trials(unread, 1, seed=0, baseline=True) == [{"strategy": "linear"}]


def test_space_files_yaml_numbers_and_refusals(tmp_path: Path) -> None:
    """In-process: YAML 1.1 reads 1e-4 (no dot) as text, taken as the number it spells; a file
    that cannot be read or parsed, or is no mapping, is a usage error naming --space."""
    from zoo.errors import UsageError
    from zoo.train.tune.space import read_space

    f = tmp_path / "space.yaml"
    f.write_text("lr: {loguniform: [1e-4, 1e-2]}\nweight_decay: 5e-5\n")
    space = read_space(f, {})
    assert space["lr"].values == (1e-4, 1e-2) and space["weight_decay"].values == (5e-5,)
    for text, problem in [
        ("lr: [unclosed\n", "not valid YAML"),
        ("- lr\n", "give a mapping of option → dimension"),
        ("mixup: {choice: []}\n", "mixup: choice takes a non-empty list; got []"),
        ("optimizer: 1e-4\n", "optimizer cannot be '1e-4'"),
        ("label_smoothing: {uniform: [0.0, 1.5]}\n", "label_smoothing 1.5 is out of range"),
        ("weight_decay: -1\n", "weight_decay -1 is out of range: it must be finite and ≥ 0"),
    ]:
        f.write_text(text)
        with pytest.raises(UsageError, match=re.escape(problem)) as err:
            read_space(f, {})
        assert err.value.param_hint == "--space"
    with pytest.raises(UsageError, match="cannot read it"):
        read_space(tmp_path / "missing.yaml", {})


def test_asha_ranks_equal_accuracies_by_the_lower_validation_loss() -> None:
    """In-process: ASHA cannot rank equals (every photos trial at 100% val/acc stopped none),
    so the rank it decides by orders equal accuracies by loss and never reorders unequal ones,
    even one image apart in a million."""
    from zoo.train.epoch_row import EpochRow, TrainPass, ValScores
    from zoo.train.tune.book import rank

    def row(acc: float, loss: float) -> EpochRow:
        return EpochRow(1, 1, TrainPass(0.0, 0.0, 0.0, 1.0, 1.0), ValScores(loss, acc, acc), 0.1, 0)

    assert rank(row(1.0, 0.01), "val/acc") > rank(row(1.0, 0.02), "val/acc")
    assert rank(row(1.0, 1e9), "val/acc") > rank(row(1.0 - 1e-6, 0.0), "val/acc")
    assert rank(row(0.5, 0.3), "val/loss") == -0.3 and rank(row(0.9, 0.3), "val/macro_f1") < 0.9


def test_the_best_line_says_how_it_stands_against_the_defaults(tmp_path: Path) -> None:
    """In-process: the summary's best line beside the baseline: the defaults' figure, the
    baseline beating every drawn trial, or no drawn trial trained (--trials 1)."""
    from zoo.train.config import TrainConfig
    from zoo.train.epoch_row import EpochRow, TrainPass, ValScores
    from zoo.train.tune.book import SearchSpec, TrialRecord
    from zoo.train.tune.search import SearchResult

    def trial(name: str, acc: float | None, baseline: bool = False) -> TrialRecord:
        rows = [] if acc is None else [
            EpochRow(1, 1, TrainPass(0.0, 0.0, 0.0, 1.0, 1.0), ValScores(0.5, acc, acc), 0.1, 0)
        ]  # fmt: skip
        return TrialRecord(name, {}, "done", tuple(rows), baseline=baseline)

    spec = SearchSpec(TrainConfig("mlp", "d"), {}, 2, "fifo", "val/acc", 1.0, 0.0, None, 0, True)

    def best_line(*trials: TrialRecord) -> str:
        best = max(trials, key=lambda t: t.epochs[0].val.acc if t.epochs else -1)
        return SearchResult(tmp_path, trials, best, spec).lines()[len(trials)]

    base = trial("trial-000", 0.9, baseline=True)
    assert "(val/acc 0.9500; the defaults: 0.9000) → " in best_line(base, trial("trial-001", 0.95))
    assert "(val/acc 0.9000, the baseline: no drawn setting beat the defaults) → " in best_line(
        base, trial("trial-001", 0.8)
    )
    assert "(val/acc 0.9000, the baseline: no drawn trial trained to compare with) → " in (
        best_line(base)
    )
    assert "(val/acc 0.9000, the baseline: no drawn trial trained to compare with) → " in (
        best_line(base, trial("trial-001", None))  # the only drawn trial failed
    )
    assert "(val/acc 0.9500) → " in best_line(trial("trial-000", 0.95))  # --no-baseline
    stopped = replace(base, status="stopped")  # ASHA stopped the baseline at its first rung
    assert "; the defaults: 0.9000 (stopped after 1 epoch(s))) → " in best_line(
        stopped, trial("trial-001", 0.95)
    )


def test_a_recorded_space_refused_now_is_named_on_resume(tmp_path: Path) -> None:
    """In-process: a tune.json whose space an older zoo accepted and this one refuses."""
    from zoo.errors import CheckpointError
    from zoo.train.config import TrainConfig
    from zoo.train.tune.book import SearchSpec
    from zoo.train.tune.space import Dimension

    spec = SearchSpec(TrainConfig("mlp", "d"), {"mixup": Dimension.parse("mixup", 0.2)}, 2,
                      "fifo", "val/acc", 1.0, 0.0, None, 0, True)  # fmt: skip
    d = json.loads(json.dumps(spec.to_dict()))
    assert SearchSpec.from_dict(d) == spec
    d["space"]["label_smoothing"] = {"uniform": [0.0, 1.0]}  # 1.0: out of range since BOUNDS
    with pytest.raises(
        CheckpointError,
        match=r"recorded space is refused now: label_smoothing 1\.0 is out of range",
    ):
        SearchSpec.from_dict(d)


def test_a_ray_address_is_probed_only_where_it_names_a_port() -> None:
    """In-process: HOST:PORT and ray://HOST:PORT[/] are probed (refused: exit 1, the address
    named); auto and local are left to Ray."""
    from zoo.errors import InputError
    from zoo.train.tune.ray_run import _probe

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}/", f"[::1]:{port}"):
        with pytest.raises(
            InputError, match=re.escape(f"Cannot reach the Ray cluster at {address!r}")
        ):
            _probe(address, timeout_s=2)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        _probe(f"127.0.0.1:{listening.getsockname()[1]}")  # something answers: passes
    _probe("auto")
    _probe("local")


def _no_ray(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("Ray was started")


def _ray_started() -> bool:
    """Whether Ray was started in this process."""
    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def _has_epoch(book: Path, trial: str) -> bool:
    try:
        trials = json.loads(book.read_text())["trials"]
    except (OSError, ValueError):  # not written yet (its writes are atomic)
        return False
    return any(t["name"] == trial and t["epochs"] for t in trials)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_nodes(address: str, n: int, env: dict[str, str]) -> None:
    """Until the cluster at ``address`` has ``n`` live nodes (`ray status` lists them)."""
    ray = str(Path(ZOO).parent / "ray")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        r = subprocess.run(
            [ray, "status", "--address", address], capture_output=True, text=True, env=env
        )
        if r.returncode == 0 and r.stdout.count(" node_") >= n:
            return
        time.sleep(0.5)
    raise AssertionError(f"the Ray cluster at {address} did not reach {n} node(s)")
