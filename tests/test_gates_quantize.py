"""The quantization accuracy gate and report on plain arrays and tiny ONNX graphs built with
onnx.helper (milliseconds; no onnxruntime quantization runs here). The end-to-end runs on the
real MobileNetV2 live in test_deploy.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.deploy.quantize import images as qi
from zoo.deploy.quantize import int8 as q
from zoo.deploy.quantize import verdict as qv
from zoo.deploy.quantize.calibration import CalibReader
from zoo.deploy.quantize.options import QuantizeOptions
from zoo.errors import QuantizationError


def _save(tmp_path: Path, nodes: list[onnx.NodeProto], name: str = "m.onnx") -> Path:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    path = tmp_path / name
    onnx.save(helper.make_model(graph), str(path))
    return path


def _fp32(tmp_path: Path) -> Path:
    return _save(
        tmp_path,
        [
            helper.make_node("Conv", ["x", "w1"], ["c1"]),
            helper.make_node("Conv", ["c1", "w2"], ["c2"]),
            helper.make_node("Relu", ["c2"], ["r"]),
            helper.make_node("Flatten", ["r"], ["f"]),
            helper.make_node("Gemm", ["f", "w3"], ["y"]),
        ],
        "fp32.onnx",
    )


def test_op_counts_and_conv_heavy(tmp_path: Path) -> None:
    counts = qv.op_counts(_fp32(tmp_path))
    assert counts == Counter({"Conv": 2, "Relu": 1, "Flatten": 1, "Gemm": 1})
    assert qv.conv_heavy(counts)
    assert not qv.conv_heavy(Counter({"Conv": 2, "Gemm": 1, "MatMul": 1}))  # 2 vs 2: not heavy
    assert not qv.conv_heavy(Counter({"Conv": 2, "MatMul": 2}))
    assert qv.conv_heavy(Counter({"Conv": 3, "Gemm": 1, "MatMul": 1}))
    assert not qv.conv_heavy(Counter({"Gemm": 1}))


def test_graphs_are_read_without_their_external_weights(tmp_path: Path) -> None:
    """Counting ops never needs the weights: a model saved with external data is read even
    when its data file is not there (nor loaded into memory when it is)."""
    w = numpy_helper.from_array(np.ones((8, 3, 1, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    path = tmp_path / "ext.onnx"
    onnx.save_model(
        helper.make_model(graph),
        str(path),
        save_as_external_data=True,
        location="ext.bin",
        size_threshold=0,
    )
    (tmp_path / "ext.bin").unlink()
    assert qv.op_counts(path) == Counter({"Conv": 1})
    assert qv.coverage(Counter({"Conv": 1}), path, "static").heavy_ops == 1


def test_coverage_dynamic_counts_integer_ops(tmp_path: Path) -> None:
    fp32 = qv.op_counts(_fp32(tmp_path))
    dyn = _save(
        tmp_path,
        [
            helper.make_node("ConvInteger", ["x", "w1"], ["c1"]),
            helper.make_node("Conv", ["c1", "w2"], ["c2"]),
            helper.make_node("MatMulInteger", ["c2", "w3"], ["y"]),
        ],
    )
    assert qv.coverage(fp32, dyn, "dynamic").to_dict() == {
        "heavy_ops": 3,
        "quantized": 2,
        "fp32_left": 1,
    }


def test_coverage_static_counts_heavy_ops_fed_by_dequantize(tmp_path: Path) -> None:
    fp32 = Counter({"Conv": 3, "Gemm": 2, "MatMul": 1, "Relu": 4})
    dequantized_weights = [
        helper.make_node("DequantizeLinear", [f"{w}q", "ws", "wz"], [w])
        for w in ("w1", "w3", "w4", "w5")
    ]
    qdq = _save(
        tmp_path,
        [
            *dequantized_weights,
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
            helper.make_node("Conv", ["xd", "w1"], ["c1"]),  # int8: input and weight dequantized
            helper.make_node("Conv", ["c1", "w2"], ["c2"]),  # fp32: input is a Conv output
            helper.make_node("Conv", ["xd", "w2"], ["c3"]),  # fp32: a float weight (kept float)
            helper.make_node("DequantizeLinear", ["c2q", "s", "z"], ["c2d"]),
            helper.make_node("MatMul", ["c2d", "w3"], ["m"]),  # int8
            helper.make_node("Relu", ["c2d"], ["r"]),  # not a heavy op, even if dequantized
            helper.make_node("Gemm", ["w4", "c2"], ["g"]),  # dequantized weight, fp32 input
            helper.make_node("Gemm", ["c2d", "w5"], ["y"]),  # int8
        ],
    )
    assert qv.coverage(fp32, qdq, "static") == qv.Coverage(heavy_ops=6, quantized=3)
    assert qv.coverage(fp32, qdq, "static").fp32_left == 3
    assert qv.coverage(fp32, qdq, "dynamic").quantized == 0


def test_calibration_reader_yields_each_batch_once_by_input_name() -> None:
    batches = [np.zeros((1, 3)), np.ones((1, 3))]
    reader = CalibReader(batches, "input")
    first, second = reader.get_next(), reader.get_next()
    assert first is not None and second is not None
    assert list(first) == ["input"] and first["input"] is batches[0]
    assert second["input"] is batches[1]
    assert reader.get_next() is None and reader.get_next() is None


def test_labels_from_folder_names_only_when_every_folder_is_a_class(tmp_path: Path) -> None:
    imgs = [tmp_path / "cat" / "1.jpg", tmp_path / "dog" / "2.jpg", tmp_path / "cat" / "3.jpg"]
    assert qi.labels_for(imgs, ["dog", "cat"]).tolist() == [1, 0, 1]
    assert qi.labels_for(imgs, ["cat"]) is None  # 'dog' is not a class of the model
    assert qi.labels_for(imgs, []) is None
    assert qi.labels_for([], []) is None


def _logits(top: list[int], n: int = 3) -> np.ndarray:
    y = np.zeros((len(top), n), np.float32)
    y[np.arange(len(top)), top] = 1.0
    return y


def test_accuracy_report_without_labels_is_agreement_only() -> None:
    r = qv.accuracy_report(_logits([0, 1, 2, 2]), _logits([0, 1, 1, 2]), None)
    assert r == {"top1_agreement": 0.75, "agreement_ci95": qv.wilson(0.75, 4)}


def test_accuracy_report_with_labels() -> None:
    y32, y8 = _logits([0, 1, 2, 2, 1]), _logits([0, 1, 1, 2, 0])
    r = qv.accuracy_report(y32, y8, np.array([0, 1, 2, 0, 0]))
    assert r == {
        "top1_agreement": 0.6,
        "agreement_ci95": qv.wilson(0.6, 5),
        "accuracy": {"fp32": 0.6, "int8": 0.6},
        "accuracy_drop": 0.0,
    }
    r = qv.accuracy_report(y32, y8, np.array([0, 1, 2, 2, 1]))
    assert r["accuracy"] == {"fp32": 1.0, "int8": 0.6} and r["accuracy_drop"] == 0.4
    r = qv.accuracy_report(_logits([0, 0, 0]), _logits([0, 1, 0]), np.array([1, 1, 1]))
    assert r["accuracy_drop"] == pytest.approx(-1 / 3, abs=1e-4)  # int8 better: negative drop
    assert r["accuracy_drop"] == round(-1 / 3, 4)


def test_gate_uses_the_accuracy_drop_when_labels_exist() -> None:
    assert qv.accuracy_gate(0.5, 0.01, 0.01) == {
        "max_accuracy_drop": 0.01,
        "measured": 0.01,
        "passed": True,
    }
    with pytest.raises(QuantizationError) as exc:
        qv.accuracy_gate(0.5, 0.01, 0.009)
    assert str(exc.value) == (
        "Accuracy drop 1.00% exceeds --max-accuracy-drop 0.90% (top-1 agreement with fp32 "
        "50.0%). Nothing was written; try --engine nncf, or --target-agreement 0.98."
    )
    assert qv.accuracy_gate(0.5, 0.0, 0.0)["passed"]


def test_gate_without_labels_counts_changed_predictions() -> None:
    assert qv.accuracy_gate(0.75, None, 0.25)["measured"] == 0.25
    with pytest.raises(QuantizationError, match=r"^Accuracy drop 25\.00% exceeds"):
        qv.accuracy_gate(0.75, None, 0.2)
    with pytest.raises(QuantizationError):  # a negative limit refuses even a perfect model
        qv.accuracy_gate(1.0, None, -1.0)
    assert qv.accuracy_gate(1.0, None, 0.0)["measured"] == 0.0


def test_advice_before_and_after() -> None:
    heavy, light = Counter({"Conv": 52, "Gemm": 1}), Counter({"Conv": 1, "MatMul": 4})
    assert qv.advice_before("m.onnx", heavy, "dynamic") == [
        "m.onnx is conv-heavy (52 Conv vs 1 Gemm/MatMul): onnxruntime dynamic quantization runs "
        "convs as ConvInteger, which is often several times slower than fp32 on CPU. Static QDQ "
        "(--mode static --calib DIR) is usually faster."
    ]
    assert qv.advice_before("m.onnx", Counter({"Conv": 5, "Gemm": 1, "MatMul": 3}), "dynamic")[
        0
    ].startswith("m.onnx is conv-heavy (5 Conv vs 4 Gemm/MatMul)")
    assert qv.advice_before("m.onnx", heavy, "static") == []
    assert qv.advice_before("m.onnx", light, "dynamic") == []
    assert qv.advice_after(heavy, "dynamic", 2.5) == (
        "measured: dynamic int8 is 2.50× the fp32 latency (slower). Recommend --mode static "
        "with --calib DIR."
    )
    assert qv.advice_after(heavy, "dynamic", 1.01).startswith("measured: dynamic int8 is 1.01×")
    assert qv.advice_after(heavy, "dynamic", 1.0) is None  # not slower: nothing to say
    assert qv.advice_after(heavy, "static", 2.5) is None
    assert qv.advice_after(light, "dynamic", 2.5) is None


def test_nncf_int8_activations_become_uint8_with_the_same_values() -> None:
    """NNCF's signed activation pairs, rewritten as uint8 (zero point + 128) so that
    onnxruntime fuses them: the same outputs, weights (a constant's dequantize) untouched."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from zoo.deploy.quantize.nncf_engine import uint8_activations

    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(-3, np.int8), "z"),
        numpy_helper.from_array(np.array([[5, -7], [2, 9]], np.int8), "w_q"),
        numpy_helper.from_array(np.array(0.1, np.float32), "ws"),
        numpy_helper.from_array(np.array(0, np.int8), "wz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w_q", "ws", "wz"], ["w"]),
        helper.make_node("MatMul", ["xd", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
        initializer=inits,
        value_info=[helper.make_tensor_value_info("xq", TensorProto.INT8, [3, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    x = np.array([[-6.5, -0.01], [0.0, 0.3], [2.2, 6.6]], np.float32)  # clipped at both ends

    def run(m: onnx.ModelProto) -> np.ndarray:
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return np.asarray(sess.run(None, {"x": x})[0])

    before = run(model)
    after_model = uint8_activations(onnx.ModelProto.FromString(model.SerializeToString()))
    np.testing.assert_array_equal(run(after_model), before)
    zero = {t.name: numpy_helper.to_array(t) for t in after_model.graph.initializer}
    q, dq, w = after_model.graph.node[:3]
    assert q.input[2] == dq.input[2] == "z_u8" and zero["z_u8"] == np.uint8(125)
    assert w.input[2] == "wz" and zero["wz"].dtype == np.int8  # the weights stay int8


def test_calib_with_dynamic_mode_is_refused_not_ignored(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from zoo.cli.app import app
    from zoo.errors import InputError

    model = tmp_path / "m.onnx"
    res = CliRunner().invoke(app, ["quantize", str(model), "--mode", "dynamic", "--calib", "x"])
    assert res.exit_code == 2 and "--calib applies to --mode static" in res.output
    with pytest.raises(InputError, match="which --mode dynamic does not quantize"):
        q.quantize(QuantizeOptions(model, tmp_path / "q.onnx", mode="dynamic", calib="x"))
    assert not list(tmp_path.iterdir())


# --- the verdict's numbers: the interval, the floor's messages, the report's properties -------


def test_wilson_interval_figures() -> None:
    # the textbook form by counts, (x + z²/2 ± z·√(x(n−x)/n + z²/4)) / (n + z²), gives these
    assert qv.wilson(0.9833, 120) == [0.9412, 0.9954]
    assert qv.wilson(1.0, 2) == [0.3424, 1.0]  # two photos prove little
    assert qv.wilson(0.0, 10) == [0.0, 0.2775]
    assert qv.wilson(0.5, 0) == [0.0, 1.0]  # no images: nothing known
    assert qv.wilson(0.5, 100, z=1.0) == [0.4502, 0.5498]


def test_the_floor_says_what_it_measured() -> None:
    images = qi.EvalImages((Path("a.png"),) * 40, None, "data", "40 images of --data d")
    assert qv.FLOOR_ACCURACY_DROP == 0.01 and qv.FLOOR_AGREEMENT == 0.98
    at = qv.check_floor(0.01, [0.0, 0.0], images)
    assert at == qv.Floor(
        True, True, "int8 loses 1.0 points of accuracy (within the 1-point floor)"
    )
    assert at.to_dict() == {
        "applies": True,
        "passed": True,
        "reason": "int8 loses 1.0 points of accuracy (within the 1-point floor)",
        "allowed": False,
    }
    assert not qv.check_floor(0.0101, [1.0, 1.0], images).passed  # labels decide, not agreement
    reach = qv.check_floor(None, [0.9, 0.98], images)
    assert reach == qv.Floor(
        True, True, "top-1 agreement's 95% interval ends at 98.0% (reaches the 98% floor)"
    )
    under = qv.check_floor(None, [0.9, 0.9799], images)
    assert under.reason == "top-1 agreement's 95% interval ends at 98.0% (under the 98% floor)"
    assert not under.passed and under.applies
    two = qi.EvalImages((Path("a.jpg"), Path("b.jpg")), None, "builtin", "2 photos")
    assert qv.check_floor(0.5, [0.0, 0.3], two) == qv.Floor(
        False,
        True,
        "agreement on 2 built-in images proves nothing: pass --data DIR with images like the "
        "model's",
    )


def test_int8_pays_only_from_half_of_the_heavy_nodes_and_a_speed_up() -> None:
    assert qv.MIN_INT8_SHARE == 0.5
    assert qv.does_not_pay(qv.Coverage(10, 5), 0.99) is None  # exactly half: pays
    msg = qv.does_not_pay(qv.Coverage(10, 4), 0.5)
    assert msg == (
        "int8 does not pay for this model: only 4 of 10 Conv/Gemm/MatMul nodes run in int8. "
        "Keep the fp32 model, or try fp16 (zoo export ... --precision fp16) or OpenVINO (zoo "
        "export ... --format openvino, or zoo serve MODEL.onnx --runtime openvino)."
    )
    both = qv.does_not_pay(qv.Coverage(10, 4), 1.25)
    assert both is not None and both.startswith(
        "int8 does not pay for this model: only 4 of 10 Conv/Gemm/MatMul nodes run in int8 and "
        "it runs at 1.25× the fp32 latency (not faster). Keep"
    )


def test_the_reports_derived_figures() -> None:
    from zoo.deploy.quantize.report import Latency, QuantizeReport

    assert Latency(8.0, 6.0, 1, 2).ratio == 0.75 and Latency(3.0, 1.0, 1, 2).ratio == 0.333
    images = qi.EvalImages((Path("a.png"),), None, "data", "1 image")

    def report(floor: qv.Floor, accuracy: tuple[float, float] | None) -> QuantizeReport:
        return QuantizeReport(
            path=Path("q.onnx"),
            written=floor.passed or floor.allowed,
            mode="static",
            engine="ort",
            calibration=None,
            weight_bits=8,
            size_mb=(4.0, 1.0),
            latency=Latency(8.0, 6.0, 1, 2),
            top1_agreement=1.0,
            agreement_ci95=[0.2, 1.0],
            accuracy=accuracy,
            images=images,
            calib_description=None,
            coverage=qv.Coverage(2, 2),
            floor=floor,
        )

    ok = report(qv.Floor(True, True, "fine"), (0.91234, 0.9))
    assert ok.accuracy_drop == 0.0123 and not ok.failed
    assert report(qv.Floor(True, True, "fine"), None).accuracy_drop is None
    assert report(qv.Floor(True, False, "below"), None).failed
    assert not report(qv.Floor(True, False, "below", allowed=True), None).failed
