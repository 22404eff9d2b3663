"""What ``zoo quantize`` reports: :class:`QuantizeReport`, its ``--json`` shape
(:meth:`QuantizeReport.to_dict`) and its summary (:meth:`QuantizeReport.lines`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.deploy.choices import QuantEngine, QuantMode
from zoo.deploy.quantize.calibration import Calibration
from zoo.deploy.quantize.images import EvalImages
from zoo.deploy.quantize.nncf_engine import BitsChoice
from zoo.deploy.quantize.search import SearchResult
from zoo.deploy.quantize.verdict import Coverage, Floor, wilson


@dataclass(frozen=True)
class Latency:
    """Median (p50) latency of one call of ``batch`` images, fp32 then int8, both measured by
    :func:`zoo.deploy.bench.harness.time_session` in one process.

    Attributes:
        fp32_p50: the fp32 model's median, in ms.
        int8_p50: the int8 model's median, in ms.
        batch: images per call.
        threads: ONNX Runtime's intra-op threads for both.
    """

    fp32_p50: float
    int8_p50: float
    batch: int
    threads: int

    @property
    def ratio(self) -> float:
        """int8 over fp32, to 3 decimals (under 1: int8 is faster)."""
        return round(self.int8_p50 / self.fp32_p50, 3)


@dataclass(frozen=True)
class QuantizeReport:
    """What :func:`zoo.deploy.quantize.int8.quantize` did and measured; :meth:`to_dict` is
    ``zoo quantize --json``'s shape and :meth:`lines` the summary it prints.

    Attributes:
        path: where the int8 model is (or, when ``written`` is False, would have been) written.
        written: False when it fell below the floor without ``allow_drop``.
        mode: ``dynamic`` or ``static``.
        engine: ``ort`` or ``nncf`` (``auto`` already decided).
        calibration: onnxruntime's static setting (None: dynamic mode or NNCF).
        weight_bits: static: the int8 weights' bits, 8 or 7 (onnxruntime's ``reduce_range``;
            NNCF's overflow fix: :func:`~zoo.deploy.quantize.nncf_engine.overflow_fix`); None:
            dynamic mode.
        size_mb: the fp32 and int8 file sizes, in MiB (:func:`zoo.system.mib`).
        latency: both models' median latency.
        top1_agreement: the share of images whose top-1 class int8 and fp32 agree on.
        agreement_ci95: its 95% Wilson interval, ``[low, high]``.
        accuracy: top-1 accuracy of fp32 and int8 where the images have labels, else None.
        images: the images it was judged on and their source.
        calib_description: the calibration images, in words (None: dynamic mode).
        coverage: how many Conv/Gemm/MatMul nodes run in int8.
        floor: the accuracy floor's verdict.
        not_paying: why int8 does not pay here (few int8 nodes, or no faster), else None.
        advice_before: what was said before quantizing (the mode on this CPU).
        advice_after: what to try instead, when the result disappoints.
        gate: the ``max_accuracy_drop`` gate's verdict, when one was asked for.
        search: the ``target_agreement`` search's outcome, when one ran.
        bits_choice: NNCF's weight bits and, where it made both, what chose them.
    """

    path: Path
    written: bool
    mode: QuantMode
    engine: QuantEngine
    calibration: Calibration | None
    weight_bits: int | None
    size_mb: tuple[float, float]
    latency: Latency
    top1_agreement: float
    agreement_ci95: list[float]
    accuracy: tuple[float, float] | None
    images: EvalImages
    calib_description: str | None
    coverage: Coverage
    floor: Floor
    not_paying: str | None = None
    advice_before: list[str] = field(default_factory=list)
    advice_after: str | None = None
    gate: dict[str, Any] | None = None
    search: SearchResult | None = None
    bits_choice: BitsChoice | None = None

    @property
    def accuracy_drop(self) -> float | None:
        """fp32 minus int8 top-1 accuracy (None without labels)."""
        return None if self.accuracy is None else round(self.accuracy[0] - self.accuracy[1], 4)

    @property
    def failed(self) -> bool:
        """Below the floor and not allowed: nothing was written; the command exits 1."""
        return not self.floor.passed and not self.floor.allowed

    def to_dict(self) -> dict[str, Any]:
        """``zoo quantize --json``'s shape (sections absent when they do not apply)."""
        c = self.calibration
        out: dict[str, Any] = {
            "path": str(self.path),
            "written": self.written,
            "mode": self.mode,
            "engine": self.engine,
            "method": None if c is None else c.method,
            "per_channel": True if c is None else c.per_channel,
            "calibration": None if c is None else c.to_dict(),
            "calibration_images": self.calib_description,
            "weight_bits": self.weight_bits,
            "weight_bits_agreement": None if self.bits_choice is None else self.bits_choice.tried(),
            "size_mb": {"fp32": self.size_mb[0], "int8": self.size_mb[1]},
            "size_ratio": round(self.size_mb[1] / self.size_mb[0], 3),
            "latency_ms": {
                "fp32_p50": self.latency.fp32_p50,
                "int8_p50": self.latency.int8_p50,
                "batch": self.latency.batch,
                "threads": self.latency.threads,
            },
            "latency_ratio": self.latency.ratio,
            "top1_agreement": self.top1_agreement,
            "agreement_ci95": self.agreement_ci95,
            "n_images": len(self.images.paths),
            "images": self.images.description,
            "image_source": self.images.source,
            "coverage": self.coverage.to_dict(),
            "floor": self.floor.to_dict(),
            "int8_pays": self.not_paying is None,
            "advice_before": self.advice_before,
        }
        if self.accuracy is not None:
            out["accuracy"] = {"fp32": self.accuracy[0], "int8": self.accuracy[1]}
            out["accuracy_drop"] = self.accuracy_drop
        if self.not_paying:
            out["not_paying"] = self.not_paying
        if self.advice_after:
            out["advice_after"] = self.advice_after
        if self.gate is not None:
            out["gate"] = self.gate
        if self.search is not None:
            s = self.search
            out["search"] = s.to_dict(wilson(s.agreement, s.n_held_out))
        return out

    def lines(self) -> list[str]:
        """The summary, a line each."""
        lat, (f32, i8) = self.latency, self.size_mb
        low, high = self.agreement_ci95
        lines = [
            f"wrote {self.path}"
            if self.written
            else f"nothing written (below the floor; --allow-drop writes {self.path})",
            f"size {f32} → {i8} MiB (×{round(i8 / f32, 3)})",
            f"latency p50 {lat.fp32_p50:.2f} → {lat.int8_p50:.2f} ms (×{lat.ratio}, "
            f"batch {lat.batch}, {lat.threads} threads)",
            f"judged on {self.images.description}",
            f"top-1 agreement with fp32: {self.top1_agreement:.1%} on {len(self.images.paths)} "
            f"images (95% interval {low:.1%}–{high:.1%})",
        ]
        if self.accuracy is not None:
            lines.append(f"accuracy {self.accuracy[0]:.4f} → {self.accuracy[1]:.4f}")
        cov = self.coverage
        lines.append(f"coverage: {cov.quantized}/{cov.heavy_ops} Conv/Gemm/MatMul nodes in int8")
        if self.calibration is not None and self.search is None:
            lines.append(f"calibration: {self.calibration.describe()} on {self.calib_description}")
        elif self.engine == "nncf":
            lines.append(
                f"calibration: NNCF's post-training quantization on {self.calib_description}"
            )
            if self.bits_choice is not None:
                lines.append(self.bits_choice.describe())
        if self.search is not None:
            lines += _search_lines(self.search)
        verdict = "ok" if self.floor.passed else ("ALLOWED" if self.floor.allowed else "FAILED")
        lines.append(f"floor: {verdict}: {self.floor.reason}")
        if self.not_paying:
            lines.append(self.not_paying)
        return lines


def _search_lines(s: SearchResult) -> list[str]:
    ops = ", ".join(
        f"{n} {op}" for op, n in sorted(Counter(s.ops[x] for x in s.float_nodes).items())
    )
    cal = s.calibration
    low, high = wilson(s.agreement, s.n_held_out)
    return [
        f"float: {s.k} of {len(s.order)} quantizable nodes kept float ({ops or 'none'}) for "
        f"target agreement {s.target:.1%}",
        f"calibration: {cal.method} ranges, per-channel weights "
        f"{'on' if cal.per_channel else 'off'}"
        f"{', symmetric activations' if cal.symmetric else ''} (the best of {len(s.tried)} "
        f"settings tried on {s.n_calibration} calibration images)",
        f"held-out agreement: {s.agreement:.1%} on {s.n_held_out} images (95% interval "
        f"{low:.1%}–{high:.1%}; the float count was chosen on them)",
    ]
