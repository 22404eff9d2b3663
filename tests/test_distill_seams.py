"""``zoo distill`` at its seams with the teacher's run: the teacher's rejection ("unknown") rule
is refitted on the distilled model, ``--qat`` included, and said at the start; the run's
train/val split is lined up with the teacher's, so its validation images (the student's val acc,
the teacher-vs-student table) were never in the teacher's training split. Real digits at 16 px;
a simple_cnn teacher fine-tuned here with ``--reject msp`` and another seed than the distill
runs' (so a fresh seeded split of the same folder differs from the teacher's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import zoo_here
from zoo.train.config import TrainConfig

QUIET = ["--num-workers", "0", "--no-progress", "--no-report"]


@pytest.fixture(scope="module")
def teacher(digits16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simple_cnn fine-tuned one epoch on the digits with an msp rejection rule, seed 1."""
    from zoo.train.trainer import fit

    cfg = TrainConfig(
        "simple_cnn", str(digits16), epochs=1, augment=False, seed=1, reject="msp",
        runs_root=str(tmp_path_factory.mktemp("teacher")), name="t", num_workers=0,
        progress=False,
    )  # fmt: skip
    run = fit(cfg)
    assert run is not None
    return run


def rows(run: Path, split: str) -> set[str]:
    """A run's images of ``split``, as absolute paths."""
    doc = json.loads((run / "split.json").read_text())
    return {str(Path(doc["root"]) / rel) for rel, _ in doc["splits"].get(split, [])}


def rule_of(run: Path) -> dict[str, object] | None:
    return json.loads((run / "model" / "config.json").read_text())["calibration"]["reject"]


def test_the_teachers_rejection_rule_is_refitted_by_qat_and_by_a_student(
    teacher: Path, digits16: Path, tmp_path: Path
) -> None:
    """The teacher answers 'unknown' below an msp threshold: the --qat run (the same model,
    trained through int8) and a distilled student each ship the same kind of rule at the same
    acceptance, refitted on their own weights; the log says so before training. --reject off
    drops it, with a warning that names the teacher's rule."""
    theirs = rule_of(teacher)
    assert theirs is not None and theirs["score"] == "msp"
    common = ["--data", str(digits16), "--epochs", "1", "--runs", str(tmp_path), *QUIET]
    for name, how in (("q", ["--qat"]), ("s", ["--student", "mlp"])):
        d = zoo_here("distill", str(teacher), *how, "--name", name, *common)
        assert d.returncode == 0, d.stderr
        ours = rule_of(tmp_path / name)
        assert ours is not None, f"{name}: the teacher's rejection rule was dropped"
        assert (ours["score"], ours["acceptance"]) == (theirs["score"], theirs["acceptance"])
        said = " ".join(d.stderr.split())
        # said at the start, before the first epoch
        told = said.find("refits the teacher's rejection rule (msp, accepting 95%")
        assert -1 < told < said.index("epoch 1/1"), said
        assert "rejects below msp" in said  # the end's calibration line names the new threshold
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert (config["reject"], config["acceptance"]) == ("msp", 0.95)
    # the int8-trained model answers 'unknown' like its teacher: predict applies the rule
    image = str(next(iter(rows(tmp_path / "q", "val"))))
    p = zoo_here("predict", str(tmp_path / "q" / "model"), image, "--json")
    assert p.returncode == 0, p.stderr
    assert "accepted" in json.loads(p.stdout)[0], p.stdout
    # asked for none: a warning at the start, and none shipped
    d = zoo_here(
        "distill", str(teacher), "--qat", "--reject", "off", "--name", "off", *common
    )  # fmt: skip
    assert d.returncode == 0, d.stderr
    said = " ".join(d.stderr.split())
    assert "warning: the teacher" in said and "fits no rejection rule (--reject off)" in said
    assert rule_of(tmp_path / "off") is None


def test_the_split_is_the_teachers_so_validation_images_are_unseen_by_it(
    teacher: Path, digits16: Path, tmp_path: Path
) -> None:
    """The teacher split the digits with seed 1; a distill run with seed 0 keeps the teacher's
    training images in training and its validation images in validation, says so, and its
    report counts the validation images the teacher trained on: none."""
    t_train, t_val = rows(teacher, "train"), rows(teacher, "val")
    from zoo.train.data import scan

    fresh = scan(digits16, val_fraction=0.2, seed=0)
    fresh_val = {str(p) for p, _ in fresh.samples("val")}
    assert fresh_val & t_train  # the seeded split alone would validate on trained images
    common = ["--data", str(digits16), "--epochs", "1", "--runs", str(tmp_path), *QUIET]
    for name, how in (("s", ["--student", "mlp"]), ("q", ["--qat"])):
        d = zoo_here("distill", str(teacher), *how, "--name", name, *common)
        assert d.returncode == 0, d.stderr
        run = tmp_path / name
        val, train = rows(run, "val"), rows(run, "train")
        assert not val & t_train, f"{name}: {len(val & t_train)} val images the teacher trained on"
        assert val == t_val and train == t_train  # the same folder: exactly the teacher's split
        said = " ".join(d.stderr.split())
        told = said.find("split lined up with the teacher's (run t)")
        assert -1 < told < said.index("epoch 1/1"), said
        summary = json.loads((run / "report.json").read_text())["distill"]
        assert summary["teacher_split"] == str(teacher)
        assert summary["val_seen_by_teacher"] == 0
        assert "none in the teacher's training split" in said  # the side-by-side table
    # only images the teacher trained on: nothing left to validate on, refused before any run
    seen = tmp_path / "seen"
    for p in sorted(t_train):
        link = seen / Path(p).parent.name / Path(p).name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(p)
    r = zoo_here(
        "distill", str(teacher), "--student", "mlp", "--data", str(seen), "--name", "x",
        "--runs", str(tmp_path / "none"), *QUIET,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    said = " ".join(r.stderr.split())
    assert "The teacher (run t) trained on every image of" in said, said
    assert "none is left for validation" in said and "--data the folder the teacher" in said
    assert not (tmp_path / "none").exists()
