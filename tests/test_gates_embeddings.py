"""The embeddings gate on tiny ONNX graphs built with onnx.helper and on plain arrays
(milliseconds): which tensor is the classifier's input (float, through int8 forms), the
refusal where there is none, the second output through a real onnxruntime session, padded
fixed-batch runs, and the batch scoring that keeps rows and errors in input order. The real
MobileNetV2 runs, and the Ray engine, are in test_predict_out.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.deploy.predict.embeddings import feature_tensor, flat, with_feature_output
from zoo.deploy.predict.rows import score_decoded
from zoo.deploy.predict.scoring import Scorer
from zoo.deploy.predict.store import columns
from zoo.deploy.runtimes.loader import OnnxClassifier, make_session
from zoo.errors import InputError
from zoo.onnx_meta import set_metadata

RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3)).astype(np.float32)  # 4 features → 3 classes
B = RNG.standard_normal(3).astype(np.float32)
PRE = {
    "input_size": [3, 2, 2],
    "crop_pct": 1.0,
    "interpolation": "bilinear",
    "mean": [0.5, 0.5, 0.5],
    "std": [0.5, 0.5, 0.5],
}


def _graph(nodes: list[onnx.NodeProto], batch: int | str = "N") -> onnx.GraphProto:
    inits = [numpy_helper.from_array(a, n) for a, n in ((W, "w"), (B, "b"), (W.T.copy(), "wt"))]
    return helper.make_graph(
        [
            helper.make_node("Flatten", ["x"], ["flat"]),
            helper.make_node("Slice", ["flat", "s0", "s1", "ax"], ["cut"]),
            helper.make_node("Relu", ["cut"], ["h"]),
            *nodes,
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 2, 2])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3])],
        [
            *inits,
            numpy_helper.from_array(np.array([0], np.int64), "s0"),
            numpy_helper.from_array(np.array([4], np.int64), "s1"),
            numpy_helper.from_array(np.array([1], np.int64), "ax"),
        ],
    )


GEMM = [helper.make_node("Gemm", ["h", "w", "b"], ["logits"])]
MATMUL_ADD = [
    helper.make_node("MatMul", ["h", "w"], ["mm"]),
    helper.make_node("Add", ["mm", "b"], ["logits"]),
]
DYNAMIC_INT8 = [  # the shape onnxruntime's quantize_dynamic gives a Gemm
    helper.make_node("DynamicQuantizeLinear", ["h"], ["hq", "hs", "hz"]),
    helper.make_node("Mul", ["hs", "ws"], ["scales"]),
    helper.make_node("MatMulInteger", ["hq", "wq", "hz", "wz"], ["mmi"]),
    helper.make_node("Cast", ["mmi"], ["mmf"], to=TensorProto.FLOAT),
    helper.make_node("Mul", ["mmf", "scales"], ["mm"]),
    helper.make_node("Add", ["mm", "b"], ["logits"]),
]
QDQ = [  # static int8, QDQ format
    helper.make_node("QuantizeLinear", ["h", "s", "z"], ["hq"]),
    helper.make_node("DequantizeLinear", ["hq", "s", "z"], ["hd"]),
    helper.make_node("MatMul", ["hd", "w"], ["mm"]),
    helper.make_node("Add", ["mm", "b"], ["logits"]),
]


@pytest.mark.parametrize("nodes", [GEMM, MATMUL_ADD, DYNAMIC_INT8, QDQ])
def test_the_classifier_input_is_found_in_float(nodes: list[onnx.NodeProto]) -> None:
    assert feature_tensor(_graph(nodes)) == "h"


def _chain(steps: int) -> list[onnx.NodeProto]:
    """A Gemm, then ``steps`` Relus and an Identity before the logits."""
    return [
        helper.make_node("Gemm", ["h", "w", "b"], ["r0"]),
        *[helper.make_node("Relu", [f"r{i}"], [f"r{i + 1}"]) for i in range(steps)],
        helper.make_node("Identity", [f"r{steps}"], ["logits"]),
    ]


def test_a_graph_without_a_linear_classifier_is_refused() -> None:
    assert feature_tensor(_graph(_chain(6))) == "h"  # 8 nodes back from the logits: found
    for nodes in ([helper.make_node("Sigmoid", ["h"], ["logits"])], _chain(7)):
        with pytest.raises(InputError, match="drop --embeddings, or predict with the registry"):
            feature_tensor(_graph(nodes))


def _classifier(tmp_path: Path, batch: int | str) -> Path:
    model = helper.make_model(_graph(GEMM, batch), opset_imports=[helper.make_opsetid("", 17)])
    set_metadata(model, {"preprocessing": PRE, "class_names": ["a", "b", "c"]})
    path = tmp_path / f"m{batch}.onnx"
    onnx.save(model, str(path))
    return path


def _expected(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.maximum(x.reshape(len(x), -1)[:, :4], 0)
    return h @ W + B, h


def test_the_second_output_runs_in_onnxruntime(tmp_path: Path) -> None:
    blob, name = with_feature_output(_classifier(tmp_path, "N"))
    assert name == "h"
    sess = make_session(blob, threads=1)
    assert [o.name for o in sess.get_outputs()] == ["logits", "h"]
    x = RNG.standard_normal((5, 3, 2, 2)).astype(np.float32)
    logits, h = sess.run(None, {"x": x})
    want_logits, want_h = _expected(x)
    np.testing.assert_allclose(h, want_h, rtol=0, atol=1e-6)
    np.testing.assert_allclose(logits, want_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("batch", ["N", 2])
def test_classifier_features_for_any_count_and_fixed_batches(
    tmp_path: Path, batch: int | str
) -> None:
    """A fixed batch of 2 runs 5 samples as 2+2+1 padded: each sample keeps its own rows."""
    clf = OnnxClassifier(_classifier(tmp_path, batch), threads=1, embeddings=True)
    assert clf.static_batch == (None if batch == "N" else 2)
    x = RNG.standard_normal((5, 3, 2, 2)).astype(np.float32)
    logits, feats = clf.run_with_features(x)
    want_logits, want_h = _expected(x)
    assert feats.shape == (5, 4) and feats.dtype == np.float32
    np.testing.assert_allclose(feats, want_h, rtol=0, atol=1e-6)
    np.testing.assert_allclose(logits, want_logits, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(clf.run(x), logits)
    with pytest.raises(ValueError, match="embeddings=True"):
        OnnxClassifier(_classifier(tmp_path, batch), threads=1).run_with_features(x)


def test_flat() -> None:
    f = flat(np.arange(12, dtype=np.float64).reshape(2, 3, 2, 1))
    assert f.shape == (2, 6) and f.dtype == np.float32 and f.flags.c_contiguous
    assert f[1].tolist() == [6, 7, 8, 9, 10, 11]


def _scorer() -> Scorer:
    def embed(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x[:, :3], x[:, 3:] * 2

    return Scorer(
        prepare=lambda im: np.asarray(im),
        score=lambda x: x[:, :3],
        labels=("a", "b", "c"),
        num_classes=3,
        embed=embed,
    )


def test_score_decoded_keeps_rows_errors_and_embeddings_in_order() -> None:
    rows = [np.array([0.1, 0.7, 0.2, 1.0, 2.0]), np.array([0.6, 0.3, 0.1, 3.0, 4.0])]
    batch = [("p0", rows[0], None), ("bad", None, "Cannot decode"), ("p2", rows[1], None)]
    out = score_decoded(_scorer(), batch, 2, embeddings=True)
    assert [(p, reason) for p, _, reason in out] == [
        ("p0", None),
        ("bad", "Cannot decode"),
        ("p2", None),
    ]
    assert out[1][1] is None
    first, third = out[0][1], out[2][1]
    assert first is not None and third is not None
    assert (first["label_1"], first["index_1"], first["label_2"]) == ("b", 1, "c")
    assert (third["label_1"], third["score_1"]) == ("a", 0.6)
    assert first["embedding"] == [2.0, 4.0] and third["embedding"] == [6.0, 8.0]
    plain = score_decoded(_scorer(), batch, 1)
    assert "embedding" not in plain[0][1] and plain[2][1]["label_1"] == "a"  # type: ignore[index]
    assert [r for _, r, _ in score_decoded(_scorer(), batch[1:2], 1)] == [None]


def test_embedding_column_is_last_and_a_list_of_float32(tmp_path: Path) -> None:
    assert columns(1, False, True)[-1] == ("embedding", "floats")
    assert columns(1, True, True)[-2:] == [("labels", "str"), ("embedding", "floats")]
    assert ("embedding", "floats") not in columns(1, True)
    assert json.dumps(columns(2, False))  # plain names and type tags
