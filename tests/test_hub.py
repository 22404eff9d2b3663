"""The artifact contract, Hub pull through a pre-seeded offline cache, push up to the HfApi
boundary, conversion of legacy checkpoints, and lineage in the registry."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from huggingface_hub import HfApi, ModelCard, constants, scan_cache_dir
from safetensors.torch import save_file

import zoo
from tests.conftest import run_zoo, zoo_here
from tests.hub_cache import seed_repo
from zoo.artifact import REQUIRED_FILES
from zoo.errors import (
    ArtifactError,
    InputError,
    StateDictMismatchError,
    UnsafeWeightsError,
    WeightsIntegrityError,
    WeightsNotFoundError,
)

C1, C2 = "1" * 40, "2" * 40


@pytest.fixture()
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "zoo-home"))
    return cache


@pytest.fixture(scope="module")
def digits_run(small_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    r = zoo_here(
        "finetune",
        "mlp",
        "--data",
        str(small_digits),
        "--epochs",
        "2",
        "--runs",
        str(runs),
        "--name",
        "digits",
        "--num-workers",
        "0",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    return runs / "digits"


def _files(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.iterdir() if not p.name.startswith(".")}


def _out(model: torch.nn.Module, seed: int = 0) -> torch.Tensor:
    x = torch.randn(
        4, *zoo.model_info("mlp").input_size, generator=torch.Generator().manual_seed(seed)
    )
    with torch.no_grad():
        return model(x)


def test_run_model_folder_contract_and_card(digits_run: Path) -> None:
    folder = digits_run / "model"
    assert {p.name for p in folder.iterdir()} == REQUIRED_FILES
    card = ModelCard.load(folder / "README.md")
    config = json.loads((folder / "config.json").read_text())
    acc = config["metrics"]["val/acc"]
    assert any(r.metric_value == pytest.approx(acc) for r in card.data.eval_results)
    assert card.data.base_model == "mlp.scratch" and "Lineage" in card.text
    assert config["lineage"] == ["mlp.scratch"] and config["data"]["fingerprint"]


def test_bundle_registry_entry_roundtrip(tmp_path: Path, mobilenet_weights: Path) -> None:
    r = zoo_here("bundle", "mobilenet_v2", str(tmp_path / "mb"))
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (tmp_path / "mb").iterdir()} == REQUIRED_FILES
    a, b = zoo.create_model("mobilenet_v2"), zoo.create_model(str(tmp_path / "mb"))
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


def test_bundle_push_pull_elsewhere_identical(
    digits_run: Path, tmp_path: Path, hf_cache: Path
) -> None:
    bundled = tmp_path / "bundle"
    assert zoo_here("bundle", str(digits_run), str(bundled)).returncode == 0
    sent = _RecordingApi()
    from zoo.hub import push

    result = push(bundled, "me/digits-mlp", api=sent, private=True)
    assert result["files"] == ["README.md", "config.json", "model.safetensors"]
    seed_repo(hf_cache, "me/digits-mlp", _files(bundled), commit=C1)  # what the Hub would now hold
    assert scan_cache_dir(hf_cache).repos  # huggingface_hub recognises the layout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run_zoo(
        "pull",
        f"hf:me/digits-mlp@{C1}",
        "--json",
        cwd=elsewhere,
        env={"HF_HUB_CACHE": str(hf_cache), "ZOO_HOME": str(tmp_path / "zoo-home")},
    )
    assert r.returncode == 0, r.stderr
    pulled = json.loads(r.stdout)
    assert pulled["base"] == "mlp.scratch" and pulled["lineage"][0] == "mlp.scratch"
    original = zoo.create_model(str(digits_run))
    again = zoo.create_model(f"hf:me/digits-mlp@{C1}")
    assert torch.equal(_out(original), _out(again))
    assert zoo.create_model("hf:me/digits-mlp").zoo_info.num_classes == 10  # refs/main


def test_bundle_and_convert_never_write_over_a_folder_of_other_files(
    digits_run: Path, small_digits: Path, tmp_path: Path
) -> None:
    """A model folder is written whole, replacing what is there: named a folder of the user's
    own files (their data, a run, a repository) or a file, bundle and convert refuse, exit 1,
    and every file stays; a model folder (an earlier bundle) and an empty folder are fine."""
    data = tmp_path / "digits"
    shutil.copytree(small_digits / "digit_3", data / "digit_3")
    (data / "notes.txt").write_text("keep")
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    a_file = tmp_path / "f.txt"
    a_file.write_text("keep")
    before = {p: p.read_bytes() for p in (*data.rglob("*.*"), a_file)}
    plain = tmp_path / "plain.pth"
    torch.save(zoo.create_model("mlp", weights="none").state_dict(), plain)
    for target in (data, digits_run, repo, a_file):
        for cmd in (("bundle", str(digits_run)), ("convert", str(plain), "--arch", "mlp", "-o")):
            r = zoo_here(*cmd, str(target))
            assert r.returncode == 1, (cmd, target, r.stdout, r.stderr)
            assert str(target) in r.stderr and "Traceback" not in r.stderr
    assert "notes.txt" in zoo_here("bundle", str(digits_run), str(data)).stderr
    assert {p: p.read_bytes() for p in (*data.rglob("*.*"), a_file)} == before
    assert (repo / ".git").is_dir() and (digits_run / "model" / "model.safetensors").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    for target in (empty, empty):  # the second time, over the first bundle
        assert zoo_here("bundle", str(digits_run), str(target)).returncode == 0
    assert {p.name for p in empty.iterdir()} == REQUIRED_FILES


def test_revision_pin_selects_the_commit(digits_run: Path, tmp_path: Path, hf_cache: Path) -> None:
    first = tmp_path / "v1"
    assert zoo_here("bundle", str(digits_run), str(first)).returncode == 0
    model = zoo.create_model(str(first))
    with torch.no_grad():
        model.head.bias.add_(1.0)
    from zoo.artifact import read_config, save_model_folder
    from zoo.model_config import ModelConfig

    cfg = read_config(first).to_dict()
    second = save_model_folder(
        model,
        tmp_path / "v2",
        ModelConfig({k: v for k, v in cfg.items() if k != "weights_sha256"}),
        (first / "README.md").read_text(),
    )
    seed_repo(hf_cache, "me/pinned", _files(first), commit=C1, ref=None)
    seed_repo(hf_cache, "me/pinned", _files(second), commit=C2)
    old, new = zoo.create_model(f"hf:me/pinned@{C1}"), zoo.create_model("hf:me/pinned")
    assert torch.allclose(_out(new) - _out(old), torch.ones(1))


def test_tampered_cache_file_is_refused(digits_run: Path, hf_cache: Path) -> None:
    snap = seed_repo(hf_cache, "me/tamper", _files(digits_run / "model"), commit=C1)
    zoo.create_model(f"hf:me/tamper@{C1}")  # first load records the hash
    blob = (snap / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(
        WeightsIntegrityError,
        match=r"model\.safetensors failed its hash check: expected sha256 [0-9a-f]{64}, got [0-9a-f]{64}",
    ):
        zoo.create_model(f"hf:me/tamper@{C1}")


def test_offline_and_nothing_cached_names_repo_and_revision(hf_cache: Path) -> None:
    with pytest.raises(
        WeightsNotFoundError, match=rf"hf:me/absent@{C1}.*zoo pull hf:me/absent@{C1}"
    ):
        zoo.create_model(f"hf:me/absent@{C1}")
    r = run_zoo("pull", "hf:me/absent", env={"HF_HUB_CACHE": str(hf_cache)})
    assert r.returncode == 1 and "hf:me/absent@main" in r.stderr and "HF_HUB_OFFLINE=1" in r.stderr


def test_config_and_weights_disagree_on_classes(
    digits_run: Path, tmp_path: Path, hf_cache: Path
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    for name, src in _files(digits_run / "model").items():
        (bad / name).write_bytes(src.read_bytes())
    cfg = json.loads((bad / "config.json").read_text())
    cfg["num_classes"], cfg["class_names"] = 5, cfg["class_names"][:5]
    (bad / "config.json").write_text(json.dumps(cfg))
    seed_repo(hf_cache, "me/bad-classes", _files(bad), commit=C1)
    with pytest.raises(
        StateDictMismatchError, match="10 outputs in the weights but the model expects 5 classes"
    ):
        zoo.create_model(f"hf:me/bad-classes@{C1}")


def test_pickle_only_repo_is_refused(tmp_path: Path, hf_cache: Path) -> None:
    pth = tmp_path / "pytorch_model.bin"
    torch.save(zoo.create_model("mlp", weights="none").state_dict(), pth)
    cfg = tmp_path / "config.json"
    cfg.write_text("{}")
    seed_repo(hf_cache, "me/pickled", {"pytorch_model.bin": pth, "config.json": cfg}, commit=C1)
    with pytest.raises(UnsafeWeightsError, match="zoo convert"):
        zoo.create_model(f"hf:me/pickled@{C1}")


def test_timm_hub_name_resolves_offline(hf_cache: Path) -> None:
    import timm

    weights = hf_cache.parent / "model.safetensors"
    save_file(timm.create_model("resnet18").state_dict(), weights)
    seed_repo(hf_cache, "timm/resnet18.a1_in1k", {"model.safetensors": weights}, commit=C1)
    a = zoo.create_model("hf-hub:timm/resnet18.a1_in1k")
    b = zoo.create_model("resnet18.a1_in1k")
    assert a.zoo_load_report.loaded and not b.zoo_load_report.missing
    assert torch.equal(a.fc.weight, b.fc.weight)


class _RecordingApi(HfApi):
    """The HfApi boundary: records the exact calls and operations instead of sending them."""

    def __init__(self) -> None:
        super().__init__(token="hf_test")
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def create_repo(self, repo_id: str, **kw: Any) -> Any:  # type: ignore[override]
        self.calls.append(("create_repo", {"repo_id": repo_id, **kw}))

    def create_branch(self, repo_id: str, **kw: Any) -> Any:  # type: ignore[override]
        self.calls.append(("create_branch", {"repo_id": repo_id, **kw}))

    def create_commit(self, repo_id: str, operations: Any, **kw: Any) -> Any:  # type: ignore[override]
        self.calls.append(
            ("create_commit", {"repo_id": repo_id, "operations": list(operations), **kw})
        )
        return type("Info", (), {"commit_url": f"https://hub/{repo_id}/commit/x", "pr_url": None})()


def test_push_sends_one_commit_with_exact_files_and_card(digits_run: Path) -> None:
    from zoo.hub import push

    api = _RecordingApi()
    push(digits_run, "me/digits", api=api, revision="v1", private=True)
    names = [c[0] for c in api.calls]
    assert names == ["create_repo", "create_branch", "create_commit"]
    assert api.calls[0][1]["private"] is True and api.calls[1][1]["branch"] == "v1"
    ops = api.calls[2][1]["operations"]
    assert sorted(op.path_in_repo for op in ops) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    assert api.calls[2][1]["revision"] == "v1"
    card = next(op for op in ops if op.path_in_repo == "README.md")
    text = Path(card.path_or_fileobj).read_text()
    acc = json.loads((digits_run / "model" / "config.json").read_text())["metrics"]["val/acc"]
    assert f"{acc:.4f}" in text and "mlp.scratch → mlp.ft-digits" in text


def test_push_refuses_contract_breaks(digits_run: Path, tmp_path: Path) -> None:
    from zoo.hub import push

    folder = tmp_path / "f"
    folder.mkdir()
    for name, src in _files(digits_run / "model").items():
        (folder / name).write_bytes(src.read_bytes())
    (folder / "extra.pth").write_bytes(b"pickle")
    api = _RecordingApi()
    with pytest.raises(ArtifactError, match=r"extra\.pth"):
        push(folder, "me/x", api=api)
    assert api.calls == []  # nothing was sent


@pytest.fixture()
def refusing_hub() -> Any:
    """A Hub endpoint on loopback that refuses every request with the status it is set to."""
    import http.server
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        status = 401

        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b'{"error": "refused by the test"}'
            self.send_response(Refuse.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *args: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield Refuse, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_push_errors_say_what_to_do(
    digits_run: Path, refusing_hub: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the Hub's client raises on upload (no network, offline mode, a token refused or
    without write access) is an InputError naming the fix, through a real HfApi."""
    from tests.serving import free_port
    from zoo.hub import push

    handler, url = refusing_hub
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the tests run offline
    for status, words in [
        (401, "did not accept the token: run `hf auth login`"),
        (403, "may not write to me/digits: push to your own namespace"),
    ]:
        handler.status = status
        with pytest.raises(InputError, match=f"HTTP {status}") as exc:
            push(digits_run, "me/digits", api=HfApi(endpoint=url, token="hf_test"))
        assert words in str(exc.value)
        assert "hf_test" not in str(exc.value)
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(InputError, match=f"the Hub at {closed} cannot be reached"):
        push(digits_run, "me/digits", api=HfApi(endpoint=closed, token="hf_test"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(InputError, match="HF_HUB_OFFLINE is set: unset it"):
        push(digits_run, "me/digits", api=HfApi(endpoint=url, token="hf_test"))


def test_convert_legacy_checkpoint(tmp_path: Path) -> None:
    sd = zoo.create_model("mlp", weights="none").state_dict()
    plain = tmp_path / "plain.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}}, plain)
    r = zoo_here("convert", str(plain), "--arch", "mlp", "-o", str(tmp_path / "conv"))
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "conv"
    cfg = json.loads((folder / "config.json").read_text())
    from zoo.weights import sha256_file

    assert (
        cfg["provenance"]["source_sha256"] == sha256_file(plain)
        and not cfg["provenance"]["trusted_pickle"]
    )
    assert all(torch.equal(v, zoo.create_model(str(folder)).state_dict()[k]) for k, v in sd.items())
    legacy = tmp_path / "legacy.pth"
    torch.save(
        {"model": zoo.create_model("mlp", weights="none"), "note": object.__new__(_Legacy)}, legacy
    )
    refused = zoo_here("convert", str(legacy), "--arch", "mlp", "-o", str(tmp_path / "no"))
    assert (
        refused.returncode == 1 and "--trust" in refused.stderr and not (tmp_path / "no").exists()
    )


class _Legacy:
    pass


def test_convert_a_cut_network_counts_its_own_parameters_and_refuses_a_headless_file(
    tmp_path: Path, mobilenet_weights: Path
) -> None:
    """A trained mobilenet_v2_s16 checkpoint converts with its head's classes and its own
    parameter count (not the entry's head-less one); a checkpoint holding no head is no trained
    model: exit 1, saying how to train one from it, nothing written."""
    model = zoo.create_model("mobilenet_v2_s16", num_classes=4)
    trained = tmp_path / "s16.pth"
    torch.save(model.state_dict(), trained)
    r = zoo_here("convert", str(trained), "--arch", "mobilenet_v2_s16", "-o", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())
    from zoo.profile import count_params

    assert cfg["num_classes"] == 4 and cfg["params"] == count_params(model)
    back = zoo.create_model(str(tmp_path / "c"))
    assert torch.equal(back.classifier[1].weight, model.classifier[1].weight)
    bare = tmp_path / "bare.pth"
    torch.save({k: v for k, v in model.state_dict().items() if "classifier" not in k}, bare)
    no = zoo_here("convert", str(bare), "--arch", "mobilenet_v2_s16", "-o", str(tmp_path / "n"))
    said = " ".join(no.stderr.split())
    assert no.returncode == 1 and "holds no classifier.1 weights" in said, no.stderr
    assert "zoo finetune mobilenet_v2_s16.tv_in1k --weights" in said
    assert not (tmp_path / "n").exists()


def test_list_shows_runs_with_parent_and_lineage(digits_run: Path) -> None:
    r = run_zoo("list", "--json", "--runs", str(digits_run.parent), "--base", "mlp")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert "mlp.scratch" in rows and str(digits_run) in rows
    assert rows[str(digits_run)]["parent"] == "mlp.scratch"
    assert not any(n.startswith("resnet") for n in rows)
    info = run_zoo("info", str(digits_run), "--json")
    assert json.loads(info.stdout)["lineage"] == ["mlp.scratch", "ft-digits"]
