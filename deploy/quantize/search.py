"""``zoo quantize --target-agreement``: static int8 (onnxruntime QDQ) that keeps the nodes it
cannot afford to round in float, until top-1 agreement with fp32 holds on held-out real images.

Three stages, each on data it is allowed to see:

1. **Calibration** (on the ``--calib`` images): activation ranges by each of onnxruntime's
   methods (minmax, entropy, percentile), each computed once; every method with per-channel
   weight scales on and off, then symmetric activations for the best of those; the setting with
   the lowest logit error against fp32 on the calibration images wins.
2. **Sensitivity** (on 16 of the calibration images): every node onnxruntime would quantize is
   quantized *alone* (``nodes_to_quantize=[node]``, the rest fp32) and scored by the logit error
   that alone causes. Alone, because then onnxruntime computes only that node's weight scales
   (~0.3 s a node on MobileNetV2, against ~1.3 s for "all but this one", where it recomputes
   every per-channel scale), and the score is that node's own rounding, not its neighbours'.
3. **How many stay float** (on the held-out ``--data`` images, disjoint from ``--calib``): the
   smallest k such that keeping the k most sensitive nodes float (``nodes_to_exclude``) reaches
   the target agreement, by bisection over k (agreement is near-monotone in k; the chosen k is
   always a measured one). This k is the one decision made on the held-out images; the
   agreement reported for it is measured on the same images, so it is the stopping rule's own
   figure, not an independent estimate.

What onnxruntime has is used as is: ``create_calibrator`` for the ranges, its calibration cache
(``save_tensors_data`` + ``quantize_static(calibration_cache_path=...)``) so each method's ranges
are computed once and reused by every later quantization, ``nodes_to_quantize`` and
``nodes_to_exclude`` for the per-node choices. Written here only what it lacks: the search
itself, and the entropy calibrator's bin count, which ``quantize_static`` does not forward
(at its default of 128 bins, ORT's entropy keeps the full min–max range: the same model as
minmax).

Measured on the real ImageNet MobileNetV2 with bench/deploy_bench.py's photo crops (80
calibration and 120 held-out crops, from different photographs; 2 threads on an AMD EPYC with
AVX2, no VNNI): entropy ranges with per-tensor weights won; the target 0.98 took 58 of the 99
quantizable nodes float (49 of its 53 Conv/Gemm), for 98.3 % agreement (95 % interval
94.1–99.5 %) where plain minmax int8 keeps 63 %, at 0.95× the fp32 latency (all-int8: ~0.7×);
about 2 minutes. On these low-margin crops 98 % is bought with most of the network in float.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import numpy as np

from zoo.deploy.choices import CalibMethod
from zoo.deploy.quantize.calibration import (
    Calibration,
    calibrate,
    candidates,
    quantize_qdq,
)
from zoo.deploy.quantize.options import check_target
from zoo.errors import QuantizationError

SENSITIVITY_IMAGES = 16
"""Calibration images each node's sensitivity is scored on."""


@dataclass(frozen=True)
class Tried:
    """A calibration setting and how far its int8 model was from fp32 on the calibration
    images: the mean relative logit error (what picks the winner) and top-1 agreement."""

    calibration: Calibration
    logit_error: float
    agreement: float

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.calibration.to_dict(),
            "logit_error_on_calibration": round(self.logit_error, 5),
            "agreement_on_calibration": round(self.agreement, 4),
        }


@dataclass(frozen=True)
class SearchResult:
    """What :func:`search` chose and measured."""

    target: float
    calibration: Calibration
    tried: list[Tried]
    n_calibration: int
    order: list[str]
    """Every candidate node, most sensitive first."""
    scores: dict[str, float]
    ops: dict[str, str]
    k: int
    steps: list[tuple[int, float]]
    """(k, held-out agreement) in the order measured."""
    n_held_out: int
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def float_nodes(self) -> list[str]:
        return self.order[: self.k]

    @property
    def agreement(self) -> float:
        return dict(self.steps)[self.k]

    def to_dict(self, ci95: list[float]) -> dict[str, Any]:
        """The report's ``search`` section; ``ci95``: the interval of :attr:`agreement` on
        :attr:`n_held_out` images (:func:`~zoo.deploy.quantize.verdict.wilson`)."""
        return {
            "target": self.target,
            "calibration": {
                **self.calibration.to_dict(),
                "n_images": self.n_calibration,
                "chosen_by": "lowest mean relative logit error vs fp32 on the calibration images",
                "tried": [t.to_dict() for t in self.tried],
            },
            "sensitivity": {
                "n_images": min(SENSITIVITY_IMAGES, self.n_calibration),
                "candidates": len(self.order),
                "score": "mean relative logit error vs fp32 with the node alone in int8",
                "most_sensitive": [
                    {"node": n, "op": self.ops[n], "score": round(self.scores[n], 6)}
                    for n in self.order[:10]
                ],
            },
            "float_nodes": self.float_nodes,
            "float_ops": dict(sorted(Counter(self.ops[n] for n in self.float_nodes).items())),
            "k": self.k,
            "steps": [{"k": k, "agreement": a} for k, a in self.steps],
            "held_out": {
                "n_images": self.n_held_out,
                "agreement": self.agreement,
                "ci95": ci95,
                "note": "k, the number of float nodes, is chosen on these images",
            },
            "seconds": self.seconds,
        }


# --- pure parts: plain lists and arrays -------------------------------------------------------


SECONDS_QUANTIZE_ALONE = 0.3
"""``quantize_static`` with one node to quantize (MobileNetV2, 2 cores: the module's note)."""
SECONDS_QUANTIZE_PER_NODE = 0.013
"""``quantize_static`` of a whole graph, per candidate node (~1.3 s for MobileNetV2's 99)."""
CALIBRATION_COST = 3.0
"""A calibration pass costs about this many fp32 inferences an image (the augmented graph
outputs every tensor; the histogram methods bin them)."""


@dataclass(frozen=True)
class SearchBudget:
    """The search's estimated duration, stage by stage, from its counts: calibrations, trial
    quantizations, nodes and images, each priced by the fp32 model's measured seconds an image
    and the quantizer's cost (:data:`SECONDS_QUANTIZE_ALONE`, :data:`SECONDS_QUANTIZE_PER_NODE`)."""

    nodes: int
    n_calibration: int
    n_held_out: int
    seconds: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def describe(self) -> str:
        parts = ", ".join(f"{k} ~{v:.0f} s" for k, v in self.seconds.items())
        return (
            f"--target-agreement: about {self.total / 60:.1f} min ({parts}) for "
            f"{len(_methods())} calibrations of {self.n_calibration} images, {self.nodes} nodes "
            f"scored alone on {min(SENSITIVITY_IMAGES, self.n_calibration)} images, and "
            f"~{_bisect_steps(self.nodes)} trials on {self.n_held_out} held-out images "
            "(an estimate, before it starts)"
        )


def _bisect_steps(nodes: int) -> int:
    return math.ceil(math.log2(max(nodes, 1))) + 2


def estimate_seconds(
    nodes: int, n_calibration: int, n_held_out: int, seconds_per_image: float
) -> SearchBudget:
    """What :func:`search` will take on ``nodes`` candidates: 3 calibration passes, 7 trial
    settings, each node alone, then about log2(nodes) + 2 bisection steps."""
    full = SECONDS_QUANTIZE_PER_NODE * nodes
    t = seconds_per_image
    return SearchBudget(
        nodes=nodes,
        n_calibration=n_calibration,
        n_held_out=n_held_out,
        seconds={
            "calibrate": len(_methods()) * n_calibration * t * CALIBRATION_COST,
            "choose_calibration": (2 * len(_methods()) + 1) * (full + n_calibration * t),
            "sensitivity": nodes
            * (SECONDS_QUANTIZE_ALONE + min(SENSITIVITY_IMAGES, n_calibration) * t),
            "search_k": _bisect_steps(nodes) * (full + n_held_out * t),
        },
    )


def logit_error(y32: np.ndarray, y8: np.ndarray) -> float:
    """Mean over samples of ``‖y8 − y32‖² / ‖y32‖²``: how far int8 logits are from fp32's,
    relative to their size (0 is identical). Continuous, so it ranks settings that the same
    top-1 answers would tie."""
    num = ((y8.astype(np.float64) - y32) ** 2).sum(axis=1)
    den = np.maximum((y32.astype(np.float64) ** 2).sum(axis=1), 1e-12)
    return float((num / den).mean())


def top1_agreement(y32: np.ndarray, y8: np.ndarray) -> float:
    """The share of samples whose top-1 class is the same in both."""
    return float((y32.argmax(1) == y8.argmax(1)).mean())


def sensitivity_order(names: Sequence[str], scores: dict[str, float]) -> list[str]:
    """``names`` most sensitive first (highest score); ties keep the graph order."""
    position = {n: i for i, n in enumerate(names)}
    return sorted(names, key=lambda n: (-scores[n], position[n]))


def best_calibration(tried: Sequence[Tried]) -> Tried:
    """The lowest logit error; a tie goes to the one tried first.

    Raises:
        ValueError: nothing was tried.
    """
    if not tried:
        raise ValueError("no calibration setting was tried")
    return min(tried, key=lambda t: t.logit_error)  # min keeps the first of equals


def choose_k(steps: Sequence[tuple[int, float]], target: float) -> int | None:
    """The smallest measured k whose agreement reaches ``target``, or None if none does."""
    reached = [k for k, agreement in steps if agreement >= target]
    return min(reached) if reached else None


def bisect_k(measure: Callable[[int], float], n: int, target: float) -> list[tuple[int, float]]:
    """Measure agreements at chosen k in 0..n (k float nodes) to find the smallest k that
    reaches ``target``, assuming agreement grows with k: k = 0 first, then bisection between
    the largest k known to fall short and the smallest known (or, for n, assumed) to reach it.
    About log2(n) + 2 measurements; each k at most once.

    Returns:
        (k, agreement) in the order measured; :func:`choose_k` reads the answer from them.
    """
    steps: list[tuple[int, float]] = []

    def ok(k: int) -> bool:
        steps.append((k, measure(k)))
        return steps[-1][1] >= target

    if ok(0) or n == 0:
        return steps
    low, high = 0, n  # agreement(low) < target; agreement(n) not yet measured
    while high - low > 1:
        mid = (low + high) // 2
        if ok(mid):
            high = mid
        else:
            low = mid
    if high == n and n not in dict(steps):
        ok(n)  # the answer must be a measured k
    return steps


# --- onnxruntime ------------------------------------------------------------------------------


def _methods() -> list[CalibMethod]:
    return list(get_args(CalibMethod))


def logits(model: Path, x: np.ndarray, threads: int | None) -> np.ndarray:
    """The model's outputs on ``x``, run as the report measures them (``quantize._measure``:
    one image a call, or the graph's fixed batch, padded), so the agreement the search stops
    at is the one the report gives."""
    from zoo.deploy.runtimes.loader import make_session, run_padded, static_batch_of

    session = make_session(model, threads=threads)
    name = session.get_inputs()[0].name
    batch = static_batch_of(session) or 1
    return run_padded(lambda a: session.run(None, {name: a})[0], x, batch)


def search(
    model: Path,
    out: Path,
    *,
    calib_batches: Sequence[np.ndarray],
    input_name: str,
    x_held_out: np.ndarray,
    fp32_model: Path,
    target: float,
    threads: int | None = None,
    workdir: Path,
    reduce_range: bool = False,
) -> SearchResult:
    """Find the calibration and the fewest float nodes for which static int8 agrees with fp32
    on ``target`` of the held-out top-1 answers, and write that model to ``out``.

    Args:
        model: the fp32 graph to quantize, already through onnxruntime's ``quant_pre_process``.
        out: where the chosen int8 graph is written (a temporary path of the caller's).
        calib_batches: the calibration images, preprocessed, one ``(1, C, H, W)`` array each.
        input_name: the graph's input.
        x_held_out: the held-out images, preprocessed ``(N, C, H, W)``, disjoint from the
            calibration images (:func:`~zoo.deploy.quantize.calibration.check_disjoint`).
        fp32_model: the fp32 model the answers are compared with.
        target: the top-1 agreement to reach, in (0, 1].
        threads: onnxruntime intra-op threads.
        workdir: a folder for the calibration caches and candidate graphs.
        reduce_range: 7-bit weights in every setting tried (:func:`~zoo.deploy.quantize.options.default_calibration`: a CPU without VNNI, or a model trained for them).

    Returns:
        The chosen calibration and float nodes, the settings tried and the steps measured.

    Raises:
        QuantizationError: no number of float nodes reaches the target (nothing is written).
    """
    check_target(target)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    x_calib = np.concatenate(list(calib_batches))
    y32_calib = logits(fp32_model, x_calib, threads)
    y32_held = logits(fp32_model, x_held_out, threads)

    # 1. calibration: each method's ranges once, then the weight/activation settings on them
    caches = {}
    for method in _methods():
        caches[method] = workdir / f"ranges-{method}.json"
        calibrate(model, calib_batches, input_name, method, caches[method])
    seconds["calibrate"] = round(time.perf_counter() - t0, 1)
    t1 = time.perf_counter()

    def trial(c: Calibration) -> Tried:
        path = workdir / "trial.onnx"
        quantize_qdq(model, path, caches[c.method], c)
        y8 = logits(path, x_calib, threads)
        return Tried(c, logit_error(y32_calib, y8), top1_agreement(y32_calib, y8))

    rr = reduce_range
    tried = [trial(Calibration(m, pc, reduce_range=rr)) for m in _methods() for pc in (True, False)]
    best = best_calibration(tried).calibration
    tried.append(trial(Calibration(best.method, best.per_channel, symmetric=True, reduce_range=rr)))
    chosen = best_calibration(tried).calibration
    cache = caches[chosen.method]
    seconds["choose_calibration"] = round(time.perf_counter() - t1, 1)
    t2 = time.perf_counter()

    # 2. sensitivity: each node alone in int8, on a few calibration images
    ops = candidates(model)
    step = max(1, len(x_calib) // SENSITIVITY_IMAGES)
    x_few, y32_few = x_calib[::step][:SENSITIVITY_IMAGES], y32_calib[::step][:SENSITIVITY_IMAGES]
    scores = {}
    for node in ops:
        path = workdir / "alone.onnx"
        quantize_qdq(model, path, cache, chosen, only=[node])
        scores[node] = logit_error(y32_few, logits(path, x_few, threads))
    order = sensitivity_order(list(ops), scores)
    seconds["sensitivity"] = round(time.perf_counter() - t2, 1)
    t3 = time.perf_counter()

    # 3. the fewest float nodes that reach the target on the held-out images
    def measure(k: int) -> float:
        path = workdir / f"k{k}.onnx"
        quantize_qdq(model, path, cache, chosen, exclude=order[:k])
        return top1_agreement(y32_held, logits(path, x_held_out, threads))

    steps = bisect_k(measure, len(order), target)
    k = choose_k(steps, target)
    seconds["search_k"] = round(time.perf_counter() - t3, 1)
    if k is None:
        best_k, best_a = max(steps, key=lambda s: (s[1], -s[0]))
        raise QuantizationError(
            f"No number of float nodes reaches top-1 agreement {target:.1%} with fp32 on the "
            f"{len(x_held_out)} held-out images (best {best_a:.1%}, with {best_k} of "
            f"{len(order)} nodes float). Nothing was written; lower --target-agreement or "
            "keep the fp32 model."
        )
    (workdir / f"k{k}.onnx").replace(out)
    return SearchResult(
        target=target,
        calibration=chosen,
        tried=tried,
        n_calibration=len(x_calib),
        order=order,
        scores=scores,
        ops=ops,
        k=k,
        steps=steps,
        n_held_out=len(x_held_out),
        seconds=seconds,
    )
