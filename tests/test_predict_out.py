"""``zoo predict MODEL INPUTS --out FILE`` end to end on real photos and digits with the real
MobileNetV2: broken files listed and skipped, each format equal to ``predict``, and the real
command SIGKILLed at every durable write then rerun: each input exactly once, the same rows
as an uninterrupted run. The gates on plain files are in test_gates_predict.py."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests import crash
from zoo import create_model
from zoo.deploy.predict.batch import predict_to_file
from zoo.deploy.predict.options import PredictFileOptions
from zoo.deploy.predict.scoring import load_scorer, predict
from zoo.errors import InputError
from zoo.samples import sample_image_paths

KILLED = -9
BROKEN = ("fake.png", "truncated.jpg")


@pytest.fixture(scope="module")
def fork_server() -> Any:
    return crash.fork_server()


@pytest.fixture(scope="module")
def photos(small_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real photos, four real digits in a subfolder, a text file posing as a PNG, a
    truncated JPEG, and a note that is not an image at all (not an input)."""
    root = tmp_path_factory.mktemp("photos") / "photos"
    (root / "digits").mkdir(parents=True)
    for p in sample_image_paths():
        shutil.copy(p, root / p.name)
    for d in (1, 3, 7, 8):
        shutil.copy(next((small_digits / f"digit_{d}").iterdir()), root / "digits" / f"{d}.png")
    (root / "fake.png").write_text("not a picture")
    (root / "truncated.jpg").write_bytes((root / "coffee.jpg").read_bytes()[:3000])
    (root / "notes.txt").write_text("a note")
    return root


def good_images(photos: Path) -> list[str]:
    names = ["chelsea.jpg", "coffee.jpg", "digits/1.png", "digits/3.png", "digits/7.png"]
    return [str(photos / n) for n in [*names, "digits/8.png"]]


def read_rows(out: Path) -> list[dict[str, Any]]:
    if out.suffix == ".parquet":
        return pq.read_table(out).to_pylist()
    if out.suffix == ".jsonl":
        return [json.loads(line) for line in out.read_text().splitlines()]
    with out.open(newline="") as f:
        return [{k: _typed(k, v) for k, v in r.items()} for r in csv.DictReader(f)]


def _typed(key: str, value: str) -> Any:
    return (
        int(value)
        if key.startswith("index")
        else float(value)
        if key.startswith("score")
        else value
    )


def assert_same_rows(rows: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert [r["path"] for r in rows] == [r["path"] for r in expected]
    for r, e in zip(rows, expected, strict=True):
        assert {k for k in r if k.startswith("label")} == {k for k in e if k.startswith("label")}
        for key in r:
            if key.startswith("score"):
                assert abs(r[key] - e[key]) <= 1e-5, (r["path"], key)
            else:
                assert r[key] == e[key], (r["path"], key)


def zoo(fork_server: Any, log: Path, *argv: str, **env: str) -> tuple[int, str]:
    code = crash.run(fork_server, list(argv), log, **env)
    return code, log.read_text()


def test_broken_files_are_listed_and_the_rest_scored(
    fork_server: Any, mobilenet_onnx: Path, photos: Path, tmp_path: Path
) -> None:
    out = tmp_path / "preds.csv"
    args = ["predict", str(mobilenet_onnx), str(photos), "-k", "3", "--out"]
    code, log = zoo(fork_server, tmp_path / "log1", *args, str(out))
    assert code == 0, log
    assert [r["path"] for r in read_rows(out)] == good_images(photos)
    errors = [json.loads(x) for x in (tmp_path / "preds.csv.errors.jsonl").read_text().splitlines()]
    assert [e["path"] for e in errors] == [str(photos / n) for n in BROKEN]
    assert all("Cannot decode" in e["reason"] for e in errors)
    assert "6 rows, 0 skipped as already done, 2 unreadable" in log
    # a complete output is never replaced without --overwrite
    before = out.read_bytes()
    code, log = zoo(fork_server, tmp_path / "log2", *args, str(out))
    assert code == 1 and "already exists: add --overwrite" in log and out.read_bytes() == before
    # --strict: the first unreadable file is fatal, and no output appears
    strict = tmp_path / "strict.csv"
    code, log = zoo(fork_server, tmp_path / "log3", *args, str(strict), "--strict")
    assert code == 1 and "--strict stops" in log and str(photos / "fake.png") in log, log
    assert not strict.exists()


@pytest.mark.parametrize(
    ("model", "ext"),
    [("onnx", "csv"), ("onnx", "jsonl"), ("onnx", "parquet"), ("mobilenet_v2", "parquet")],
)
def test_each_format_holds_what_predict_gives(
    model: str, ext: str, mobilenet_onnx: Path, photos: Path, tmp_path: Path
) -> None:
    # the PyTorch model is built once for both (its own test is predict's)
    ref = str(mobilenet_onnx) if model == "onnx" else load_scorer(model)
    out = tmp_path / f"p.{ext}"
    s = predict_to_file(
        PredictFileOptions(ref, [str(photos)], out, top_k=5, batch_size=4, chunk_size=5, workers=2)
    )
    assert (s.done, s.rows, s.errors, s.skipped) == (8, 6, 2, 0)
    expected = [
        {"path": p.image}
        | {f"{f}_{i}": v for i, t in enumerate(p.top, 1) for f, v in t.to_dict().items()}
        for p in predict(ref, good_images(photos), k=5)
    ]
    assert_same_rows(read_rows(out), expected)


@pytest.mark.slow
def test_kill_at_every_write_then_rerun_holds_each_input_once(
    fork_server: Any, mobilenet_onnx: Path, photos: Path, tmp_path: Path
) -> None:
    argv = ["predict", str(mobilenet_onnx), str(photos), "-k", "2", "--chunk-size", "3"]

    ref = tmp_path / "ref" / "p.parquet"
    ref.parent.mkdir()
    trace = tmp_path / "trace"
    code, log = zoo(
        fork_server, tmp_path / "log", *argv, "--out", str(ref), ZOO_FAULT_TRACE=str(trace)
    )
    assert code == 0, log
    labels = crash.trace(trace)
    chunks = [x for i in range(3) for x in (f"part-0000{i}.parquet", f"{i}.json")]  # 8 inputs
    assert labels == ["manifest.json", *chunks, "p.parquet.errors.jsonl", "p.parquet"]
    expected, errors = read_rows(ref), (ref.parent / "p.parquet.errors.jsonl").read_text()
    kills = [str(n) for n in range(1, len(labels) + 1)] + [f"{len(labels)}:inside"]
    for kill in kills:
        out = tmp_path / kill / "p.parquet"
        out.parent.mkdir()
        code, log = zoo(
            fork_server, out.parent / "log", *argv, "--out", str(out), ZOO_FAULT_KILL_AT=kill
        )
        assert code == KILLED, log
        if out.exists():  # only ever complete: written in one atomic step
            assert kill == str(len(labels)) and read_rows(out) == expected
        code, log = zoo(fork_server, out.parent / "log2", *argv, "--out", str(out))
        assert code == 0, log
        assert_same_rows(read_rows(out), expected)
        assert (out.parent / "p.parquet.errors.jsonl").read_text() == errors
        assert sorted(p.name for p in out.parent.iterdir()) == [
            "log",
            "log2",
            "p.parquet",
            "p.parquet.errors.jsonl",
        ]


def test_resume_refuses_other_options_and_inputs(
    fork_server: Any, mobilenet_onnx: Path, photos: Path, tmp_path: Path
) -> None:
    out = tmp_path / "p.jsonl"
    args = ["predict", str(mobilenet_onnx), str(photos), "--chunk-size", "3", "--out", str(out)]
    assert zoo(fork_server, tmp_path / "log1", *args, ZOO_FAULT_KILL_AT="3")[0] == KILLED
    code, log = zoo(fork_server, tmp_path / "log2", *args, "-k", "3")
    assert code == 1 and "other settings (top_k: 5 then, 3 now)" in log and "--overwrite" in log
    code, log = zoo(fork_server, tmp_path / "log3", *args[:2], str(photos / "digits"), *args[3:])
    assert code == 1 and "inputs: " in log and "--overwrite" in log, log
    # resumed: chunk 0 is not redone
    code, log = zoo(fork_server, tmp_path / "log4", *args)
    assert code == 0 and "5 inputs" in log and "3 skipped as already done" in log, log
    code, log = zoo(fork_server, tmp_path / "log5", *args, "-k", "3", "--overwrite")
    assert code == 0, log
    rows = read_rows(out)
    assert len(rows) == 6 and all("label_3" in r and "label_4" not in r for r in rows)


def test_embeddings_from_onnx_and_pytorch_are_the_classifier_input(
    mobilenet_onnx: Path, photos: Path, tmp_path: Path
) -> None:
    """The embedding is what the classifier layer reads: the layer's own weights applied to it
    give the row's scores; the ONNX file and the PyTorch model give the same vectors."""
    scorer = load_scorer("mobilenet_v2", embeddings=True)
    onnx_out, torch_out = tmp_path / "o.parquet", tmp_path / "t.jsonl"
    common = {"top_k": 3, "batch_size": 4, "chunk_size": 5, "workers": 2, "embeddings": True}
    predict_to_file(PredictFileOptions(str(mobilenet_onnx), [str(photos)], onnx_out, **common))  # type: ignore[arg-type]
    predict_to_file(PredictFileOptions(scorer, [str(photos)], torch_out, **common))  # type: ignore[arg-type]
    from_onnx, from_torch = read_rows(onnx_out), read_rows(torch_out)
    assert [r["path"] for r in from_onnx] == good_images(photos)
    net = create_model("mobilenet_v2").eval()
    w, b = (p.detach().numpy() for p in net.classifier[1].parameters())
    for o, t in zip(from_onnx, from_torch, strict=True):
        e_onnx, e_torch = np.asarray(o["embedding"]), np.asarray(t["embedding"])
        assert e_onnx.shape == (1280,) and np.abs(e_onnx - e_torch).max() < 1e-4
        logits = e_torch @ w.T + b
        probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        assert int(probs.argmax()) == t["index_1"] == o["index_1"]
        assert abs(probs.max() - t["score_1"]) < 1e-5 and abs(o["score_1"] - t["score_1"]) < 1e-5
    with pytest.raises(InputError, match=r"CSV has no list type: name the output p\.parquet"):
        predict_to_file(
            PredictFileOptions(scorer, [str(photos)], tmp_path / "p.csv", embeddings=True)
        )
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "p.csv.parts").exists()


@pytest.mark.ray
def test_ray_engine_resumes_a_local_job_and_gives_the_same_rows(
    fork_server: Any, mobilenet_onnx: Path, photos: Path, tmp_path: Path
) -> None:
    """A real local Ray runtime: the job killed after its first chunk on the local engine is
    finished by `--engine ray` (2 actors), and the file equals an uninterrupted local run:
    same rows, scores and embeddings within 1e-5, the same errors file."""

    argv = ["predict", str(mobilenet_onnx), str(photos), "-k", "3", "--chunk-size", "3"]
    ref = tmp_path / "ref" / "p.parquet"
    ref.parent.mkdir()
    code, log = zoo(fork_server, tmp_path / "log0", *argv, "--embeddings", "--out", str(ref))
    assert code == 0, log
    out = tmp_path / "p.parquet"
    args = [*argv, "--embeddings", "--out", str(out)]
    assert zoo(fork_server, tmp_path / "log1", *args, ZOO_FAULT_KILL_AT="3")[0] == KILLED
    code, log = zoo(fork_server, tmp_path / "log2", *args, "--engine", "ray", "--workers", "2")
    assert code == 0 and "3 skipped as already done, 2 unreadable" in log, log
    rows, expected = read_rows(out), read_rows(ref)
    for r in (*rows, *expected):
        r["embedding"] = np.asarray(r.pop("embedding"))
    assert [r["path"] for r in rows] == good_images(photos)
    for r, e in zip(rows, expected, strict=True):
        assert np.abs(r["embedding"] - e["embedding"]).max() < 1e-5, r["path"]
    assert_same_rows(
        [{k: v for k, v in r.items() if k != "embedding"} for r in rows],
        [{k: v for k, v in e.items() if k != "embedding"} for e in expected],
    )
    errors = (tmp_path / "p.parquet.errors.jsonl").read_text()
    assert errors == (ref.parent / "p.parquet.errors.jsonl").read_text()
    assert not (tmp_path / "p.parquet.parts").exists()


def test_the_actor_class_on_a_users_own_batches(mobilenet_onnx: Path, photos: Path) -> None:
    """`ZooPredictor` as the README's Ray pipeline calls it (a batch of `path` and encoded
    `bytes`, as `read_binary_files` gives), without a Ray runtime (the real one runs in the
    test above): unreadable files flagged in `error`, the rest equal to `predict`."""
    from zoo.deploy.predict.ray_engine import ZooPredictor

    files = [*good_images(photos), *(str(photos / n) for n in BROKEN)]
    batch = {
        "path": np.array(files),
        "bytes": np.array([Path(f).read_bytes() for f in files], dtype=object),
    }
    out = ZooPredictor(str(mobilenet_onnx), top_k=2, threads=1)(batch)
    rows = {p: {k: v[i] for k, v in out.items()} for i, p in enumerate(out["path"].tolist())}
    assert list(rows) == files
    for name in BROKEN:
        bad = rows[str(photos / name)]
        assert "Cannot decode" in bad["error"] and bad["index_1"] == -1 and bad["label_1"] == ""
        assert np.isnan(bad["score_1"])
    for p in predict(str(mobilenet_onnx), good_images(photos), k=2):
        row = rows[p.image]
        assert row["error"] == "" and "embedding" not in row
        for i, t in enumerate(p.top, 1):
            assert (row[f"label_{i}"], row[f"index_{i}"]) == (t.label, t.index)
            assert abs(row[f"score_{i}"] - t.score) <= 1e-5


def test_predict_with_tta_is_the_mean_over_views(mobilenet_onnx: Path) -> None:
    """`--tta ten-crop` on the real model and photos: each image's scores are the mean of the
    plain model's scores over its ten views, and the labels stay right."""
    from zoo.images import open_image
    from zoo.tta import views

    plain = load_scorer(str(mobilenet_onnx))
    files = [str(p) for p in sample_image_paths()]
    got = predict(str(mobilenet_onnx), files, k=3, tta="ten-crop")
    assert [r.top[0].label for r in got] == ["Egyptian cat", "espresso"]
    for r, f in zip(got, files, strict=True):
        assert plain.pre is not None
        mean = plain.score(views(open_image(f), plain.pre, "ten-crop")).mean(0)
        for t in r.top:
            assert abs(t.score - mean[t.index]) < 1e-6
