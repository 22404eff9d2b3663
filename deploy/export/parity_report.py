"""What the export gate judges by and what it found: the tolerances of each precision, one
tensor comparison (:func:`compare`), the prediction and dynamic-shape checks, and the
:class:`ParityReport` that holds them (rendered by :class:`zoo.deploy.export.result.ExportResult`
and summarised in an exported file's metadata)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from zoo.deploy.export.gate_images import ImageSource
from zoo.errors import first_line

ATOL, RTOL, MIN_COSINE, MIN_AGREEMENT = 1e-4, 1e-3, 0.99999, 1.0

RunFn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Tolerances:
    """What the gate accepts: ``|out - ref| <= atol + range_atol·max|ref| + rtol·|ref|``
    element-wise, cosine ``>= min_cosine``, top-1 agreement on real images
    ``>= min_agreement``."""

    atol: float = ATOL
    rtol: float = RTOL
    min_cosine: float = MIN_COSINE
    min_agreement: float = MIN_AGREEMENT
    range_atol: float = 0.0  # a share of the output's largest magnitude


FP32 = Tolerances()
# fp16 weights and compute (inputs/outputs fp32): each rounding keeps an 11-bit mantissa, so
# the error grows with the activations' magnitude, not with each logit's own value: it is
# bounded against the output's range. (ONNX Runtime's CPU kernels upcast many fp16 ops to
# fp32: on CPU this sees the weights' rounding, not an fp16 overflow of the activations.) Measured on the real ImageNet MobileNetV2 (README,
# "fp16"): max abs 0.058 on logits up to 20.8 (0.28 % of the range), cosine 0.999991. The
# bound (2 % of the range) leaves 7x room; a classifier weight off by 5 % still fails it.
FP16 = Tolerances(range_atol=0.02, min_cosine=0.9999)
# OpenVINO bf16 and int8 (zoo export --format openvino): an 8-bit mantissa, or 8-bit values,
# move logits by more than a per-element bound that still catches a wrong graph, so these pass
# through the prediction check: top-1 must agree with PyTorch on 98 % of the gate's real images
# (``--min-agreement`` to change it; the report gives the count). The tensor bounds only catch
# a graph that is wrong, not rounded: measured on the real ImageNet MobileNetV2, NNCF int8 on
# 64 photo crops and seeded noise: cosine 0.978-0.992, max abs 1.7 on logits up to ~15; a
# wrong normalisation mean fails them. bf16 (not runnable on this CPU): max abs 0.25 on
# MobileNetV2 logits, measured on an AVX512-BF16 machine (issue #15).
BF16 = Tolerances(range_atol=0.1, min_cosine=0.99, min_agreement=0.98)
INT8 = Tolerances(range_atol=0.5, min_cosine=0.9, min_agreement=0.98)
TOLERANCES = {"fp32": FP32, "fp16": FP16, "bf16": BF16, "int8": INT8}  # per choices.PRECISIONS


@dataclass(frozen=True)
class TensorDiff:
    """One comparison of two tensors (:func:`compare`).

    Attributes:
        shape: the compared tensors' shape.
        max_abs: the largest absolute difference.
        max_rel: the largest difference relative to its reference element (|ref| ≥ 1e-6).
        cosine: the cosine similarity of the flattened tensors.
        passed: within the :class:`Tolerances` it was judged by.
    """

    shape: list[int]
    max_abs: float
    max_rel: float
    cosine: float
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(
    ref: np.ndarray,
    out: np.ndarray,
    atol: float = ATOL,
    rtol: float = RTOL,
    min_cosine: float = MIN_COSINE,
    range_atol: float = 0.0,
) -> TensorDiff:
    """Element-wise ``|out - ref| <= atol + range_atol·max|ref| + rtol·|ref|`` everywhere and
    cosine ≥ ``min_cosine``; a shape mismatch fails with infinite differences."""
    ref64, out64 = ref.astype(np.float64).ravel(), out.astype(np.float64).ravel()
    if ref.shape != out.shape:
        return TensorDiff(list(out.shape), float("inf"), float("inf"), 0.0, False)
    diff = np.abs(ref64 - out64)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(ref64), 1e-6)).max()) if diff.size else 0.0
    denom = np.linalg.norm(ref64) * np.linalg.norm(out64)
    cosine = float(ref64 @ out64 / denom) if denom else 1.0
    bound = atol + range_atol * (float(np.abs(ref64).max()) if diff.size else 0.0)
    ok = bool(np.all(diff <= bound + rtol * np.abs(ref64))) and cosine >= min_cosine
    return TensorDiff(list(ref.shape), max_abs, max_rel, cosine, ok)


@dataclass(frozen=True)
class PredictionCheck:
    """Top-1 agreement of the two sides on the gate's real images."""

    n_images: int
    agreement: float
    passed: bool
    preprocessing_max_abs: float | None = None  # each side's own preprocessing, compared

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class DynamicCheck:
    """One shape the exported side must take: a batch size and a resolution (``224`` for a
    square one, else ``"261x459"``: width x height, as PIL and zoo's messages give sizes), with
    the embedded-preprocessing gate's ``case``. A shape it rejected carries the runtime's
    ``error`` and infinite differences."""

    batch: int
    size: int | str
    diff: TensorDiff
    case: str | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.diff.passed

    @property
    def where(self) -> str:
        """The shape in words: ``batch 3, 192 px`` or ``batch 1, 85x107 (odd portrait)``."""
        size = f"{self.size} px" if isinstance(self.size, int) else self.size
        return f"batch {self.batch}, {size}" + (f" ({self.case})" if self.case else "")

    @classmethod
    def rejected(
        cls, batch: int, size: int | str, exc: Exception, case: str | None = None
    ) -> DynamicCheck:
        inf = float("inf")
        diff = TensorDiff([], inf, inf, 0.0, False)
        return cls(batch, size, diff, case=case, error=first_line(exc))

    def to_dict(self) -> dict[str, Any]:
        extra = {k: v for k, v in (("case", self.case), ("error", self.error)) if v is not None}
        return {"batch": self.batch, "size": self.size, **extra, **self.diff.to_dict()}


@dataclass(frozen=True)
class KnnCheck:
    """The graph's kNN score output against PyTorch's features scored by the same bank, on the
    gate's real images (:func:`zoo.deploy.export.knn.check_knn`)."""

    images: int
    max_abs: float
    bound: float

    @property
    def passed(self) -> bool:
        return self.max_abs <= self.bound

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    def line(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        return (
            f"parity knn_score: max abs {self.max_abs:.2e} on {self.images} real images "
            f"(bound {self.bound:.0e}) → {verdict}"
        )


@dataclass(frozen=True)
class ParityReport:
    """The gate's verdict at every level it checked; ``passed`` only when all passed.

    Attributes:
        tolerances: the bounds it judged by.
        tensors: the tensor comparison (None: not checked, which is not a pass).
        predictions: top-1 agreement on real images (None: not checked).
        dynamic: each other shape checked.
        images: which real images the tensor and prediction levels used.
        knn: the kNN score output (None: the model has no ``knn`` rule).
    """

    tolerances: Tolerances = FP32
    tensors: TensorDiff | None = None
    predictions: PredictionCheck | None = None
    dynamic: tuple[DynamicCheck, ...] = ()
    images: tuple[ImageSource, ...] = ()
    knn: KnnCheck | None = None

    @property
    def passed(self) -> bool:
        """Every level checked passed, and the tensors were compared."""
        return (
            self.tensors is not None
            and self.tensors.passed
            and (self.predictions is None or self.predictions.passed)
            and all(d.passed for d in self.dynamic)
            and (self.knn is None or self.knn.passed)
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``tensors`` and ``predictions`` are ``{}`` when not checked."""
        return {
            "tolerances": asdict(self.tolerances),
            "tensors": self.tensors.to_dict() if self.tensors else {},
            "predictions": self.predictions.to_dict() if self.predictions else {},
            "dynamic": [d.to_dict() for d in self.dynamic],
            "images": [i.to_dict() for i in self.images],
            "knn": self.knn.to_dict() if self.knn else None,
            "passed": self.passed,
        }

    def failures(self) -> list[str]:
        """What failed, a sentence each (empty when :attr:`passed`)."""
        out = []
        t, p = self.tensors, self.predictions
        if t is None:
            out.append("tensors were not compared")
        elif not t.passed:
            out.append(
                f"tensors differ: max abs {t.max_abs:.3g}, max rel {t.max_rel:.3g}, "
                f"cosine {t.cosine:.6f}"
            )
        if p is not None and not p.passed:
            out.append(
                f"top-1 agreement {p.agreement:.1%} on {p.n_images} real images "
                f"(needs {self.tolerances.min_agreement:.1%}"
                + (f"; images: {self.describe_images()})" if self.images else ")")
            )
        out += [
            f"dynamic check failed at {d.where}: "
            + (f"the graph rejected it ({d.error})" if d.error else f"max abs {d.diff.max_abs:.3g}")
            for d in self.dynamic
            if not d.passed
        ]
        if self.knn is not None and not self.knn.passed:
            out.append(self.knn.line())
        return out

    def describe_images(self) -> str:
        """The real images the gate used, in words."""
        return "; ".join(i.description for i in self.images)


def prediction_check(
    ref_top1: np.ndarray,
    ort_top1: np.ndarray,
    min_agreement: float = MIN_AGREEMENT,
    preprocessing_max_abs: float | None = None,
) -> PredictionCheck:
    """Top-1 agreement of the two sides on the same images; passes only at ``min_agreement``."""
    agreement = float((ref_top1 == ort_top1).mean())
    return PredictionCheck(
        len(ref_top1), agreement, agreement >= min_agreement, preprocessing_max_abs
    )
