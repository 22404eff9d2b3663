"""The gates of ``zoo predict --out`` on plain files, without a model (milliseconds): the input
listing's order and forms, the chunk store's commit/resume/merge, and its refusals. The real
command, killed at every write, is in test_predict_out.py."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from zoo.deploy.predict.batch import _skip
from zoo.deploy.predict.inputs import expand_glob, iter_inputs
from zoo.deploy.predict.options import PredictFileOptions
from zoo.deploy.predict.scoring import Scorer
from zoo.deploy.predict.store import ChunkStore, columns, digest, format_of
from zoo.deploy.runtimes.decisions import Decisions, decision_rule
from zoo.errors import ArtifactError, InputError


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for rel in ("a/img10.jpg", "a/img2.jpg", "a/b/x.PNG", "c.jpg", "a/notes.txt", "a/.hidden.jpg"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    (tmp_path / "a" / "loop").symlink_to(tmp_path / "a")  # followed once, not forever
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_folder_glob_and_list_forms(tree: Path) -> None:
    # natural order per folder (img2 before img10), recursive, hidden files and non-images out
    assert list(iter_inputs(["a"])) == ["a/b/x.PNG", "a/img2.jpg", "a/img10.jpg"]
    assert list(expand_glob("**/*.jpg")) == ["c.jpg", "a/img2.jpg", "a/img10.jpg"]
    assert list(expand_glob("a/*.jpg")) == ["a/img2.jpg", "a/img10.jpg"]
    assert list(expand_glob(str(tree / "a" / "*" / "*.PNG"))) == [str(tree / "a/b/x.PNG")]
    # a list file: paths relative to its own folder, comments and blank lines skipped,
    # missing files kept (they become error rows, not a silent gap)
    (tree / "lists").mkdir()
    (tree / "lists" / "todo.txt").write_text("# batch 1\n../c.jpg\n\n/abs/missing.jpg\n")
    assert list(iter_inputs(["lists/todo.txt", "c.jpg"])) == [
        "lists/../c.jpg",
        "/abs/missing.jpg",
        "c.jpg",
    ]
    with pytest.raises(InputError, match=r"'nope' does not exist.*glob"):
        list(iter_inputs(["nope"]))


def test_format_by_extension() -> None:
    assert [format_of(Path(f"x.{e}")) for e in ("csv", "JSONL", "parquet")] == [
        "csv",
        "jsonl",
        "parquet",
    ]
    with pytest.raises(InputError, match=r"'x\.json'.*\.csv, \.jsonl or \.parquet"):
        format_of(Path("x.json"))


def _row(path: str, score: float) -> dict:
    return {"path": path, "label_1": "cat", "index_1": 3, "score_1": score}


def _read(out: Path) -> list[dict]:
    if out.suffix == ".parquet":
        return pq.read_table(out).to_pylist()
    if out.suffix == ".jsonl":
        return [json.loads(line) for line in out.read_text().splitlines()]
    rows = list(csv.DictReader(out.open(newline="")))
    return [{**r, "index_1": int(r["index_1"]), "score_1": float(r["score_1"])} for r in rows]


@pytest.mark.parametrize("ext", ["csv", "jsonl", "parquet"])
def test_store_commits_resumes_and_merges_each_input_once(tmp_path: Path, ext: str) -> None:
    out = tmp_path / f"p.{ext}"
    cols = columns(1, multi_label=False)
    store = ChunkStore(out, cols)
    manifest = {"model": "m", "top_k": 1}
    assert store.open(manifest, overwrite=False) == []
    store.commit(0, ["a", "b"], [_row("a", 0.1)], [{"path": "b", "reason": "broken"}])
    # a new process: finds chunk 0, and a stale half-written part 1 is ignored
    (store.parts / "part-00001.json.tmp").write_text("{")
    (store.parts / f"part-00001.{ext}").write_text("garbage of a killed write")
    again = ChunkStore(out, cols)
    committed = again.open(manifest, overwrite=False)
    assert committed == [
        {
            "inputs": 2,
            "digest": digest(["a", "b"]),
            "rows": 1,
            "errors": [committed[0]["errors"][0]],
        }
    ]
    again.commit(1, ["c", "d"], [_row("c", 1 / 3), _row("d", 0.25)], [])
    assert again.finish(2) == 1
    assert _read(out) == [_row("a", 0.1), _row("c", 1 / 3), _row("d", 0.25)]  # exact floats
    errors = [json.loads(x) for x in (tmp_path / f"p.{ext}.errors.jsonl").read_text().splitlines()]
    assert errors == [{"path": "b", "reason": "broken"}]
    assert not store.parts.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"p.{ext}", f"p.{ext}.errors.jsonl"]


def test_store_refuses_an_existing_output_and_another_jobs_chunks(tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    cols = columns(1, multi_label=False)
    ChunkStore(out, cols).open({"top_k": 1, "inputs": ["d"]}, overwrite=False)
    with pytest.raises(InputError, match=r"other settings \(top_k: 1 then, 3 now\).*--overwrite"):
        ChunkStore(out, cols).open({"top_k": 3, "inputs": ["d"]}, overwrite=False)
    assert ChunkStore(out, cols).open({"top_k": 3, "inputs": ["d"]}, overwrite=True) == []
    ChunkStore(out, cols).finish(0)
    assert out.read_bytes() == b"path,label_1,index_1,score_1\r\n"  # empty, but readable
    with pytest.raises(InputError, match=r"p\.csv already exists: add --overwrite"):
        ChunkStore(out, cols).open({"top_k": 3, "inputs": ["d"]}, overwrite=False)
    # --overwrite keeps the old output readable until the new one replaces it
    ChunkStore(out, cols).open({"top_k": 3, "inputs": ["d"]}, overwrite=True)
    assert out.exists()


def test_resume_refuses_inputs_that_changed() -> None:
    committed = [
        {"inputs": 2, "digest": digest(["a", "b"])},
        {"inputs": 1, "digest": digest(["c"])},
    ]
    rest = iter(["a", "b", "c", "d"])
    assert _skip(rest, committed, Path("p.parts")) == 3 and list(rest) == ["d"]
    with pytest.raises(InputError, match=r"inputs changed.*chunk 1.*--overwrite"):
        _skip(iter(["a", "b", "x"]), committed, Path("p.parts"))
    with pytest.raises(InputError, match=r"chunk 0"):
        _skip(iter(["a"]), committed, Path("p.parts"))  # fewer inputs than committed


def test_scorer_top_k_and_multilabel_decisions() -> None:
    labels = ("a", "b", "c")

    def rule(found: object) -> Decisions:
        return decision_rule(found, labels, 4, where="T", fix="F")

    s = Scorer(
        prepare=lambda im: np.zeros(1),
        score=lambda x: x,
        labels=labels,
        num_classes=4,
        multi_label=True,
        decisions=rule([0.5, 0.9, 0.2, 0.5]),
    )
    row = np.array([0.6, 0.8, 0.2, 0.8])
    # ties: the lower index first; a class without a name is named by its index
    assert [(t.label, t.score) for t in s.top(row, 3)] == [("b", 0.8), ("3", 0.8), ("a", 0.6)]
    assert s.decided(row) == ("a", "c", "3")  # b is under its own threshold, c reaches its own
    assert replace(s, decisions=rule(None)).decided(row) == ("a", "b", "3")  # 0.5 for each
    assert replace(s, multi_label=False, decisions=None).decided(row) is None
    for bad, why in (([0.5, 0.5], "2 values for the model's 4 classes"), ("0.5", "not a list"),
                     ([0.5, None, 0.5, 0.5], "None, not a number in \\[0, 1\\]"),
                     ([0.5, float("nan"), 0.5, 0.5], "nan, not a number in \\[0, 1\\]"),
                     ([0.5, True, 0.5, 0.5], "True, not a number in \\[0, 1\\]"),
                     ([0.5, 1.5, 0.5, 0.5], "1.5, not a number in \\[0, 1\\]")):  # fmt: skip
        with pytest.raises(ArtifactError, match=rf"^T .*{why}.*; F$"):
            rule(bad)


def test_inputs_are_checked_before_the_job_exists(tree: Path) -> None:
    """A typo or an empty glob is refused before the sidecar is written, so the corrected
    command starts fresh instead of being told an interrupted job has other settings."""
    from zoo.deploy.predict.batch import predict_to_file
    from zoo.deploy.predict.inputs import check_inputs

    check_inputs(["a", "c.jpg"])
    for specs, message in (
        (["a", "nope"], "Input 'nope' does not exist"),
        (["*.gif"], "name no image"),
        (["a/notes.txt", "a/b/*.jpg"], "name no image"),  # an empty list file, no match
    ):
        with pytest.raises(InputError, match=message):
            check_inputs(specs)
        with pytest.raises(InputError, match=message):
            predict_to_file(PredictFileOptions("no-model-needed.onnx", specs, tree / "out.parquet"))
        assert not (tree / "out.parquet.parts").exists()


def test_the_next_batch_decodes_while_the_model_scores_and_no_further(tmp_path: Path) -> None:
    """While the model scores batch k, the threads decode all of batch k+1 (so decoding hides
    behind inference), yet never more than a batch and two inputs per thread, less one,
    beyond it."""
    import threading
    import time

    from PIL import Image

    from zoo.deploy.predict.batch import local_results

    paths = []
    for i in range(40):
        Image.new("RGB", (4, 4), (i, 0, 0)).save(p := tmp_path / f"{i}.png")
        paths.append(str(p))
    done, lock = [0], threading.Lock()

    def prepare(im: Image.Image) -> np.ndarray:
        with lock:
            done[0] += 1
        return np.asarray(im, np.float32)[:1, :1, 0].ravel()

    bs, workers, scored, checks = 16, 2, [0], []

    def score(x: np.ndarray) -> np.ndarray:
        scored[0] += len(x)
        target = min(len(paths), scored[0] + bs)  # the whole next batch
        deadline = time.monotonic() + 5
        while done[0] < target and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)  # room to overrun the bound, if anything would
        checks.append((done[0] >= target, done[0] <= scored[0] + bs + 2 * workers - 1))
        red = x[:, 0] / 255
        return np.stack([red, 1 - red], 1)

    scorer = Scorer(prepare=prepare, score=score, labels=("red", "other"), num_classes=2)
    rows = list(
        local_results(iter(paths), scorer, 1, embeddings=False, batch_size=bs, workers=workers)
    )
    assert [p for p, _, _ in rows] == paths  # input order
    assert [r["score_1"] for _, r, _ in rows][:2] == pytest.approx([1.0, 1 - 1 / 255])  # type: ignore[index]
    assert checks == [(True, True)] * 3


def test_the_local_engine_loads_ort_without_spinning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding threads share the cores with ONNX Runtime: its idle threads must sleep, not
    busy-wait (measured: bench/predict_throughput.py)."""
    from PIL import Image

    import zoo.deploy.predict.batch as bp

    Image.new("RGB", (4, 4)).save(tmp_path / "a.png")
    asked: dict = {}

    def load_scorer(model: str, **kw: object) -> Scorer:
        asked.update(kw)
        return Scorer(
            prepare=lambda im: np.zeros(1, np.float32),
            score=lambda x: np.tile([0.25, 0.75], (len(x), 1)),
            labels=("a", "b"),
            num_classes=2,
        )

    monkeypatch.setattr(bp, "load_scorer", load_scorer)
    summary = bp.predict_to_file(
        PredictFileOptions("m.onnx", [str(tmp_path / "a.png")], tmp_path / "o.jsonl")
    )
    assert summary.rows == 1 and asked["spin"] is False
