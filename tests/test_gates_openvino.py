"""OpenVINO as a zoo runtime (deploy/runtimes/openvino.py) and the int8 export's calibration
images (deploy/export/openvino.py's ``_calibration``), on tiny graphs built with onnx.helper
and IRs saved from them (well under a second each): the metadata an IR must carry, every
refusal before compiling, the precision asked of the real CPU plugin and read back, and the
outputs of the compiled graph (the logits, float32 from an --fp16-io graph too, and the kNN
score's column). The export itself (an ONNX export, the gate twice, seconds each) is
tests/test_openvino.py's; its fast tests of the precision check are selected with this file
by scripts/mutation.sh."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from zoo.deploy.runtimes import openvino as rov
from zoo.errors import BackendUnavailableError, InputError
from zoo.knn import KnnBank, add_to_graph
from zoo.onnx_meta import set_metadata
from zoo.system import available_cpus

ov = pytest.importorskip("openvino")

RNG = np.random.default_rng(0)
W = RNG.standard_normal((12, 5)).astype(np.float32)  # (3, 2, 2) pixels → 5 classes
PRE = {
    "input_size": [3, 2, 2],
    "crop_pct": 1.0,
    "interpolation": "bilinear",
    "mean": [0.5, 0.5, 0.5],
    "std": [0.5, 0.5, 0.5],
}
META = {"preprocessing": PRE, "class_names": ["a", "b", "c", "d", "e"]}


def _onnx(
    path: Path,
    meta: dict | None = META,
    batch: int | str = "N",
    dtype: int = TensorProto.FLOAT,
    out_dtype: int = TensorProto.FLOAT,
    knn: KnnBank | None = None,
) -> Path:
    """x (batch, 3, 2, 2) → Flatten → MatMul W → logits (batch, 5); with ``knn`` the kNN score
    of the flattened pixels as zoo export builds it (a second output, ``knn_score``)."""
    nodes = [helper.make_node("Flatten", ["x"], ["f"])]
    if dtype != TensorProto.FLOAT:
        nodes = [
            helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
            helper.make_node("Flatten", ["xf"], ["f"]),
        ]
    half = out_dtype != TensorProto.FLOAT  # --fp16-io: float16 logits out
    nodes.append(helper.make_node("MatMul", ["f", "w"], ["logits_f32" if half else "logits"]))
    if half:
        nodes.append(helper.make_node("Cast", ["logits_f32"], ["logits"], to=out_dtype))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", dtype, [batch, 3, 2, 2])],
        [helper.make_tensor_value_info("logits", out_dtype, [batch, 5])],
        [numpy_helper.from_array(W, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if knn is not None:
        add_to_graph(model, "f", knn)
    if meta is not None:
        set_metadata(model, meta)
    onnx.save(model, str(path))
    return path


def _ir(folder: Path, meta: dict | None, batch: int | str = "N") -> Path:
    """An IR folder as ``zoo export --format openvino`` writes it (metadata in rt_info)."""
    model = ov.convert_model(str(_onnx(folder / "src.onnx", None, batch)))
    if meta is not None:
        model.set_rt_info(json.dumps(meta), rov.META_KEY)
    xml = folder / "ir" / "model.xml"
    ov.save_model(model, str(xml), compress_to_fp16=False)
    return xml


def _want(x: np.ndarray) -> np.ndarray:
    return x.reshape(len(x), -1).astype(np.float32) @ W


def test_an_onnx_file_runs_in_fp32_with_its_own_metadata(tmp_path: Path) -> None:
    clf = rov.OpenVinoClassifier(_onnx(tmp_path / "m.onnx"), threads=1)
    assert clf.runtime == "openvino" and clf.precision == "fp32" and clf.meta == META
    assert (clf.input_name, clf.output_name) == ("x", "logits")
    assert clf.input_shape == [None, 3, 2, 2] and clf.static_batch is None
    assert clf.input_type == "tensor(float)" and clf.width == 5 and clf.num_classes == 5
    assert clf.threads == 1 and clf.load_s > 0
    assert clf.compiled.get_property("INFERENCE_PRECISION_HINT").to_string() == "f32"
    assert clf.compiled.get_property("INFERENCE_NUM_THREADS") == 1
    x = RNG.standard_normal((3, 3, 2, 2))  # float64: cast to the graph's float32
    got = clf.run(x)
    assert got.dtype == np.float32 and got.shape == (3, 5)
    np.testing.assert_allclose(got, _want(x), rtol=1e-5, atol=1e-5)
    assert not np.shares_memory(got, clf.run(x))  # a copy, not the request's own buffer


def test_an_ir_runs_at_the_precision_its_metadata_records(tmp_path: Path) -> None:
    meta = {**META, "format": "openvino", "precision": "fp32"}
    xml = _ir(tmp_path, meta, batch=2)
    assert rov.read_ir_file_metadata(str(xml)) == meta == rov.read_ir_file_metadata(xml)
    clf = rov.OpenVinoClassifier(xml)
    assert clf.meta == meta and clf.precision == "fp32" and clf.threads == available_cpus()
    assert clf.input_shape == [2, 3, 2, 2] and clf.static_batch == 2
    x = RNG.standard_normal((5, 3, 2, 2)).astype(np.float32)  # padded to the fixed batch
    np.testing.assert_allclose(clf.run(x), _want(x), rtol=1e-5, atol=1e-5)


def test_an_ir_without_zoos_metadata_is_refused(tmp_path: Path) -> None:
    xml = _ir(tmp_path, None)
    with pytest.raises(InputError) as err:
        rov.OpenVinoClassifier(xml)
    says = f"{xml} carries no zoo metadata: write it with `zoo export --format openvino`."
    assert str(err.value) == says
    with pytest.raises(InputError) as err:  # the file's own path, as given
        rov.read_ir_file_metadata(str(xml))
    assert str(err.value) == says


def test_only_the_cpu_runs_openvino(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "m.onnx")
    with pytest.raises(BackendUnavailableError) as err:
        rov.OpenVinoClassifier(path, device="cuda:0")
    assert str(err.value) == ("zoo runs OpenVINO on the CPU only, not 'cuda:0': use --device cpu.")
    assert rov.OpenVinoClassifier(path, device="cpu:0").precision == "fp32"


@pytest.mark.parametrize(
    "meta",
    [{**META, "precision": "fp16"}, {**META, "quantization": {"mode": "static"}}],
    ids=["fp16", "int8"],
)
def test_an_onnx_file_that_is_not_fp32_is_refused(tmp_path: Path, meta: dict) -> None:
    path = _onnx(tmp_path / "m.onnx", meta)
    with pytest.raises(InputError) as err:
        rov.OpenVinoClassifier(path)
    assert str(err.value) == (
        f"{path} is not an fp32 ONNX file; --runtime openvino compiles fp32 files: export "
        "one with `zoo export --format openvino --precision ...`."
    )
    ok = _onnx(tmp_path / "ok.onnx", {**META, "precision": "fp32"})
    assert rov.OpenVinoClassifier(ok).precision == "fp32"


def test_a_graph_that_takes_pixels_is_left_to_onnxruntime(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "m.onnx", dtype=TensorProto.UINT8)
    with pytest.raises(InputError) as err:
        rov.OpenVinoClassifier(path)
    assert str(err.value) == (
        f"{path} preprocesses images in its graph (--embed-preprocessing), which zoo runs in "
        "ONNX Runtime only: use --runtime onnxruntime."
    )


def test_a_model_openvino_cannot_read_is_named_with_its_last_line(tmp_path: Path) -> None:
    core = ov.Core()
    with pytest.raises(InputError) as err:
        rov.read_ir(core, tmp_path / "absent.onnx")
    assert str(err.value) == f"Model file {tmp_path / 'absent.onnx'} does not exist."
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(InputError) as err:
        rov.read_ir(core, bad)
    text = str(err.value)
    assert text.startswith(f"OpenVINO cannot read {bad}: ") and "\n" not in text
    assert isinstance(err.value.__cause__, Exception)
    # the <net> element is looked for in the first 4 KiB of an .xml
    late = tmp_path / "late.xml"
    late.write_bytes(b" " * 4096 + b"<net>")
    with pytest.raises(InputError, match=r"late\.xml is not an OpenVINO IR"):
        rov.read_ir(core, late)
    xml = _ir(tmp_path, META)
    xml.with_suffix(".bin").unlink()
    with pytest.raises(InputError) as err:
        rov.read_ir(core, xml)
    assert str(err.value) == (
        f"{xml.with_suffix('.bin')} is missing: an IR is the .xml and its .bin side by side; "
        "export it again with `zoo export --format openvino`."
    )


def test_the_real_plugin_is_asked_for_each_precision(tmp_path: Path) -> None:
    core = ov.Core()
    caps = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    model = ov.convert_model(str(_onnx(tmp_path / "m.onnx")))
    for precision, hint in rov.HINTS.items():
        if precision == "bf16" and "BF16" not in caps:
            with pytest.raises(BackendUnavailableError) as err:
                rov.compile_cpu(core, model, precision, 2)
            assert str(err.value) == (
                f"This CPU cannot run OpenVINO bf16 (its plugin offers {', '.join(caps)}; bf16 "
                "needs AVX512_BF16 or AMX), and the plugin would silently run f32 instead: use "
                "fp32 or int8 here, or a CPU with bf16."
            )
            continue
        compiled = rov.compile_cpu(core, model, precision, 2)
        assert compiled.get_property("INFERENCE_PRECISION_HINT").to_string() == hint
        assert compiled.get_property("INFERENCE_NUM_THREADS") == 2
        assert int(compiled.get_property("NUM_STREAMS")) == 1
        assert str(compiled.get_property("PERFORMANCE_HINT")) == "LATENCY"
    assert rov.HINTS == {"fp32": "f32", "bf16": "bf16", "int8": "f32"}


def test_a_missing_openvino_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    with pytest.raises(BackendUnavailableError) as err:
        rov.openvino()
    assert str(err.value).startswith("OpenVINO is not installed: pip install 'zoo[openvino]' (")
    assert err.value.__cause__ is None and err.value.__suppress_context__


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_an_ir_compiles_the_precision_its_metadata_records(tmp_path: Path, precision: str) -> None:
    xml = _ir(tmp_path, {**META, "format": "openvino", "precision": precision})
    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if precision == "bf16" and "BF16" not in caps:
        with pytest.raises(BackendUnavailableError, match=r"cannot run OpenVINO bf16"):
            rov.OpenVinoClassifier(xml, threads=1)
        return
    t0 = time.perf_counter()
    clf = rov.OpenVinoClassifier(xml, threads=1)
    took = time.perf_counter() - t0
    assert clf.precision == precision and 0 < clf.load_s <= took  # the load, not a clock reading
    hint = clf.compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
    assert hint == rov.HINTS[precision] == {"int8": "f32", "bf16": "bf16"}[precision]
    x = RNG.standard_normal((3, 3, 2, 2)).astype(np.float32)
    tol = 1e-5 if precision == "int8" else 0.1  # no FakeQuantize here: int8 runs f32
    np.testing.assert_allclose(clf.run(x), _want(x), rtol=tol, atol=tol)


def test_an_fp16_io_graph_is_half_at_its_boundary_and_float32_here(tmp_path: Path) -> None:
    path = _onnx(tmp_path / "m.onnx", dtype=TensorProto.FLOAT16, out_dtype=TensorProto.FLOAT16)
    clf = rov.OpenVinoClassifier(path, threads=1)
    assert clf.input_type == "tensor(float16)" and clf.half_io and not clf.embedded
    x = RNG.standard_normal((3, 3, 2, 2)).astype(np.float32)
    got = clf.run(x)
    assert got.dtype == np.float32 and got.shape == (3, 5)  # float16 logits, read as float32
    want = _want(x.astype(np.float16)).astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_the_knn_score_is_the_outputs_last_column(tmp_path: Path) -> None:
    bank = KnnBank.of(RNG.standard_normal((6, 12)), k=2)
    clf = rov.OpenVinoClassifier(_onnx(tmp_path / "knn.onnx", knn=bank), threads=1)
    assert clf.knn is True and clf.output_name == "logits" and clf.num_classes == 5
    x = RNG.standard_normal((3, 3, 2, 2)).astype(np.float32)
    out = clf.outputs(x)
    assert out.dtype == np.float32 and out.shape == (3, 6)
    logits, knn = clf.split(out)
    np.testing.assert_allclose(logits, _want(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(knn, bank.scores(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(clf.run(x), logits)  # the logits alone
    plain = rov.OpenVinoClassifier(_onnx(tmp_path / "plain.onnx"), threads=1)
    assert plain.knn is False and plain.outputs(x).shape == (3, 5)


def test_a_class_axis_that_is_not_fixed_counts_the_class_names(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["logits"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", "C"])],
        [numpy_helper.from_array(np.array(2, np.float32), "two")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    set_metadata(model, META)
    onnx.save(model, str(tmp_path / "m.onnx"))
    clf = rov.OpenVinoClassifier(tmp_path / "m.onnx", threads=1)
    assert clf.width is None and clf.num_classes == 5  # len(class_names)
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    np.testing.assert_allclose(clf.run(x), 2 * x, rtol=1e-6)


def test_the_net_element_is_looked_for_in_the_first_4096_bytes(tmp_path: Path) -> None:
    core = ov.Core()
    inside = tmp_path / "inside.xml"  # "<net" ends at the 4096th byte: read as an IR
    inside.write_bytes(b" " * 4092 + b"<net>")
    with pytest.raises(InputError, match=r"inside\.bin is missing"):
        rov.read_ir(core, inside)
    past = tmp_path / "past.xml"  # one byte later: not looked at
    past.write_bytes(b" " * 4093 + b"<net>")
    with pytest.raises(InputError, match=r"past\.xml is not an OpenVINO IR"):
        rov.read_ir(core, past)


def test_openvinos_last_line_is_quoted_up_to_300_characters(tmp_path: Path) -> None:
    bad = tmp_path / ("m" * 150 + ".onnx")  # OpenVINO's last line names the path: > 300 chars
    bad.write_bytes(b"not a model")
    core = ov.Core()
    with pytest.raises(Exception) as raw:
        core.read_model(str(bad))
    last = str(raw.value).strip().splitlines()[-1]  # after "Exception from ...cpp:N:" lines
    assert len(last) > 300
    with pytest.raises(InputError) as err:
        rov.read_ir(core, bad)
    assert str(err.value) == f"OpenVINO cannot read {bad}: {last[:300]}"


# ---- the int8 export's calibration images ---------------------------------------------------


def _photos(folder: Path, n: int, size: tuple[int, int] = (6, 4)) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        p = folder / f"{i:03d}.png"
        Image.new("RGB", size, (i * 7 % 256, 10, 20)).save(p)
        out.append(p)
    return out


def test_calibration_batches_are_preprocessed_images_spread_over_the_folder(
    tmp_path: Path,
) -> None:
    from zoo.deploy.export.openvino import _calibration
    from zoo.images import open_image
    from zoo.preprocess import preprocess
    from zoo.preprocessing import Preprocessing

    pre = Preprocessing((3, 4, 4), 1.0, "bilinear", (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    photos = _photos(tmp_path / "calib", 10)
    gate = _photos(tmp_path / "gate", 1, (5, 5))
    batches = _calibration(str(tmp_path / "calib"), gate, pre, 5)
    assert len(batches) == 5 and all(b.shape == (1, 3, 4, 4) for b in batches)
    for b, p in zip(batches, photos[::2], strict=True):  # every second image, up to the limit
        np.testing.assert_array_equal(b[0], preprocess(open_image(p), pre))
    with pytest.raises(InputError) as err:
        _calibration(str(tmp_path / "empty"), gate, pre, 5)
    assert str(err.value) == f"No images found for calibration in {tmp_path / 'empty'}."


def test_calibration_needs_a_folder_disjoint_from_the_gates(tmp_path: Path) -> None:
    from zoo.deploy.export.openvino import _calibration

    with pytest.raises(InputError) as err:
        _calibration(None, [], None, 10)
    assert str(err.value) == (
        "--precision int8 needs --calib DIR: a folder of real images like the ones the model "
        "will see (a few hundred; not the --data images the gate judges it on)."
    )
    photos = _photos(tmp_path / "calib", 3)
    with pytest.raises(InputError, match=r"1 --data image\(s\) are also --calib images"):
        _calibration(str(tmp_path / "calib"), photos[1:2], None, 10)
