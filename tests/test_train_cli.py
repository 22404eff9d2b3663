"""``zoo finetune`` end to end on real data, through the real command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import zoo_here
from tests.test_data import _corrupt_set, _img
from zoo.artifact import REQUIRED_FILES


@pytest.mark.slow
def test_simple_cnn_from_scratch_reaches_95_percent_on_digits(
    digits_dir: Path, tmp_path: Path
) -> None:
    r = zoo_here(
        "finetune",
        "simple_cnn",
        "--data",
        str(digits_dir),
        "--epochs",
        "6",  # 0.955 at epoch 4 of 6 here, 0.964 at 6 (8 epochs: 0.981)
        "--runs",
        str(tmp_path),
        "--name",
        "digits",
        "--num-workers",
        "1",
    )
    assert r.returncode == 0, r.stderr
    run = tmp_path / "digits"
    report = json.loads((run / "report.json").read_text())
    assert report["best"]["val/acc"] >= 0.95, report["best"]
    for f in (
        "config.json",
        "split.json",
        "classes.json",
        "metrics.csv",
        "metrics.jsonl",
        "report.json",
        "curves.png",
        "confusion_matrix.png",
        "checkpoints/last.pt",
        "checkpoints/best.pt",
    ):
        assert (run / f).exists(), f
    assert any((run / "tensorboard").iterdir())
    assert {p.name for p in (run / "model").iterdir()} == REQUIRED_FILES
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["strategy"] == "full" and cfg["lr"] == 1e-3  # random init trains fully
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 6
    assert len(report["per_class"]) == 10 and len(report["confusion_matrix"]) == 10
    assert "estimate" in r.stderr and "620,362 parameters" in r.stderr
    # zoo eval on the run reproduces the shipped model's accuracy
    e = zoo_here("eval", str(run), "--json")
    assert e.returncode == 0, e.stderr
    assert json.loads(e.stdout)["acc"] == pytest.approx(report["best"]["val/acc"])
    # the checkpoint holds only tensors and plain data
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert {
        "model",
        "optimizer",
        "scheduler",
        "scaler",
        "rng",
        "epoch",
        "global_step",
    } <= state.keys()


def test_corrupt_files_are_quarantined_and_run_completes(
    small_digits: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    shutil.copytree(small_digits, data)
    _corrupt_set(data / "digit_3")
    r = zoo_here(
        "finetune",
        "mlp",
        "--data",
        str(data),
        "--epochs",
        "1",
        "--runs",
        str(tmp_path),
        "--name",
        "q",
        "--num-workers",
        "0",
    )
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "q" / "report.json").read_text())
    names = sorted(Path(q["path"]).name for q in report["quarantined"])
    assert names == ["empty.jpg", "notes.jpg", "truncated.jpg"]
    strict = zoo_here(
        "finetune",
        "mlp",
        "--data",
        str(data),
        "--epochs",
        "1",
        "--runs",
        str(tmp_path),
        "--strict-data",
    )
    assert strict.returncode == 1 and "unreadable image" in strict.stderr


def test_a_run_whose_validation_images_were_unreadable_evaluates_reports_and_exports(
    small_digits: Path, tmp_path: Path
) -> None:
    """Unreadable files in the validation folder are set aside by the data check and are not
    in the run's ``split.json``: the run's report, ``zoo eval`` and ``zoo export`` (its gate
    reads the run's validation images) go through, and eval counts only the readable ones.
    ``zoo eval`` takes the run's model folder as the run, leaves out (and says so) an image
    deleted since, and ``--resume`` of the model folder names the run to resume."""
    data = tmp_path / "data"
    for i, src in enumerate(sorted(p for p in small_digits.rglob("*.png"))):
        dest = data / ("val" if i % 5 == 0 else "train") / src.parent.name / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
    (data / "val" / "digit_3" / "notes.png").write_text("this is not an image")
    (data / "val" / "digit_3" / "empty.png").write_bytes(b"")
    readable_val = len(list((data / "val").rglob("*.png"))) - 2
    args = ["--data", str(data), "--epochs", "1", "--runs", str(tmp_path), "--name", "q"]
    r = zoo_here("finetune", "mlp", *args, "--num-workers", "0", "--report")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "q"
    assert "report: none" not in r.stderr and (run / "report.html").is_file(), r.stderr
    report = json.loads((run / "report.json").read_text())
    assert sorted(Path(q["path"]).name for q in report["quarantined"]) == ["empty.png", "notes.png"]
    split = json.loads((run / "split.json").read_text())["splits"]
    assert not [rel for rel, _ in split["val"] + split["train"] if "notes" in rel or "empty" in rel]
    for model in (run, run / "model"):  # the model folder evaluates the run's own split
        e = zoo_here("eval", str(model), "--json")
        assert e.returncode == 0, e.stderr
        assert json.loads(e.stdout)["n"] == readable_val and "missing" not in e.stdout
    x = zoo_here("export", str(run))
    assert x.returncode == 0, x.stderr
    (data / split["val"][0][0]).unlink()  # a validation image deleted since the run
    e = zoo_here("eval", str(run))
    assert e.returncode == 0, e.stderr
    assert f"{readable_val - 1} images" in e.stdout
    assert "1 of the run's val images is no longer on disk" in e.stderr
    shutil.rmtree(data / "val")  # every validation image gone: nothing to evaluate, said
    gone = zoo_here("eval", str(run))
    assert gone.returncode == 1 and (
        f"run {run} has {len(split['val'])} val images in split.json, but none exist under "
        f"{data} any more: pass --data DIR"
    ) in " ".join(gone.stderr.split()), gone.stderr
    again = zoo_here("finetune", "--resume", str(run / "model"))
    assert again.returncode == 1 and f"resume the run: zoo finetune --resume {run}" in (
        again.stderr.replace("\n", " ")
    ), again.stderr


def test_check_command(tmp_path: Path) -> None:
    _corrupt_set(tmp_path / "d")
    _img(tmp_path / "d" / "b" / "fine.png")
    r = zoo_here("check", str(tmp_path / "d"), "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["corrupt"]) == 3
    assert zoo_here("check", str(tmp_path / "d"), "--strict").returncode == 1


@pytest.mark.parametrize("case", ["missing", "no_home", "one_class", "empty_class", "val_only"])
def test_bad_data_exits_1_with_clear_message(case: str, tmp_path: Path) -> None:
    d = tmp_path / "d"
    expected = {
        "missing": "does not exist",
        "no_home": "--data '~no-such-user-zoo/d' starts with '~', but no user 'no-such-user-zoo'",
        "one_class": "at least 2",
        "empty_class": "no images",
        "val_only": "not in train",
    }[case]
    if case == "one_class":
        _img(d / "only" / "a.png")
    elif case == "empty_class":
        _img(d / "a" / "1.png")
        _img(d / "b" / "1.png")
        (d / "c_empty").mkdir()
    elif case == "val_only":
        for s, c in [("train", "a"), ("train", "b"), ("val", "a"), ("val", "ghost")]:
            _img(d / s / c / "1.png")
    given = "~no-such-user-zoo/d" if case == "no_home" else str(d)
    r = zoo_here("finetune", "mlp", "--data", given, "--runs", str(tmp_path / "runs"))
    assert r.returncode == 1, r.stderr
    assert expected in " ".join(r.stderr.split()) and "Traceback" not in r.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert zoo_here("finetune", "mlp").returncode == 2  # no --data
    assert (
        zoo_here("finetune", "mlp", "--data", str(tmp_path), "--strategy", "bogus").returncode == 2
    )
    r = zoo_here("finetune", "mlp", "--data", str(tmp_path), "--extend", "2")
    assert r.returncode == 2


def test_random_init_refuses_frozen_strategy(small_digits: Path, tmp_path: Path) -> None:
    r = zoo_here(
        "finetune",
        "mobilenet_v2",
        "--weights",
        "none",
        "--strategy",
        "linear",
        "--data",
        str(small_digits),
        "--runs",
        str(tmp_path),
        "--dry-run",
    )
    assert r.returncode == 1 and "train fully" in r.stderr


def test_dry_run_reports_shapes_params_and_estimate(
    small_digits: Path, tmp_path: Path, mobilenet_weights: Path
) -> None:
    r = zoo_here(
        "finetune",
        "mobilenet_v2",
        "--data",
        str(small_digits),
        "--runs",
        str(tmp_path),
        "--dry-run",
        "--image-size",
        "64",
        "--name",
        "dry",
    )
    assert r.returncode == 0, r.stderr
    assert "2,236,682 parameters (12,810 trainable now)" in r.stderr  # gradual: frozen first
    assert "ms/step" in r.stderr and "dry run" in r.stderr
    assert not (tmp_path / "dry").exists() and r.stdout == ""  # nothing trained, nothing written


def test_nonfinite_loss_rolls_back_then_stops_with_advice(
    small_digits: Path, tmp_path: Path
) -> None:
    r = zoo_here(
        "finetune",
        "mlp",
        "--data",
        str(small_digits),
        "--epochs",
        "3",
        "--runs",
        str(tmp_path),
        "--optimizer",
        "sgd",
        "--lr",
        "1e12",
        "--save-every-steps",
        "2",
        "--num-workers",
        "0",
        "--no-progress",
    )
    assert r.returncode == 1
    assert "rolled back to the last checkpoint" in r.stderr
    assert "Loss is not finite at epoch" in r.stderr and "Files in the offending batch" in r.stderr
    assert "--detect-anomaly" in r.stderr and "10× lower" in r.stderr
