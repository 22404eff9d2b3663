"""``zoo predict``'s seams a new user meets, through the real CLI (in this process,
:func:`tests.conftest.zoo_here`) with a stand-in model (a fake :class:`Scorer`: what is tested
is the command around the model, not its scores):

- an ``--out`` that can never be written (a folder, a path under a file) is refused before
  any work, and nothing is written;
- without ``--out`` an unreadable input no longer hides the answers for the others: each
  failure is reported on stderr, the rest are printed, and the command exits 1 (``--strict``:
  stop at the first), the same policy as ``--out``'s errors file; ``--json`` stays one array;
- a path read from a list of paths is named with its line and list, and a list none of whose
  paths exists says it was read as a list of image paths.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import zoo_here
from zoo.deploy.predict import batch, scoring
from zoo.deploy.predict.inputs import Listed, check_inputs, iter_inputs
from zoo.deploy.predict.scoring import Scorer, Unreadable, predict_each
from zoo.errors import InputError


def fake_scorer(*_: object, **__: object) -> Scorer:
    """Two classes, ``cat`` 0.75 for every image: no model loaded."""
    return Scorer(
        prepare=lambda im: np.zeros(1, np.float32),
        score=lambda x: np.tile([0.25, 0.75], (len(x), 1)),
        labels=("dog", "cat"),
        num_classes=2,
    )


@pytest.fixture
def fake_model(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(scoring, "load_scorer", fake_scorer)
    monkeypatch.setattr(batch, "load_scorer", fake_scorer)
    return "fake.onnx"  # never opened


@pytest.fixture
def loose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``loose/``: two good images and a truncated JPEG; ``list.txt`` names a good one and a
    missing one; the working folder is ``tmp_path``."""
    root = tmp_path / "loose"
    root.mkdir()
    for name in ("a.png", "b.png"):
        Image.new("RGB", (8, 8), (200, 10, 10)).save(root / name)
    buf = root / "full.jpg"
    Image.new("RGB", (64, 64), (10, 200, 10)).save(buf)
    (root / "c_truncated.jpg").write_bytes(buf.read_bytes()[:200])
    buf.unlink()
    (tmp_path / "list.txt").write_text("loose/a.png\nloose/missing.jpg\n")
    monkeypatch.chdir(tmp_path)
    return root


def tree_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# --out that can never be written


def test_an_out_that_is_a_folder_is_refused_before_any_work(
    fake_model: str, loose: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "d.csv"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    before = tree_of(tmp_path)
    for extra in ([], ["--overwrite"]):
        r = zoo_here("predict", fake_model, "loose", "--out", "d.csv", *extra)
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr and "--overwrite" not in r.stderr, r.stderr
        assert "--out d.csv is a folder" in r.stderr, r.stderr
        assert "--out d.csv/predictions.csv" in r.stderr, r.stderr  # a file to name instead
        assert tree_of(tmp_path) == before  # no d.csv.parts/, no temporary, keep.txt intact
        assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "list.txt", "loose"]


def test_an_out_under_a_file_is_refused_before_any_work(
    fake_model: str, loose: Path, tmp_path: Path
) -> None:
    (tmp_path / "ev.json").write_text("{}")
    before = tree_of(tmp_path)
    for out in ("ev.json/p.csv", "ev.json/sub/p.csv"):
        r = zoo_here("predict", fake_model, "loose", "--out", out)
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert f"--out {out}" in r.stderr and "ev.json is a file" in r.stderr, r.stderr
        assert tree_of(tmp_path) == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ev.json", "list.txt", "loose"]


# one policy for unreadable inputs, with and without --out


def test_without_out_the_readable_inputs_are_answered_and_each_failure_reported(
    fake_model: str, loose: Path
) -> None:
    r = zoo_here("predict", fake_model, "list.txt", "loose")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    # every readable image answered, in order, on stdout; nothing about the failures there
    assert [line for line in r.stdout.splitlines() if line.endswith(":")] == [
        "loose/a.png:",
        "loose/a.png:",
        "loose/b.png:",
    ]
    assert "0.7500  cat" in r.stdout and "missing" not in r.stdout
    # each failure on stderr: the path (with the list's line) and why; then the count
    assert "loose/missing.jpg (line 2 of the list list.txt) does not exist" in r.stderr
    assert "Cannot decode loose/c_truncated.jpg" in r.stderr, r.stderr
    assert "error: 2 of 5 inputs could not be scored" in r.stderr, r.stderr


def test_with_out_the_same_inputs_go_to_the_errors_file(
    fake_model: str, loose: Path, tmp_path: Path
) -> None:
    r = zoo_here("predict", fake_model, "list.txt", "loose", "--out", "p.jsonl")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x)["path"] for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert rows == ["loose/a.png", "loose/a.png", "loose/b.png"]
    errors = [json.loads(x) for x in (tmp_path / "p.jsonl.errors.jsonl").read_text().splitlines()]
    assert [e["path"] for e in errors] == ["loose/missing.jpg", "loose/c_truncated.jpg"]
    assert "(line 2 of the list list.txt) does not exist" in errors[0]["reason"]


def test_json_without_out_stays_one_valid_array(fake_model: str, loose: Path) -> None:
    r = zoo_here("predict", fake_model, "list.txt", "--json")
    assert r.returncode == 1
    got = json.loads(r.stdout)  # stdout is the JSON alone
    assert [g["image"] for g in got] == ["loose/a.png", "loose/missing.jpg"]
    assert got[0]["top"][0]["label"] == "cat" and "error" not in got[0]
    assert "does not exist" in got[1]["error"] and "top" not in got[1]
    assert "error: 1 of 2 inputs could not be scored" in r.stderr


def test_strict_stops_at_the_first_failure_in_both_modes(
    fake_model: str, loose: Path, tmp_path: Path
) -> None:
    r = zoo_here("predict", fake_model, "list.txt", "loose", "--strict")
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert "--strict stops at the first input" in r.stderr
    assert "loose/missing.jpg (line 2 of the list list.txt) does not exist" in r.stderr
    assert "c_truncated" not in r.stderr  # stopped at the first
    r = zoo_here("predict", fake_model, "loose", "--strict", "--out", "s.csv")
    assert r.returncode == 1 and "--strict stops" in r.stderr
    assert not (tmp_path / "s.csv").exists()


def test_every_readable_input_answered_exits_0(fake_model: str, loose: Path) -> None:
    r = zoo_here("predict", fake_model, "loose/a.png", "loose/b.png")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = zoo_here("predict", fake_model, "loose/a.png", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["image"] == "loose/a.png"


def test_predict_each_keeps_input_order(loose: Path) -> None:
    got = predict_each(fake_scorer(), ["loose/c_truncated.jpg", "loose/a.png", "nope.png"], k=1)
    assert [type(g) for g in got] == [Unreadable, scoring.Prediction, Unreadable]
    assert [str(g.image) for g in got] == ["loose/c_truncated.jpg", "loose/a.png", "nope.png"]


# where a path from a list came from


def test_a_path_from_a_list_carries_its_line_and_list(tmp_path: Path) -> None:
    (tmp_path / "todo.txt").write_text("# header\n\nx.jpg\n/abs/y.jpg\n")
    got = list(iter_inputs([str(tmp_path / "todo.txt")]))
    assert got == [str(tmp_path / "x.jpg"), "/abs/y.jpg"]  # still plain paths
    assert all(isinstance(g, Listed) for g in got)
    assert [(g.line, g.list_file) for g in got] == [
        (3, str(tmp_path / "todo.txt")),
        (4, str(tmp_path / "todo.txt")),
    ]
    back = pickle.loads(pickle.dumps(got[0]))  # to a worker and back
    assert (
        back == got[0] and back.origin == got[0].origin == f"line 3 of the list {got[0].list_file}"
    )


def test_a_text_file_whose_paths_do_not_exist_says_it_was_read_as_a_list(
    fake_model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = tmp_path / "odd" / "green" / "notes.txt"
    notes.parent.mkdir(parents=True)
    notes.write_text("hello\n")
    monkeypatch.chdir(tmp_path)
    r = zoo_here("predict", fake_model, "./odd/green/notes.txt")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "read as a list of image paths, one per line" in r.stderr, r.stderr
    assert "./odd/green/hello (line 1 of the list ./odd/green/notes.txt) does not exist" in (
        r.stderr
    )
    notes.write_text("hello\nworld\n")
    with pytest.raises(
        InputError, match=r"none of its paths exists: .*hello \(line 1 of.*nor does the other path"
    ):
        check_inputs(["./odd/green/notes.txt"])
