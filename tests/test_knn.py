"""The kNN score of :mod:`zoo.knn` by hand: the k-th cosine similarity, the class-stratified
bank, its file, and the graph nodes that compute it (checked in onnxruntime against numpy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zoo.errors import ArtifactError
from zoo.knn import KNN_OUTPUT, KnnBank, add_to_graph, normalise, stratified


def test_the_score_is_the_kth_largest_cosine_similarity() -> None:
    rows = normalise(np.array([[1, 0], [0, 1], [1, 1], [-1, 0]], np.float32))
    x = np.array([[2.0, 0.0], [0.0, -3.0]], np.float32)  # unnormalised on purpose
    sims = normalise(x) @ rows.T  # [[1, 0, .707, -1], [0, -1, -.707, 0]]
    for k in (1, 2, 3, 4):
        want = np.sort(sims, axis=1)[:, ::-1][:, k - 1]
        assert KnnBank(rows, k).scores(x) == pytest.approx(want, abs=1e-6)
    assert KnnBank(rows, 1).scores(x)[0] == pytest.approx(1.0)  # a bank row itself scores 1


def test_stratified_keeps_each_class_share_and_every_class() -> None:
    labels = np.array(["a"] * 90 + ["b"] * 9 + ["c"])
    idx = stratified(labels, cap=20, seed=0)
    chosen = labels[idx]
    assert (chosen == "a").sum() == 18 and (chosen == "b").sum() == 2 and (chosen == "c").sum() == 1
    assert list(idx) == sorted(set(idx)) and np.array_equal(idx, stratified(labels, cap=20, seed=0))
    assert not np.array_equal(idx, stratified(labels, cap=20, seed=1))
    assert np.array_equal(stratified(labels, cap=100), np.arange(100))  # under the cap: all


def test_bank_file_round_trip_and_plain_refusals(tmp_path: Path) -> None:
    bank = KnnBank.of(np.random.default_rng(0).normal(size=(30, 8)), k=5)
    assert np.allclose(np.linalg.norm(bank.rows, axis=1), 1.0)
    bank.save(tmp_path)
    back = KnnBank.load(tmp_path)
    assert back.k == 5 and np.array_equal(back.rows, bank.rows)
    with pytest.raises(ArtifactError, match="another model"):
        bank.scores(np.ones((2, 9), np.float32))
    with pytest.raises(ArtifactError, match=r"no knn_bank\.safetensors.*zoo calibrate"):
        KnnBank.load(tmp_path / "nowhere")
    with pytest.raises(ArtifactError, match="k = 31"):
        KnnBank(bank.rows, k=31)
    assert KnnBank.of(bank.rows[:3], k=10).k == 3  # a tiny split lowers k
    (tmp_path / "knn_bank.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ArtifactError, match="not a readable kNN bank"):
        KnnBank.load(tmp_path)


@pytest.mark.parametrize(
    ("batch", "dtype"), [(None, np.float32), (3, np.float32), (None, np.float16)]
)
def test_the_graph_computes_the_bank_score(batch: int | None, dtype: type) -> None:
    """A hand-built classifier (features → Gemm → logits) gains the kNN output; onnxruntime's
    score equals :meth:`KnnBank.scores` of the same features, for a fixed or dynamic batch and
    for float16 features (cast to float first)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    dim, classes = 6, 3
    elem = TensorProto.FLOAT16 if dtype is np.float16 else TensorProto.FLOAT
    n = batch or "batch"
    g = helper.make_graph(
        [
            helper.make_node("Relu", ["input"], ["feat"]),
            helper.make_node("Gemm", ["feat", "w"], ["logits"], transB=1),
        ],
        "g",
        [helper.make_tensor_value_info("input", elem, [n, dim])],
        [helper.make_tensor_value_info("logits", elem, [n, classes])],
        [numpy_helper.from_array(rng.normal(size=(classes, dim)).astype(dtype), "w")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    bank = KnnBank.of(rng.normal(size=(40, dim)), k=4)
    add_to_graph(model, "feat", bank)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.normal(size=(batch or 5, dim)).astype(dtype)
    logits, got = sess.run(["logits", KNN_OUTPUT], {"input": x})
    assert got.shape == (len(x),) and got.dtype == np.float32 and logits.shape == (len(x), classes)
    want = bank.scores(np.maximum(x, 0).astype(np.float32))
    assert got == pytest.approx(want, abs=1e-3 if dtype is np.float16 else 1e-6)


def test_triton_declares_the_knn_output() -> None:
    from zoo.deploy.export.triton import build_config, validate_config

    cfg = validate_config(
        build_config("m", input_dims=[3, 8, 8], num_classes=4, max_batch=8, knn=True)
    )
    outs = {o.name: o for o in cfg.output}
    assert list(outs) == ["logits", KNN_OUTPUT]
    assert list(outs[KNN_OUTPUT].dims) == [1] and list(outs[KNN_OUTPUT].reshape.shape) == []
    plain = validate_config(build_config("m", input_dims=[3, 8, 8], num_classes=4, max_batch=8))
    assert [o.name for o in plain.output] == ["logits"]
