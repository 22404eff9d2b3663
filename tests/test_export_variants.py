"""Export variants behind the same gate: ``--slim`` (onnxslim simplifies the graph) and
``--precision fp16``; the gate judges the final graph, so a pass that changes answers is
refused like any other broken export."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.conftest import run_zoo
from zoo.deploy.export import parity
from zoo.deploy.export.onnx_export import export_onnx
from zoo.deploy.quantize.options import QuantizeOptions
from zoo.deploy.runtimes.loader import OnnxClassifier
from zoo.errors import ExportError, ParityError
from zoo.images import open_image
from zoo.preprocess import preprocess
from zoo.samples import sample_image_paths


def test_fp16_slimmed_mobilenet_passes_the_fp16_gate_and_names_the_photos(
    tmp_path: Path, mobilenet_onnx: Path
) -> None:
    """One export with both options (each is a real MobileNetV2 export: CI time)."""
    out = tmp_path / "fp16.onnx"
    r = run_zoo("export", "mobilenet_v2", "--precision", "fp16", "--slim", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["precision"] == "fp16" and rep["parity"]["passed"]
    assert rep["parity"]["tolerances"] == asdict(parity.FP16)
    assert rep["parity"]["predictions"]["agreement"] == 1.0
    sl = rep["slim"]
    assert sl["nodes_after"] <= sl["nodes_before"] and sl["bytes_after"] <= sl["bytes_before"]
    graph = onnx.load(str(out)).graph
    assert len(graph.node) >= sl["nodes_after"]  # + the fp16 converter's casts
    assert out.stat().st_size < 0.55 * mobilenet_onnx.stat().st_size  # fp16 weights
    inits = graph.initializer
    assert {t.data_type for t in inits if len(t.dims) == 4} == {onnx.TensorProto.FLOAT16}
    half, full = OnnxClassifier(str(out)), OnnxClassifier(str(mobilenet_onnx))
    assert half.meta["precision"] == "fp16" and half.meta["slim"] == sl  # says what was done
    photos = [open_image(p) for p in sample_image_paths()]
    x = np.stack([preprocess(im, full.pre) for im in photos])
    assert half.run(x).dtype == np.float32  # inputs and outputs stay fp32
    d = parity.compare(full.run(x), half.run(x), **_bounds(parity.FP16))
    assert d.passed and d.max_abs > 1e-4  # really computed in fp16, within its bounds
    assert [p[0].label for p in half.classify(photos)] == ["Egyptian cat", "espresso"]


def _bounds(t: parity.Tolerances) -> dict[str, float]:
    return {"atol": t.atol, "rtol": t.rtol, "min_cosine": t.min_cosine, "range_atol": t.range_atol}


def test_a_simplifier_that_changes_answers_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxslim

    real = onnxslim.slim

    def off_by_a_bit(model: onnx.ModelProto) -> onnx.ModelProto:
        slimmed = real(model)
        init = max(slimmed.graph.initializer, key=lambda t: np.prod(t.dims))  # the largest weight
        w = numpy_helper.to_array(init) * 1.01
        init.CopyFrom(numpy_helper.from_array(w.astype(np.float32), init.name))
        return slimmed

    monkeypatch.setattr(onnxslim, "slim", off_by_a_bit)
    out = tmp_path / "m.onnx"
    with pytest.raises(ParityError, match="does not match PyTorch"):
        export_onnx("simple_cnn", out, slim=True, exporter="legacy")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary left


def test_slim_without_onnxslim_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxslim", None)  # import fails as if not installed
    with pytest.raises(ExportError, match=r"pip install 'zoo\[slim\]'"):
        export_onnx("simple_cnn", tmp_path / "m.onnx", slim=True, exporter="legacy")
    assert list(tmp_path.iterdir()) == []


def test_slim_is_an_onnx_option() -> None:
    r = run_zoo("export", "simple_cnn", "--format", "torchscript", "--slim")
    assert r.returncode == 2 and "--slim applies to --format onnx" in r.stderr


def test_int8_quantization_refuses_an_fp16_export(tmp_path: Path) -> None:
    from zoo.deploy.quantize.int8 import quantize
    from zoo.errors import InputError

    half = tmp_path / "sc16.onnx"
    export_onnx("simple_cnn", half, precision="fp16", exporter="legacy")
    with pytest.raises(InputError, match="is a fp16 export; int8 quantization starts from fp32"):
        quantize(QuantizeOptions(half, tmp_path / "q.onnx", mode="dynamic"))
    assert not (tmp_path / "q.onnx").exists()


def test_fp16_io_takes_and_gives_float16_behind_the_same_gate(tmp_path: Path) -> None:
    """``--fp16-io``: float16 at the graph's boundary too; the gate and zoo's runtime cast
    there, so callers still pass float32 and get float32 back, within fp16's bounds."""
    from zoo.factory import create_model

    net = create_model("simple_cnn").eval()  # one set of (random) weights for both
    full, half = tmp_path / "fp32.onnx", tmp_path / "io16.onnx"
    export_onnx("simple_cnn", full, exporter="legacy", model=net)
    rep = export_onnx(
        "simple_cnn", half, precision="fp16", fp16_io=True, exporter="legacy", model=net
    )
    assert rep.parity is not None and rep.parity.passed and rep.fp16_io
    graph = onnx.load(str(half)).graph
    f16 = onnx.TensorProto.FLOAT16
    assert graph.input[0].type.tensor_type.elem_type == f16
    assert graph.output[0].type.tensor_type.elem_type == f16
    a, b = OnnxClassifier(str(full)), OnnxClassifier(str(half))
    assert b.half_io and b.meta["input"]["dtype"] == "float16"
    x = np.stack([preprocess(open_image(p), a.pre) for p in sample_image_paths()])
    y = b.run(x)
    assert y.dtype == np.float32
    assert parity.compare(a.run(x), y, **_bounds(parity.FP16)).passed
    import httpx

    from tests.serving import free_port, in_process_server, json_infer
    from zoo.deploy.serve.config import ServeConfig

    cfg = ServeConfig(model_path=str(half), name="m", port=free_port())
    with in_process_server(cfg, ready=True) as (url, _):
        ok = httpx.post(f"{url}/v2/models/m/infer", json=json_infer(x[:1]), timeout=60)
        assert ok.status_code == 200, ok.text
        big = httpx.post(f"{url}/v2/models/m/infer", json=json_infer(x[:1] * 1e6), timeout=60)
        assert big.status_code == 400 and "float16's range" in big.json()["error"]  # not NaN
    r = run_zoo("export", "simple_cnn", "--fp16-io", cwd=tmp_path)
    assert r.returncode == 2 and "--precision fp16" in r.stderr
