"""Bad input that once escaped as a traceback, each now a clear refusal or handled: images
PIL opens in modes it cannot convert directly (CIELab, big-endian 16-bit TIFF), ``zoo
quantize -o`` that cannot be written, and a model folder's ``config.json`` that is not
UTF-8, not a JSON object, or has a schema that is not a number."""

from __future__ import annotations

import json
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import pytest
import skimage.data
from PIL import Image
from sklearn.datasets import load_digits

from tests.conftest import zoo_here, zoo_ok
from tests.test_gates_serve import PREDICT_PATH, float_model, png, serving
from zoo.artifact import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, read_config
from zoo.deploy.runtimes.loader import OnnxClassifier
from zoo.errors import ArtifactError, InputError
from zoo.images import open_image, to_channels


def _cat(size: int = 32) -> Image.Image:
    """scikit-image's photo of a cat, small."""
    return Image.fromarray(skimage.data.chelsea()).resize((size, size), Image.Resampling.BICUBIC)


def _lab_tiff(path: Path) -> Path:
    """The cat saved as a CIELab TIFF (PIL's mode ``LAB``)."""
    _cat().convert("LAB").save(path)
    return path


def _digit_16bit() -> np.ndarray:
    """A real handwritten digit as 16-bit greyscale (0..65535), 32×32."""
    digit = Image.fromarray((load_digits().images[0] / 16 * 255).astype(np.uint8))
    big = np.asarray(digit.resize((32, 32), Image.Resampling.BICUBIC), np.float64)
    return np.round(big / 255 * 65535).astype(np.uint16)


def _i16b_tiff(path: Path) -> Path:
    """The digit saved as a big-endian 16-bit TIFF (PIL's mode ``I;16B``)."""
    Image.fromarray(_digit_16bit().astype(">u2")).save(path)
    return path


def _without_imagecms(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as one whose Pillow was built without LittleCMS: ``PIL.ImageCms`` cannot
    be imported, so PIL cannot convert CIELab."""
    monkeypatch.delattr(PIL, "ImageCms", raising=False)
    monkeypatch.setitem(sys.modules, "PIL.ImageCms", None)


def test_cielab_and_big_endian_16_bit_tiffs_convert_to_the_models_channels(
    tmp_path: Path,
) -> None:
    lab = _lab_tiff(tmp_path / "cat.tif")
    assert Image.open(lab).mode == "LAB"
    rgb = np.asarray(open_image(lab, channels=3), np.int16)
    assert np.abs(rgb - np.asarray(_cat(), np.int16)).max() <= 4  # CIELab → sRGB, not a copy
    grey = np.asarray(open_image(lab, channels=1), np.int16)
    assert np.abs(grey - np.asarray(_cat().convert("L"), np.int16)).max() <= 4

    i16b = _i16b_tiff(tmp_path / "digit.tif")
    assert Image.open(i16b).mode == "I;16B"
    little = to_channels(Image.fromarray(_digit_16bit()), 1)  # the byte order PIL scales
    for channels in (1, 3):
        got = open_image(i16b, channels=channels)
        assert np.array_equal(np.asarray(got.convert("L")), np.asarray(little))
    assert len(np.unique(np.asarray(little))) > 50  # scaled to 8 bits, not clipped to 0/255


def test_zoo_check_passes_convertible_modes_and_reports_an_unconvertible_one(
    tmp_path: Path, small_digits: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    for d in (0, 1):
        (data / f"digit_{d}").mkdir(parents=True)
        for p in sorted((small_digits / f"digit_{d}").glob("*.png"))[:6]:
            (data / f"digit_{d}" / p.name).write_bytes(p.read_bytes())
    _lab_tiff(data / "digit_0" / "lab.tif")
    _i16b_tiff(data / "digit_1" / "big.tif")

    r = zoo_here("check", str(data), "--json", "--strict")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["corrupt"] == []
    assert {o["mode"] for o in report["odd_modes"]} == {"LAB", "I;16B"}

    _without_imagecms(monkeypatch)
    (data / "digit_0" / "lab2.tif").write_bytes((data / "digit_0" / "lab.tif").read_bytes())
    r = zoo_here("check", str(data), "--strict")
    assert r.returncode == 1
    assert "corrupt or unreadable (quarantined): 1" in r.stdout
    line = next(s for s in r.stdout.splitlines() if "lab2.tif" in s)
    assert "InputError" in line and "'LAB'" in line and "PNG" in line


def test_an_unconvertible_image_is_an_input_error_for_the_classifier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clf = OnnxClassifier(float_model(tmp_path / "m.onnx"), threads=1, spin=False)
    lab = _lab_tiff(tmp_path / "cat.tif")
    assert clf.prepare(open_image(lab)).shape == (3, 4, 4)
    _without_imagecms(monkeypatch)
    with pytest.raises(InputError, match=r"cat\.tif has pixel mode 'LAB'.*PNG"):
        clf.prepare(open_image(lab))


def test_serve_answers_16_bit_and_cielab_uploads_and_refuses_an_unconvertible_one_with_400(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = _lab_tiff(tmp_path / "cat.tif").read_bytes()
    i16b = _i16b_tiff(tmp_path / "digit.tif").read_bytes()
    with serving(float_model(tmp_path / "m.onnx")) as (c, _):
        for body in (lab, i16b):
            r = c.post(PREDICT_PATH, content=body)
            assert r.status_code == 200, r.text
            assert len(r.json()["predictions"]) == 5
        _without_imagecms(monkeypatch)
        r = c.post(PREDICT_PATH, content=lab)
        assert r.status_code == 400, r.text
        assert "pixel mode 'LAB'" in r.text and "PNG" in r.text
        assert c.post(PREDICT_PATH, content=png()).status_code == 200  # still serving


def test_quantize_refuses_an_output_it_cannot_write_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = float_model(tmp_path / "m.onnx")

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("quantize started before -o was checked")

    monkeypatch.setattr("zoo.deploy.quantize.int8.quantize", never)
    folder = tmp_path / "out"
    folder.mkdir()
    r = zoo_here("quantize", str(model), "-o", str(folder))
    assert r.returncode == 1, r.stderr
    assert f"-o {folder} is a folder" in r.stderr and "model-int8.onnx" in r.stderr
    r = zoo_here("quantize", str(model), "-o", str(tmp_path / "m.int8"))
    assert r.returncode == 2, r.stderr
    assert "named .onnx" in r.stderr and "m.onnx" in r.stderr
    assert list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "m.onnx",
        "out",
    ]


def test_quantize_writes_its_model_through_a_durable_replace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zoo import durable
    from zoo.deploy.quantize.int8 import quantize
    from zoo.deploy.quantize.options import QuantizeOptions

    model = float_model(tmp_path / "m.onnx")
    out = tmp_path / "q" / "m-int8.onnx"
    through: list[Path] = []
    real = durable.file_output

    def spy(path: Path, **kw: Any) -> AbstractContextManager[Path]:
        through.append(path)
        return real(path, **kw)

    monkeypatch.setattr(durable, "file_output", spy)
    report = quantize(QuantizeOptions(model, output=out, mode="dynamic", allow_drop=True))
    assert report.written and through == [out]
    session = OnnxClassifier(out, threads=1, spin=False)
    assert session.outputs(np.zeros((1, 3, 4, 4), np.float32)).shape == (1, 5)
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary left
    assert min(report.size_mb) > 0  # a model of a few kB: its summary divides by its size
    assert report.lines()[1].startswith("size ")


def _model_folder(folder: Path, config: bytes) -> Path:
    folder.mkdir()
    (folder / WEIGHTS_FILE).write_bytes(b"")
    (folder / CARD_FILE).write_text("# digits\n")
    (folder / CONFIG_FILE).write_bytes(config)
    return folder


GOOD = {
    "zoo_schema": 1,
    "base": "resnet18.tv_in1k",
    "num_classes": 2,
    "class_names": ["café", "thé"],
    "weights_sha256": "0" * 64,
}


@pytest.mark.parametrize(
    ("config", "says"),
    [
        (json.dumps(GOOD, ensure_ascii=False).encode("latin-1"), "not valid UTF-8 JSON"),
        (b"3\n", "holds 3, not the JSON object"),
        (json.dumps(list(GOOD)).encode(), 'holds ["zoo_schema", "base"'),
        (json.dumps({**GOOD, "zoo_schema": "2"}).encode(), "'zoo_schema' is '2', not a JSON"),
        (json.dumps({**GOOD, "class_names": 2}).encode(), "'class_names' is 2, not a JSON list"),
    ],
    ids=["latin-1", "number", "list", "string-schema", "number-classes"],
)
def test_a_config_json_of_the_wrong_kind_is_an_artifact_error(
    tmp_path: Path, config: bytes, says: str
) -> None:
    assert read_config(_model_folder(tmp_path / "ok", json.dumps(GOOD).encode())).raw == GOOD
    folder = _model_folder(tmp_path / "bad", config)
    with pytest.raises(ArtifactError, match=r"config\.json") as info:
        read_config(folder)
    assert says in str(info.value)


def test_resuming_with_training_images_gone_names_them_and_what_to_do(
    digits16: Path, tmp_path: Path
) -> None:
    """It ended in a FileNotFoundError traceback from the data check."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(digits16, data)
    r = zoo_here(
        "finetune", "simple_cnn", "--data", str(data), "--epochs", "1", "--runs",
        str(tmp_path / "runs"), "--name", "r", "--num-workers", "0", "--no-progress", "--no-report",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = tmp_path / "runs" / "r"
    card = (run / "model" / "README.md").read_text()  # it said "local folder None"
    assert "weights_source: this model folder's weights" in card and "None" not in card
    rel = json.loads((run / "split.json").read_text())["splits"]["train"][0][0]
    (data / rel).unlink()
    before = sorted(p.name for p in run.rglob("*"))
    r = zoo_here("finetune", "--resume", str(run), "--extend", "1", "--no-progress")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"1 of the images {run} was trained on are gone from {data} (e.g. {rel})" in r.stderr
    assert f"zoo finetune {run} --data DIR" in r.stderr
    assert sorted(p.name for p in run.rglob("*")) == before  # the run is as it was
    data.rename(tmp_path / "moved")  # the whole folder
    r = zoo_here("finetune", "--resume", str(run), "--extend", "1", "--no-progress")
    assert r.returncode == 1 and f"are gone from {data}" in r.stderr
    (tmp_path / "moved" / rel).write_bytes((digits16 / rel).read_bytes())
    r = zoo_here("eval", str(run), "--data", str(tmp_path / "moved"), "--json")  # it was "all"
    assert r.returncode == 0, r.stderr
    val = json.loads((run / "split.json").read_text())["splits"]["val"]
    assert (json.loads(r.stdout)["split"], json.loads(r.stdout)["n"]) == ("val", len(val))


def test_export_leaves_out_a_gate_image_damaged_since_and_never_blames_the_exporter(
    digits16: Path, tmp_path: Path
) -> None:
    """A validation image truncated after training read "ONNX export of RUN failed (dynamo:
    InputError: ...; legacy: InputError: ...)": both exporters tried for a data problem."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(digits16, data)
    runs = tmp_path / "runs"
    zoo_ok(
        "finetune", "simple_cnn", "--data", str(data), "--epochs", "1", "--runs", str(runs),
        "--name", "r", "--num-workers", "0", "--no-progress", "--no-report",
    )  # fmt: skip
    run = runs / "r"
    val = [rel for rel, _ in json.loads((run / "split.json").read_text())["splits"]["val"]]
    (data / val[0]).write_bytes((data / val[0]).read_bytes()[:60])
    r = zoo_here("export", str(run), "-o", str(tmp_path / "one.onnx"))  # one damaged: left out
    assert r.returncode == 0, r.stderr
    assert f"1 that no longer decodes left out (e.g. {data / val[0]})" in r.stderr + r.stdout
    for rel in val:
        (data / rel).write_bytes((data / rel).read_bytes()[:60])  # every one
    r = zoo_here("export", str(run), "-o", str(tmp_path / "m.onnx"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "decodes any more" in r.stderr and "failed (dynamo" not in r.stderr
    assert not (tmp_path / "m.onnx").exists()


def test_quantize_given_a_folder_names_the_onnx_file_in_it(tmp_path: Path) -> None:
    """It said "ONNX file RUN does not exist." of a folder that exists and holds one."""
    from zoo.deploy.quantize.options import QuantizeOptions

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    with pytest.raises(InputError) as exc:
        QuantizeOptions(model=run)  # a folder of no kind of ours: no export to suggest
    assert str(exc.value) == f"{run} is a folder; zoo quantize takes an exported fp32 .onnx file."
    (run / "split.json").write_text("{}")  # a run's
    with pytest.raises(InputError) as exc:
        QuantizeOptions(model=run)
    assert str(exc.value) == (
        f"{run} is a folder; zoo quantize takes an exported fp32 .onnx file: export one first "
        f"(zoo export {run})."
    )
    float_model(run / "model" / "model.onnx")
    for given in (run, run / "model"):
        r = zoo_here("quantize", str(given))
        assert r.returncode == 1 and "Traceback" not in r.stderr
        assert (
            f"{given} is a folder; zoo quantize takes an exported fp32 .onnx file: give "
            in r.stderr
        )
        assert f"give {run / 'model' / 'model.onnx'}." in r.stderr


def test_quantize_says_when_the_data_folders_are_not_the_models_classes(tmp_path: Path) -> None:
    """``--data`` of other classes dropped the labels silently: no accuracy line, no word."""
    from zoo.deploy.quantize.images import eval_images

    for cls in ("a", "b"):
        (tmp_path / "other" / cls).mkdir(parents=True)
        Image.new("RGB", (40, 40), (9, 9, 9)).save(tmp_path / "other" / cls / "x.png")
    other = str(tmp_path / "other")
    got = eval_images(tmp_path / "m.onnx", other, ["cat", "dog"])
    assert got.labels is None and got.description == (
        f"2 images of {other} (unlabelled: a, b not among the model's classes, so agreement "
        "with fp32 only, no accuracy)"
    )
    mine = eval_images(tmp_path / "m.onnx", other, ["a", "b"])
    assert mine.labels is not None and mine.description == f"2 images of {other}"
    flat = str(tmp_path / "other" / "a")
    assert eval_images(tmp_path / "m.onnx", flat, ["cat", "dog"]).description == (
        f"1 images of {flat} (unlabelled: no class folders, so agreement with fp32 only, no "
        "accuracy)"
    )


def test_eval_of_a_model_without_class_names_says_what_to_evaluate(digits16: Path) -> None:
    r = zoo_here("eval", "simple_cnn", "--data", str(digits16))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert (
        "simple_cnn has no class names to match the folder's classes against: evaluate a "
        in r.stderr
    )
    assert "(zoo finetune simple_cnn --data DIR, then zoo eval RUN)." in r.stderr


def test_a_resume_checks_every_split_and_names_what_an_unfinished_run_started_from(
    tmp_path: Path,
) -> None:
    from zoo.errors import DataError
    from zoo.train.data import Splits
    from zoo.train.resolve import _check_present

    (tmp_path / "a").mkdir()
    for name in ("t.png", "v.png"):
        (tmp_path / "a" / name).write_bytes(b"x")
    files = {"train": [("a/t.png", "a")], "val": [("a/v.png", "a")], "test": [("a/gone.png", "a")]}
    splits = Splits(root=tmp_path, classes=["a"], files=files, layout="split")
    run = tmp_path / "run"  # interrupted: no model/ yet
    with pytest.raises(DataError) as exc:
        _check_present(splits, run, "mobilenet_v2")
    assert "1 of the images" in str(exc.value) and "(e.g. a/gone.png)" in str(exc.value)
    assert str(exc.value).endswith("zoo finetune mobilenet_v2 --data DIR")


def test_outputs_under_a_file_or_outside_runs_are_refused_before_any_work(
    digits16: Path, tmp_path: Path
) -> None:
    """``ev.json/x.png`` (``ev.json`` a file) ended in FileExistsError/NotADirectoryError
    tracebacks after the work; ``--name ../escaped`` wrote outside ``--runs``."""
    blocker = tmp_path / "ev.json"
    blocker.write_text("{}")
    cases = [
        ("lr-find", "simple_cnn", "--data", str(digits16), "--weights", "none",
         "--plot", str(blocker / "x.png")),
        ("eval", "simple_cnn", "--data", str(digits16), "--report",
         "--report-out", str(blocker / "r.html")),
        ("finetune", "simple_cnn", "--data", str(digits16), "--weights", "none",
         "--runs", str(blocker)),
        ("finetune", "simple_cnn", "--data", str(digits16), "--weights", "none",
         "--runs", str(blocker / "runs")),
    ]  # fmt: skip
    for args in cases:
        r = zoo_here(*args, cwd=tmp_path)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (args, r.stderr)
        assert str(blocker) in r.stderr and "file" in r.stderr, (args, r.stderr)
    assert blocker.read_text() == "{}"
    for name in ("../escaped", "a/b", ".."):
        r = zoo_here(
            "finetune", "simple_cnn", "--data", str(digits16), "--weights", "none",
            "--runs", str(tmp_path / "runs"), "--name", name, cwd=tmp_path,
        )  # fmt: skip
        assert r.returncode == 2 and "give a folder name, not a path" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev.json"]


def test_a_path_the_file_system_refuses_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    """The net under every command's own checks: ENOTDIR, EISDIR, EACCES … are said in a
    line naming the path (exit 1); any other OSError stays a traceback (a bug of ours)."""
    import errno

    from zoo.cli.app import _path_error

    said = _path_error(NotADirectoryError(errno.ENOTDIR, "Not a directory", "ev.json/p.csv"))
    assert said is not None and said.startswith("ev.json/p.csv: a folder on this path is a file")
    assert "a folder where a file was needed" in str(
        _path_error(IsADirectoryError(errno.EISDIR, "Is a directory", "d.csv"))
    )
    assert _path_error(OSError(errno.EIO, "I/O error", "x")) is None


def test_a_failed_write_is_said_of_the_users_path_not_a_temporary_one(tmp_path: Path) -> None:
    """An atomic write fails on its hidden temporary file (here its rename onto a folder): the
    net names the file the user asked for; so does a failure inside a scratch folder zoo
    works in (zoo quantize, an OpenVINO export); a folder of the user's that merely starts
    with ``tmp`` is named as it is."""
    import errno
    import os

    from zoo import durable
    from zoo.cli.app import _path_error

    (tmp_path / "out.json").mkdir()
    with pytest.raises(IsADirectoryError) as got:
        durable.write_json(tmp_path / "out.json", {}, label=None)
    assert durable.TEMP_NAME.fullmatch(Path(got.value.filename).name)  # what the OS named
    assert _path_error(got.value) == (
        f"{tmp_path / 'out.json'} (writing it): is a folder where a file was needed: name a file."
    )
    full = OSError(errno.ENOSPC, "No space left", str(tmp_path / ".m.1a2b3c4d.tmp" / "w.bin"))
    said = _path_error(full)
    assert said is not None and said.startswith(
        f"{tmp_path / 'm' / 'w.bin'} (writing it): no space"
    )
    with durable.scratch_dir(tmp_path / "q.int8.onnx") as scratch:
        inside = OSError(errno.ENOSPC, "No space left", str(Path(scratch) / "prepped.onnx"))
        said = _path_error(inside)
    assert said is not None
    assert said.startswith(f"{tmp_path / 'q.int8.onnx' / 'prepped.onnx'} (writing it): no space")
    own = tmp_path / "tmp_outputs" / "a.jpg"  # the user's folder, not a scratch one
    said = _path_error(OSError(errno.EACCES, "Permission denied", str(own)))
    assert said == f"{own}: permission denied: choose a place you can write to (or read)."
    said = _path_error(OSError(errno.EACCES, "Permission denied", os.fsencode(own)))
    assert said == f"{own}: permission denied: choose a place you can write to (or read)."


def test_an_image_damaged_after_training_is_left_out_of_eval_with_a_note(
    digits16: Path, tmp_path: Path
) -> None:
    """A validation image truncated after training stopped ``zoo eval`` (and ``--ood`` stopped
    at one broken file) where a deleted one is left out and finetune quarantines it."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(digits16, data)
    zoo_ok(
        "finetune", "simple_cnn", "--weights", "none", "--data", str(data), "--epochs", "1",
        "--runs", str(tmp_path / "runs"), "--name", "r", "--num-workers", "0", "--no-progress",
        "--no-report",
    )  # fmt: skip
    run = tmp_path / "runs" / "r"
    val = json.loads((run / "split.json").read_text())["splits"]["val"]
    broken = data / val[0][0]
    broken.write_bytes(broken.read_bytes()[:40])  # a truncated PNG
    outside = tmp_path / "outside"
    outside.mkdir()
    for i, name in enumerate(sorted(p.name for p in (data / "digit_3").iterdir())[:4]):
        shutil.copy(data / "digit_3" / name, outside / f"{i}.png")
    (outside / "bad.png").write_bytes(b"not an image")
    r = zoo_here("eval", str(run), "--ood", str(outside), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["n"] == len(val) - 1
    assert [u["path"] for u in got["unreadable"]] == [str(broken)]
    assert got["ood"]["n_out"] == 4
    assert [Path(u["path"]).name for u in got["ood"]["unreadable"]] == ["bad.png"]
    r = zoo_here("eval", str(run))
    assert r.returncode == 0, r.stderr
    assert f"note: 1 of the val images does not decode (changed or damaged; e.g. {broken}" in (
        r.stderr
    )


def test_freeze_epochs_that_nothing_reads_is_refused_and_one_past_the_end_is_said(
    digits16: Path, tmp_path: Path
) -> None:
    """``--freeze-epochs`` with ``--strategy full`` was accepted and ignored; with gradual and
    ``--freeze-epochs`` ≥ ``--epochs`` the run was silently a linear probe."""
    r = zoo_here(
        "finetune", "simple_cnn", "--weights", "none", "--data", str(digits16),
        "--freeze-epochs", "2", "--runs", str(tmp_path), "--dry-run", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2 and "--freeze-epochs applies to --strategy gradual" in r.stderr
    assert "strategy is full" in r.stderr
    r = zoo_here(
        "finetune", "mobilenet_v2", "--data", str(digits16), "--image-size", "32",
        "--freeze-epochs", "5", "--epochs", "2", "--runs", str(tmp_path), "--dry-run",
        "--num-workers", "0", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "note: --freeze-epochs 5 ≥ --epochs 2: the backbone stays frozen" in r.stderr


def test_enroll_takes_a_folder_of_images(digits16: Path, tmp_path: Path) -> None:
    """``zoo enroll RUN --class star star/`` said "1 image(s) given" of a folder of six."""
    from zoo.images import image_files

    folder = digits16 / "digit_3"
    files = image_files([folder, tmp_path / "missing.png"])
    assert files[:-1] == tuple(sorted(folder.iterdir())) and files[-1] == tmp_path / "missing.png"
    few = tmp_path / "few"
    few.mkdir()
    for p in sorted(folder.iterdir())[:3]:
        (few / p.name).write_bytes(p.read_bytes())
    r = zoo_here("enroll", str(tmp_path / "no-run"), str(few), "--class", "star")
    assert r.returncode == 2 and "3 image(s) given for 'star'" in r.stderr, r.stderr
