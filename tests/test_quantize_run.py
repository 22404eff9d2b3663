"""``zoo quantize`` of a run's model: judged on the run's own validation images, written to the
model folder's ``variants/``, held to the floor, and honest when int8 does not pay.

One module fixture: real MobileNetV2 weights fine-tuned (linear probe, feature cache, 1 epoch,
32 px) on 300 real digits, exported into its run. The decisions (floor, "does not pay", the
CPU-dependent setting, the search's time estimate) are pure functions tested on given numbers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import finetune_here, zoo_here
from zoo.deploy.quantize import calibration
from zoo.deploy.quantize import images as qi
from zoo.deploy.quantize import options as qo
from zoo.deploy.quantize import verdict as qv
from zoo.deploy.quantize.search import estimate_seconds
from zoo.errors import InputError


@pytest.fixture(scope="module")
def run(small_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Trained and exported in this process (the commands' start-up is not what is tested)."""
    root = tmp_path_factory.mktemp("qrun")
    finetune_here(
        small_digits, root, "digits", model="mobilenet_v2", strategy="linear",
        cache_features=True, epochs=1, image_size=32,
    )  # fmt: skip
    e = zoo_here("export", str(root / "digits"), "--data", str(small_digits))
    assert e.returncode == 0, e.stderr
    return root / "digits"


@pytest.fixture(scope="module")
def quantized(run: Path) -> dict:
    """The plain command on the run's model (dynamic: no calibration, the cheapest)."""
    r = zoo_here("quantize", str(run / "model" / "model.onnx"), "--mode", "dynamic", "--json")
    assert r.returncode in (0, 1), r.stderr
    return {"rc": r.returncode, "report": json.loads(r.stdout), "stderr": r.stderr}


def test_judged_on_the_runs_validation_images(run: Path, quantized: dict) -> None:
    rep = quantized["report"]
    n_val = len(json.loads((run / "split.json").read_text())["splits"]["val"])
    assert rep["image_source"] == "run" and rep["n_images"] == n_val
    assert rep["images"] == f"all run digits's {n_val} validation images"
    assert "accuracy" in rep, "the run's labels give accuracy, not only agreement"
    assert rep["floor"]["applies"]
    # the exit code follows the floor: 1 and no file below it, 0 and the file above it
    out = run / "model" / "variants" / "int8-dynamic.onnx"
    assert quantized["rc"] == (0 if rep["floor"]["passed"] else 1)
    assert out.exists() == rep["floor"]["passed"] == rep["written"]


def test_default_output_is_a_variant_and_the_run_still_predicts(run: Path) -> None:
    r = zoo_here("quantize", str(run / "model" / "model.onnx"), "--engine", "ort", "--allow-drop")
    assert r.returncode == 0, r.stderr
    out = run / "model" / "variants" / "int8-static.onnx"
    assert out.is_file() and f"wrote {out}" in r.stdout
    assert "judged on all run digits's" in r.stdout and "bundled" not in r.stdout
    assert "calibration: minmax ranges, U8S8" in r.stdout and "run digits's" in r.stdout
    assert not list((run / "model").glob("*.int8-*")), "nothing beside model.onnx"
    image = next(
        p for p in sorted(Path(json.loads((run / "split.json").read_text())["root"]).rglob("*.png"))
    )
    p = zoo_here("predict", str(run), str(image))
    assert p.returncode == 0, p.stderr


def test_below_the_floor_exits_1_unless_allowed(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the floor at −1 (any int8 is below it) the command prints its summary, exits 1
    and writes nothing; ``--allow-drop`` writes the file and exits 0."""
    from zoo.cli.app import app

    monkeypatch.setattr(qv, "FLOOR_ACCURACY_DROP", -1.0)
    model = run / "model" / "model.onnx"
    out = tmp_path / "q.onnx"
    args = ["quantize", str(model), "--mode", "dynamic", "-o", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1, res.output
    assert "floor: FAILED" in res.output and "nothing written" in res.output
    assert "Nothing was written" in res.output and "--allow-drop" in res.output
    # the next road, named with this run: quantization-aware fine-tuning
    assert f"zoo distill {run} --qat --data DIR" in " ".join(res.output.split())
    assert not out.exists() and not list(tmp_path.iterdir())
    res = CliRunner().invoke(app, [*args, "--allow-drop"])
    assert res.exit_code == 0, res.output
    assert "floor: ALLOWED" in res.output and out.is_file()


def test_a_registry_model_says_its_two_photos_prove_nothing(tmp_path: Path) -> None:
    model = tmp_path / "sc.onnx"
    assert zoo_here("export", "simple_cnn", "-o", str(model)).returncode == 0
    r = zoo_here("quantize", str(model), "--mode", "dynamic")
    assert r.returncode == 0, r.stderr
    assert "built-in images proves nothing" in r.stdout
    assert (tmp_path / "sc.int8-dynamic.onnx").is_file()  # not a model folder: beside it


# --- the decisions, on given numbers ----------------------------------------------------------


def _run_with_a_photo_in_both_splits(small_digits: Path, root: Path) -> Path:
    """A run folder as ``zoo finetune`` leaves it (split.json, model/), over a copy of the
    digits where one photo is there twice under two names: one copy in each split, as a user's
    folder with a duplicate ends up."""
    data = root / "data"
    shutil.copytree(small_digits, data)
    dup = data / "digit_3" / "dup.png"
    first = sorted((data / "digit_3").glob("*.png"))[0]
    shutil.copy(first, dup)
    rows = [(str(p.relative_to(data)), p.parent.name) for p in sorted(data.rglob("*.png"))]
    val = [r for r in rows if r[0] == str(dup.relative_to(data))] + rows[1:40:4]
    train = [r for r in rows if r not in val]
    assert (str(first.relative_to(data)), "digit_3") in train
    run = root / "run"
    (run / "model").mkdir(parents=True)
    (run / "split.json").write_text(
        json.dumps({"root": str(data), "splits": {"train": train, "val": val}})
    )
    return run


def test_a_photo_in_both_splits_is_left_out_of_the_calibration(
    small_digits: Path, tmp_path: Path
) -> None:
    """No --calib: zoo calibrates on the run's training split and judges on its validation
    split, both its own choice. A photo the user's folder holds twice (one copy in each) is
    left out of the calibration and said so, instead of an error blaming --data/--calib, which
    the user never gave."""
    run = _run_with_a_photo_in_both_splits(small_digits, tmp_path)
    model = run / "model" / "model.onnx"
    held = qi.eval_images(model, None, [f"digit_{d}" for d in range(10)])
    assert held.source == "run"
    paths, said = qi.calibration_images(model, None, 1000, held_out=held)
    n_train = len(json.loads((run / "split.json").read_text())["splits"]["train"])
    assert len(paths) == n_train - 1 and (run.parent / "data/digit_3/dup.png") not in paths
    assert said == f"{n_train - 1} of run run's {n_train} train images (seed 0)" + (
        " (left out: 1 of the run's validation images)"
    )
    calibration.check_disjoint(paths, list(held.paths), from_run=True)  # now disjoint
    few, said = qi.calibration_images(model, None, 8, held_out=held)
    assert len(few) == 8 and said.startswith("8 of run run's")
    # the limit counts kept images: the copy left out does not make the sample one short
    most, said = qi.calibration_images(model, None, n_train - 1, held_out=held)
    assert len(most) == n_train - 1 and said.startswith(f"{n_train - 1} of run run's")


def test_calibration_from_calib_leaves_the_judged_images_out_and_refuses_when_none_is_left(
    small_digits: Path, tmp_path: Path
) -> None:
    """--calib the folder the run was trained on: its validation images (and copies) are left
    out and counted; a --calib or a training split holding nothing else is refused, naming it
    and what to do."""
    run = _run_with_a_photo_in_both_splits(small_digits, tmp_path)
    model = run / "model" / "model.onnx"
    held = qi.eval_images(model, None, [f"digit_{d}" for d in range(10)])
    data = run.parent / "data"
    paths, said = qi.calibration_images(model, str(data), 1000, held_out=held)
    n_all = len(list(data.rglob("*.png")))
    # the validation images, and the training copy of the photo held twice
    assert len(paths) == n_all - len(held.paths) - 1
    left_out = f"(left out: {len(held.paths) + 1} of the run's validation images)"
    assert said == f"{len(paths)} images of {data} {left_out}"
    few, said = qi.calibration_images(model, str(data), 5, held_out=held)
    assert len(few) == 5 and said.startswith(f"5 images of {data} (left out: ")
    most, _ = qi.calibration_images(model, str(data), len(paths), held_out=held)
    # the limit counts kept images, after the held-out ones are left out (the one extra copy of
    # a held-out photo takes a place of its own)
    assert len(most) == len(paths) - 1 and set(most) < set(paths)
    fresh = tmp_path / "fresh"
    shutil.copytree(data / "digit_5", fresh / "digit_5")
    for p in held.paths:  # none of the validation images: nothing to leave out
        if p.parent.name == "digit_5":
            (fresh / "digit_5" / p.name).unlink()
    fresh_paths, said = qi.calibration_images(model, str(fresh), 1000, held_out=held)
    assert said == f"{len(fresh_paths)} images of {fresh}"  # nothing left out: nothing said
    (fresh / "empty").mkdir()
    with pytest.raises(InputError) as exc:
        qi.calibration_images(model, str(fresh / "empty"), 8, held_out=held)
    assert str(exc.value) == f"No images found for calibration in {fresh / 'empty'}."
    only_val = tmp_path / "only_val"
    only_val.mkdir()
    for i, p in enumerate(held.paths):
        shutil.copy(p, only_val / f"{i}.png")
    with pytest.raises(InputError) as exc:
        qi.calibration_images(model, str(only_val), 8, held_out=held)
    assert str(exc.value) == (
        f"Every image of --calib {only_val} is one of the run's validation images int8 is judged "
        "on: give --calib other images like them (or omit it: zoo then calibrates on the run's "
        "training split)."
    )
    doc = json.loads((run / "split.json").read_text())
    val = {rel for rel, _ in doc["splits"]["val"]}
    doc["splits"]["train"] = [[rel, "digit_3"] for rel in sorted(val)[:1]]  # a val image
    (run / "split.json").write_text(json.dumps(doc))
    with pytest.raises(InputError) as exc:
        qi.calibration_images(model, None, 8, held_out=held)
    assert str(exc.value) == (
        "Every image of run run's training split is one of the run's validation images int8 is "
        "judged on: its folder holds the same photos more than once: give --calib DIR with "
        "other images like them."
    )
    with pytest.raises(InputError, match=r"^--mode static needs --calib DIR"):
        qi.calibration_images(tmp_path / "no_run.onnx", None, 8, held_out=held)


def test_data_in_the_runs_training_split_blames_neither_calib_nor_the_user(
    small_digits: Path, tmp_path: Path
) -> None:
    """--data given, no --calib: calibration is the run's training split; --data images among
    it are refused, naming where the calibration came from and what to do."""
    run = _run_with_a_photo_in_both_splits(small_digits, tmp_path)
    model = run / "model" / "model.onnx"
    held = qi.eval_images(model, str(run.parent / "data"), [f"digit_{d}" for d in range(10)])
    assert held.source == "data"
    paths, _ = qi.calibration_images(model, None, 50, held_out=held)
    with pytest.raises(InputError) as exc:
        calibration.check_disjoint(paths, list(held.paths), from_run=True)
    digest = calibration.file_digest
    shared = calibration.shared_files(
        [(str(p), digest(p)) for p in paths], [(str(p), digest(p)) for p in held.paths]
    )
    shown = "; ".join(c if c == h else f"{c} = {h}" for c, h in shared[:3])
    assert len(shared) > 3 and shown.count("; ") == 2  # three named, of more
    assert str(exc.value) == (
        f"{len(shared)} --data image(s) are also images of the run's training split, which zoo "
        f"calibrates on without --calib ({shown}): an agreement must be measured on held-out "
        "images. Give --data images the run was not trained on (different source photos, not "
        "just different files), or --calib a folder disjoint from --data."
    )
    with pytest.raises(InputError) as exc:
        calibration.check_disjoint(paths, list(held.paths))
    assert str(exc.value) == (
        f"{len(shared)} --data image(s) are also --calib images ({shown}): an agreement must be "
        "measured on held-out images. Give --data and --calib disjoint folders (different "
        "source photos, not just different files)."
    )


def _images(source: str = "run") -> qi.EvalImages:
    return qi.EvalImages((Path("a.png"),) * 359, None, source, "359 images")  # type: ignore[arg-type]


def test_floor_on_accuracy_and_on_agreement() -> None:
    assert qv.check_floor(0.01, [0.9, 1.0], _images()).passed  # exactly 1 point: at the floor
    low = qv.check_floor(0.209, [0.6, 0.8], _images())
    assert not low.passed and low.reason.startswith("int8 loses 20.9 points of accuracy (over")
    assert qv.check_floor(None, [0.95, 0.98], _images()).passed  # interval reaches 98 %
    assert not qv.check_floor(None, [0.9, 0.979], _images()).passed
    builtin = qv.check_floor(0.5, [0.0, 0.66], _images("builtin"))
    assert builtin.passed and not builtin.applies and "proves nothing" in builtin.reason


def test_int8_does_not_pay_with_few_int8_nodes_or_no_speed_up() -> None:
    assert qv.does_not_pay(qv.Coverage(53, 53), 0.7) is None
    few = qv.does_not_pay(qv.Coverage(53, 1), 0.7)
    assert few is not None and "only 1 of 53 Conv/Gemm/MatMul nodes run in int8" in few
    slow = qv.does_not_pay(qv.Coverage(53, 53), 1.0)
    assert slow is not None and "1.00× the fp32 latency" in slow
    assert "fp16" in slow and "OpenVINO" in slow and "Keep the fp32 model" in slow
    both = qv.does_not_pay(qv.Coverage(53, 20), 1.3)
    assert both is not None and "only 20 of 53" in both and "1.30×" in both
    assert qv.does_not_pay(qv.Coverage(0, 0), 0.9) is None


def test_reduce_range_only_without_vnni() -> None:
    assert qo.default_calibration(flags=frozenset({"avx2"})).reduce_range
    for vnni in ("avx512_vnni", "avx_vnni", "amx_int8"):
        assert not qo.default_calibration(flags=frozenset({"avx2", vnni})).reduce_range
    c = qo.default_calibration(flags=frozenset())
    assert (c.method, c.per_channel, c.int8_activations) == (qo.DEFAULT_METHOD, True, False)
    assert qo.default_calibration("entropy", False, frozenset()).method == "entropy"


def test_one_naming_rule() -> None:
    assert qo.variant_name("static") == "int8-static"
    assert qo.variant_name("dynamic") == "int8-dynamic"
    assert qo.variant_name("static", "nncf") == "int8-nncf"
    assert qo.default_output(Path("/x/m.onnx"), "static", "nncf") == Path("/x/m.int8-nncf.onnx")


def test_search_estimate_grows_with_nodes_and_images() -> None:
    small = estimate_seconds(99, 60, 200, 0.002)
    assert set(small.seconds) == {"calibrate", "choose_calibration", "sensitivity", "search_k"}
    assert estimate_seconds(99, 300, 200, 0.002).total > small.total
    assert estimate_seconds(200, 60, 200, 0.002).total > small.total
    assert small.seconds["sensitivity"] == pytest.approx(99 * (0.3 + 16 * 0.002))
    assert "99 nodes" in small.describe() and "before it starts" in small.describe()


def test_auto_engine_is_nncf_where_it_applies() -> None:
    """``--engine auto`` (the default) takes the engine that kept the most accuracy measured
    (NNCF) unless the options ask for onnxruntime's own settings or a mode NNCF lacks."""
    import importlib.util

    from zoo.deploy.quantize.options import resolve_engine

    best = "nncf" if importlib.util.find_spec("nncf") else "ort"
    assert resolve_engine("auto", "static", None, None, None) == best
    assert resolve_engine("auto", "dynamic", None, None, None) == "ort"
    assert resolve_engine("auto", "static", "entropy", None, None) == "ort"
    assert resolve_engine("auto", "static", None, False, None) == "ort"
    assert resolve_engine("auto", "static", None, None, 0.98) == "ort"
    assert resolve_engine("ort", "static", None, None, None) == "ort"
    assert resolve_engine("nncf", "static", None, None, None) == "nncf"


def test_nncf_overflow_fix_follows_the_bits() -> None:
    """NNCF's weights take the bits asked: 7 on every dense layer (``ENABLE``), else 7 on the
    first layer alone (``FIRST_LAYER``, its default); end to end: tests/test_deploy.py."""
    advanced = pytest.importorskip("nncf.quantization.advanced_parameters")
    from zoo.deploy.quantize.nncf_engine import overflow_fix

    assert overflow_fix(7) == advanced.OverflowFix.ENABLE
    assert overflow_fix(8) == advanced.OverflowFix.FIRST_LAYER


def test_nncf_tries_both_widths_only_where_nothing_else_decides() -> None:
    """On a CPU without VNNI NNCF makes 7- and 8-bit weights and keeps the one agreeing more
    with fp32 (a tie: 7, the first); ``--weight-bits``, a QAT model's bits or a VNNI CPU decide
    alone; the choice is said with both agreements, and nothing is said without one."""
    from zoo.deploy.quantize.nncf_engine import BitsChoice, better_bits

    avx2, vnni = frozenset({"avx2"}), frozenset({"avx2", "avx512_vnni"})
    assert qo.nncf_weight_bits_to_try(None, None, avx2) == (7, 8)
    assert qo.nncf_weight_bits_to_try(None, None, vnni) == (8,)
    assert qo.nncf_weight_bits_to_try(None, 8, avx2) == (8,)
    assert qo.nncf_weight_bits_to_try(7, None, vnni) == (7,)
    assert qo.nncf_weight_bits_to_try(8, None, avx2) == (7,)
    assert better_bits({7: 0.9, 8: 0.9}) == 7 and better_bits({7: 0.8, 8: 0.85}) == 8
    chose = BitsChoice(8, {7: 0.77, 8: 0.82}, 300)
    said = chose.describe()
    assert said is not None and said.startswith("weights: 8 bits, the better of two")
    assert "300 calibration images: 7-bit 77.0%, 8-bit 82.0%" in said
    assert chose.tried() == {"7": 0.77, "8": 0.82}
    assert BitsChoice(7).describe() == "weights: 7 bits" and BitsChoice(7).tried() is None
    tie = BitsChoice(7, {7: 1.0, 8: 1.0}, 2).describe()
    assert tie.startswith("weights: 7 bits, a tie of the two") and "2 calibration images" in tie


def test_weight_bits_decide_instead_of_the_rule_and_are_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--weight-bits`` overrides the rule (the fewer of a QAT model's bits and this CPU's),
    for a file that runs on another CPU; the plan says what that means, and nothing when the
    bits asked are this CPU's anyway; bits other than 8 or 7 and dynamic mode are refused by
    name; NNCF takes them too."""
    from zoo.errors import InputError, UsageError

    avx2, vnni = frozenset({"avx2"}), frozenset({"avx2", "avx512_vnni"})
    assert not qo.default_calibration(flags=avx2, asked_bits=8).reduce_range
    assert qo.default_calibration(flags=vnni, asked_bits=7).reduce_range
    assert not qo.default_calibration(flags=avx2, weight_bits=7, asked_bits=8).reduce_range
    # the rule both engines follow: asked, else the fewer of the trained bits and the CPU's
    assert qo.shipped_weight_bits(None, None, avx2) == 7
    assert qo.shipped_weight_bits(None, None, vnni) == 8
    assert qo.shipped_weight_bits(7, None, vnni) == 7 and qo.shipped_weight_bits(8, None, avx2) == 7
    assert qo.shipped_weight_bits(7, 8, avx2) == 8 and qo.shipped_weight_bits(None, 7, vnni) == 7
    monkeypatch.setattr(qo, "int8_weight_bits", lambda flags=None: 7)  # no VNNI here
    for_server = qo.weight_bits_note(False, None, 8)
    assert for_server is not None and "a file for a CPU with VNNI" in for_server
    assert "understates" in for_server and "--allow-drop" in for_server
    assert qo.weight_bits_note(True, None, 7) is None  # this CPU's bits anyway
    assert qo.weight_bits_note(True, None, None) is None
    other = qo.weight_bits_note(True, 8, 7)
    assert other is not None and "trained (zoo distill --qat) for 8-bit" in other
    assert "another rounding" in other and "VNNI" not in other
    trained = qo.weight_bits_note(True, 8, None)  # the rule's own note names the way out
    assert trained is not None and "--weight-bits 8" in trained
    monkeypatch.setattr(qo, "int8_weight_bits", lambda flags=None: 8)  # VNNI here
    for_avx2 = qo.weight_bits_note(True, None, 7)
    assert for_avx2 is not None and "a file for a CPU without it" in for_avx2
    assert qo.weight_bits_note(False, 8, 8) is None
    model = tmp_path / "m.onnx"
    with pytest.raises(UsageError, match="--weight-bits 6: int8 weights take 8 bits, or 7 \\(for"):
        qo.QuantizeOptions(model, weight_bits=6)
    with pytest.raises(InputError, match="use --mode static \\(got --mode dynamic\\)"):
        qo.QuantizeOptions(model, mode="dynamic", weight_bits=8)
    # both engines take them (NNCF as its overflow fix: test_nncf_overflow_fix_follows_the_bits)
    assert qo.QuantizeOptions(model, engine="nncf", weight_bits=7).weight_bits == 7
    assert qo.QuantizeOptions(model, weight_bits=8).resolved_engine == qo.resolve_engine(
        "auto", "static", None, None, None
    )
    from typer.testing import CliRunner

    from zoo.cli.app import app

    res = CliRunner().invoke(app, ["quantize", str(model), "--weight-bits", "6"])
    assert res.exit_code == 2 and "int8 weights take 8 bits, or 7" in res.output, res.output
    assert not list(tmp_path.iterdir())  # nothing written
