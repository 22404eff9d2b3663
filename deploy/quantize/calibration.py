"""Static int8's calibration, as onnxruntime does it: one :class:`Calibration` setting, the
activation ranges of a method computed once into onnxruntime's calibration cache
(:func:`calibrate`), the QDQ quantization that reads them (:func:`quantize_qdq`), and the check
that held-out images are not calibration images (:func:`check_disjoint`). Used by plain
``zoo quantize --mode static`` and by the search of :mod:`zoo.deploy.quantize.search`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo import durable
from zoo.deploy.choices import CalibMethod
from zoo.errors import InputError

ENTROPY_BINS = 512
"""Histogram bins of the entropy calibrator: thresholds from a quarter of each tensor's range
up (onnxruntime's default, 128 bins against 128 quantized bins, tries only the full range)."""
CALIBRATION_CHUNK = 16
"""Calibration images per ``collect_data`` call (:func:`calibrate`)."""
CALIBRATOR_OPTIONS: dict[str, dict[str, Any]] = {
    "minmax": {},
    "entropy": {"num_bins": ENTROPY_BINS},
    "percentile": {},  # onnxruntime's defaults: 2048 bins, the 99.999th percentile
}


@dataclass(frozen=True)
class Calibration:
    """One static quantization setting: how activation ranges are calibrated (``method``),
    per-channel weight scales, symmetric activation ranges (zero point at mid-range), signed
    int8 activations (onnxruntime's S8S8 QDQ; unsigned uint8 otherwise) and ``reduce_range``
    (7-bit weights, so that uint8 × int8 sums cannot saturate on CPUs without VNNI)."""

    method: CalibMethod
    per_channel: bool
    symmetric: bool = False
    int8_activations: bool = False
    reduce_range: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "per_channel": self.per_channel,
            "symmetric_activations": self.symmetric,
            "activations": "int8" if self.int8_activations else "uint8",
            "reduce_range": self.reduce_range,
        }

    def describe(self) -> str:
        """For the summary, e.g. ``entropy ranges, S8S8 symmetric, per-channel weights``."""
        acts = "S8S8" if self.int8_activations else "U8S8"
        return (
            f"{self.method} ranges, {acts}{' symmetric' if self.symmetric else ''}, "
            f"{'per-channel' if self.per_channel else 'per-tensor'} weights"
            f"{', reduce_range (7-bit weights)' if self.reduce_range else ''}"
        )


class CalibReader:
    """onnxruntime's calibration data reader over a list of batches (one pass)."""

    def __init__(self, batches: Sequence[np.ndarray], input_name: str) -> None:
        self._it = iter([{input_name: b} for b in batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes: the same image under another name (a copy, a hard link)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shared_files(
    calib: Sequence[tuple[str, str]], held_out: Sequence[tuple[str, str]]
) -> list[tuple[str, str]]:
    """(calibration file, held-out file) pairs with the same content, from (name, digest)
    pairs; in the held-out order."""
    by_digest: dict[str, str] = {}
    for name, digest in calib:
        by_digest.setdefault(digest, name)
    return [(by_digest[d], name) for name, d in held_out if d in by_digest]


def check_disjoint(
    calib: Sequence[Path], held_out: Sequence[Path], *, from_run: bool = False
) -> None:
    """Refuse held-out images (``--data``) that are also calibration images (same bytes,
    whatever the name): the agreement would be measured on what int8 was fitted to.
    ``from_run``: zoo chose the calibration images (the run's training split, no ``--calib``),
    so the message must not blame a ``--calib`` the user did not give.

    Raises:
        InputError: naming up to three of the shared files and how many there are.
    """
    shared = shared_files(
        [(str(p), file_digest(p)) for p in calib], [(str(p), file_digest(p)) for p in held_out]
    )
    if shared:
        shown = "; ".join(c if c == h else f"{c} = {h}" for c, h in shared[:3])
        raise InputError(
            f"{len(shared)} --data image(s) are also "
            + (
                "images of the run's training split, which zoo calibrates on without --calib "
                f"({shown}): an agreement must be measured on held-out images. Give --data "
                "images the run was not trained on (different source photos, not just "
                "different files), or --calib a folder disjoint from --data."
                if from_run
                else f"--calib images ({shown}): an agreement must be measured on held-out "
                "images. Give --data and --calib disjoint folders (different source photos, "
                "not just different files)."
            )
        )


def _ort_methods() -> dict[str, Any]:
    from onnxruntime.quantization import CalibrationMethod

    return {m.name.lower(): m for m in CalibrationMethod}  # MinMax -> minmax


def op_types_to_quantize() -> list[str]:
    """What ``quantize_static`` quantizes by default (and calibrates)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


def candidates(model: Path) -> dict[str, str]:
    """Node name → op type of every named node of a type onnxruntime quantizes, in graph order:
    the nodes the search can keep float (all of them float is the fp32 model). The kNN score's
    nodes (:func:`zoo.knn.add_to_graph`) are never among them: they always stay float."""
    import onnx

    from zoo.knn import NODE_PREFIX

    types = set(op_types_to_quantize())
    graph = onnx.load(str(model), load_external_data=False).graph
    return {
        n.name: n.op_type
        for n in graph.node
        if n.op_type in types and n.name and not n.name.startswith(NODE_PREFIX)
    }


def knn_nodes(model: Path) -> list[str]:
    """The kNN score's nodes in ``model`` (kept float: int8 similarities to the bank would move
    the score the rejection threshold was fitted on)."""
    import onnx

    from zoo.knn import NODE_PREFIX

    graph = onnx.load(str(model), load_external_data=False).graph
    return [n.name for n in graph.node if n.name.startswith(NODE_PREFIX)]


def calibrate(
    model: Path, batches: Sequence[np.ndarray], input_name: str, method: str, cache: Path
) -> None:
    """Activation ranges of ``model`` on ``batches`` by ``method``, saved as onnxruntime's
    calibration cache at ``cache`` (what ``quantize_static(calibration_cache_path=...)`` reads).

    The batches go in :data:`CALIBRATION_CHUNK` at a time, the calibrator merging its ranges
    and histograms: in one pass it holds every tensor of every image (6 GB for MobileNetV2 on
    80 images), in chunks 2 GB, in half the time. minmax ranges are the same; percentile's
    within 0.2 %; entropy's differ (its thresholds depend on the histogram's bins), with no
    larger error on MobileNetV2's calibration crops."""
    from onnxruntime.quantization import create_calibrator, save_tensors_data

    with (
        durable.scratch_dir(cache) as tmp,
        contextlib.redirect_stdout(io.StringIO()),  # the histogram calibrators' progress
    ):
        calibrator = create_calibrator(
            model,
            op_types_to_quantize(),
            augmented_model_path=str(Path(tmp) / "augmented.onnx"),
            calibrate_method=_ort_methods()[method],
            extra_options=CALIBRATOR_OPTIONS[method],
        )
        for i in range(0, len(batches), CALIBRATION_CHUNK):
            calibrator.collect_data(CalibReader(batches[i : i + CALIBRATION_CHUNK], input_name))
        save_tensors_data(calibrator.compute_data(), cache)


def quantize_qdq(
    model: Path,
    out: Path,
    cache: Path,
    calibration: Calibration,
    *,
    exclude: Sequence[str] = (),
    only: Sequence[str] = (),
) -> None:
    """``quantize_static`` (QDQ, int8 weights, activations as ``calibration`` says) with the
    cached ranges: ``exclude`` nodes stay float; ``only``, if given, are the only nodes
    quantized."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    quantize_static(
        str(model),
        str(out),
        None,
        quant_format=QuantFormat.QDQ,
        per_channel=calibration.per_channel,
        reduce_range=calibration.reduce_range,
        activation_type=QuantType.QInt8 if calibration.int8_activations else QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=_ort_methods()[calibration.method],
        nodes_to_exclude=[*exclude, *knn_nodes(model)],
        nodes_to_quantize=list(only),
        extra_options={"ActivationSymmetric": calibration.symmetric},
        calibration_cache_path=str(cache),
    )
