"""Weights hashing, fetching and the Hub weights lock on small real files (seconds): every pin
is tested alone, so skipping any one comparison fails a test here. The Hub end-to-end tests
(pull, push, tamper) live in test_hub.py."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants
from safetensors.torch import save_file

import zoo
from tests.conftest import no_home, zoo_here
from tests.hub_cache import seed_repo
from zoo import hub, weights
from zoo.errors import (
    ArtifactError,
    InputError,
    NoHomeFolderError,
    UnsafeWeightsError,
    WeightsIntegrityError,
    WeightsNotFoundError,
)
from zoo.metadata import WeightSource

C1 = "1" * 40


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture()
def blob(tmp_path: Path) -> Path:
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 9000)  # 2.2 MiB: more than two default chunks
    return path


# ---- hashing ------------------------------------------------------------------------------


def test_sha256_file_matches_hashlib_over_several_chunks(blob: Path, tmp_path: Path) -> None:
    data = blob.read_bytes()
    assert weights.sha256_file(blob) == _sha(data)
    assert weights.sha256_file(blob, chunk=1000) == _sha(data)
    assert weights.sha256_file(str(blob), chunk=len(data) + 1) == _sha(data)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert weights.sha256_file(empty) == _sha(b"")


def test_verify_file_full_hash(blob: Path) -> None:
    good = _sha(blob.read_bytes())
    assert weights.verify_file(blob, sha256=good) == good
    assert weights.verify_file(blob) == good  # nothing pinned: only reports the hash
    bad = "0" * 64
    with pytest.raises(WeightsIntegrityError) as exc:
        weights.verify_file(blob, sha256=bad)
    assert (exc.value.path, exc.value.expected, exc.value.actual) == (str(blob), bad, good)
    assert str(exc.value) == (
        f"Weights file {blob} failed its hash check: expected sha256 {bad}, got {good}. The "
        "file is corrupt or was tampered with; delete it and fetch it again."
    )


def test_verify_file_prefix_and_precedence(blob: Path) -> None:
    good = _sha(blob.read_bytes())
    assert weights.verify_file(blob, prefix=good[:8]) == good
    with pytest.raises(WeightsIntegrityError) as exc:
        weights.verify_file(blob, prefix="deadbeef")
    assert (exc.value.path, exc.value.expected, exc.value.actual) == (str(blob), "deadbeef…", good)
    with pytest.raises(WeightsIntegrityError):  # the suffix is no prefix
        weights.verify_file(blob, prefix=good[-8:])
    # a full hash wins over the prefix, both ways
    assert weights.verify_file(blob, sha256=good, prefix="deadbeef") == good
    with pytest.raises(WeightsIntegrityError) as exc:
        weights.verify_file(blob, sha256="f" * 64, prefix=good[:8])
    assert exc.value.expected == "f" * 64


# ---- torchvision files --------------------------------------------------------------------


@pytest.fixture()
def torch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    hub_dir = tmp_path / "torch-hub"
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(hub_dir))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("ZOO_OFFLINE", raising=False)
    return hub_dir


def _tv(data: bytes, **kw: str) -> WeightSource:
    return WeightSource(
        kind="torchvision", url="https://example.org/w/tiny-12345678.pth", filename="tiny.pth", **kw
    )


def test_torchvision_cache_path(torch_home: Path) -> None:
    assert weights.torchvision_cache_path(_tv(b"")) == torch_home / "checkpoints" / "tiny.pth"


def test_cached_torchvision_file_is_verified_on_every_load(torch_home: Path) -> None:
    path = torch_home / "checkpoints" / "tiny.pth"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"weights")
    assert weights.fetch_weights(_tv(b"", sha256=_sha(b"weights"))) == path
    path.write_bytes(b"tampered")
    with pytest.raises(WeightsIntegrityError):
        weights.fetch_weights(_tv(b"", sha256=_sha(b"weights")))
    with pytest.raises(WeightsIntegrityError):
        weights.fetch_weights(_tv(b"", hash_prefix=_sha(b"weights")[:8]))


def test_a_model_folders_own_weights_say_how_to_make_them_again(tmp_path: Path) -> None:
    """A model folder's weights (a local file, pinned by its config) that no longer match:
    the error says how to restore or remake the folder, not to fetch what nothing can fetch."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"weights")
    local = WeightSource(kind="local", path=str(path), sha256=_sha(b"weights"))
    assert weights.fetch_weights(local) == path
    path.write_bytes(b"truncat")
    with pytest.raises(WeightsIntegrityError) as exc:
        weights.fetch_weights(local)
    said = str(exc.value)
    assert f"Weights file {path} failed its hash check" in said
    assert "fetch it again" not in said and "restore the folder from a copy" in said
    assert "`zoo finetune`" in said
    told = weights.availability(local).describe()  # what `zoo info FOLDER` says of it
    assert told.startswith(f"no: {path} fails its pinned hash") and "restore the folder" in told
    path.unlink()
    told = weights.availability(local).describe()
    assert told.startswith(f"no: {path} is not there") and "download" not in told


@pytest.mark.parametrize("var", ["HF_HUB_OFFLINE", "ZOO_OFFLINE"])
def test_offline_and_not_cached(
    torch_home: Path, monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    monkeypatch.setenv(var, "1")
    calls = []
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: calls.append(a))
    path = torch_home / "checkpoints" / "tiny.pth"
    with pytest.raises(WeightsNotFoundError) as exc:
        weights.fetch_weights(_tv(b""))
    assert str(exc.value) == (
        f"Weights tiny.pth are not in the torch hub cache ({path}) and downloads are disabled "
        "(offline). Copy the file there or go online."
    )
    assert calls == [] and not path.parent.exists()


def test_online_download_goes_through_a_partial_file(
    torch_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    seen = []

    def download(url: str, dst: str, hash_prefix: str | None = None) -> None:
        seen.append((url, dst, hash_prefix))
        Path(dst).write_bytes(b"weights")

    monkeypatch.setattr(torch.hub, "download_url_to_file", download)
    final = torch_home / "checkpoints" / "tiny.pth"
    final.parent.mkdir(parents=True)
    (final.parent / "other.pth").write_bytes(b"another entry's weights")  # the cache exists
    got = weights.fetch_weights(_tv(b"", hash_prefix="ab12", sha256=_sha(b"weights")))
    assert got == final and final.read_bytes() == b"weights"
    assert seen == [("https://example.org/w/tiny-12345678.pth", str(final) + ".partial", "ab12")]
    assert sorted(p.name for p in final.parent.iterdir()) == ["other.pth", "tiny.pth"]


def test_failed_download_leaves_nothing_and_says_where_to_put_the_file(
    torch_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def download(url: str, dst: str, hash_prefix: str | None = None) -> None:
        Path(dst).write_bytes(b"half")
        raise OSError("connection reset")

    monkeypatch.setattr(torch.hub, "download_url_to_file", download)
    final = torch_home / "checkpoints" / "tiny.pth"
    with pytest.raises(WeightsNotFoundError) as exc:
        weights.fetch_weights(_tv(b""))
    assert str(exc.value) == (
        "Could not download https://example.org/w/tiny-12345678.pth (connection reset). Place "
        f"the file at {final} (torch hub cache, $TORCH_HOME) or retry with network access."
    )
    assert isinstance(exc.value.__cause__, OSError)
    assert list(final.parent.iterdir()) == []

    def no_route(url: str, dst: str, hash_prefix: str | None = None) -> None:
        raise OSError("name resolution failed")  # before a single byte was written

    monkeypatch.setattr(torch.hub, "download_url_to_file", no_route)
    with pytest.raises(WeightsNotFoundError, match=r"\(name resolution failed\)"):
        weights.fetch_weights(_tv(b""))


# ---- Hub and local files ------------------------------------------------------------------


def test_hub_errors_become_one_error_with_repo_revision_and_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import httpx2
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    response = httpx2.Response(404, request=httpx2.Request("GET", "https://hub/x"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cases = [
        (
            LocalEntryNotFoundError("x"),
            "model.safetensors of hf:me/m@main is not in the Hugging Face cache and the Hub cannot "
            "be reached (HF_HUB_OFFLINE=1). Fetch it once with network access: `zoo pull "
            "hf:me/m@main` (unset HF_HUB_OFFLINE).",
        ),
        (RevisionNotFoundError("x", response=response), "Revision None does not exist in hf:me/m."),
        (
            RepositoryNotFoundError("x", response=response),
            "Hub repo 'me/m' does not exist or needs a token (`hf auth login`).",
        ),
        (EntryNotFoundError("x"), "hf:me/m@main has no model.safetensors."),
    ]
    for raised, message in cases:
        with (
            pytest.raises(WeightsNotFoundError) as exc,
            weights.hub_errors("me/m", None, "model.safetensors"),
        ):
            raise raised
        assert str(exc.value) == message and exc.value.__cause__ is raised
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with (
        pytest.raises(WeightsNotFoundError, match=r"\(HF_HUB_OFFLINE=0\)"),
        weights.hub_errors("me/m", "v2", "w"),
    ):
        raise LocalEntryNotFoundError("x")
    with (
        pytest.raises(WeightsNotFoundError, match=r"^Revision 'v2' does not"),
        weights.hub_errors("me/m", "v2", "w"),
    ):
        raise RevisionNotFoundError("x", response=response)
    with pytest.raises(KeyError), weights.hub_errors("me/m", "v2", "w"):
        raise KeyError("not a Hub error: passes through")


def test_hub_download_asks_for_the_exact_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    calls = []

    def fake(repo_id: str, filename: str, revision: str | None = None) -> str:
        calls.append((repo_id, filename, revision))
        if revision == "absent":
            raise LocalEntryNotFoundError("not cached")
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    assert weights.hub_download("me/m", "w.safetensors", "abc") == tmp_path / "w.safetensors"
    assert calls == [("me/m", "w.safetensors", "abc")]
    with pytest.raises(WeightsNotFoundError) as exc:
        weights.hub_download("me/m", "w.safetensors", "absent")
    assert str(exc.value).startswith(
        "w.safetensors of hf:me/m@absent is not in the Hugging Face cache"
    )


def _hub_source(filename: str, sha: str | None = None) -> WeightSource:
    return WeightSource(kind="hub", repo_id="me/m", filename=filename, revision="r", sha256=sha)


def test_hub_weights_are_safetensors_only_and_hash_checked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    file = tmp_path / "w.safetensors"
    file.write_bytes(b"weights")
    got = []
    monkeypatch.setattr(weights, "hub_download", lambda *a: got.append(a) or file)
    with pytest.raises(UnsafeWeightsError) as exc:
        weights.fetch_weights(_hub_source("pytorch_model.bin"))
    assert str(exc.value) == (
        "Refusing 'pytorch_model.bin' from hf:me/m: only safetensors are loaded from the Hub. "
        "Convert pickle checkpoints with `zoo convert`."
    )
    assert got == []  # refused before any download
    assert weights.fetch_weights(_hub_source("w.safetensors")) == file
    assert weights.fetch_weights(_hub_source("w.safetensors", _sha(b"weights"))) == file
    assert got[0] == ("me/m", "w.safetensors", "r")
    with pytest.raises(WeightsIntegrityError):
        weights.fetch_weights(_hub_source("w.safetensors", _sha(b"other")))


def test_local_weights(tmp_path: Path) -> None:
    file = tmp_path / "w.safetensors"
    file.write_bytes(b"weights")
    local = WeightSource(kind="local", path=str(file), sha256=_sha(b"weights"))
    assert weights.fetch_weights(local) == file
    assert weights.fetch_weights(WeightSource(kind="local", path=str(file))) == file
    with pytest.raises(WeightsIntegrityError):
        weights.fetch_weights(WeightSource(kind="local", path=str(file), sha256="0" * 64))
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(WeightsNotFoundError, match=rf"^Weights file {missing} does not exist\.$"):
        weights.fetch_weights(WeightSource(kind="local", path=str(missing)))
    with pytest.raises(WeightsNotFoundError) as exc:
        weights.fetch_weights(WeightSource())
    assert str(exc.value) == "This entry has no pretrained weights (random initialisation)."


# ---- reading state dicts without unpickling -----------------------------------------------


def _sd() -> dict[str, torch.Tensor]:
    return {"a.weight": torch.arange(6.0).reshape(2, 3), "a.bias": torch.tensor([1.0, -1.0])}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_read_state_dict_formats(tmp_path: Path) -> None:
    save_file(_sd(), tmp_path / "w.safetensors")
    torch.save(_sd(), tmp_path / "plain.pth")
    torch.save({"state_dict": _sd(), "epoch": 3}, tmp_path / "wrapped.pth")
    for name in ("w.safetensors", "plain.pth", "wrapped.pth"):
        assert _same(weights.read_state_dict(tmp_path / name), _sd()), name
    save_file(_sd(), tmp_path / "w.safetensors")
    assert _same(
        weights.load_weights(WeightSource(kind="local", path=str(tmp_path / "w.safetensors"))),
        _sd(),
    )


def test_a_checkpoint_saved_on_a_gpu_loads_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.serialization as serialization

    with monkeypatch.context() as m:  # what torch.save writes for tensors that lived on cuda:0
        m.setattr(serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(_sd(), tmp_path / "gpu.pth")
    got = weights.read_state_dict(tmp_path / "gpu.pth")
    assert _same(got, _sd()) and {v.device.type for v in got.values()} == {"cpu"}


class _Pickled:
    pass


def test_read_state_dict_refuses_pickles_and_non_tensors(tmp_path: Path) -> None:
    torch.save({"model": _Pickled()}, tmp_path / "obj.pth")
    with pytest.raises(UnsafeWeightsError) as exc:
        weights.read_state_dict(tmp_path / "obj.pth")
    assert str(exc.value).startswith(f"{tmp_path / 'obj.pth'} cannot be loaded without unpickling")
    assert str(exc.value).endswith("If you trust it, convert it with `zoo convert --trust`.")
    assert "unpickling arbitrary objects (Weights only load failed." in str(exc.value)
    bad = [
        ("mixed.pth", {"w": torch.zeros(1), "epoch": 3}),
        ("list.pth", [torch.zeros(1)]),
        ("wrapped_mixed.pth", {"state_dict": {"w": torch.zeros(1), "n": 1}}),
    ]
    for name, obj in bad:
        torch.save(obj, tmp_path / name)
        with pytest.raises(UnsafeWeightsError) as exc:
            weights.read_state_dict(tmp_path / name)
        assert str(exc.value) == f"{tmp_path / name} does not hold a plain state_dict of tensors."
    # "state_dict" that is not a dict is taken as the (invalid) top level, not unwrapped
    torch.save({"state_dict": torch.zeros(1), "w": torch.ones(1)}, tmp_path / "sd_tensor.pth")
    got = weights.read_state_dict(tmp_path / "sd_tensor.pth")
    assert set(got) == {"state_dict", "w"}


# ---- the Hub weights lock -----------------------------------------------------------------


@pytest.fixture()
def zoo_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "zoo-home"
    monkeypatch.setenv("ZOO_HOME", str(home))
    return home


def test_lock_path(zoo_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert hub.lock_path() == zoo_home / "weights.lock.json"
    monkeypatch.delenv("ZOO_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert hub.lock_path() == tmp_path / "me" / ".cache" / "zoo" / "weights.lock.json"
    # no ZOO_HOME and no home at all (a container's user): named, with what to set
    no_home(monkeypatch)
    with pytest.raises(NoHomeFolderError) as err:
        hub.lock_path()
    assert str(err.value) == (
        "zoo's home folder '~/.cache/zoo' starts with '~', but $HOME is unset to expand it. "
        "Set ZOO_HOME (or HOME) to a folder."
    )


def test_lock_records_first_then_compares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "not" / "yet" / "there"))
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"first")
    b.write_bytes(b"second")
    assert not hub.lock_path().exists() and hub._read_lock() == {}
    assert hub.verify_locked("me/m@c/w", a) == _sha(b"first")
    assert hub.verify_locked("me/other@c/w", b) == _sha(b"second")
    lock = json.loads(hub.lock_path().read_text())
    assert lock == {"me/m@c/w": _sha(b"first"), "me/other@c/w": _sha(b"second")}
    assert hub._read_lock() == lock
    assert hub.verify_locked("me/m@c/w", a) == _sha(b"first")  # same file again: fine
    with pytest.raises(WeightsIntegrityError) as exc:
        hub.verify_locked("me/m@c/w", b)  # same key, other bytes
    assert (exc.value.path, exc.value.expected, exc.value.actual) == (
        str(b),
        _sha(b"first"),
        _sha(b"second"),
    )
    assert json.loads(hub.lock_path().read_text()) == lock  # a mismatch never rewrites the lock


def _snapshot(root: Path, weights_bytes: bytes, config_sha: str | None = None) -> Path:
    snap = root / C1
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "model.safetensors").write_bytes(weights_bytes)
    config = {
        "zoo_schema": 1,
        "base": "mlp.scratch",
        "num_classes": 2,
        "class_names": ["a", "b"],
        "weights_sha256": config_sha or _sha(weights_bytes),
    }
    (snap / "config.json").write_text(json.dumps(config))
    (snap / "README.md").write_text("card")
    return snap


def test_snapshot_checked_against_its_config(zoo_home: Path, tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, b"weights", config_sha="0" * 64)
    with pytest.raises(WeightsIntegrityError) as exc:
        hub.verify_snapshot(snap, "me/m")
    assert (exc.value.path, exc.value.expected, exc.value.actual) == (
        str(snap / "model.safetensors"),
        "0" * 64,
        _sha(b"weights"),
    )


def test_snapshot_checked_against_the_lock_alone(zoo_home: Path, tmp_path: Path) -> None:
    """The config is consistent with the new file: only the lock can tell it was replaced."""
    snap = _snapshot(tmp_path, b"weights")
    hub.verify_snapshot(snap, "me/m")
    assert hub._read_lock() == {f"me/m@{C1}/model.safetensors": _sha(b"weights")}
    _snapshot(tmp_path, b"replaced")  # weights and config.json rewritten consistently
    with pytest.raises(WeightsIntegrityError) as exc:
        hub.verify_snapshot(snap, "me/m")
    assert (exc.value.expected, exc.value.actual) == (_sha(b"weights"), _sha(b"replaced"))
    hub.verify_snapshot(snap, "me/other")  # the lock is per repo@commit


def test_snapshot_must_be_a_model_folder(zoo_home: Path, tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, b"weights")
    (snap / "README.md").unlink()
    with pytest.raises(ArtifactError, match=r"missing README\.md"):
        hub.verify_snapshot(snap, "me/m")
    assert not hub.lock_path().exists()  # nothing recorded for a broken folder


def test_pulled_model_replaced_in_cache_with_a_consistent_config_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zoo_home: Path
) -> None:
    """End to end through create_model: a cached snapshot swapped for another model whose own
    config.json matches it passes every check except the lock recorded at the first pull."""
    from zoo.bundle import bundle

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    torch.manual_seed(0)
    first = bundle("mlp", tmp_path / "first")
    torch.manual_seed(1)
    second = bundle("mlp", tmp_path / "second")
    files = ("model.safetensors", "config.json", "README.md")
    seed_repo(cache, "me/swap", {f: first / f for f in files}, commit=C1)
    zoo.create_model(f"hf:me/swap@{C1}")
    seed_repo(cache, "me/swap", {f: second / f for f in files}, commit=C1)
    with pytest.raises(WeightsIntegrityError) as exc:
        zoo.create_model(f"hf:me/swap@{C1}")
    assert exc.value.expected == weights.sha256_file(first / "model.safetensors")
    assert exc.value.actual == weights.sha256_file(second / "model.safetensors")


def test_safetensors_never_go_through_torch_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.14's torch.load reads safetensors too, so only this test tells the two readers
    apart: zoo uses safetensors' own reader, whatever torch version is installed."""
    save_file(_sd(), tmp_path / "w.safetensors")

    def no_torch_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("torch.load called on a safetensors file")

    monkeypatch.setattr(torch, "load", no_torch_load)
    assert _same(weights.read_state_dict(tmp_path / "w.safetensors"), _sd())


def test_torch_s_escape_hatch_does_not_reopen_unpickling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 flips torch.load's *default* to full unpickling; zoo
    passes weights_only=True explicitly, so a pickle's code never runs."""
    ran = tmp_path / "unpickling-ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.mkdir, (str(ran),))  # what a malicious file would do, harmlessly

    torch.save({"w": torch.ones(1), "x": Payload()}, tmp_path / "evil.pth")
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UnsafeWeightsError):
        weights.read_state_dict(tmp_path / "evil.pth")
    assert not ran.exists()


def test_read_state_dict_names_a_torn_or_foreign_file_without_offering_to_unpickle(
    tmp_path: Path,
) -> None:
    """A truncated download or a file of another kind is an input error that says so: it is
    not a pickle to trust, and ``--trust`` would not load it either."""
    torch.save({"w": torch.ones(3)}, tmp_path / "whole.pth")
    whole = (tmp_path / "whole.pth").read_bytes()
    save_file({"w": torch.ones(3)}, str(tmp_path / "whole.safetensors"))
    cases = {
        "torn.pth": whole[: len(whole) // 2],
        "empty.pth": b"",
        "notes.pth": b"hello world\n",
        "page.pth": b"<!doctype html><title>404 Not Found</title>\n",
        "record.pth": b'{"w": [1, 2, 3]}\n',
        "torn.safetensors": (tmp_path / "whole.safetensors").read_bytes()[:20],
        "notes.safetensors": b"hello world\n",
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(InputError) as exc:
            weights.read_state_dict(tmp_path / name)
        said = str(exc.value)
        assert not isinstance(exc.value, UnsafeWeightsError), name
        assert said.startswith(f"{tmp_path / name} is not a readable "), said
        assert "truncated download or another kind of file" in said, said
        assert "--trust" not in said, said
    fix = (
        "a truncated download or another kind of file. Fetch it again, or pass a .safetensors file."
    )
    said = {}
    for name in ("empty.pth", "notes.pth", "torn.pth", "torn.safetensors"):
        with pytest.raises(InputError) as exc:
            weights.read_state_dict(tmp_path / name)
        said[name] = str(exc.value)
    assert (
        said["empty.pth"]
        == f"{tmp_path / 'empty.pth'} is not a readable PyTorch checkpoint (EOFError): {fix}"
    )
    assert said["notes.pth"].startswith(
        f"{tmp_path / 'notes.pth'} is not a readable PyTorch checkpoint (KeyError: "
    )
    assert said["torn.pth"].startswith(
        f"{tmp_path / 'torn.pth'} is not a readable PyTorch checkpoint (RuntimeError: PytorchStreamReader"
    )
    assert said["torn.pth"].endswith(f"): {fix}")
    assert said["torn.safetensors"].startswith(
        f"{tmp_path / 'torn.safetensors'} is not a readable safetensors file (Error while "
    )
    assert said["torn.safetensors"].endswith(
        "): a truncated download or another kind of file. Fetch or export it again."
    )


def test_convert_trusted_names_a_file_that_still_does_not_load(tmp_path: Path) -> None:
    (tmp_path / "notes.pth").write_text("hello world\n")
    r = zoo_here(
        "convert",
        str(tmp_path / "notes.pth"),
        "--arch",
        "mlp",
        "--trust",
        "-o",
        str(tmp_path / "m"),
    )
    assert r.returncode == 1, r.stderr
    assert f"{tmp_path / 'notes.pth'} could not be loaded even trusted" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "m").exists()
