"""``--embed-preprocessing`` (deploy/export/graph_preprocess.py) on tiny graphs built with
onnx.helper (well under a second each): the prefix's declared boundary, its merge in front of
an exported graph (the input renamed ``pixels``, the graph's own opset and IR version kept,
the report's fields), and the pixel arrays a client sends. How the prefix's arithmetic matches
the Python preprocessing on real photos is tests/test_embed_preprocessing.py's (selected with
this file by scripts/mutation.sh)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from PIL import Image

from zoo.deploy.export.graph_preprocess import (
    INPUT,
    MIN_OPSET,
    MODES,
    embed_file,
    pixels,
    preprocessing_graph,
)
from zoo.errors import InputError
from zoo.images import open_image
from zoo.preprocess import preprocess
from zoo.preprocessing import Preprocessing
from zoo.samples import sample_image_paths

PRE = Preprocessing((3, 16, 16), 0.8, "bilinear", (0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
GRAY = Preprocessing((1, 8, 8), 1.0, "bicubic", (0.5,), (0.25,))


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def _pooling_model(
    path: Path, pre: Preprocessing, opset: int = 18, ir: int = 8, domain: str = ""
) -> Path:
    """A stand-in exported graph: ``x (N, C, crop, crop)`` float → its per-channel means,
    with the exporter's plain opset import and a second, custom-domain one before it."""
    c, s = pre.channels, pre.crop_size
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["x"], ["p"]),
            helper.make_node("Flatten", ["p"], ["logits"]),
        ],
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", c, s, s])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", c])],
    )
    opsets = [helper.make_opsetid("com.example", 1), helper.make_opsetid(domain, opset)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir
    onnx.save(model, str(path))
    return path


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_the_prefix_declares_pixels_in_and_the_model_input_out() -> None:
    m = preprocessing_graph(PRE, "x", 18)
    (inp,), (out,) = m.graph.input, m.graph.output
    assert (
        (inp.name, inp.type.tensor_type.elem_type)
        == (INPUT, TensorProto.UINT8)
        == (
            "pixels",
            TensorProto.UINT8,
        )
    )
    assert _dims(inp) == ["batch", "height", "width", 3]
    assert (out.name, out.type.tensor_type.elem_type) == ("x", TensorProto.FLOAT)
    assert _dims(out) == ["batch", 3, 16, 16]
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 18)]
    assert m.graph.name == "zoo_preprocessing"
    onnx.checker.check_model(m, full_check=True)
    assert (MIN_OPSET, MODES) == (18, {"bilinear": "linear", "bicubic": "cubic"})


@pytest.mark.parametrize("pre", [PRE, GRAY], ids=["rgb-bilinear", "gray-bicubic"])
def test_the_resize_nodes_are_pils_filters(pre: Preprocessing) -> None:
    resizes = [n for n in preprocessing_graph(pre, "x", 19).graph.node if n.op_type == "Resize"]
    want = {
        "mode": MODES[pre.interpolation].encode(),
        "coordinate_transformation_mode": b"half_pixel",
        "antialias": 1,
        "exclude_outside": 1,
    }
    if pre.interpolation == "bicubic":
        want["cubic_coeff_a"] = -0.5
    assert len(resizes) == 2  # width, then height, as PIL does
    for n in resizes:
        assert {a.name: helper.get_attribute_value(a) for a in n.attribute} == want


def test_the_refusals_name_the_interpolation_and_the_opset() -> None:
    from dataclasses import replace

    with pytest.raises(InputError) as err:
        preprocessing_graph(replace(PRE, interpolation="lanczos"), "x", 18)
    assert str(err.value) == (
        "--embed-preprocessing: the model resizes with 'lanczos', which ONNX Resize cannot "
        "reproduce (bilinear, bicubic only). Export without it."
    )
    with pytest.raises(InputError) as err:
        preprocessing_graph(PRE, "x", 17)
    assert str(err.value) == (
        "--embed-preprocessing needs --opset 18 or higher (Resize with antialias); got 17."
    )
    assert preprocessing_graph(PRE, "x", 18).opset_import[0].version == 18  # the bound passes


@pytest.mark.parametrize("pre", [PRE, GRAY], ids=["rgb", "gray"])
def test_embed_file_puts_the_prefix_in_front_of_the_graph(
    pre: Preprocessing, tmp_path: Path
) -> None:
    path = _pooling_model(tmp_path / "m.onnx", pre, ir=9)
    rep = embed_file(path, pre)
    assert rep == {"input": "pixels", "dtype": "uint8", "layout": "NHWC", "channels": pre.channels}
    merged = onnx.load(str(path))
    assert merged.ir_version == 9
    assert [i.name for i in merged.graph.input] == ["pixels"]
    assert [o.name for o in merged.graph.output] == ["logits"]
    assert ("", 18) in [(o.domain, o.version) for o in merged.opset_import]
    sess = _session(path)
    for p in sample_image_paths():
        im = open_image(p)
        got = sess.run(None, {"pixels": pixels(im, pre.channels)[None]})[0][0]
        want = preprocess(im, pre).mean((1, 2))
        np.testing.assert_allclose(got, want, atol=0.05)


def test_embed_file_reads_the_graphs_own_opset(tmp_path: Path) -> None:
    path = _pooling_model(tmp_path / "m.onnx", PRE, opset=17)
    before = path.read_bytes()
    with pytest.raises(InputError, match=r"--opset 18 or higher .*; got 17\.$"):
        embed_file(path, PRE)
    assert path.read_bytes() == before  # refused before anything was written
    newer = _pooling_model(tmp_path / "n.onnx", PRE, opset=19)
    embed_file(newer, PRE)
    assert ("", 19) in [(o.domain, o.version) for o in onnx.load(str(newer)).opset_import]
    # the default domain under its long name is the same opset
    old = _pooling_model(tmp_path / "o.onnx", PRE, opset=17, domain="ai.onnx")
    with pytest.raises(InputError, match=r"got 17\.$"):
        embed_file(old, PRE)


def test_pixels_are_uint8_hwc_in_the_models_channels() -> None:
    rgba = Image.new("RGBA", (5, 3), (10, 20, 30, 0))  # transparent: flattened onto white
    a = pixels(rgba, 3)
    assert a.dtype == np.uint8 and a.shape == (3, 5, 3) and (a == 255).all()
    g = pixels(Image.new("RGB", (5, 3), (200, 100, 0)), 1)
    assert g.dtype == np.uint8 and g.shape == (3, 5, 1)
    assert int(g[0, 0, 0]) == Image.new("RGB", (1, 1), (200, 100, 0)).convert("L").getpixel((0, 0))
    with pytest.raises(InputError, match="1x101 pixels"):
        pixels(Image.new("L", (1, 101)), 1)
