"""``zoo export --precision fp16``'s conversion (deploy/export/fp16.py) on tiny graphs built
with onnx.helper (milliseconds each): weights become float16, the boundary stays float32 unless
``fp16_io``, the written graph is in topological order and runs in onnxruntime, the report's
sizes are the file's, the converter's warnings are reported once each on every export, and a
file the converter cannot read is an ExportError that keeps its cause."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.deploy.export.fp16 import to_fp16_file
from zoo.errors import ExportError

RNG = np.random.default_rng(0)
W1 = RNG.normal(size=(4, 256)).astype(np.float32)
W2 = RNG.normal(size=(256, 3)).astype(np.float32)


def _mlp(path: Path) -> Path:
    """x (n, 4) → MatMul → Relu → MatMul → y (n, 3), float32 weights, written to ``path``."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        [numpy_helper.from_array(W1, "w1"), numpy_helper.from_array(W2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _io_types(path: Path) -> tuple[int, int]:
    g = onnx.load(str(path)).graph
    return g.input[0].type.tensor_type.elem_type, g.output[0].type.tensor_type.elem_type


def _topological(path: Path) -> bool:
    g = onnx.load(str(path)).graph
    known = {i.name for i in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        if not all(i in known for i in n.input if i):
            return False
        known.update(n.output)
    return True


def test_weights_become_float16_and_the_boundary_stays_float32(tmp_path: Path) -> None:
    path = _mlp(tmp_path / "m.onnx")
    size = path.stat().st_size
    x = RNG.normal(size=(5, 4)).astype(np.float32)
    want = np.maximum(x @ W1, 0) @ W2

    rep = to_fp16_file(path)

    assert rep == {"bytes_before": size, "bytes_after": path.stat().st_size, "warnings": []}
    assert rep["bytes_after"] < 0.6 * size  # the weights are most of the file, now halved
    g = onnx.load(str(path)).graph
    assert {t.name: t.data_type for t in g.initializer} == {
        "w1": TensorProto.FLOAT16,
        "w2": TensorProto.FLOAT16,
    }
    assert _io_types(path) == (TensorProto.FLOAT, TensorProto.FLOAT)
    assert _topological(path), [n.op_type for n in g.node]  # the input Cast before its reader
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    got = _run(path, x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
    assert not np.array_equal(got, want)  # really computed in float16


def test_fp16_io_takes_and_gives_float16(tmp_path: Path) -> None:
    path = _mlp(tmp_path / "m.onnx")
    to_fp16_file(path, fp16_io=True)
    assert _io_types(path) == (TensorProto.FLOAT16, TensorProto.FLOAT16)
    assert _topological(path)
    x = RNG.normal(size=(2, 4)).astype(np.float16)
    got = _run(path, x)
    assert got.dtype == np.float16 and got.shape == (2, 3)


def test_each_export_reports_the_converters_warnings_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Warnings raised while the real converter runs are the report's: the first line of each,
    at most 200 characters, each distinct one once, sorted; and a second export in the same
    process reports them again (Python shows a warning once per place by default)."""
    import onnxruntime.transformers.float16 as f16

    real = f16.convert_float_to_float16
    long = "w" * 300

    def warning_converter(model: Any, **kw: Any) -> Any:
        for _ in range(2):
            warnings.warn(f"b: weights clipped {long}\nthe second line", UserWarning, stacklevel=1)
        warnings.warn("a: value truncated", RuntimeWarning, stacklevel=1)
        return real(model, **kw)

    monkeypatch.setattr(f16, "convert_float_to_float16", warning_converter)
    want = ["a: value truncated", f"b: weights clipped {long}"[:200] + " …"]  # marked cut
    for name in ("first.onnx", "second.onnx"):
        rep = to_fp16_file(_mlp(tmp_path / name))
        assert rep["warnings"] == want, name
        assert _topological(tmp_path / name)


def test_a_file_the_converter_cannot_read_is_an_export_error(tmp_path: Path) -> None:
    path = _mlp(tmp_path / "m.onnx")
    path.write_bytes(path.read_bytes()[:40])  # a half-written file
    with pytest.raises(ExportError, match=r"^fp16 conversion failed: ") as err:
        to_fp16_file(path)
    assert err.value.__cause__ is not None and str(err.value.__cause__) in str(err.value)
