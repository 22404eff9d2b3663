"""The metadata zoo embeds in an exported graph: everything ``zoo predict`` and ``zoo serve``
need to run it (classes, preprocessing, input layout, calibration) and the evidence it was shipped on
(the gate's summary, versions, the source weights and epoch)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from zoo.deploy.export.parity_report import ParityReport
from zoo.metadata import ModelInfo
from zoo.ref import ModelRef

if TYPE_CHECKING:
    from zoo.deploy.export.result import ExportResult


def export_metadata(
    info: ModelInfo, ref: ModelRef, result: ExportResult, weights_sha: str | None
) -> dict[str, Any]:
    """The metadata embedded in an exported graph: everything ``zoo predict`` and ``zoo serve``
    need (classes, preprocessing) and the evidence (parity, versions, source weights)."""
    import onnx

    return {
        # the name to build it again by: the entry, the Hub reference, or the model folder
        "registry_id": (
            str(ref.model_folder)
            if ref.kind in ("run", "model-folder")
            else str(ref)
            if ref.kind == "hf"
            else info.name
        ),
        "arch": info.arch,
        "tag": info.tag,
        "parent": info.parent,
        "class_names": list(info.label_names or []),
        "num_classes": info.num_classes,
        "multi_label": info.multi_label,
        "thresholds": list(info.thresholds) if info.thresholds else None,
        # temperature and rejection rule, applied by the runtime (zoo.onnx_meta.read_calibration)
        "calibration": info.calibration.to_dict() if info.calibration else None,
        "preprocessing": info.preprocessing().to_dict(),
        "opset": result.opset,
        "exporter": result.exporter,
        "slim": result.slim,
        "precision": result.precision,
        # a graph that resizes, crops and normalises itself takes uint8 (N, H, W, C) pixels
        "input": (
            {"dtype": "uint8", "layout": "NHWC", "preprocessing": "in-graph"}
            if result.embedded_preprocessing
            else {
                "dtype": "float16" if result.fp16_io else "float32",
                "layout": "NCHW",
                "preprocessing": "client",
            }
        ),
        "dynamic_batch": result.dynamic_batch,
        "static_batch": result.static_batch,
        "dynamic_size": result.dynamic_size,
        "torch_version": torch.__version__,
        "onnx_version": onnx.__version__,
        "source_weights_sha256": weights_sha,
        "source_epoch": _shipped_epoch(ref),
        "quantization_aware": _quantization_aware(ref),
        "qat_weight_bits": _qat_weight_bits(ref),
        "parity": parity_summary(result.parity),
    }


def _shipped_epoch(ref: ModelRef) -> int | None:
    """The training epoch whose weights a run or model folder holds (None: not recorded)."""
    if ref.kind not in ("run", "model-folder"):
        return None
    from zoo.artifact import read_config

    return read_config(ref.model_folder).shipped_epoch


def _quantization_aware(ref: ModelRef) -> bool | None:
    """Whether a run or model folder's weights were trained through int8 rounding
    (:func:`zoo.artifact.quantization_aware`; None: not said, e.g. a registry model), so ``zoo
    quantize`` of the export knows it wherever the file goes: the engine it trained for, its
    weight bits where the CPU allows (:func:`zoo.deploy.quantize.options.trained_weight_bits`)."""
    if ref.kind not in ("run", "model-folder"):
        return None
    from zoo.artifact import quantization_aware

    return quantization_aware(ref.model_folder)


def _qat_weight_bits(ref: ModelRef) -> int | None:
    """The int8 weights' bits a quantization-aware run or model folder trained for
    (:func:`zoo.artifact.qat_weight_bits`), which ``zoo quantize`` then uses."""
    if ref.kind not in ("run", "model-folder"):
        return None
    from zoo.artifact import qat_weight_bits

    return qat_weight_bits(ref.model_folder)


def parity_summary(report: ParityReport | None) -> dict[str, Any]:
    """What an exported file says of its gate: the verdict, the headline numbers, the shapes
    and the real images it was judged on."""
    if report is None:
        return {"passed": None}
    t, p = report.tensors, report.predictions
    return {
        "passed": report.passed,
        "max_abs": t.max_abs if t else None,
        "cosine": t.cosine if t else None,
        "top1_agreement": p.agreement if p else None,
        "dynamic_checked": [[d.batch, d.size] for d in report.dynamic],
        "images": report.describe_images(),
    }


__all__ = ["export_metadata", "parity_summary"]
