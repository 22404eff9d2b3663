"""What the measurements say: how much of the model runs in int8 (:func:`coverage`), whether
int8 keeps enough accuracy (:func:`check_floor`, :func:`accuracy_gate`), and whether it pays
(:func:`does_not_pay`, :func:`advice_before`, :func:`advice_after`). Pure functions of counts,
arrays and numbers, but for :func:`op_counts` and :func:`coverage`, which read a graph."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo.deploy.quantize.images import EvalImages
from zoo.errors import QuantizationError

HEAVY_OPS = ("Conv", "Gemm", "MatMul")


def op_counts(path: Path) -> Counter[str]:
    """Op types of the model's nodes, the kNN score's left out (they stay float by design)."""
    import onnx

    from zoo.knn import NODE_PREFIX

    graph = onnx.load(str(path), load_external_data=False).graph
    return Counter(n.op_type for n in graph.node if not n.name.startswith(NODE_PREFIX))


def conv_heavy(counts: Counter[str]) -> bool:
    return counts["Conv"] > counts["Gemm"] + counts["MatMul"]


FLOOR_ACCURACY_DROP = 0.01
"""The floor: int8 may lose at most 1 point of top-1 accuracy on labelled images."""
FLOOR_AGREEMENT = 0.98
"""The floor without labels: the top of the agreement's 95 % interval must reach 98 %."""
MIN_INT8_SHARE = 0.5
"""Below this share of Conv/Gemm/MatMul nodes in int8, int8 does not pay."""


@dataclass(frozen=True)
class Coverage:
    """How many of the fp32 model's Conv/Gemm/MatMul nodes run in int8."""

    heavy_ops: int
    quantized: int

    @property
    def fp32_left(self) -> int:
        return self.heavy_ops - self.quantized

    def to_dict(self) -> dict[str, int]:
        return {
            "heavy_ops": self.heavy_ops,
            "quantized": self.quantized,
            "fp32_left": self.fp32_left,
        }


def coverage(fp32: Counter[str], q_path: Path, mode: str) -> Coverage:
    """How many of the fp32 model's Conv/Gemm/MatMul nodes run in int8 afterwards: integer ops
    (dynamic), or heavy ops whose two operands (activation and weight) both come from a
    DequantizeLinear, which ORT fuses into QLinear ops (QDQ). A node kept float
    (``nodes_to_exclude``) keeps its float weight and counts as fp32 even when its input was
    dequantized for it."""
    import onnx

    graph = onnx.load(str(q_path), load_external_data=False).graph
    producer = {out: n.op_type for n in graph.node for out in n.output}
    total = sum(fp32[o] for o in HEAVY_OPS)
    if mode == "dynamic":
        quantized = sum(1 for n in graph.node if n.op_type in ("ConvInteger", "MatMulInteger"))
    else:
        quantized = sum(
            1
            for n in graph.node
            if n.op_type in HEAVY_OPS
            and all(producer.get(i) == "DequantizeLinear" for i in n.input[:2])
        )
    return Coverage(heavy_ops=total, quantized=quantized)


def does_not_pay(cov: Coverage, latency_ratio: float) -> str | None:
    """Why int8 does not pay for this model (few nodes left in int8, or no faster than fp32)
    and what does; None when it pays."""
    reasons = []
    if cov.heavy_ops and cov.quantized / cov.heavy_ops < MIN_INT8_SHARE:
        reasons.append(
            f"only {cov.quantized} of {cov.heavy_ops} Conv/Gemm/MatMul nodes run in int8"
        )
    if latency_ratio >= 1.0:
        reasons.append(f"it runs at {latency_ratio:.2f}× the fp32 latency (not faster)")
    if not reasons:
        return None
    return (
        f"int8 does not pay for this model: {' and '.join(reasons)}. Keep the fp32 model, or "
        "try fp16 (zoo export ... --precision fp16) or OpenVINO (zoo export ... --format "
        "openvino, or zoo serve MODEL.onnx --runtime openvino)."
    )


@dataclass(frozen=True)
class Floor:
    """The accuracy floor every quantization is held to on the model's own images."""

    applies: bool
    passed: bool
    reason: str
    allowed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "applies": self.applies,
            "passed": self.passed,
            "reason": self.reason,
            "allowed": self.allowed,
        }


def check_floor(
    accuracy_drop: float | None, agreement_ci95: list[float], images: EvalImages
) -> Floor:
    """More than :data:`FLOOR_ACCURACY_DROP` of accuracy lost (with labels), or an agreement
    whose 95 % interval ends under :data:`FLOOR_AGREEMENT` (without): below the floor. Not
    applied to the bundled photos, on which nothing can be judged."""
    if images.proves_nothing:
        return Floor(
            False,
            True,
            f"agreement on {len(images.paths)} built-in images proves nothing: pass --data DIR "
            "with images like the model's",
        )
    if accuracy_drop is not None:
        ok = accuracy_drop <= FLOOR_ACCURACY_DROP
        return Floor(
            True,
            ok,
            f"int8 loses {100 * accuracy_drop:.1f} points of accuracy "
            f"({'within' if ok else 'over'} the {100 * FLOOR_ACCURACY_DROP:g}-point floor)",
        )
    ok = agreement_ci95[1] >= FLOOR_AGREEMENT
    return Floor(
        True,
        ok,
        f"top-1 agreement's 95% interval ends at {agreement_ci95[1]:.1%} "
        f"({'reaches' if ok else 'under'} the {FLOOR_AGREEMENT:.0%} floor)",
    )


def wilson(p: float, n: int, z: float = 1.96) -> list[float]:
    """95% Wilson score interval of a proportion ``p`` measured on ``n`` images: what an
    agreement on a few images can and cannot claim."""
    if n == 0:
        return [0.0, 1.0]
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def accuracy_report(y32: np.ndarray, y8: np.ndarray, labels: np.ndarray | None) -> dict[str, Any]:
    """Top-1 agreement of the int8 model with fp32 (and its 95% Wilson interval) and, where
    labels are known, both top-1 accuracies and the drop (fp32 − int8, rounded to 4 places)."""
    top32, top8 = y32.argmax(1), y8.argmax(1)
    agreement = float((top32 == top8).mean())
    out: dict[str, Any] = {
        "top1_agreement": agreement,
        "agreement_ci95": wilson(agreement, len(top32)),
    }
    if labels is not None:
        acc32, acc8 = float((top32 == labels).mean()), float((top8 == labels).mean())
        out["accuracy"] = {"fp32": acc32, "int8": acc8}
        out["accuracy_drop"] = round(acc32 - acc8, 4)
    return out


def accuracy_gate(
    agreement: float, accuracy_drop: float | None, max_accuracy_drop: float
) -> dict[str, Any]:
    """``--max-accuracy-drop``: the measured drop in accuracy (or, without labels, the share
    of images whose top-1 changed) must not exceed the limit.

    Raises:
        QuantizationError: the drop exceeds the limit (the caller then writes nothing).
    """
    measured = accuracy_drop if accuracy_drop is not None else 1.0 - agreement
    if measured > max_accuracy_drop:
        raise QuantizationError(
            f"Accuracy drop {measured:.2%} exceeds --max-accuracy-drop {max_accuracy_drop:.2%} "
            f"(top-1 agreement with fp32 {agreement:.1%}). Nothing was written; "
            "try --engine nncf, or --target-agreement 0.98."
        )
    return {"max_accuracy_drop": max_accuracy_drop, "measured": measured, "passed": True}


def advice_before(name: str, counts: Counter[str], mode: str) -> list[str]:
    """What to expect, said before quantizing: dynamic mode on a conv-heavy model."""
    if mode != "dynamic" or not conv_heavy(counts):
        return []
    return [
        f"{name} is conv-heavy ({counts['Conv']} Conv vs {counts['Gemm'] + counts['MatMul']} "
        "Gemm/MatMul): onnxruntime dynamic quantization runs convs as ConvInteger, which is often "
        "several times slower than fp32 on CPU. Static QDQ (--mode static --calib DIR) is usually faster."
    ]


def advice_after(counts: Counter[str], mode: str, latency_ratio: float) -> str | None:
    """The measured verdict: dynamic int8 on a conv-heavy model that came out slower."""
    if mode == "dynamic" and conv_heavy(counts) and latency_ratio > 1.0:
        return (
            f"measured: dynamic int8 is {latency_ratio:.2f}× the fp32 latency "
            "(slower). Recommend --mode static with --calib DIR."
        )
    return None
