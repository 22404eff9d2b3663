"""``zoo export RUN``: the parity gate judges a fine-tuned model on its own run's validation
images (a seeded sample of 64, at the run's image size) besides the bundled photos, and the
report, the JSON and the exported file's metadata name the images it used. ``--data DIR``
replaces both, as before. A real fine-tune on real digits, real exports, real onnxruntime."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_zoo
from zoo.deploy.export.parity import gate_images
from zoo.errors import DataError
from zoo.onnx_meta import read_metadata
from zoo.ref import ModelRef
from zoo.run_images import images_for
from zoo.samples import sample_image_paths


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 real digits per class: 80 validation images, more than the gate's sample of 64."""
    from zoo.samples import write_digits_folder

    return write_digits_folder(tmp_path_factory.mktemp("digits") / "digits", per_class=40)


@pytest.fixture(scope="module")
def run(digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of real digits at 32 px (its validation split is 20 %)."""
    root = tmp_path_factory.mktemp("runs")
    r = run_zoo(
        *("finetune", "mobilenet_v2", "--data", str(digits), "--strategy", "linear"),
        *("--cache-features", "--epochs", "1", "--image-size", "32", "--no-progress"),
        *("--num-workers", "0", "--runs", str(root), "--name", "digits"),
    )
    assert r.returncode == 0, r.stderr
    return root / "digits"


@pytest.fixture(scope="module")
def exported(run: Path) -> dict:
    r = run_zoo("export", str(run), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_gate_judges_a_run_on_its_own_validation_images(run: Path, exported: dict) -> None:
    sample = images_for(run)
    assert sample is not None and len(sample.paths) == 64 and sample.total > 64
    p = exported["parity"]
    assert p["passed"] and p["images"] == [
        {"kind": "bundled", "count": 2, "description": "2 bundled photos"},
        {
            "kind": "run",
            "count": 64,
            "description": f"64 of run digits's {sample.total} validation images (seed 0)",
        },
    ]
    assert p["predictions"]["n_images"] == 66 and p["predictions"]["agreement"] == 1.0
    meta = read_metadata(run / "model" / "model.onnx")  # the file says what judged it
    assert meta["parity"]["passed"] and meta["parity"]["images"] == (
        f"2 bundled photos; 64 of run digits's {sample.total} validation images (seed 0)"
    )
    assert meta["preprocessing"]["input_size"] == [3, 32, 32]  # judged at the run's size


def test_gate_images_are_the_bundled_photos_then_the_runs_seeded_sample(run: Path) -> None:
    sample = images_for(run)
    assert sample is not None
    for ref in (str(run), str(run / "model")):  # the run, or its model folder
        gate = gate_images(ModelRef.parse(ref), None)
        assert gate.paths == (*sample_image_paths(), *sample.paths)
        assert [s.kind for s in gate.sources] == ["bundled", "run"]
    assert gate_images(ModelRef.parse(str(run)), None) == gate  # seeded: the same every time
    plain = gate_images(ModelRef.parse("mobilenet_v2"), None)  # a registry model has no run
    assert plain.paths == tuple(sample_image_paths()) and len(plain.sources) == 1


def test_a_run_whose_images_are_gone_is_refused_and_data_is_the_way_out(
    run: Path, digits: Path, tmp_path: Path
) -> None:
    """The run copied without its data: refused (exit 1) naming ``--data DIR``, nothing
    written; with ``--data`` (which replaces the gate's images, as always) it exports, and the
    text report names the images that judged it."""
    moved = tmp_path / "moved"
    shutil.copytree(run / "model", moved / "model")
    split = json.loads((run / "split.json").read_text())
    (moved / "split.json").write_text(json.dumps({**split, "root": str(tmp_path / "gone")}))
    with pytest.raises(DataError, match="--data DIR"):
        gate_images(ModelRef.parse(str(moved)), None)
    out = tmp_path / "judged-on-data.onnx"
    r = run_zoo("export", str(moved), "-o", str(out))
    assert r.returncode == 1 and "--data DIR" in r.stderr, r.stderr
    assert not out.exists()
    r = run_zoo("export", str(moved), "--data", str(digits / "digit_3"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert f"parity images: 40 images of --data {digits / 'digit_3'}" in r.stdout
    assert "bundled" not in r.stdout and "validation images" not in r.stdout
    assert "parity predictions: top-1 agreement 100.0% on 40 real images" in r.stdout
