"""``zoo quantize --target-agreement``: the search's pure parts on plain lists and arrays
(milliseconds), its refusals (before anything is read or written), and one end-to-end search on
a real small model: ``simple_cnn`` fine-tuned on the real digits, where int8 alone keeps ~70 %
of the fp32 answers and the search keeps a few nodes float to reach the target."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from tests.conftest import run_zoo
from zoo.deploy.quantize import calibration as qc

# --- choosing k -------------------------------------------------------------------------------
from zoo.deploy.quantize import images as qi
from zoo.deploy.quantize import report as qr
from zoo.deploy.quantize import search as qs
from zoo.deploy.quantize import verdict as qv
from zoo.deploy.quantize.int8 import quantize
from zoo.deploy.quantize.options import QuantizeOptions, check_target
from zoo.deploy.quantize.verdict import wilson
from zoo.errors import InputError, QuantizationError


def test_choose_k_is_the_smallest_measured_k_that_reaches_the_target() -> None:
    steps = [(0, 0.63), (99, 1.0), (49, 0.99), (24, 0.96), (36, 0.98), (30, 0.975), (33, 0.979)]
    assert qs.choose_k(steps, 0.98) == 36  # reaching it exactly counts
    assert qs.choose_k(steps, 0.979) == 33
    assert qs.choose_k(steps, 0.5) == 0
    assert qs.choose_k(steps, 1.0) == 99
    assert qs.choose_k([(0, 0.5), (10, 0.9)], 0.95) is None
    assert qs.choose_k([], 0.5) is None


@pytest.mark.parametrize("n", [0, 1, 2, 7, 64, 99])
def test_bisection_finds_the_first_k_of_a_monotone_curve(n: int) -> None:
    for first in range(n + 1):
        calls: list[int] = []

        def measure(k: int, first: int = first, calls: list[int] = calls) -> float:
            calls.append(k)
            return 0.99 if k >= first else 0.9 + k / 10_000  # rising, short of 0.98 before first

        steps = qs.bisect_k(measure, n, 0.98)
        assert qs.choose_k(steps, 0.98) == first
        assert [k for k, _ in steps] == calls and len(set(calls)) == len(calls), "each k once"
        assert len(calls) <= math.ceil(math.log2(max(n, 1))) + 2
        if first > 0:  # the k just below the answer was measured and falls short
            assert dict(steps)[first - 1] < 0.98


def test_bisection_stops_at_k_0_and_measures_n_when_nothing_else_reaches() -> None:
    assert qs.bisect_k(lambda k: 1.0, 99, 0.98) == [(0, 1.0)]
    steps = qs.bisect_k(lambda k: 0.5, 8, 0.98)
    assert steps == [(0, 0.5), (4, 0.5), (6, 0.5), (7, 0.5), (8, 0.5)]
    assert qs.choose_k(steps, 0.98) is None


# --- ordering and calibration -----------------------------------------------------------------


def test_sensitivity_order_is_highest_score_first_ties_in_graph_order() -> None:
    names = ["conv0", "clip0", "conv1", "add0", "gemm"]
    scores = {"conv0": 0.08, "clip0": 0.0, "conv1": 0.08, "add0": 0.3, "gemm": 0.001}
    assert qs.sensitivity_order(names, scores) == ["add0", "conv0", "conv1", "gemm", "clip0"]
    assert qs.sensitivity_order([], {}) == []


def test_best_calibration_is_the_lowest_logit_error_first_of_equals() -> None:
    a = qs.Tried(qc.Calibration("minmax", True), 0.2, 0.7)
    b = qs.Tried(qc.Calibration("percentile", False), 0.1, 0.6)  # fewer answers, closer logits
    c = qs.Tried(qc.Calibration("entropy", True, symmetric=True), 0.1, 0.9)
    assert qs.best_calibration([a, b, c]) is b
    assert qs.best_calibration([a]) is a
    with pytest.raises(ValueError):
        qs.best_calibration([])


def test_logit_error_and_top1_agreement() -> None:
    y32 = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]], np.float32)
    assert qs.logit_error(y32, y32) == 0.0
    y8 = y32.copy()
    y8[0] = [4.0, 3.0]  # |d|² = 2, |y|² = 25; flips the top-1
    assert qs.logit_error(y32, y8) == pytest.approx(2 / 25 / 3)
    assert qs.top1_agreement(y32, y8) == pytest.approx(2 / 3)
    assert math.isfinite(qs.logit_error(np.zeros((1, 2)), np.ones((1, 2))))  # zero logits


# --- held-out images must not be calibration images -------------------------------------------


def test_shared_files_pairs_the_same_content_under_any_name() -> None:
    calib = [("c/a.png", "d1"), ("c/b.png", "d2"), ("c/b2.png", "d2")]
    held = [("h/x.png", "d3"), ("h/y.png", "d2"), ("h/z.png", "d1")]
    assert qc.shared_files(calib, held) == [("c/b.png", "h/y.png"), ("c/a.png", "h/z.png")]
    assert qc.shared_files(calib, [("h/x.png", "d3")]) == []


def test_check_disjoint_refuses_a_copy_a_link_or_the_same_file(tmp_path: Path) -> None:
    (tmp_path / "calib").mkdir()
    (tmp_path / "held").mkdir()
    calib = [tmp_path / "calib" / f"{i}.png" for i in range(3)]
    for i, p in enumerate(calib):
        p.write_bytes(b"image %d" % i)
    fresh = tmp_path / "held" / "new.png"
    fresh.write_bytes(b"another image")
    qc.check_disjoint(calib, [fresh])  # disjoint: nothing to say
    copy, link = tmp_path / "held" / "copy.png", tmp_path / "held" / "link.png"
    copy.write_bytes(calib[1].read_bytes())
    os.link(calib[2], link)
    for held in ([fresh, copy], [link], [calib[0]], [fresh, copy, link, calib[0]]):
        with pytest.raises(InputError, match=r"are also --calib images") as exc:
            qc.check_disjoint(calib, held)
        assert f"{len(held) - (fresh in held)} --data image(s)" in str(exc.value)
    with pytest.raises(InputError) as exc:
        qc.check_disjoint(calib, [fresh, copy])
    assert f"{calib[1]} = {copy}" in str(exc.value) and "disjoint folders" in str(exc.value)
    with pytest.raises(InputError) as exc:
        qc.check_disjoint(calib, [calib[0]])  # the same file: named once
    assert str(exc.value).startswith(f"1 --data image(s) are also --calib images ({calib[0]}):")


# --- refusals: before anything is read or written ---------------------------------------------


@pytest.mark.parametrize("target", [0.0, -0.1, 1.0001, 2.0, float("nan"), float("inf")])
def test_target_must_be_a_share_in_0_1(target: float) -> None:
    with pytest.raises(InputError, match=r"must be in \(0, 1\]") as exc:
        check_target(target)
    assert repr(target) in str(exc.value)


def test_target_in_range_passes() -> None:
    assert check_target(1.0) == 1.0 and check_target(0.5) == 0.5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "dynamic"}, r"use --mode static --engine ort \(got --mode dynamic"),
        ({"engine": "nncf"}, r"use --mode static --engine ort \(got --mode static --engine nncf"),
        ({"method": "entropy"}, r"tries every --method .* drop --method entropy"),
        ({"per_channel": False}, r"drop --per-channel/--no-per-channel"),
        ({"eval_data": None}, r"needs --data DIR: held-out real images"),
        ({"target_agreement": 1.5}, r"must be in \(0, 1\], a share of top-1 answers: got 1\.5"),
    ],
)
def test_quantize_refuses_what_the_search_cannot_do(
    kwargs: dict[str, object], match: str, tmp_path: Path
) -> None:
    args: dict[str, object] = {
        "mode": "static",
        "calib": str(tmp_path),
        "eval_data": str(tmp_path),
        "target_agreement": 0.98,
        **kwargs,
    }
    with pytest.raises(InputError, match=match):
        options = QuantizeOptions(tmp_path / "m.onnx", tmp_path / "q.onnx", **args)  # type: ignore[arg-type]
        quantize(options)
    assert not list(tmp_path.iterdir()), "nothing read, nothing written"


@pytest.mark.parametrize("value", ["0", "nan", "-0.5", "1.01", "x"])
def test_cli_target_out_of_range_is_a_usage_error(value: str, tmp_path: Path) -> None:
    from zoo.cli.app import app

    model = tmp_path / "m.onnx"
    res = CliRunner().invoke(app, ["quantize", str(model), "--target-agreement", value])
    assert res.exit_code == 2, res.output
    assert "--target-agreement" in res.output and "Traceback" not in res.output
    assert not list(tmp_path.iterdir())


def test_cli_prints_the_search(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The human-readable lines: how many nodes stayed float, which calibration won, and the
    held-out agreement with its interval (the report itself is checked end to end below)."""
    from zoo.cli.app import app
    from zoo.deploy.quantize import int8 as q

    seen: dict[str, object] = {}
    ops = {f"n{i}": op for i, op in enumerate(["Add"] * 3 + ["Clip"] * 4 + ["Conv"] * 92)}
    result = qs.SearchResult(
        target=0.98,
        calibration=qc.Calibration("percentile", False),
        tried=[qs.Tried(qc.Calibration("minmax", True), 0.1, 0.9)] * 7,
        n_calibration=80,
        order=[f"n{i}" for i in [*range(3), *range(3, 7), *range(7, 20)]]
        + [f"n{i}" for i in range(20, 99)],
        scores={},
        ops=ops,
        k=20,
        steps=[(0, 0.6), (20, 0.9833)],
        n_held_out=120,
    )
    images = qi.EvalImages((tmp_path / "a.png",) * 120, None, "data", "120 images of val")

    def fake(options: QuantizeOptions, **kw: object) -> qr.QuantizeReport:
        seen.update(vars(options))
        return qr.QuantizeReport(
            path=tmp_path / "q.onnx",
            written=True,
            mode="static",
            engine="ort",
            calibration=result.calibration,
            weight_bits=8,
            size_mb=(13.6, 4.0),
            latency=qr.Latency(8.0, 7.2, 1, 2),
            top1_agreement=0.9833,
            agreement_ci95=wilson(0.9833, 120),
            accuracy=None,
            images=images,
            calib_description="80 images of calib",
            coverage=qv.Coverage(53, 40),
            floor=qv.check_floor(None, wilson(0.9833, 120), images),
            search=result,
        )

    monkeypatch.setattr(q, "quantize", fake)
    res = CliRunner().invoke(
        app, ["quantize", str(tmp_path / "m.onnx"), "--target-agreement", "0.98"]
    )
    assert res.exit_code == 0, res.output
    assert seen["target_agreement"] == 0.98
    assert (
        "float: 20 of 99 quantizable nodes kept float (3 Add, 4 Clip, 13 Conv) for target "
        "agreement 98.0%"
    ) in res.output
    assert (
        "calibration: percentile ranges, per-channel weights off (the best of 7 settings "
        "tried on 80 calibration images)"
    ) in res.output
    assert "held-out agreement: 98.3% on 120 images (95% interval 94.1%–99.5%" in (res.output)


def test_a_node_kept_float_is_fp32_in_the_coverage(tmp_path: Path) -> None:
    """``nodes_to_exclude`` leaves a Conv with its float weight, reading an activation that was
    dequantized for its neighbours: ORT cannot fuse it, so coverage counts it as fp32."""
    from collections import Counter

    from onnx import TensorProto, helper

    from zoo.deploy.quantize.verdict import coverage

    nodes = [
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w1q", "s", "z"], ["w1"]),
        helper.make_node("Conv", ["xd", "w1"], ["c1"]),  # int8: both operands dequantized
        helper.make_node("Conv", ["xd", "w2"], ["c2"]),  # kept float: w2 is a float weight
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("xq", TensorProto.UINT8, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("c2", TensorProto.FLOAT, None)],
    )
    onnx.save(helper.make_model(graph), str(tmp_path / "q.onnx"))
    assert coverage(Counter({"Conv": 2}), tmp_path / "q.onnx", "static").to_dict() == {
        "heavy_ops": 2,
        "quantized": 1,
        "fp32_left": 1,
    }


# --- end to end on a real small model ---------------------------------------------------------


@pytest.fixture(scope="module")
def digits_cnn(small_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``simple_cnn`` fine-tuned for 3 epochs on 300 real digits (val accuracy ~0.7: small
    logit margins that int8 flips), exported; calibration (6 a class) and held-out (20 a
    class) images, disjoint."""
    from zoo.deploy.export.onnx_export import export_onnx

    root = tmp_path_factory.mktemp("search")
    r = run_zoo(
        *("finetune", "simple_cnn", "--data", str(small_digits), "--epochs", "3"),
        *("--runs", str(root), "--name", "cnn", "--no-progress", "--num-workers", "0"),
    )
    assert r.returncode == 0, r.stderr
    model = root / "cnn.onnx"
    export_onnx(str(root / "cnn"), model)
    for split, part in (("calib", slice(0, 6)), ("held", slice(10, 30))):
        for cls in sorted(d for d in small_digits.iterdir() if d.is_dir()):
            (root / split / cls.name).mkdir(parents=True)
            for f in sorted(cls.iterdir())[part]:
                (root / split / cls.name / f.name).symlink_to(f)
    return {"model": model, "calib": root / "calib", "held": root / "held", "root": root}


@pytest.mark.slow
def test_search_reaches_the_target_with_nodes_kept_float(
    digits_cnn: dict[str, Path], tmp_path: Path
) -> None:
    from zoo.cli.app import app
    from zoo.onnx_meta import read_metadata

    out = tmp_path / "q.onnx"
    args = ["quantize", str(digits_cnn["model"]), "--calib", str(digits_cnn["calib"])]
    # every answer kept: int8 alone flips a few of 200 on any ISA (on AVX-512 VNNI ~1, on
    # AVX2 without it many more), so the search has to keep nodes float whatever the CPU
    args += ["--data", str(digits_cnn["held"]), "--target-agreement", "1.0", "--allow-drop"]
    res = CliRunner().invoke(app, [*args, "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    s = rep["search"]
    steps = {d["k"]: d["agreement"] for d in s["steps"]}
    k = s["k"]
    # the search did something: int8 alone falls short, k > 0 nodes float reach the target
    assert steps[0] < 1.0 and k > 0 and steps[k] == 1.0 and steps[k - 1] < 1.0
    assert k < s["sensitivity"]["candidates"], "not simply the fp32 model"
    held = s["held_out"]
    assert held == {
        "n_images": 200,
        "agreement": steps[k],
        "ci95": wilson(steps[k], 200),
        "note": "k, the number of float nodes, is chosen on these images",
    }
    assert rep["top1_agreement"] == held["agreement"] and rep["n_images"] == 200  # held-out
    assert s["float_nodes"] == [d["node"] for d in s["sensitivity"]["most_sensitive"]][:k]
    # calibration: every method with per-channel on and off, then symmetric for the best
    cal = s["calibration"]
    tried = cal["tried"]
    assert len(tried) == 7 and cal["n_images"] == 60
    assert {(t["method"], t["per_channel"]) for t in tried[:6]} == {
        (m, pc) for m in ("minmax", "entropy", "percentile") for pc in (True, False)
    }
    best = min(tried, key=lambda t: t["logit_error_on_calibration"])
    assert (cal["method"], cal["per_channel"], cal["symmetric_activations"]) == (
        best["method"],
        best["per_channel"],
        best["symmetric_activations"],
    )
    assert (rep["method"], rep["per_channel"]) == (cal["method"], cal["per_channel"])
    # the float nodes really are float in the written graph
    graph = onnx.load(str(out)).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    initializers = {t.name for t in graph.initializer}
    by_name = {n.name: n for n in graph.node}
    heavy = [n for n in s["float_nodes"] if by_name[n].op_type in ("Conv", "Gemm", "MatMul")]
    for name in heavy:
        weight = by_name[name].input[1]
        assert weight in initializers and weight not in producer, f"{name} kept its fp32 weight"
    assert rep["coverage"]["fp32_left"] == len(heavy) > 0
    meta = read_metadata(out)["quantization"]
    assert meta["float_nodes"] == s["float_nodes"] and meta["target_agreement"] == 1.0


def test_search_refuses_held_out_images_that_are_calibration_images(
    digits_cnn: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "q.onnx"
    with pytest.raises(InputError, match=r"--data image\(s\) are also --calib images"):
        quantize(
            QuantizeOptions(
                digits_cnn["model"],
                out,
                mode="static",
                calib=str(digits_cnn["calib"]),
                eval_data=str(digits_cnn["calib"] / "digit_3"),
                target_agreement=0.98,
            )
        )
    assert not out.exists() and not list(tmp_path.iterdir())


def test_search_that_cannot_reach_the_target_writes_nothing(
    digits_cnn: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If no number of float nodes reached the target (here: every measured agreement made
    0.5), QuantizationError, and no file; one calibration method keeps it short."""
    monkeypatch.setattr(qs, "_methods", lambda: ["minmax"])
    monkeypatch.setattr(qs, "top1_agreement", lambda y32, y8: 0.5)
    out = tmp_path / "q.onnx"
    with pytest.raises(QuantizationError, match=r"No number of float nodes reaches top-1"):
        quantize(
            QuantizeOptions(
                digits_cnn["model"],
                out,
                mode="static",
                calib=str(digits_cnn["calib"]),
                eval_data=str(digits_cnn["held"]),
                target_agreement=0.98,
            )
        )
    assert not list(tmp_path.iterdir()), "nothing written, temporary files gone"
