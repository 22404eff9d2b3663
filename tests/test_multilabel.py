"""Multi-label training on real images: BCEWithLogits, per-class thresholds, sigmoid scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_zoo
from zoo.errors import DataError
from zoo.train.data import scan_multilabel


def test_scan_multilabel(multilabel_digits: Path) -> None:
    s = scan_multilabel(multilabel_digits, seed=1)
    assert s.layout == "multilabel" and len(s.classes) == 14
    assert s.classes[:3] == ["d0", "d1", "d2"]
    target = s.samples("train")[0][1]
    assert target.shape == (14,) and float(target.sum()) == 3.0
    with pytest.raises(DataError, match=r"labels\.csv"):
        scan_multilabel(multilabel_digits / "images")


def test_multilabel_finetune_export_predict(multilabel_digits: Path, tmp_path: Path) -> None:
    r = run_zoo(
        "finetune",
        "simple_cnn",
        "--multi-label",
        "--data",
        str(multilabel_digits),
        "--epochs",
        "12",
        "--no-augment",
        "--runs",
        str(tmp_path),
        "--name",
        "ml",
        "--num-workers",
        "0",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "ml" / "report.json").read_text())
    assert report["best"]["val/macro_f1"] > 0.8 and len(report["thresholds"]) == 14
    assert report["best"]["monitor"] == "val/macro_f1"
    config = json.loads((tmp_path / "ml" / "model" / "config.json").read_text())
    assert config["multi_label"] is True and len(config["thresholds"]) == 14
    ex = run_zoo(
        "export",
        str(tmp_path / "ml"),
        "--dynamic-batch",
        "--data",
        str(multilabel_digits / "images"),
    )
    assert ex.returncode == 0, ex.stderr
    img = next((multilabel_digits / "images" / "digit_4").iterdir())
    p = run_zoo(
        "predict", str(tmp_path / "ml" / "model" / "model.onnx"), str(img), "-k", "14", "--json"
    )
    scores = [t["score"] for t in json.loads(p.stdout)[0]["top"]]
    assert sum(scores) > 1.5  # independent sigmoids, not a softmax that sums to 1
    ev = run_zoo("eval", str(tmp_path / "ml"), "--json")
    assert ev.returncode == 0, ev.stderr
    assert json.loads(ev.stdout)["macro_f1"] > 0.8
