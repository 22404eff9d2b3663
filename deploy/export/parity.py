"""Parity of an exported model with PyTorch, at three levels:

1. tensors: max abs / max rel difference and cosine on the same inputs, within tolerances;
2. predictions: top-1 agreement on real images, each side with its own preprocessing
   (torchvision for PyTorch, numpy/PIL for ONNX Runtime);
3. dynamic proven: outputs checked at batch sizes 1, 2 and an odd size different from the
   export batch, and at two other resolutions when H/W are dynamic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from zoo.deploy.runtimes.loader import run_padded
from zoo.images import list_images, open_image
from zoo.metadata import ModelInfo
from zoo.preprocess import preprocess
from zoo.ref import ModelRef
from zoo.transforms import eval_transform

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
    """One comparison of two tensors (:func:`compare`)."""

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
    """One shape the exported side must take: a batch size, a resolution (``224``) or an
    embedded-preprocessing case's image size (``"261x459"``). A shape it rejected carries the
    runtime's ``error`` and infinite differences."""

    batch: int
    size: int | str
    diff: TensorDiff
    case: str | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.diff.passed

    @classmethod
    def rejected(cls, batch: int, size: int | str, exc: Exception) -> DynamicCheck:
        inf = float("inf")
        return cls(batch, size, TensorDiff([], inf, inf, 0.0, False), error=_first_line(exc))

    def to_dict(self) -> dict[str, Any]:
        extra = {k: v for k, v in (("case", self.case), ("error", self.error)) if v is not None}
        return {"batch": self.batch, "size": self.size, **extra, **self.diff.to_dict()}


ImageKind = Literal["bundled", "data", "run", "given"]


@dataclass(frozen=True)
class ImageSource:
    """Where some of the gate's real images come from, for the report.

    Attributes:
        kind: ``bundled`` (zoo's sample photos), ``data`` (``--data DIR``), ``run`` (the
            seeded sample of the run's validation split) or ``given`` (a caller's list).
        count: how many images of this source the gate used.
        description: for people, e.g. ``64 of run digits's 359 validation images (seed 0)``.
    """

    kind: ImageKind
    count: int
    description: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GateImages:
    """The real images the gate judges with, and where each group comes from."""

    paths: tuple[Path, ...]
    sources: tuple[ImageSource, ...]

    @classmethod
    def given(cls, paths: Sequence[Path]) -> GateImages:
        return cls(tuple(paths), (ImageSource("given", len(paths), f"{len(paths)} given images"),))


@dataclass(frozen=True)
class ParityReport:
    """The gate's verdict at every level it checked; ``passed`` only when all passed.

    Attributes:
        tolerances: the bounds it judged by.
        tensors: the tensor comparison (None: not checked, which is not a pass).
        predictions: top-1 agreement on real images (None: not checked).
        dynamic: each other shape checked.
        images: which real images the tensor and prediction levels used.
    """

    tolerances: Tolerances = FP32
    tensors: TensorDiff | None = None
    predictions: PredictionCheck | None = None
    dynamic: tuple[DynamicCheck, ...] = ()
    images: tuple[ImageSource, ...] = ()

    @property
    def passed(self) -> bool:
        return (
            self.tensors is not None
            and self.tensors.passed
            and (self.predictions is None or self.predictions.passed)
            and all(d.passed for d in self.dynamic)
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``tensors`` and ``predictions`` are ``{}`` when not checked."""
        return {
            "tolerances": asdict(self.tolerances),
            "tensors": self.tensors.to_dict() if self.tensors else {},
            "predictions": self.predictions.to_dict() if self.predictions else {},
            "dynamic": [d.to_dict() for d in self.dynamic],
            "images": [i.to_dict() for i in self.images],
            "passed": self.passed,
        }

    def failures(self) -> list[str]:
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
            f"dynamic check failed at batch {d.batch}, size {d.size}: max abs {d.diff.max_abs:.3g}"
            for d in self.dynamic
            if not d.passed
        ]
        return out

    def describe_images(self) -> str:
        return "; ".join(i.description for i in self.images)


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__


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


def real_images(data: str | Path | None, limit: int = 64) -> list[Path]:
    """Images for the prediction check: ``--data DIR`` (up to ``limit``) or the bundled samples."""
    if data is None:
        from zoo.samples import sample_image_paths

        return sample_image_paths()
    files = list_images(Path(data))
    step = max(1, len(files) // limit)
    return files[::step][:limit]


def gate_images(model: ModelRef | None, data: str | Path | None, limit: int = 64) -> GateImages:
    """The real images the export gate judges ``model`` on.

    ``--data DIR``: up to ``limit`` of its images, spread over the folder (as always).
    Otherwise zoo's bundled photos, and, when ``model`` is a run or a folder of one, a seeded
    sample of ``limit`` of the run's own validation images at the run's image size
    (:mod:`zoo.run_images`): a fine-tuned model is judged on its own distribution too.

    Args:
        model: what is being exported (only a run or its model folder has images of its own).
        data: ``--data DIR``, or None.
        limit: the most images taken from ``data`` or the run.

    Raises:
        DataError: the run's ``split.json`` cannot be read or none of its validation images
            exist any more (the message says to pass ``--data DIR``).
    """
    if data is not None:
        paths = real_images(data, limit)
        return GateImages(
            tuple(paths),
            (ImageSource("data", len(paths), f"{len(paths)} images of --data {data}"),),
        )
    from zoo.run_images import images_for
    from zoo.samples import sample_image_paths

    bundled = tuple(sample_image_paths())
    sources = [ImageSource("bundled", len(bundled), f"{len(bundled)} bundled photos")]
    run = None
    if model is not None and model.kind in ("run", "model-folder"):
        run = images_for(model.model_folder, limit=limit)  # None: a folder outside a run
    if run is None:
        return GateImages(bundled, tuple(sources))
    sources.append(ImageSource("run", len(run.paths), run.describe()))
    return GateImages(bundled + run.paths, tuple(sources))


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
        dynamic_size: also check two other resolutions (±32 px).
        images: real images for the tensor and prediction checks (:func:`gate_images`, which
            the report names, or plain paths).
        tolerances: the bounds of every level (:data:`FP16` for an fp16 graph).

    Returns:
        The report; ``report.passed`` is the verdict, ``report.failures()`` says why not.
        A shape the exported side rejects is a failed dynamic check, not an exception.

    Raises:
        InputError: an image cannot be opened.
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
    c, h = info.input_size[0], info.input_size[1]
    shapes = []
    if dynamic_batch:
        shapes += [(b, h) for b in (1, 2, 5 if export_batch != 5 else 7)]
    if dynamic_size:
        shapes += [(export_batch if not dynamic_batch else 3, s) for s in (h - 32, h + 32)]
    rng = np.random.default_rng(1)
    dynamic = []
    for b, s in shapes:
        xi = rng.standard_normal((b, c, s, s), np.float32)
        try:
            dynamic.append(DynamicCheck(b, s, compare(eager(xi), run(xi), **tol)))
        except Exception as exc:  # onnxruntime rejects a shape the graph baked in
            dynamic.append(DynamicCheck.rejected(b, s, exc))
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
        try:
            got = run(np.stack([pixels(im, channels) for im in ims]))
            size = f"{ims[0].size[0]}x{ims[0].size[1]}"
            dynamic.append(DynamicCheck(len(ims), size, compare(eager(ims), got, **tol), label))
        except Exception as exc:  # the graph rejected a shape it should take
            dynamic.append(DynamicCheck.rejected(len(ims), label, exc))
    return ParityReport(tolerances, tensors, predictions, tuple(dynamic), gate.sources)
