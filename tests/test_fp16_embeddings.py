"""Embeddings of fp16 and int8 exports: the second output that :mod:`zoo.deploy.predict.embeddings`
adds is declared with the feature tensor's own type (float16 inside an fp16 graph, with float32
or float16 at its boundary), and the runtime hands back float32 either way. On the embeddings
gate's tiny graph converted by the export's own fp16 converter (milliseconds), then on a real
SimpleCNN run's ``zoo export --precision fp16 [--fp16-io]`` and ``zoo quantize`` variants:
``zoo index``, ``zoo similar`` and ``zoo predict --embeddings`` read each of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import finetune_here, zoo_here
from tests.test_gates_embeddings import _classifier, _expected, _graph
from zoo.deploy.export.fp16 import to_fp16_file
from zoo.deploy.index.store import IndexManifest, read_shards
from zoo.deploy.predict.embeddings import element_type, with_feature_output
from zoo.deploy.runtimes.loader import OnnxClassifier, make_session
from zoo.errors import InputError

RNG = np.random.default_rng(1)


def _fp16(tmp_path: Path, *, fp16_io: bool, value_info: bool = True) -> Path:
    """The embeddings gate's Gemm classifier as ``zoo export --precision fp16`` makes it."""
    path = _classifier(tmp_path, "N")
    to_fp16_file(path, fp16_io=fp16_io)
    if not value_info:  # as a graph from another tool may come: types left to inference
        model = onnx.load(str(path))
        del model.graph.value_info[:]
        onnx.save(model, str(path))
    return path


def _added(blob: bytes) -> onnx.ValueInfoProto:
    return onnx.load_from_string(blob).graph.output[-1]


@pytest.mark.parametrize("fp16_io", [False, True], ids=["fp16", "fp16-io"])
def test_an_fp16_graphs_features_are_declared_float16_and_read_as_float32(
    tmp_path: Path, fp16_io: bool
) -> None:
    path = _fp16(tmp_path, fp16_io=fp16_io)
    blob, name = with_feature_output(path)
    assert name == "h" and _added(blob).type.tensor_type.elem_type == TensorProto.FLOAT16
    clf = OnnxClassifier(path, threads=1, embeddings=True)
    assert clf.half_io == fp16_io
    x = RNG.standard_normal((5, 3, 2, 2)).astype(np.float32)
    logits, feats = clf.run_with_features(x)
    want_logits, want_h = _expected(x)
    assert feats.dtype == np.float32 and feats.shape == (5, 4) and logits.dtype == np.float32
    np.testing.assert_allclose(feats, want_h, rtol=0, atol=1e-2)  # float16 rounding
    np.testing.assert_allclose(logits, want_logits, rtol=0, atol=2e-2)
    np.testing.assert_array_equal(clf.run(x), logits)  # the same pass as without features


def test_without_value_info_the_type_comes_from_inference(tmp_path: Path) -> None:
    path = _fp16(tmp_path, fp16_io=False, value_info=False)
    model = onnx.load(str(path))
    assert not model.graph.value_info and element_type(model, "h") == TensorProto.FLOAT16
    assert _added(with_feature_output(path)[0]).type.tensor_type.elem_type == TensorProto.FLOAT16


def test_a_type_nothing_states_is_left_to_onnxruntime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where inference fails (a model over 2 GB), the output goes in untyped: onnxruntime
    types it from the graph, and the features still come back float32."""

    def fail(model: onnx.ModelProto) -> onnx.ModelProto:
        raise ValueError("too big")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", fail)
    path = _fp16(tmp_path, fp16_io=True, value_info=False)
    blob, name = with_feature_output(path)
    assert not _added(blob).HasField("type")
    sess = make_session(blob, threads=1)
    assert [(o.name, o.type) for o in sess.get_outputs()][-1] == (name, "tensor(float16)")
    x = RNG.standard_normal((3, 3, 2, 2)).astype(np.float32)
    feats = OnnxClassifier(path, threads=1, embeddings=True).run_with_features(x)[1]
    assert feats.dtype == np.float32
    np.testing.assert_allclose(feats, _expected(x)[1], rtol=0, atol=1e-2)


def test_a_classifier_reading_integers_is_refused(tmp_path: Path) -> None:
    graph = _graph([helper.make_node("MatMul", ["h", "w"], ["logits"])])
    graph.node.pop(2)  # h: a graph input of int32, not the Relu of the float image
    graph.input.append(helper.make_tensor_value_info("h", TensorProto.INT32, ["N", 4]))
    path = tmp_path / "int.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(
        InputError, match=r"\('h'\) holds int32, not float32, float16.*drop --embeddings"
    ):
        with_feature_output(path)


# a real run: SimpleCNN, one epoch on 100 16 px digits (resized to its 32 px), and its variants


@pytest.fixture(scope="module")
def variants(digits16: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``runs/r``: exported fp32, ``--precision fp16``, ``--precision fp16 --fp16-io`` and
    quantized (dynamic int8)."""
    root = tmp_path_factory.mktemp("fp16-emb")
    run = finetune_here(digits16, root, "r", model="simple_cnn", epochs=1, image_size=32)
    for flags in ((), ("--precision", "fp16"), ("--precision", "fp16", "--fp16-io")):
        r = zoo_here("export", str(run), *flags)
        assert r.returncode == 0, r.stderr
    r = zoo_here("quantize", str(run / "model" / "model.onnx"), "--mode", "dynamic")
    assert r.returncode in (0, 1), r.stderr  # 1: the int8 gate's verdict, the file is written
    return run


def _index(model: Path, images: Path, out: Path) -> np.ndarray:
    r = zoo_here("index", str(model), str(images), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == 100
    found = list(read_shards(out, IndexManifest.read(out)))
    assert all(e.dtype == np.float32 for _, e in found)
    return np.concatenate([e for _, e in found])


@pytest.mark.parametrize("variant", ["fp16", "fp16-io16", "int8-dynamic"])
def test_an_index_from_each_variant_matches_fp32(
    variants: Path, digits16: Path, tmp_path: Path, variant: str
) -> None:
    """``zoo index RUN/model/variants/V.onnx DIR``, then ``zoo similar`` with that file: each
    image's nearest neighbour is itself, and every row is the fp32 model's to within rounding
    (before the fix: "onnxruntime cannot load the model" for both fp16 variants)."""
    model = variants / "model"
    reference = _index(model / "model.onnx", digits16, tmp_path / "fp32.index")
    index = tmp_path / f"{variant}.index"
    got = _index(model / "variants" / f"{variant}.onnx", digits16, index)
    cosine = np.sum(got * reference, axis=1)  # rows are L2-normalised
    assert cosine.min() > 0.99, cosine.min()
    query = sorted((digits16 / "digit_3").iterdir())[0]
    r = zoo_here("similar", str(index), str(query), "-k", "2", "--json")
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)[0]["neighbours"][0]
    assert first["path"] == str(query.relative_to(digits16))
    assert first["similarity"] == pytest.approx(1.0, abs=1e-3)


def test_predict_embeddings_of_an_fp16_io_variant(
    variants: Path, digits16: Path, tmp_path: Path
) -> None:
    """``zoo predict RUN DIR --variant fp16-io16 --out F --embeddings``: float16 in and out at
    the graph's boundary, float32 rows written, the fp32 export's to within rounding."""
    import pyarrow.parquet as pq

    folder = tmp_path / "threes"
    shutil.copytree(digits16 / "digit_3", folder)

    def embeddings(*variant: str) -> np.ndarray:
        out = tmp_path / f"p{len(variant)}.parquet"
        argv = ["predict", str(variants), str(folder), *variant, "--out", str(out)]
        r = zoo_here(*argv, "--embeddings")
        assert r.returncode == 0, r.stderr
        table = pq.read_table(out).sort_by("path")
        assert str(table.schema.field("embedding").type) == "list<element: float>"
        return np.asarray(table.column("embedding").to_pylist(), np.float32)

    got, reference = embeddings("--variant", "fp16-io16"), embeddings()
    assert got.shape == reference.shape == (10, 256)
    np.testing.assert_allclose(got, reference, rtol=0, atol=2e-2 * np.abs(reference).max())
