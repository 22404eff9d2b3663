"""README claims that had no test: each one checked the way a user would meet it.

Export formats and ``--jit script``, a parity breach through the real CLI, a pinned Hub commit
that never touches the network, ``push --create-pr``, ``convert --trust``, the non-finite loss
rollback with half the LR, and ``zoo eval`` figures against scikit-learn."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import zoo
from tests import toy_models
from tests.conftest import ROOT, run_zoo
from tests.hub_cache import seed_repo
from tests.toy_models import BRANCHY, zoo_with_toys
from zoo.samples import sample_image_paths
from zoo.transforms import eval_transform

C1 = "1" * 40


def _photos(info: Any) -> torch.Tensor:
    from PIL import Image

    tf = eval_transform(info)
    return torch.stack([tf(Image.open(p)) for p in sample_image_paths()])


@pytest.fixture(scope="module")
def branchy_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    toy_models.register()
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("branchy") / "w.safetensors"
    save_file(toy_models.Branchy().state_dict(), str(path))
    return path


# ---- export formats -----------------------------------------------------------------------


def test_jit_script_keeps_control_flow_that_trace_freezes(
    tmp_path: Path, branchy_weights: Path
) -> None:
    """`--jit script` really scripts: on real photos (the branch the export dummy did not take)
    the scripted file matches eager, the traced one does not."""
    files = {}
    for jit in ("script", "trace"):
        files[jit] = tmp_path / f"{jit}.ts"
        r = zoo_with_toys(
            "export", BRANCHY, "--format", "torchscript", "--jit", jit,
            "--weights", str(branchy_weights), "-o", str(files[jit]), "--json",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["format"] == "torchscript" and rep["exporter"] == jit and rep["parity"]["passed"]
        assert "FutureWarning" not in r.stderr  # torch's four, one per jit call: said once
        assert r.stderr.count("TorchScript (trace/script) is deprecated upstream") == 1
    eager = zoo.create_model(BRANCHY, weights=str(branchy_weights))
    x = _photos(eager.zoo_info)
    assert float(x.amax()) < 3.0
    with torch.no_grad():
        ref = eager(x)
        scripted = torch.jit.load(str(files["script"]))(x)
        traced = torch.jit.load(str(files["trace"]))(x)
    torch.testing.assert_close(scripted, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(traced, ref + 10.0, rtol=1e-5, atol=1e-5)  # the frozen branch


@pytest.mark.parametrize("fmt", ["pt2", "torchscript"])
def test_pt2_and_torchscript_files_match_eager_on_real_photos(tmp_path: Path, fmt: str) -> None:
    torch.manual_seed(0)
    weights = tmp_path / "w.safetensors"
    save_file(zoo.create_model("simple_cnn", weights="none").state_dict(), str(weights))
    out = tmp_path / f"m.{fmt}"
    r = run_zoo(
        "export", "simple_cnn", "--format", fmt, "--weights", str(weights), "-o", str(out), "--json"
    )
    assert r.returncode == 0, r.stderr
    assert "Unable to load package" not in r.stderr, r.stderr  # torch's warning on a scratch name
    rep = json.loads(r.stdout)
    assert rep["exporter"] == ("torch.export" if fmt == "pt2" else "trace")
    assert rep["parity"]["passed"] and rep["size_mb"] == float(f"{out.stat().st_size / 2**20:.4g}")
    eager = zoo.create_model("simple_cnn", weights=str(weights))
    x = _photos(eager.zoo_info)
    loaded = torch.export.load(str(out)).module() if fmt == "pt2" else torch.jit.load(str(out))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), eager(x), rtol=1e-5, atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, "w.safetensors"])


# ---- a parity breach through the CLI ------------------------------------------------------


def test_parity_breach_exits_1_and_allow_mismatch_keeps_the_file(tmp_path: Path) -> None:
    out = tmp_path / "b.onnx"
    r = zoo_with_toys("export", BRANCHY, "-o", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "does not match PyTorch: tensors differ: max abs 10" in r.stderr
    assert "Nothing was written; --allow-mismatch writes it anyway." in r.stderr
    assert "Traceback" not in r.stderr and list(tmp_path.iterdir()) == []
    kept = zoo_with_toys("export", BRANCHY, "-o", str(out), "--allow-mismatch", "--json")
    assert kept.returncode == 0, kept.stderr
    assert "warning: parity FAILED (written because of --allow-mismatch)" in kept.stderr
    report = json.loads(kept.stdout)
    assert report["parity"]["passed"] is False and report["parity"]["tensors"]["max_abs"] >= 9.99
    from zoo.onnx_meta import read_metadata

    assert read_metadata(out)["parity"]["passed"] is False  # the file says so too


# ---- Hub: a pinned commit never touches the network ---------------------------------------

NETWORK_GUARD = """
import os, socket
def _refuse(*args, **kwargs):
    with open(os.environ["NET_LOG"], "a") as f:
        f.write(f"network attempt: {args!r}\\n")
    raise OSError("network disabled by the test")
socket.socket.connect = _refuse
socket.socket.connect_ex = _refuse
socket.create_connection = _refuse
socket.getaddrinfo = _refuse
from zoo.cli.app import main
main()
"""


@pytest.fixture()
def mlp_folder(tmp_path: Path) -> Path:
    from zoo.bundle import bundle

    torch.manual_seed(0)
    return bundle("mlp", tmp_path / "mlp")


def test_pinned_commit_in_cache_never_touches_the_network(tmp_path: Path, mlp_folder: Path) -> None:
    import subprocess
    import sys

    cache = tmp_path / "hf-cache"
    files = {f: mlp_folder / f for f in ("model.safetensors", "config.json", "README.md")}
    seed_repo(cache, "me/pinned", files, commit=C1)
    net_log = tmp_path / "net.log"
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_OFFLINE", "HF_HUB_OFFLINE")}
    env.update(
        HF_HUB_CACHE=str(cache),
        ZOO_HOME=str(tmp_path / "zoo-home"),
        NET_LOG=str(net_log),
        HF_HUB_OFFLINE="0",  # online: only zoo's own rule keeps it off the network
    )

    def zoo_guarded(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", NETWORK_GUARD, *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
        )

    r = zoo_guarded("pull", f"hf:me/pinned@{C1}", "--json")
    assert r.returncode == 0, r.stderr
    assert not net_log.exists(), net_log.read_text()
    img = str(sample_image_paths()[1])
    p = zoo_guarded("predict", f"hf:me/pinned@{C1}", img, "--json")
    assert p.returncode == 0, p.stderr
    assert not net_log.exists(), net_log.read_text()
    # the guard works: an unpinned name asks the Hub for the current commit of main
    zoo_guarded("pull", "hf:me/pinned")
    assert "network attempt" in net_log.read_text()


# ---- Hub: push --create-pr ----------------------------------------------------------------


def test_push_create_pr_opens_a_pull_request_instead_of_a_branch(
    mlp_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub
    from typer.testing import CliRunner

    from tests.test_hub import _RecordingApi
    from zoo.cli.app import app

    made: list[_RecordingApi] = []

    class Api(_RecordingApi):
        def __init__(self, token: str | None = None) -> None:
            super().__init__()
            made.append(self)

        def create_commit(self, repo_id: str, operations: Any, **kw: Any) -> Any:  # type: ignore[override]
            super().create_commit(repo_id, operations, **kw)
            return type(
                "Info", (), {"commit_url": "c", "pr_url": f"https://hub/{repo_id}/discussions/1"}
            )()

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    runner = CliRunner()
    for extra, revision in (([], None), (["--revision", "v1"], "v1")):
        res = runner.invoke(
            app, ["push", str(mlp_folder), "me/fish", "--create-pr", *extra, "--json"]
        )
        assert res.exit_code == 0, res.output
        calls = made[-1].calls
        assert [c[0] for c in calls] == ["create_repo", "create_commit"]  # no branch created
        commit = calls[1][1]
        assert commit["create_pr"] is True and commit["revision"] == revision
        assert sorted(op.path_in_repo for op in commit["operations"]) == [
            "README.md",
            "config.json",
            "model.safetensors",
        ]
        sent = json.loads(res.stdout)
        assert sent["create_pr"] is True and sent["pr_url"] == "https://hub/me/fish/discussions/1"
    res = runner.invoke(app, ["push", str(mlp_folder), "me/fish", "--revision", "v1", "--json"])
    assert [c[0] for c in made[-1].calls] == ["create_repo", "create_branch", "create_commit"]
    assert made[-1].calls[2][1]["create_pr"] is False


# ---- convert --trust ----------------------------------------------------------------------


class _Legacy:
    """An object only full unpickling can rebuild (as in old training scripts)."""


@pytest.mark.parametrize("layout", ["module", "dict_with_module", "state_dict_and_objects"])
def test_convert_trust_reads_the_users_own_pickles(tmp_path: Path, layout: str) -> None:
    torch.manual_seed(0)
    model = zoo.create_model("mlp", weights="none")
    obj: Any = {
        "module": model,
        "dict_with_module": {"model": model, "epoch": 3, "note": _Legacy()},
        "state_dict_and_objects": {"state_dict": model.state_dict(), "note": _Legacy()},
    }[layout]
    pth = tmp_path / "legacy.pth"
    torch.save(obj, pth)
    code = "from zoo.cli.app import main; main()"  # run from the repo: _Legacy is importable
    import subprocess
    import sys

    refused = subprocess.run(
        [sys.executable, "-c", code, "convert", str(pth), "--arch", "mlp", "-o", str(tmp_path / "no")],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert refused.returncode == 1 and "--trust" in refused.stderr
    assert not (tmp_path / "no").exists()
    out = tmp_path / "conv"
    r = subprocess.run(
        [sys.executable, "-c", code, "convert", str(pth), "--arch", "mlp", "-o", str(out), "--trust"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "warning: --trust unpickles the file" in r.stderr
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["provenance"]["trusted_pickle"] is True
    from zoo.weights import sha256_file

    assert cfg["provenance"]["source_sha256"] == sha256_file(pth)
    loaded = zoo.create_model(str(out)).state_dict()
    assert all(torch.equal(v, loaded[k]) for k, v in model.state_dict().items())


# ---- non-finite losses: skip, roll back with half the LR, never NaN in the weights ---------


def _train(data: Path, runs: Path, name: str) -> Path:
    from zoo.train import TrainConfig, fit

    cfg = TrainConfig(
        model=toy_models.NANBURST,
        data=str(data),
        runs_root=str(runs),
        name=name,
        weights="none",
        epochs=2,
        batch_size=32,
        lr=0.01,
        save_every_steps=2,
        num_workers=0,
        progress=False,
        seed=0,
    )
    fit(cfg)
    return runs / name


def test_nonfinite_burst_rolls_back_with_half_the_lr_and_weights_stay_finite(
    small_digits: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    toy_models.register()
    run = _train(small_digits, tmp_path, "nan")
    err = capfd.readouterr().err
    assert "rolled back to the last checkpoint with LR × 0.5" in err
    last = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert (last["rollbacks"], last["lr_scale"]) == (1, 0.5)
    for path in sorted((run / "checkpoints").glob("*.pt")):
        state = torch.load(path, weights_only=True)["model"]
        assert all(torch.isfinite(v).all() for v in state.values()), path.name
    from safetensors.torch import load_file

    shipped = load_file(str(run / "model" / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in shipped.values())
    # the same run without the burst: same steps, twice the LR at the end
    monkeypatch.setattr(toy_models.NaNBurst, "burst", ())
    clean = _train(small_digits, tmp_path, "clean")
    ref = torch.load(clean / "checkpoints" / "last.pt", weights_only=True)
    assert ref["global_step"] == last["global_step"]
    lr = [g["lr"] for g in last["optimizer"]["param_groups"]]
    lr_ref = [g["lr"] for g in ref["optimizer"]["param_groups"]]
    assert lr == pytest.approx([x / 2 for x in lr_ref], rel=1e-12)


# ---- zoo eval against scikit-learn --------------------------------------------------------


def test_eval_figures_match_scikit_learn(small_digits: Path, tmp_path: Path) -> None:
    from sklearn import metrics

    r = run_zoo(
        "finetune", "mlp", "--data", str(small_digits), "--epochs", "1", "--lr", "2e-4",
        "--runs", str(tmp_path), "--name", "weak", "--num-workers", "0", "--no-progress",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = tmp_path / "weak"
    ev = run_zoo("eval", str(run), "--json")
    assert ev.returncode == 0, ev.stderr
    got = json.loads(ev.stdout)
    # independently: the shipped model on the run's val split, metrics by scikit-learn
    from PIL import Image

    split = json.loads((run / "split.json").read_text())
    classes = split["classes"]
    model = zoo.create_model(str(run))
    tf = eval_transform(model.zoo_info)
    rows = split["splits"]["val"]
    x = torch.stack([tf(Image.open(Path(split["root"]) / rel)) for rel, _ in rows])
    y = np.array([classes.index(c) for _, c in rows])
    with torch.no_grad():
        logits = model(x).numpy()
    labels = list(range(len(classes)))
    pred = logits.argmax(1)
    assert got["n"] == len(y) == 60
    assert got["acc"] == pytest.approx(metrics.accuracy_score(y, pred), abs=1e-9)
    top5 = metrics.top_k_accuracy_score(y, logits, k=5, labels=labels)
    assert got["top5"] == pytest.approx(top5, abs=1e-9)
    assert 0.2 < got["acc"] < got["top5"] < 1.0, "a weak model: top-5 differs from top-1"
    assert got["confusion_matrix"] == metrics.confusion_matrix(y, pred, labels=labels).tolist()
    p, rc, f1, support = metrics.precision_recall_fscore_support(
        y, pred, labels=labels, zero_division=0
    )
    for i, row in enumerate(got["per_class"]):
        assert row["class"] == classes[i] and row["support"] == support[i]
        assert (row["precision"], row["recall"], row["f1"]) == pytest.approx(
            (p[i], rc[i], f1[i]), abs=5e-5
        )
    assert got["macro_f1"] == pytest.approx(
        metrics.f1_score(y, pred, labels=labels, average="macro", zero_division=0), abs=5e-5
    )
    loss = nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(y))
    assert got["loss"] == pytest.approx(
        metrics.log_loss(y, torch.softmax(torch.from_numpy(logits), 1).numpy(), labels=labels),
        rel=1e-4,
    )
    assert got["loss"] == pytest.approx(float(loss), rel=1e-5)
