"""Parity of an exported model with PyTorch, at three levels:

1. tensors: max abs / max rel difference and cosine on the same inputs, within tolerances;
2. predictions: top-1 agreement on real images, each side with its own preprocessing
   (torchvision for PyTorch, numpy/PIL for ONNX Runtime);
3. dynamic proven: outputs checked at batch sizes 1, 2 and an odd size different from the
   export batch, and at two other resolutions when H/W are dynamic.

The report types and tolerances are in :mod:`zoo.deploy.export.parity_report`, the gate's real
images in :mod:`zoo.deploy.export.gate_images`; both are re-exported here, the gate's one
public face.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoo.deploy.export.gate_images import (
    GateImages,
    ImageKind,
    ImageSource,
    gate_images,
    real_images,
)
from zoo.deploy.export.parity_report import (
    ATOL,
    BF16,
    FP16,
    FP32,
    INT8,
    MIN_AGREEMENT,
    MIN_COSINE,
    RTOL,
    TOLERANCES,
    DynamicCheck,
    ParityReport,
    PredictionCheck,
    RunFn,
    TensorDiff,
    Tolerances,
    compare,
    prediction_check,
)
from zoo.deploy.runtimes.loader import run_padded
from zoo.images import open_image
from zoo.metadata import ModelInfo
from zoo.preprocess import preprocess
from zoo.transforms import eval_transform


def other_sizes(height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two resolutions a ``--dynamic-size`` graph is proven at, as ``(H, W)``: each side
    32 px smaller (halved where that would leave less than 16 px: 16 px for a 32 px model) and
    32 px larger."""

    def smaller(side: int) -> int:
        return side - 32 if side >= 48 else max(1, side // 2)

    return (smaller(height), smaller(width)), (height + 32, width + 32)


def check_parity(
    model: torch.nn.Module,
    info: ModelInfo,
    run: RunFn,
    *,
    export_batch: int,
    dynamic_batch: bool,
    dynamic_size: bool,
    images: GateImages | Sequence[Path],
    tolerances: Tolerances = FP32,
) -> ParityReport:
    """Prove that ``run`` (an exported graph) reproduces ``model``, at the three levels above.

    Args:
        model: the PyTorch model in eval mode (the reference side).
        info: its metadata (input size, preprocessing for both sides).
        run: the exported side: a float32 NCHW batch in, logits out.
        export_batch: the batch size the graph was exported with (a fixed-batch graph is fed
            padded chunks of it).
        dynamic_batch: also check batch sizes 1, 2 and an odd one.
        dynamic_size: also check two other resolutions (:func:`other_sizes`).
        images: real images for the tensor and prediction checks (:func:`gate_images`, which
            the report names, or plain paths).
        tolerances: the bounds of every level (:data:`FP16` for an fp16 graph).

    Returns:
        The report; ``report.passed`` is the verdict, ``report.failures()`` says why not.
        A shape the exported side rejects is a failed dynamic check, not an exception.

    Raises:
        InputError: an image cannot be opened.
        Exception: the model itself fails at a checked shape (``export_onnx`` refuses such a
            model before it exports).
    """
    gate = images if isinstance(images, GateImages) else GateImages.given(images)
    tol = {k: v for k, v in asdict(tolerances).items() if k != "min_agreement"}
    torch_tf = eval_transform(info)
    pre = info.preprocessing()
    pil = [open_image(p) for p in gate.paths]

    def eager(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(x)).float().numpy()

    # 1. tensors: real images, repeated to the export batch, plus seeded noise
    base = np.stack([preprocess(im, pre) for im in pil])
    x = np.concatenate(
        [base, np.random.default_rng(0).standard_normal(base.shape[1:], np.float32)[None]]
    )
    x = np.resize(x, (export_batch, *x.shape[1:])).astype(np.float32)
    tensors = compare(eager(x), run(x), **tol)
    # 2. predictions: each side with its own preprocessing; PyTorch in chunks of 32, the graph
    # in padded chunks of the export batch (a run's 64 images at its own size stay cheap)
    torch_x = torch.stack([torch_tf(im) for im in pil])
    ref_top1 = np.concatenate([eager(chunk.numpy()) for chunk in torch_x.split(32)]).argmax(1)
    ort_top1 = run_padded(run, base, export_batch).argmax(1)
    predictions = prediction_check(
        ref_top1,
        ort_top1,
        tolerances.min_agreement,
        preprocessing_max_abs=float(np.abs(torch_x.numpy() - base).max()),
    )
    # 3. dynamic proven
    c, h, w = info.input_size
    shapes = []
    if dynamic_batch:
        shapes += [(b, (h, w)) for b in (1, 2, 5 if export_batch != 5 else 7)]
    if dynamic_size:
        shapes += [(export_batch if not dynamic_batch else 3, hw) for hw in other_sizes(h, w)]
    rng = np.random.default_rng(1)
    dynamic = []
    for b, (hi, wi) in shapes:
        xi = rng.standard_normal((b, c, hi, wi), np.float32)
        size = hi if hi == wi else f"{wi}x{hi}"
        want = eager(xi)  # the model itself takes it: export_onnx refuses one that does not
        try:
            dynamic.append(DynamicCheck(b, size, compare(want, run(xi), **tol)))
        except Exception as exc:  # onnxruntime rejects a shape the graph baked in
            dynamic.append(DynamicCheck.rejected(b, size, exc))
    return ParityReport(tolerances, tensors, predictions, tuple(dynamic), gate.sources)


# --embed-preprocessing: the graph resizes in float where PIL works in 8-bit fixed point; the
# two differ by at most 2 of 256 levels on about 1 % of pixels (measured on real photographs,
# bilinear and bicubic; nearest is exact). Measured end to end on the real ImageNet
# MobileNetV2: see README ("Preprocessing inside the graph"). The bound is a share of the
# logits' range, as for fp16 (whose bounds these also hold: an fp16 graph with embedded
# preprocessing is judged by them); top-1 must agree on every real image.
EMBEDDED = Tolerances(range_atol=0.02, min_cosine=0.9999)


def check_embedded_parity(
    model: torch.nn.Module,
    info: ModelInfo,
    run: Callable[[np.ndarray], np.ndarray],
    images: GateImages | Sequence[Path],
    tolerances: Tolerances = EMBEDDED,
) -> ParityReport:
    """The gate for a graph that preprocesses itself: decoded pixels in, against PyTorch on
    torchvision's eval transform of the same images (so resize, crop and normalisation are
    judged together with the model).

    Levels: every real image at its own size (logits stacked and compared as one tensor), top-1
    agreement, and the dynamic axes: a batch of 3 of one image, an image smaller than the
    crop (upsampled), and odd and portrait sizes (the crop's offsets round half to even).

    Args:
        model: the PyTorch model in eval mode.
        info: its metadata (preprocessing, channels).
        run: the graph: ``uint8 (N, H, W, C)`` in, logits out.
        images: real images (:func:`gate_images`, or plain paths).
        tolerances: :data:`EMBEDDED` unless told otherwise.

    Returns:
        The report (``passed``, ``failures()``), as :func:`check_parity`'s.
    """
    from zoo.deploy.export.graph_preprocess import pixels

    gate = images if isinstance(images, GateImages) else GateImages.given(images)
    tol = {k: v for k, v in asdict(tolerances).items() if k != "min_agreement"}
    tf, channels = eval_transform(info), info.preprocessing().channels
    pil = [open_image(p) for p in gate.paths]

    def eager(ims: list[Any]) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.stack([tf(im) for im in ims])).float().numpy()

    ref = np.concatenate([eager(pil[i : i + 32]) for i in range(0, len(pil), 32)])
    out = np.concatenate([run(pixels(im, channels)[None]) for im in pil])
    tensors = compare(ref, out, **tol)
    predictions = prediction_check(ref.argmax(1), out.argmax(1), tolerances.min_agreement)
    first = pil[0]
    crop = info.preprocessing().crop_size
    cases = {  # a batch, an image smaller than the crop (upsampled), odd portrait sides
        "one image thrice": [first] * 3,
        "small": [first.resize((max(1, crop // 2), max(1, crop // 3)))],
        "odd portrait": [first.resize((crop + 37, crop * 2 + 11))],
    }
    dynamic = []
    for label, ims in cases.items():
        size = f"{ims[0].size[0]}x{ims[0].size[1]}"
        want = eager(ims)  # PyTorch takes every case: its transform resizes and crops
        try:
            got = run(np.stack([pixels(im, channels) for im in ims]))
            dynamic.append(DynamicCheck(len(ims), size, compare(want, got, **tol), label))
        except Exception as exc:  # the graph rejected a shape it should take
            dynamic.append(DynamicCheck.rejected(len(ims), size, exc, label))
    return ParityReport(tolerances, tensors, predictions, tuple(dynamic), gate.sources)


__all__ = [
    "ATOL",
    "BF16",
    "EMBEDDED",
    "FP16",
    "FP32",
    "INT8",
    "MIN_AGREEMENT",
    "MIN_COSINE",
    "RTOL",
    "TOLERANCES",
    "DynamicCheck",
    "GateImages",
    "ImageKind",
    "ImageSource",
    "ParityReport",
    "PredictionCheck",
    "RunFn",
    "TensorDiff",
    "Tolerances",
    "check_embedded_parity",
    "check_parity",
    "compare",
    "gate_images",
    "other_sizes",
    "prediction_check",
    "real_images",
]
