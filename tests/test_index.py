"""Embeddings you can search (issue #33): ``zoo index`` → ``zoo similar`` on a real SimpleCNN
run over real digits, the model's identity guarding every query, bad input, the index's
shards read back, the search backends against brute force, and the kNN score of
``zoo eval --ood`` on real photographs (scikit-image's) against digits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import zoo_here
from zoo.errors import ArtifactError


@pytest.fixture(scope="module")
def run(four_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("index-runs")
    r = zoo_here(
        "finetune", "simple_cnn", "--data", str(four_digits), "--epochs", "2", "--runs",
        str(runs), "--name", "cnn", "--num-workers", "0", "--no-progress", "--no-report",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return runs / "cnn"


@pytest.fixture(scope="module")
def index(run: Path, four_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("index") / "digits.index"
    r = zoo_here("index", str(run), str(four_digits), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["rows"] == len(list(four_digits.glob("*/*.png"))) and summary["skipped"] == 0
    return out


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from zoo.samples import write_photo_folder

    return write_photo_folder(tmp_path_factory.mktemp("photos"), per_class=3)


def test_index_then_similar(index: Path, four_digits: Path) -> None:
    queries = [
        sorted((four_digits / c).iterdir())[i] for c in ("digit_1", "digit_7") for i in (0, 5)
    ]
    r = zoo_here("similar", str(index), *map(str, queries), "-k", "6", "--json")
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert [f["image"] for f in found] == [str(q) for q in queries]
    same = []
    for q, f in zip(queries, found, strict=True):
        first, *rest = f["neighbours"]
        # an indexed image's nearest neighbour is itself (paths relative to the folder)
        assert first["path"] == str(q.relative_to(four_digits))
        assert first["similarity"] == pytest.approx(1.0, abs=1e-4)
        sims = [n["similarity"] for n in f["neighbours"]]
        assert sims == sorted(sims, reverse=True) and all(-1 <= s <= 1 + 1e-6 for s in sims)
        same += [n["path"].split("/")[0] == q.parent.name for n in rest]
    assert np.mean(same) >= 0.7, f"a digit's neighbours are mostly its class: {np.mean(same)}"
    text = zoo_here("similar", str(index), str(queries[0]), "-k", "2")
    assert text.returncode == 0 and str(queries[0].relative_to(four_digits)) in text.stdout


@pytest.mark.slow
def test_a_query_with_another_model_is_refused(
    run: Path, index: Path, four_digits: Path, photos: Path, tmp_path: Path
) -> None:
    """Another model's weights (the run's copy with changed weights, as after a resumed run):
    refused by ``similar --model``, by ``eval --index``, and when the index's own model changes."""
    from safetensors.numpy import load_file, save_file

    from zoo.weights import sha256_file

    other = tmp_path / "other"
    shutil.copytree(run, other, symlinks=True)
    weights, config = other / "model" / "model.safetensors", other / "model" / "config.json"
    tensors = load_file(weights)
    name = next(iter(tensors))

    def retrain(scale: float) -> None:  # new weights, recorded as a resumed run records them
        tensors[name] = tensors[name] * scale
        save_file(tensors, weights)
        cfg = json.loads(config.read_text())
        config.write_text(json.dumps({**cfg, "weights_sha256": sha256_file(weights)}))

    retrain(1.5)
    image = str(next((four_digits / "digit_3").iterdir()))
    r = zoo_here("similar", str(index), image, "--model", str(other))
    assert r.returncode == 1 and "other weights" in r.stderr and "Traceback" not in r.stderr
    e = zoo_here("eval", str(other), "--ood", str(photos), "--index", str(index))
    assert e.returncode == 1 and "other weights" in e.stderr, e.stderr
    stale = tmp_path / "stale.index"  # an index of `other`, whose weights then change again
    assert (
        zoo_here("index", str(other), str(four_digits / "digit_3"), "-o", str(stale)).returncode
        == 0
    )
    retrain(2.0)
    r = zoo_here("similar", str(stale), image)
    assert r.returncode == 1 and "rebuild it" in r.stderr


def test_bad_input_is_refused_clearly(run: Path, index: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    r = zoo_here("index", str(run), str(empty), "-o", str(tmp_path / "x"))
    assert r.returncode == 1 and "holds no images" in r.stderr
    r = zoo_here("index", str(run), str(tmp_path / "nope"), "-o", str(tmp_path / "x"))
    assert r.returncode == 1 and "no such folder" in r.stderr
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.*"))
    r = zoo_here("index", str(run), str(empty), "-o", str(index))
    assert r.returncode == 1 and "--overwrite" in r.stderr
    image = str(next(Path(json.loads((index / "index.json").read_text())["root"]).glob("*/*.png")))
    r = zoo_here("similar", str(empty), image)
    assert r.returncode == 1 and "is not a zoo index" in r.stderr
    broken = tmp_path / "broken"
    shutil.copytree(index, broken)
    (broken / "shard-00000.safetensors").unlink()
    r = zoo_here("similar", str(broken), image)
    assert r.returncode == 1 and "lacks shard-00000.safetensors" in r.stderr
    r = zoo_here("similar", str(index), image, "--backend", "fais")
    assert r.returncode == 2 and "Did you mean 'faiss'?" in r.stderr
    r = zoo_here("eval", str(run), "--knn")
    assert r.returncode == 2 and "apply to --ood only" in r.stderr


def test_shards_read_back_in_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Rows arrive in batches that straddle shards; every row keeps its path and order."""
    from zoo.deploy.index import store

    monkeypatch.setattr(store, "SHARD_ROWS", 4)
    rows = np.random.default_rng(0).standard_normal((11, 3)).astype(np.float32)
    ident = store.ModelIdentity("m", "0" * 64)
    with store.IndexWriter(tmp_path / "i", ident, tmp_path) as w:
        for start in (0, 3, 6, 9):
            w.add([f"p{i}" for i in range(start, min(start + 3, 11))], rows[start : start + 3])
        m = w.publish()
    assert [s.rows for s in m.shards] == [4, 4, 3] and m.rows == 11
    again = store.IndexManifest.read(tmp_path / "i")
    parts = list(store.read_shards(tmp_path / "i", again))
    assert np.array_equal(np.concatenate([e for _, e in parts]), rows)
    assert store.read_paths(tmp_path / "i", again) == [f"p{i}" for i in range(11)]
    assert not list(tmp_path.glob(".i.*")), "no temporary folder left"
    shard = tmp_path / "i" / m.shards[1].file
    shard.write_bytes(shard.read_bytes()[:20])  # torn: both readers name it, no traceback
    for read in (store.read_paths, lambda i, m: list(store.read_shards(i, m))):
        with pytest.raises(ArtifactError, match=f"{shard} is unreadable .*: rebuild the index"):
            read(tmp_path / "i", again)


def test_backends_agree_with_brute_force() -> None:
    from zoo.deploy.index.search import FaissSearcher, NumpySearcher, faiss_installed, normalise

    rng = np.random.default_rng(1)
    rows, queries = (
        normalise(rng.standard_normal((300, 16))),
        normalise(rng.standard_normal((7, 16))),
    )
    want = np.argsort(-(queries @ rows.T), axis=1)[:, :5]
    searchers: list = [NumpySearcher(300, 16)]
    if faiss_installed():  # the faiss extra is optional
        searchers.append(FaissSearcher(16))
    for s in searchers:
        for start in (0, 128, 256):
            s.add(rows[start : start + 128])
        sims, idx = s.search(queries, 5)
        assert np.array_equal(idx, want), s.name
        assert np.allclose(sims, np.take_along_axis(queries @ rows.T, want, axis=1), atol=1e-5)


@pytest.mark.slow
def test_knn_score_in_eval_ood(run: Path, photos: Path, tmp_path: Path) -> None:
    """``--knn`` (the run's training split embedded on the fly) and ``--index`` of the same
    training images give the same kNN score; on real photographs against digits it
    separates them."""
    split = json.loads((run / "split.json").read_text())
    train = tmp_path / "train"
    from zoo.train.data import Splits

    s = Splits.from_json(split)
    for rel, _ in s.files["train"]:
        (train / rel).parent.mkdir(parents=True, exist_ok=True)
        (train / rel).symlink_to(s.root / rel)
    idx = tmp_path / "train.index"
    assert zoo_here("index", str(run), str(train), "-o", str(idx)).returncode == 0
    results = []
    for extra in (["--knn"], ["--index", str(idx)]):
        e = zoo_here("eval", str(run), "--ood", str(photos), *extra, "--knn-k", "5", "--json")
        assert e.returncode == 0, e.stderr
        results.append(json.loads(e.stdout)["ood"]["scores"])
    on_the_fly, from_index = results
    assert set(on_the_fly) == {"msp", "energy", "knn"}
    assert on_the_fly["knn"] == pytest.approx(from_index["knn"], abs=1e-6)
    assert on_the_fly["knn"]["auroc"] >= 0.9, on_the_fly


def test_overwrite_replaces_an_index_and_never_a_folder_of_another_kind(
    run: Path, index: Path, four_digits: Path, tmp_path: Path
) -> None:
    """A user following ``zoo similar``'s advice once pointed ``-o`` at a run folder and
    ``--overwrite`` replaced the run (checkpoints, model, reports) with an index."""
    keep = sorted(p.relative_to(run) for p in run.rglob("*"))
    r = zoo_here("index", str(run), str(four_digits), "-o", str(run), "--overwrite")
    assert r.returncode == 1 and f"-o {run} exists and is not a zoo index" in r.stderr
    assert (
        f"-o {run}-index" in r.stderr and sorted(p.relative_to(run) for p in run.rglob("*")) == keep
    )
    image = str(next(four_digits.glob("*/*.png")))
    r = zoo_here("similar", str(run), image)  # the advice names a new folder, not the run
    assert r.returncode == 1 and f"-o {run}-index` and pass that" in r.stderr
    r = zoo_here("index", str(run), str(four_digits), "-o", ".", "--overwrite", cwd=run)
    assert r.returncode == 1 and "Traceback" not in r.stderr and f"-o {run}-index" in r.stderr
    empty = tmp_path / "made-by-mkdir"
    empty.mkdir()  # nothing in it to lose: used
    assert zoo_here("index", str(run), str(four_digits), "-o", str(empty)).returncode == 0
    again = tmp_path / "again.index"
    shutil.copytree(index, again)
    r = zoo_here("index", str(run), str(four_digits), "-o", str(again), "--overwrite", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == json.loads((index / "index.json").read_text())["rows"]
