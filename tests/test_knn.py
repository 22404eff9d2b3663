"""The kNN score of :mod:`zoo.knn` by hand: the k-th cosine similarity, the class-stratified
bank, its file, and the graph nodes that compute it (checked in onnxruntime against numpy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zoo.calibration import KNN_K
from zoo.errors import ArtifactError
from zoo.knn import (
    BANK_FILE,
    KNN_OUTPUT,
    NODE_PREFIX,
    KnnBank,
    add_to_graph,
    normalise,
    rule_bank,
    stratified,
)


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
    assert np.array_equal(stratified(labels, cap=20), idx)  # seed 0 by default
    few = np.array(["a"] * 95 + ["b"] * 3 + ["c"] * 2)
    small = few[stratified(few, cap=20)]  # b's share rounds to 1 row, c's to none: kept at 1
    assert [(small == c).sum() for c in "abc"] == [19, 1, 1]


def test_a_big_draw_takes_each_row_once() -> None:
    labels = np.array(["a"] * 1000 + ["b"] * 1000)
    idx = stratified(labels, cap=1500, seed=0)
    assert len(idx) == len(set(idx)) == 1500  # without replacement: no row twice
    assert np.array_equal(stratified(labels, cap=2000), np.arange(2000))  # at the cap: all


def test_only_a_single_label_knn_rule_loads_its_bank(tmp_path: Path) -> None:
    """``rule_bank`` asks for the model folder only when the rule's score is ``knn``."""
    from types import SimpleNamespace

    KnnBank.of(np.random.default_rng(0).normal(size=(6, 4)), k=2).save(tmp_path)
    asked: list[int] = []

    def folder() -> Path:
        asked.append(1)
        return tmp_path

    def calibration(score: str | None) -> SimpleNamespace:
        return SimpleNamespace(reject=None if score is None else SimpleNamespace(score=score))

    assert rule_bank(None, False, folder) is None
    assert rule_bank(calibration(None), False, folder) is None
    assert rule_bank(calibration("msp"), False, folder) is None
    assert rule_bank(calibration("knn"), True, folder) is None  # multi-label: no bank
    assert asked == []
    bank = rule_bank(calibration("knn"), False, folder)
    assert asked == [1] and bank is not None and bank.k == 2 and bank.rows.shape == (6, 4)


def test_the_bank_is_a_named_durable_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from zoo import durable

    trace = tmp_path / "trace.tsv"
    monkeypatch.setenv(durable.TRACE_ENV, str(trace))
    KnnBank.of(np.ones((3, 2)), k=1).save(tmp_path)
    assert trace.read_text().splitlines()[-1].split("\t")[1] == BANK_FILE


def test_bank_file_round_trip_and_plain_refusals(tmp_path: Path) -> None:
    bank = KnnBank.of(np.random.default_rng(0).normal(size=(30, 8)), k=5)
    assert np.allclose(np.linalg.norm(bank.rows, axis=1), 1.0)
    bank.save(tmp_path)
    back = KnnBank.load(tmp_path)
    assert back.k == 5 and np.array_equal(back.rows, bank.rows)
    with pytest.raises(
        ArtifactError, match=r"another model; refit it \(zoo calibrate RUN --reject knn\)\.$"
    ):
        bank.scores(np.ones((2, 9), np.float32))
    for bad in (np.ones(4, np.float32), np.ones((0, 3), np.float32)):
        with pytest.raises(ArtifactError, match=r"needs \(M, D\) rows"):
            KnnBank(bad)
    grown = bank.extended(np.ones((2, 8)), k=2)
    assert grown.k == 2 and len(grown.rows) == 32 and np.array_equal(grown.rows[:30], bank.rows)
    assert grown.rows[30] == pytest.approx(np.full(8, 8**-0.5)) and bank.extended(bank.rows).k == 5
    with pytest.raises(ArtifactError, match=r"no knn_bank\.safetensors.*zoo calibrate"):
        KnnBank.load(tmp_path / "nowhere")
    with pytest.raises(ArtifactError, match="k = 31"):
        KnnBank(bank.rows, k=31)
    assert KnnBank.of(bank.rows[:3], k=10).k == 3  # a tiny split lowers k
    assert KnnBank.of(bank.rows[:1], k=10).k == 1
    from safetensors.numpy import save_file

    save_file({"rows": bank.rows.astype(np.float64)}, str(tmp_path / "knn_bank.safetensors"))
    plain = KnnBank.load(tmp_path)  # no metadata: the default k; rows read as float32
    assert plain.k == KNN_K and plain.rows.dtype == np.float32
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
    added = [n.name for n in model.graph.node[2:]]
    assert (
        len(added) == 6 and len(set(added)) == 6 and all(n.startswith(NODE_PREFIX) for n in added)
    )
    out = model.graph.output[1]
    assert (
        out.name == KNN_OUTPUT
        and out.type.tensor_type.shape.dim[0] == g.output[0].type.tensor_type.shape.dim[0]
    )
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
