"""``zoo quantize --target-agreement``'s search (deploy/quantize/search.py) run for real, with
onnxruntime's calibrators and quantizer, on a tiny three-layer MatMul net built with
onnx.helper (about a second): every figure the result reports is recomputed here from the
files it names, and the search's estimate and report shapes are checked to the digit. The
pure parts (bisection, ordering, the logit error) are tests/test_quantize_search.py's fast
tests, selected with this file by scripts/mutation.sh."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.deploy.quantize import search as qs
from zoo.deploy.quantize.calibration import Calibration, candidates, quantize_qdq
from zoo.errors import QuantizationError

RNG = np.random.default_rng(0)
CALIB = [RNG.normal(size=(1, 8)).astype(np.float32) for _ in range(40)]
HELD = RNG.normal(size=(30, 8)).astype(np.float32)
WEIGHTS = [RNG.normal(size=s).astype(np.float32) for s in ((8, 32), (32, 32), (32, 5))]
TARGET = 1.0  # on this net: k = 0 and 1 fall short, 2 of the 5 nodes float reach it


def _net(path: Path) -> Path:
    w = WEIGHTS
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"], name="mm1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="mm2"),
        helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
        helper.make_node("MatMul", ["r2", "w3"], ["y"], name="mm3"),
    ]
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])],
        [numpy_helper.from_array(a, f"w{i + 1}") for i, a in enumerate(w)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _search(model: Path, out: Path, work: Path, target: float, **kw: Any) -> qs.SearchResult:
    """:func:`qs.search` of ``model`` against itself on the module's images (``calib_batches``
    and the rest overridable)."""
    args: dict[str, Any] = {"calib_batches": CALIB, "input_name": "x", "x_held_out": HELD}
    return qs.search(model, out, fp32_model=model, target=target, workdir=work, **{**args, **kw})


@pytest.fixture  # per test (about a second): mutmut credits a module fixture to one test only
def searched(tmp_path: Path) -> dict[str, Any]:
    root = tmp_path
    model = _net(root / "m.onnx")
    work = root / "work"
    work.mkdir()
    out = root / "int8.onnx"
    t0 = time.perf_counter()
    result = _search(model, out, work, TARGET)
    wall = time.perf_counter() - t0
    return {"model": model, "work": work, "out": out, "result": result, "root": root, "wall": wall}


def _logits(path: Path, x: np.ndarray) -> np.ndarray:
    return qs.logits(path, x, None)


def test_each_calibration_setting_is_tried_on_its_own_ranges(searched: dict[str, Any]) -> None:
    r: qs.SearchResult = searched["result"]
    model, work, tmp = searched["model"], searched["work"], searched["root"] / "t.onnx"
    settings = [(t.calibration.method, t.calibration.per_channel) for t in r.tried[:6]]
    assert settings == [(m, pc) for m in ("minmax", "entropy", "percentile") for pc in (1, 0)]
    assert not any(t.calibration.symmetric for t in r.tried[:6])
    best = min(r.tried[:6], key=lambda t: t.logit_error).calibration
    assert r.tried[6].calibration == Calibration(best.method, best.per_channel, symmetric=True)
    assert r.calibration == min(r.tried, key=lambda t: t.logit_error).calibration
    assert sorted(p.name for p in work.glob("ranges-*")) == [
        "ranges-entropy.json",
        "ranges-minmax.json",
        "ranges-percentile.json",
    ]
    x = np.concatenate(CALIB)
    y32 = _logits(model, x)
    for t in r.tried:  # each figure, recomputed from that method's cached ranges
        quantize_qdq(model, tmp, work / f"ranges-{t.calibration.method}.json", t.calibration)
        y8 = _logits(tmp, x)
        assert t.logit_error == qs.logit_error(y32, y8) > 0
        assert t.agreement == qs.top1_agreement(y32, y8)
    assert r.n_calibration == 40 and r.n_held_out == 30 and r.target == TARGET


def test_each_node_is_scored_alone_on_16_spread_calibration_images(
    searched: dict[str, Any],
) -> None:
    r: qs.SearchResult = searched["result"]
    model, work, tmp = searched["model"], searched["work"], searched["root"] / "s.onnx"
    assert r.ops == candidates(model) and list(r.ops) == ["mm1", "relu1", "mm2", "relu2", "mm3"]
    assert r.order == qs.sensitivity_order(list(r.ops), r.scores)
    x_few = np.concatenate(CALIB)[::2]  # 40 images: every second one, 16 of them
    x_few = x_few[:16]
    y32 = _logits(model, x_few)
    cache = work / f"ranges-{r.calibration.method}.json"
    for node in r.ops:
        quantize_qdq(model, tmp, cache, r.calibration, only=[node])
        assert r.scores[node] == qs.logit_error(y32, _logits(tmp, x_few)), node
    assert r.scores[r.order[0]] > 0


def test_the_fewest_float_nodes_that_reach_the_target_are_written(
    searched: dict[str, Any],
) -> None:
    r: qs.SearchResult = searched["result"]
    model, work, out = searched["model"], searched["work"], searched["out"]
    tmp = searched["root"] / "k.onnx"
    cache = work / f"ranges-{r.calibration.method}.json"
    y32 = _logits(model, HELD)
    assert r.steps[0][0] == 0 and r.steps[0][1] < TARGET  # k = 0 first, and it falls short
    for k, agreement in r.steps:  # each step, recomputed with the k most sensitive float
        quantize_qdq(model, tmp, cache, r.calibration, exclude=r.order[:k])
        assert qs.top1_agreement(y32, _logits(tmp, HELD)) == agreement, k
    assert r.k == qs.choose_k(r.steps, TARGET) == 2 and [k for k, _ in r.steps] == [0, 2, 1]
    assert r.float_nodes == r.order[:2] and r.agreement == dict(r.steps)[2] >= TARGET
    assert qs.top1_agreement(y32, _logits(out, HELD)) == r.agreement
    graph = onnx.load(str(out)).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    for n in graph.node:  # the float MatMuls keep their float weights, the others read int8
        if n.op_type == "MatMul":
            assert (producer.get(n.input[1]) != "DequantizeLinear") == (n.name in r.float_nodes)
    assert not (work / f"k{r.k}.onnx").exists()  # moved to out, not copied
    # the scratch left in the caller's workdir: each method's ranges, the last trial and node
    # alone, and each measured k but the chosen one
    assert sorted(p.name for p in work.iterdir()) == sorted(
        [f"ranges-{m}.json" for m in ("minmax", "entropy", "percentile")]
        + ["trial.onnx", "alone.onnx"]
        + [f"k{k}.onnx" for k, _ in r.steps if k != r.k]
    )
    assert list(r.seconds) == ["calibrate", "choose_calibration", "sensitivity", "search_k"]
    for v in r.seconds.values():  # each stage's own seconds, to a tenth, within the whole
        assert type(v) is float and v == round(v, 1) and 0 <= v <= searched["wall"] + 0.05
    assert sum(r.seconds.values()) <= searched["wall"] + 0.2


def test_every_inference_runs_on_the_callers_threads_one_image_a_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``threads`` reaches every session the search opens, and a graph with a dynamic batch
    runs one image a call, as ``zoo quantize``'s report measures it."""
    from zoo.deploy.runtimes import loader

    real_session, sessions, batches = loader.make_session, [], []

    class Counted:  # the real session, its calls' batch sizes recorded
        def __init__(self, session: Any) -> None:
            self.session = session

        def get_inputs(self) -> Any:
            return self.session.get_inputs()

        def run(self, names: Any, feed: dict[str, np.ndarray]) -> Any:
            batches.append(next(iter(feed.values())).shape[0])
            return self.session.run(names, feed)

    def make_session(path: Any, **kw: Any) -> Counted:
        sessions.append(kw.get("threads"))
        return Counted(real_session(path, **kw))

    monkeypatch.setattr(loader, "make_session", make_session)
    model = _net(tmp_path / "m.onnx")
    y = qs.logits(model, HELD[:3], 2)
    assert sessions == [2] and batches == [1, 1, 1]
    np.testing.assert_array_equal(y, real_session(model).run(None, {"x": HELD[:3]})[0])
    work = tmp_path / "work"
    work.mkdir()
    sessions.clear()
    r = _search(model, tmp_path / "int8.onnx", work, TARGET, threads=1)
    # fp32 twice, 7 calibration trials, each node alone, each measured k
    assert sessions == [1] * (2 + 7 + len(r.ops) + len(r.steps))
    assert set(batches) == {1}


def test_a_logit_vector_smaller_than_one_is_its_own_scale() -> None:
    y32 = np.array([[0.1, 0.2]], np.float32)
    y8 = np.array([[0.2, 0.2]], np.float32)
    assert qs.logit_error(y32, y8) == pytest.approx(0.01 / 0.05)  # not clamped to a scale of 1


def test_nothing_tried_is_named() -> None:
    with pytest.raises(ValueError, match=r"^no calibration setting was tried$"):
        qs.best_calibration([])


def test_reaching_the_target_exactly_counts_and_n_is_not_measured_past_an_answer() -> None:
    steps = qs.bisect_k(lambda k: 0.98 if k >= 3 else 0.5, 8, 0.98)
    assert steps == [(0, 0.5), (4, 0.98), (2, 0.5), (3, 0.98)]


def test_a_target_no_float_count_reaches_writes_nothing_and_names_the_best(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held-out agreements made up (the calibration ones real): 50 % at k = 0, then 70 % at
    k = 2 and 3, 60 % above; the best is the fewest float nodes at the highest agreement."""
    model = _net(tmp_path / "m.onnx")
    made_up = iter([0.5, 0.7, 0.7, 0.6, 0.6])
    real = qs.top1_agreement
    monkeypatch.setattr(
        qs, "top1_agreement", lambda a, b: next(made_up) if len(a) == 30 else real(a, b)
    )
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "int8.onnx"
    with pytest.raises(QuantizationError) as err:
        _search(model, out, work, 0.98)
    assert str(err.value) == (
        "No number of float nodes reaches top-1 agreement 98.0% with fp32 on the 30 held-out "
        "images (best 70.0%, with 2 of 5 nodes float). Nothing was written; lower "
        "--target-agreement or keep the fp32 model."
    )
    assert not out.exists()


def test_a_target_out_of_range_is_refused_before_any_work(tmp_path: Path) -> None:
    from zoo.errors import InputError

    with pytest.raises(InputError, match="--target-agreement"):
        _search(tmp_path / "absent.onnx", tmp_path / "o.onnx", tmp_path, 1.5)


# --- the estimate said before it starts, and the report's shapes ------------------------------


def test_the_estimate_prices_each_stage() -> None:
    b = qs.estimate_seconds(nodes=99, n_calibration=80, n_held_out=120, seconds_per_image=0.01)
    full = 0.013 * 99
    steps = 7 + 2  # ceil(log2(99)) + 2
    assert b.seconds == pytest.approx(
        {
            "calibrate": 3 * 80 * 0.01 * 3.0,
            "choose_calibration": 7 * (full + 80 * 0.01),
            "sensitivity": 99 * (0.3 + 16 * 0.01),
            "search_k": steps * (full + 120 * 0.01),
        }
    )
    assert list(b.seconds) == ["calibrate", "choose_calibration", "sensitivity", "search_k"]
    assert (b.nodes, b.n_calibration, b.n_held_out) == (99, 80, 120)
    assert b.total == pytest.approx(sum(b.seconds.values()))
    few = qs.estimate_seconds(nodes=1, n_calibration=5, n_held_out=3, seconds_per_image=1.0)
    assert few.seconds["sensitivity"] == pytest.approx(0.3 + 5)  # 5 images, not 16
    assert few.seconds["search_k"] == pytest.approx(2 * (0.013 + 3))  # log2(1) + 2 steps
    assert qs.estimate_seconds(0, 5, 3, 1.0).seconds["search_k"] == pytest.approx(2 * 3)


def test_the_estimate_reads_as_one_line() -> None:
    b = qs.SearchBudget(
        nodes=99,
        n_calibration=80,
        n_held_out=120,
        seconds={"calibrate": 7.2, "choose_calibration": 14.6, "sensitivity": 45.5},
    )
    assert b.describe() == (
        "--target-agreement: about 1.1 min (calibrate ~7 s, choose_calibration ~15 s, "
        "sensitivity ~46 s) for 3 calibrations of 80 images, 99 nodes scored alone on 16 "
        "images, and ~9 trials on 120 held-out images (an estimate, before it starts)"
    )
    assert (
        qs.SearchBudget(1, 1, 1, {"calibrate": 600.0})
        .describe()
        .startswith("--target-agreement: about 10.0 min (calibrate ~600 s) ")
    )
    small = qs.SearchBudget(5, 10, 4, {"calibrate": 60.0})
    assert "scored alone on 10 images" in small.describe()
    assert "~5 trials" in small.describe()


def test_the_report_section_names_what_was_chosen_and_on_what() -> None:
    tried = [
        qs.Tried(Calibration("minmax", True), 0.123456789, 0.87654),
        qs.Tried(Calibration("entropy", False, symmetric=True), 0.01, 0.95),
    ]
    order = [f"n{i}" for i in range(12)]
    ops = {n: ("Conv" if i % 3 else "Add") for i, n in enumerate(order)}
    scores = {n: 1.0 / (i + 1) + 1e-9 for i, n in enumerate(order)}
    r = qs.SearchResult(
        target=0.98,
        calibration=tried[1].calibration,
        tried=tried,
        n_calibration=20,
        order=order,
        scores=scores,
        ops=ops,
        k=4,
        steps=[(0, 0.5), (6, 0.99), (3, 0.97), (4, 0.985), (5, 0.99)],
        n_held_out=100,
        seconds={"calibrate": 1.0},
    )
    assert r.float_nodes == ["n0", "n1", "n2", "n3"] and r.agreement == 0.985
    d = r.to_dict([0.9, 0.99])
    assert d["target"] == 0.98 and d["k"] == 4 and d["float_nodes"] == r.float_nodes
    assert d["calibration"] == {
        **tried[1].calibration.to_dict(),
        "n_images": 20,
        "chosen_by": "lowest mean relative logit error vs fp32 on the calibration images",
        "tried": [
            {
                **tried[0].calibration.to_dict(),
                "logit_error_on_calibration": 0.12346,
                "agreement_on_calibration": 0.8765,
            },
            {
                **tried[1].calibration.to_dict(),
                "logit_error_on_calibration": 0.01,
                "agreement_on_calibration": 0.95,
            },
        ],
    }
    assert d["sensitivity"] == {
        "n_images": 16,
        "candidates": 12,
        "score": "mean relative logit error vs fp32 with the node alone in int8",
        "most_sensitive": [
            {"node": n, "op": ops[n], "score": round(scores[n], 6)} for n in order[:10]
        ],
    }
    assert d["float_ops"] == {"Add": 2, "Conv": 2} and list(d["float_ops"]) == ["Add", "Conv"]
    assert d["steps"][:2] == [{"k": 0, "agreement": 0.5}, {"k": 6, "agreement": 0.99}]
    assert len(d["steps"]) == 5
    assert d["held_out"] == {
        "n_images": 100,
        "agreement": 0.985,
        "ci95": [0.9, 0.99],
        "note": "k, the number of float nodes, is chosen on these images",
    }
    assert d["seconds"] == {"calibrate": 1.0}
    few = qs.SearchResult(0.9, tried[0].calibration, tried, 5, order, scores, ops, 0, [(0, 1.0)], 3)
    assert few.to_dict([0.0, 1.0])["sensitivity"]["n_images"] == 5
    assert few.float_nodes == [] and few.seconds == {}


def test_under_32_calibration_images_the_first_16_score_the_nodes(tmp_path: Path) -> None:
    model = _net(tmp_path / "m.onnx")
    work = tmp_path / "work"
    work.mkdir()
    calib = CALIB[:20]
    r = _search(model, tmp_path / "int8.onnx", work, 0.5, calib_batches=calib)
    assert r.steps == [(0, r.agreement)] and r.k == 0  # all int8 already reaches 50 %
    x_few = np.concatenate(calib)[:16]
    y32 = _logits(model, x_few)
    tmp = tmp_path / "s.onnx"
    for node in r.ops:
        cache = work / f"ranges-{r.calibration.method}.json"
        quantize_qdq(model, tmp, cache, r.calibration, only=[node])
        assert r.scores[node] == qs.logit_error(y32, _logits(tmp, x_few)), node


def test_the_search_keeps_the_weight_bits_it_is_given(tmp_path: Path) -> None:
    """7-bit weights (a CPU without VNNI, or a model trained for them): every setting the
    search tries, and so the one it picks, keeps them."""
    model = _net(tmp_path / "m.onnx")
    work = tmp_path / "work"
    work.mkdir()
    r = _search(model, tmp_path / "int8.onnx", work, 0.5, reduce_range=True)
    assert len(r.tried) == 7 and all(t.calibration.reduce_range for t in r.tried)
    assert r.calibration.reduce_range
