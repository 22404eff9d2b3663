"""``zoo quantize``: onnxruntime dynamic or static (QDQ) int8 quantization that reports what it
did to size, latency and accuracy, measured with the same harness as the fp32 model.

Judged on the model's own images: ``--data DIR``, else the validation split of the run the
model belongs to (:mod:`zoo.run_images`), else the two bundled photos, which the report says
prove nothing. Below the floor (:data:`FLOOR_ACCURACY_DROP` of accuracy lost, or an agreement
whose 95 % interval lies under :data:`FLOOR_AGREEMENT`) nothing is written unless
``allow_drop``; when int8 keeps few nodes in int8 or runs no faster, the report says that it
does not pay and what does.

The defaults come from bench/quantize_defaults.py on a fine-tuned MobileNetV2 (digits, 96 px;
docs/bench/quantize_defaults.json): onnxruntime's best there was U8S8 QDQ, minmax, per-channel
(−2.5 points), with ``reduce_range`` decided here from the CPU's flags (on only without VNNI);
NNCF kept the most (−0.8 points), so a drop below the floor points to ``--engine nncf``.

On CPUs without VNNI-friendly integer conv kernels, dynamic quantization of a conv-heavy model
(ConvInteger) is usually *slower* than fp32, while static QDQ is faster. zoo says so before
and after with the measured numbers, and never switches modes silently.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from zoo.deploy.bench.harness import time_session
from zoo.deploy.choices import (
    CALIB_METHODS,
    QUANT_ENGINES,
    QUANT_MODES,
    CalibMethod,
    QuantEngine,
    QuantMode,
)
from zoo.deploy.export.parity import real_images
from zoo.deploy.quantize.search import Calibration, SearchResult
from zoo.deploy.runtimes.loader import make_session
from zoo.errors import ChoiceError, InputError, QuantizationError
from zoo.images import open_image
from zoo.onnx_meta import read_metadata, read_preprocessing, set_metadata
from zoo.preprocess import preprocess
from zoo.run_images import find_run, run_validation_images

HEAVY_OPS = ("Conv", "Gemm", "MatMul")
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
"""CPU flags of integer dot-product instructions: with one, uint8 × int8 products cannot
saturate in onnxruntime's kernels, so weights keep all 8 bits (no ``reduce_range``)."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The flags of this machine's first CPU (empty where ``/proc/cpuinfo`` is not there)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def op_counts(path: Path) -> Counter[str]:
    import onnx

    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def conv_heavy(counts: Counter[str]) -> bool:
    return counts["Conv"] > counts["Gemm"] + counts["MatMul"]


FLOOR_ACCURACY_DROP = 0.01
"""The floor: int8 may lose at most 1 point of top-1 accuracy on labelled images."""
FLOOR_AGREEMENT = 0.98
"""The floor without labels: the top of the agreement's 95 % interval must reach 98 %."""
MIN_INT8_SHARE = 0.5
"""Below this share of Conv/Gemm/MatMul nodes in int8, int8 does not pay."""
EVAL_LIMIT = 500
"""At most this many evaluation images (a run's validation split, or ``--data``)."""
DEFAULT_CALIB_SIZE = 300
"""Calibration images by default (the bench's setting; its winner used them all)."""
DEFAULT_METHOD: CalibMethod = "minmax"
"""onnxruntime's activation ranges by default: bench/quantize_defaults.py's best onnxruntime
setting (U8S8 minmax; S8S8 symmetric lost 4–7 points where this lost 2.5)."""
ImageSource = Literal["data", "run", "builtin"]


def resolve_engine(
    engine: QuantEngine,
    mode: QuantMode,
    method: CalibMethod | None,
    per_channel: bool | None,
    target_agreement: float | None,
) -> QuantEngine:
    """``auto`` → ``nncf`` where NNCF is installed and nothing asked for onnxruntime's own
    settings (it kept the most accuracy: docs/bench/quantize_defaults.json), else ``ort``."""
    if engine != "auto":
        return engine
    ort_only = method is not None or per_channel is not None or target_agreement is not None
    if mode != "static" or ort_only:
        return "ort"
    import importlib.util

    return "nncf" if importlib.util.find_spec("nncf") is not None else "ort"


def variant_name(mode: QuantMode, engine: QuantEngine = "ort") -> str:
    """The one naming rule of a quantized file: ``int8-dynamic``, ``int8-static`` (onnxruntime)
    or ``int8-nncf``."""
    return "int8-nncf" if mode == "static" and engine == "nncf" else f"int8-{mode}"


def default_output(model: Path, mode: QuantMode, engine: QuantEngine = "ort") -> Path:
    """``FOLDER/variants/NAME.onnx`` for a model in a model folder (a run's ``model/``), which
    stays readable; else ``NAME`` beside the input (``m.onnx`` → ``m.int8-static.onnx``)."""
    from zoo.variants import default_variant_path

    name = variant_name(mode, engine)
    return default_variant_path(model, name) or model.with_name(f"{model.stem}.{name}.onnx")


def default_calibration(
    method: CalibMethod | None = None,
    per_channel: bool | None = None,
    flags: frozenset[str] | None = None,
) -> Calibration:
    """onnxruntime's static setting: U8S8 QDQ (uint8 asymmetric activations, int8 weights),
    per-channel weights, :data:`DEFAULT_METHOD` ranges, unless given; ``reduce_range`` (7-bit
    weights) only on a CPU without VNNI (``flags``: this machine's by default), where uint8 ×
    int8 sums could saturate. Measured on the digits run (docs/bench/quantize_defaults.json):
    S8S8 symmetric ranges lost more accuracy with every method, and ``reduce_range`` on a VNNI
    CPU lost more again."""
    vnni = bool((cpu_flags() if flags is None else flags) & VNNI_FLAGS)
    return Calibration(
        method=method or DEFAULT_METHOD,
        per_channel=True if per_channel is None else per_channel,
        reduce_range=not vnni,
    )


@dataclass(frozen=True)
class EvalImages:
    """The images int8 is judged on, where they came from, and their labels (class indices,
    None when unknown or multi-label)."""

    paths: tuple[Path, ...]
    labels: np.ndarray | None
    source: ImageSource
    description: str

    @property
    def proves_nothing(self) -> bool:
        """The bundled photos: two ImageNet images say nothing about a model's own domain."""
        return self.source == "builtin"


def eval_images(model: Path, data: str | None, classes: list[str]) -> EvalImages:
    """``--data`` (labels from class folders), else the run's validation images (labels from
    its split), else the bundled photos."""
    if data is not None:
        paths = real_images(data, limit=EVAL_LIMIT)
        if not paths:
            raise InputError(f"No images found in --data {data}: give a folder of real images.")
        return EvalImages(
            tuple(paths), _labels_for(paths, classes), "data", f"{len(paths)} images of {data}"
        )
    run = find_run(model)
    if run is not None:
        imgs = run_validation_images(run, limit=EVAL_LIMIT)
        index = {c: i for i, c in enumerate(classes)}
        labels = (
            np.array([index[label] for label in imgs.labels])
            if all(label in index for label in imgs.labels)
            else None
        )
        return EvalImages(imgs.paths, labels, "run", imgs.describe())
    paths = real_images(None)
    return EvalImages(
        tuple(paths),
        _labels_for(paths, classes),
        "builtin",
        f"the {len(paths)} bundled sample photos",
    )


def calibration_images(model: Path, calib: str | None, limit: int) -> tuple[list[Path], str]:
    """``--calib`` (up to ``limit``), else a seeded sample of the model's run's training split;
    with a description.

    Raises:
        InputError: neither (or no images in ``calib``).
    """
    if calib is not None:
        paths = real_images(calib, limit=limit)
        if not paths:
            raise InputError(f"No images found for calibration in {calib}.")
        return paths, f"{len(paths)} images of {calib}"
    run = find_run(model)
    if run is None:
        raise InputError("--mode static needs --calib DIR with representative real images.")
    imgs = run_validation_images(run, limit=limit, split="train")
    return list(imgs.paths), imgs.describe()


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


@dataclass(frozen=True)
class Latency:
    fp32_p50: float
    int8_p50: float
    batch: int
    threads: int

    @property
    def ratio(self) -> float:
        return round(self.int8_p50 / self.fp32_p50, 3)


@dataclass(frozen=True)
class QuantizeReport:
    """What :func:`quantize` did and measured; ``to_dict`` is ``--json``'s shape and
    :meth:`lines` the summary."""

    path: Path
    written: bool
    mode: QuantMode
    engine: QuantEngine
    calibration: Calibration | None
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

    @property
    def accuracy_drop(self) -> float | None:
        return None if self.accuracy is None else round(self.accuracy[0] - self.accuracy[1], 4)

    @property
    def failed(self) -> bool:
        """Below the floor and not allowed: nothing was written; the command exits 1."""
        return not self.floor.passed and not self.floor.allowed

    def to_dict(self) -> dict[str, Any]:
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
            f"size {f32} → {i8} MB (×{round(i8 / f32, 3)})",
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


def _labels_for(images: list[Path], classes: list[str]) -> np.ndarray | None:
    """Labels from the parent folder names, when every folder is a class of the model."""
    index = {c: i for i, c in enumerate(classes)}
    if not classes or not all(p.parent.name in index for p in images):
        return None
    return np.array([index[p.parent.name] for p in images])


def quantize(
    model: Path,
    out: Path | None = None,
    *,
    mode: QuantMode,
    calib: str | None = None,
    method: CalibMethod | None = None,
    per_channel: bool | None = None,
    eval_data: str | None = None,
    max_accuracy_drop: float | None = None,
    threads: int | None = None,
    calib_size: int = DEFAULT_CALIB_SIZE,
    engine: QuantEngine = "auto",
    target_agreement: float | None = None,
    allow_drop: bool = False,
    on_plan: Callable[[str], None] | None = None,
) -> QuantizeReport:
    """Quantize an exported fp32 ONNX model to int8, measure it against fp32 on the model's
    own images, and write it atomically (nothing is written when a step, the gate or the floor
    fails).

    Args:
        model: an fp32 ``.onnx`` file exported by zoo (its metadata gives preprocessing and
            class names).
        out: the int8 ``.onnx`` file to write; default :func:`default_output` (a run's
            ``model/variants/int8-static.onnx``, or beside the input).
        mode: ``dynamic`` (weights only) or ``static`` (QDQ, activations calibrated).
        calib: static: a folder of representative real images; default: the training split
            of the run ``model`` belongs to (required for any other model).
        method: static, ``ort``: how activation ranges are calibrated; default
            :data:`DEFAULT_METHOD` (:func:`default_calibration`).
        per_channel: per-channel weight scales (default on).
        eval_data: images (class folders give labels) for the accuracy comparison; default:
            the run's validation images, else the bundled samples (which prove nothing).
        max_accuracy_drop: fail if accuracy drops (or, without labels, top-1 changes) by
            more than this fraction.
        threads: ORT intra-op threads for the timing (default: available CPUs).
        calib_size: static: at most this many calibration images.
        engine: static: ``ort`` (onnxruntime's ``quantize_static``), ``nncf`` (NNCF's
            post-training quantization: :mod:`zoo.deploy.quantize.nncf_engine`), or ``auto``
            (:func:`resolve_engine`: NNCF, the measured best, where it is installed).
        target_agreement: static, ``ort``: search for the calibration and the fewest nodes
            kept float such that top-1 agreement with fp32 on the evaluation images (which
            must be disjoint from the calibration images) reaches this share, in (0, 1]
            (:mod:`zoo.deploy.quantize.search`). ``max_accuracy_drop`` still applies.
        allow_drop: write the file even when it is below the floor (:func:`check_floor`).
        on_plan: told, before a ``target_agreement`` search starts, its estimated duration.

    Returns:
        The :class:`QuantizeReport`; ``written`` is False when it is below the floor and
        ``allow_drop`` was not given.

    Raises:
        ChoiceError: an unknown ``mode``, ``method`` or ``engine``.
        InputError: ``model`` is missing, not ONNX or without zoo metadata; static mode
            without calibration images; ``target_agreement`` out of (0, 1], without static
            ``ort`` mode or images of the model's own, with a ``method`` or ``per_channel``
            of its own; evaluation images that are also calibration images.
        DataError: the model's run lists images that are gone.
        QuantizationError: the accuracy gate failed, or no number of float nodes reaches
            ``target_agreement``.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    ChoiceError.check("mode", mode, QUANT_MODES)
    if method is not None:
        ChoiceError.check("method", method, CALIB_METHODS)
    ChoiceError.check("engine", engine, QUANT_ENGINES)
    engine = resolve_engine(engine, mode, method, per_channel, target_agreement)
    if engine == "nncf" and mode != "static":
        raise InputError("--engine nncf quantizes statically: use --mode static.")
    if engine == "nncf" and method is not None:
        raise InputError(
            "--engine nncf picks activation ranges its own way: drop --method (it applies to "
            "--engine ort)."
        )
    if target_agreement is not None:
        _check_search_options(target_agreement, mode, engine, method, per_channel, eval_data, model)
    if mode == "dynamic" and calib is not None:
        raise InputError(
            "--calib calibrates activations, which --mode dynamic does not quantize: drop "
            "--calib, or use --mode static."
        )
    out = out or default_output(model, mode, engine)
    meta = read_metadata(model)
    if meta.get("precision", "fp32") != "fp32":
        raise InputError(
            f"{model} is a {meta['precision']} export; int8 quantization starts from fp32: "
            "quantize the export made without --precision"
        )
    if "quantization" in meta:
        raise InputError(
            f"{model} is already quantized ({meta['quantization'].get('mode')} int8): quantize "
            "the fp32 export it came from."
        )
    if (meta.get("input") or {}).get("dtype") == "uint8":
        raise InputError(
            f"{model} takes uint8 pixels (exported with --embed-preprocessing); int8 "
            "quantization calibrates the model's float input: quantize the export made "
            "without it."
        )
    pre = read_preprocessing(meta, model)
    fp32_ops = op_counts(model)
    advice = advice_before(model.name, fp32_ops, mode)
    images = eval_images(model, eval_data, list(meta.get("class_names") or []))
    if target_agreement is not None and images.proves_nothing:
        raise InputError(
            "--target-agreement needs --data DIR: held-out real images, none of them in "
            "--calib, to measure the agreement on."
        )
    calib_imgs: list[Path] = []
    calib_description = None
    calibration = None
    if mode == "static":
        calib_imgs, calib_description = calibration_images(model, calib, calib_size)
        if not images.proves_nothing:
            from zoo.deploy.quantize.search import check_disjoint

            check_disjoint(calib_imgs, list(images.paths))
        if engine == "ort":
            calibration = default_calibration(method, per_channel)
    x_eval = np.stack([preprocess(open_image(p), pre) for p in images.paths])
    searched = None
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmpdir:
        prepped = Path(tmpdir) / "prepped.onnx"
        quant_pre_process(str(model), str(prepped), skip_symbolic_shape=False)
        tmp_out = Path(tmpdir) / "q.onnx"
        if mode == "dynamic":
            quantize_dynamic(
                str(prepped),
                str(tmp_out),
                weight_type=QuantType.QInt8,
                per_channel=True if per_channel is None else per_channel,
            )
        else:
            batches = [preprocess(open_image(p), pre)[None] for p in calib_imgs]
            sess_in = make_session(model).get_inputs()[0].name
            if engine == "nncf":
                from zoo.deploy.quantize.nncf_engine import nncf_quantize

                nncf_quantize(prepped, tmp_out, batches, sess_in)
            elif target_agreement is not None:
                from zoo.deploy.quantize.search import candidates, estimate_seconds, search

                if on_plan is not None:
                    budget = estimate_seconds(
                        len(candidates(prepped)),
                        len(batches),
                        len(x_eval),
                        _seconds_per_image(model, x_eval[:1], threads),
                    )
                    on_plan(budget.describe())
                searched = search(
                    prepped,
                    tmp_out,
                    calib_batches=batches,
                    input_name=sess_in,
                    x_held_out=x_eval,
                    fp32_model=model,
                    target=target_agreement,
                    threads=threads,
                    workdir=Path(tmpdir),
                )
                calibration = searched.calibration
            else:
                from zoo.deploy.quantize.search import calibrate, quantize_qdq

                assert calibration is not None  # engine ort, static
                cache = Path(tmpdir) / "ranges.json"
                calibrate(prepped, batches, sess_in, calibration.method, cache)
                quantize_qdq(prepped, tmp_out, cache, calibration)
        import onnx

        q = onnx.load(str(tmp_out))
        set_metadata(
            q,
            {
                **meta,
                "quantization": {
                    "mode": mode,
                    "engine": engine if mode == "static" else "ort",
                    "method": None if calibration is None else calibration.method,
                    "per_channel": True if calibration is None else calibration.per_channel,
                    "calibration": None if calibration is None else calibration.to_dict(),
                    "source": str(model),
                    **(
                        {}
                        if searched is None
                        else {
                            "symmetric_activations": searched.calibration.symmetric,
                            "target_agreement": searched.target,
                            "float_nodes": searched.float_nodes,
                        }
                    ),
                },
            },
        )
        onnx.save(q, str(tmp_out))
        report = _measure(
            model,
            tmp_out,
            x_eval,
            images,
            threads,
            mode=mode,
            engine=engine if mode == "static" else "ort",
            calibration=calibration,
            calib_description=calib_description,
            coverage=coverage(fp32_ops, tmp_out, mode),
            out=out,
            allow_drop=allow_drop,
        )
        gate = (
            None
            if max_accuracy_drop is None
            else accuracy_gate(report.top1_agreement, report.accuracy_drop, max_accuracy_drop)
        )
        after = advice_after(fp32_ops, mode, report.latency.ratio)
        report = _replace(
            report, advice_before=advice, advice_after=after, gate=gate, search=searched
        )
        if not report.failed:
            os.replace(tmp_out, out)
    return report


def _replace(report: QuantizeReport, **changes: Any) -> QuantizeReport:
    from dataclasses import replace

    return replace(report, **changes)


def _seconds_per_image(model: Path, x: np.ndarray, threads: int | None) -> float:
    """fp32 seconds for one image (the median of 5 runs after one warm-up): the unit of the
    search's time estimate."""
    session = make_session(model, threads=threads)
    name = session.get_inputs()[0].name
    session.run(None, {name: x})
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        session.run(None, {name: x})
        times.append(time.perf_counter() - t0)
    return sorted(times)[2] / len(x)


def _check_search_options(
    target: float,
    mode: str,
    engine: str,
    method: str | None,
    per_channel: bool | None,
    eval_data: str | None,
    model: Path,
) -> None:
    """``--target-agreement``'s own checks, made before anything is read or written."""
    from zoo.deploy.quantize.search import check_target

    check_target(target)
    if mode != "static" or engine != "ort":
        raise InputError(
            "--target-agreement keeps nodes float in onnxruntime's static QDQ int8: use "
            f"--mode static --engine ort (got --mode {mode} --engine {engine})."
        )
    if method is not None or per_channel is not None:
        raise InputError(
            "--target-agreement tries every --method and --per-channel/--no-per-channel "
            "setting itself and reports which won: drop "
            f"{'--method ' + method if method is not None else '--per-channel/--no-per-channel'}."
        )
    if eval_data is None and find_run(model) is None:
        raise InputError(
            "--target-agreement needs --data DIR: held-out real images, none of them in "
            "--calib, to measure the agreement on."
        )


def _measure(
    fp32: Path,
    q: Path,
    x: np.ndarray,
    images: EvalImages,
    threads: int | None,
    *,
    mode: QuantMode,
    engine: QuantEngine,
    calibration: Calibration | None,
    calib_description: str | None,
    coverage: Coverage,
    out: Path,
    allow_drop: bool,
) -> QuantizeReport:
    """Both models on the evaluation images and timed in turn: the report."""
    from zoo.deploy.runtimes.loader import run_padded, static_batch_of

    s32, s8 = make_session(fp32, threads=threads), make_session(q, threads=threads)
    name = s32.get_inputs()[0].name
    batch = static_batch_of(s32) or 1
    y32 = run_padded(lambda a: s32.run(None, {name: a})[0], x, batch)
    y8 = run_padded(lambda a: s8.run(None, {name: a})[0], x, batch)
    one = x[:batch]
    t32 = time_session(lambda: s32.run(None, {name: one}), label="fp32")
    t8 = time_session(lambda: s8.run(None, {name: one}), label="int8")
    latency = Latency(
        fp32_p50=t32["p50_ms"],
        int8_p50=t8["p50_ms"],
        batch=batch,
        threads=s32.get_session_options().intra_op_num_threads,
    )
    acc = accuracy_report(y32, y8, images.labels)
    floor = check_floor(acc.get("accuracy_drop"), acc["agreement_ci95"], images)
    floor = Floor(
        floor.applies, floor.passed, floor.reason, allowed=allow_drop and not floor.passed
    )
    accuracy = acc.get("accuracy")
    return QuantizeReport(
        path=out,
        written=floor.passed or allow_drop,
        mode=mode,
        engine=engine,
        calibration=calibration,
        size_mb=(round(fp32.stat().st_size / 2**20, 2), round(q.stat().st_size / 2**20, 2)),
        latency=latency,
        top1_agreement=acc["top1_agreement"],
        agreement_ci95=acc["agreement_ci95"],
        accuracy=None if accuracy is None else (accuracy["fp32"], accuracy["int8"]),
        images=images,
        calib_description=calib_description,
        coverage=coverage,
        floor=floor,
        not_paying=does_not_pay(coverage, latency.ratio),
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
