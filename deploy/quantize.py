"""``zoo quantize``: onnxruntime dynamic or static (QDQ) int8 quantization that reports what it
did to size, latency and accuracy, measured with the same harness as the fp32 model.

On CPUs without VNNI-friendly integer conv kernels, dynamic quantization of a conv-heavy model
(ConvInteger) is usually *slower* than fp32, while static QDQ is faster. zoo says so before
and after with the measured numbers, and never switches modes silently.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from zoo.deploy.bench_harness import time_session
from zoo.deploy.choices import (
    CALIB_METHODS,
    QUANT_ENGINES,
    QUANT_MODES,
    CalibMethod,
    QuantEngine,
    QuantMode,
)
from zoo.deploy.onnx_meta import read_metadata, read_preprocessing, set_metadata
from zoo.deploy.parity import real_images
from zoo.deploy.preprocess import preprocess
from zoo.deploy.quantize_search import CalibReader
from zoo.deploy.runtime import make_session
from zoo.errors import ChoiceError, InputError, QuantizationError
from zoo.images import open_image

HEAVY_OPS = ("Conv", "Gemm", "MatMul")


def op_counts(path: Path) -> Counter[str]:
    import onnx

    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def conv_heavy(counts: Counter[str]) -> bool:
    return counts["Conv"] > counts["Gemm"] + counts["MatMul"]


def coverage(fp32: Counter[str], q_path: Path, mode: str) -> dict[str, Any]:
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
    return {"heavy_ops": total, "quantized": quantized, "fp32_left": total - quantized}


def _labels_for(images: list[Path], classes: list[str]) -> np.ndarray | None:
    """Labels from the parent folder names, when every folder is a class of the model."""
    index = {c: i for i, c in enumerate(classes)}
    if not classes or not all(p.parent.name in index for p in images):
        return None
    return np.array([index[p.parent.name] for p in images])


def quantize(
    model: Path,
    out: Path,
    *,
    mode: QuantMode,
    calib: str | None = None,
    method: CalibMethod = "minmax",
    per_channel: bool = True,
    eval_data: str | None = None,
    max_accuracy_drop: float | None = None,
    threads: int | None = None,
    calib_size: int = 64,
    engine: QuantEngine = "ort",
    target_agreement: float | None = None,
) -> dict[str, Any]:
    """Quantize an exported fp32 ONNX model to int8, measure it against fp32, and write it
    atomically (nothing is written when a step or the accuracy gate fails).

    Args:
        model: an fp32 ``.onnx`` file exported by zoo (its metadata gives preprocessing and
            class names).
        out: the int8 ``.onnx`` file to write.
        mode: ``dynamic`` (weights only) or ``static`` (QDQ, activations calibrated).
        calib: static: a folder of representative real images (required).
        method: static: how activation ranges are calibrated (``minmax``, ``entropy``, ...).
        per_channel: per-channel weight scales.
        eval_data: images (class folders give labels) for the accuracy comparison; default:
            the bundled samples.
        max_accuracy_drop: fail if accuracy drops (or, without labels, top-1 changes) by
            more than this fraction.
        threads: ORT intra-op threads for the timing (default: available CPUs).
        calib_size: static: at most this many calibration images.
        engine: static: ``ort`` (onnxruntime's ``quantize_static``, with ``method`` and
            ``per_channel``) or ``nncf`` (NNCF's post-training quantization, its own ranges:
            :mod:`zoo.deploy.quantize_nncf`).
        target_agreement: static, ``ort``: search for the calibration and the fewest nodes
            kept float such that top-1 agreement with fp32 on the ``eval_data`` images (which
            must be disjoint from ``calib``) reaches this share, in (0, 1]
            (:mod:`zoo.deploy.quantize_search`). The search tries every ``method`` and
            ``per_channel`` setting itself. The number of float nodes is chosen on the
            ``eval_data`` images, so the agreement reported there is the stopping rule's own
            figure. ``max_accuracy_drop`` still applies to the result, on the same images.

    Returns:
        The report: sizes, p50 latencies and their ratios, top-1 agreement (and accuracy
        with labels), op coverage, advice, the gate, ``path``, and with
        ``target_agreement`` a ``search`` section (calibration tried and chosen, float
        nodes, the steps of the search, held-out agreement with its interval).

    Raises:
        ChoiceError: an unknown ``mode``, ``method`` or ``engine``.
        InputError: ``model`` is missing, not ONNX or without zoo metadata; static mode
            without ``calib`` or with no images in it; ``target_agreement`` out of (0, 1],
            without static ``ort`` mode or ``eval_data``, with a ``method`` or
            ``per_channel`` of its own, or with ``eval_data`` images that are also
            calibration images.
        QuantizationError: the accuracy gate failed, or no number of float nodes reaches
            ``target_agreement``.
    """
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    ChoiceError.check("mode", mode, QUANT_MODES)
    ChoiceError.check("method", method, CALIB_METHODS)
    ChoiceError.check("engine", engine, QUANT_ENGINES)
    if engine == "nncf" and mode != "static":
        raise InputError("--engine nncf quantizes statically: use --mode static.")
    if engine == "nncf" and method != "minmax":
        raise InputError(
            "--engine nncf picks activation ranges its own way: drop --method (it applies to "
            "--engine ort)."
        )
    if target_agreement is not None:
        _check_search_options(target_agreement, mode, engine, method, per_channel, eval_data)
    if mode == "dynamic" and calib is not None:
        raise InputError(
            "--calib calibrates activations, which --mode dynamic does not quantize: drop "
            "--calib, or use --mode static."
        )
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
    eval_imgs = real_images(eval_data, limit=200)
    calib_imgs: list[Path] = []
    if mode == "static":
        if calib is None:
            raise InputError("--mode static needs --calib DIR with representative real images.")
        calib_imgs = real_images(calib, limit=calib_size)
        if not calib_imgs:
            raise InputError(f"No images found for calibration in {calib}.")
        if target_agreement is not None:
            from zoo.deploy.quantize_search import check_disjoint

            check_disjoint(calib_imgs, eval_imgs)
    x_eval = np.stack([preprocess(open_image(p), pre) for p in eval_imgs])
    searched = None
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmpdir:
        prepped = Path(tmpdir) / "prepped.onnx"
        quant_pre_process(str(model), str(prepped), skip_symbolic_shape=False)
        tmp_out = Path(tmpdir) / "q.onnx"
        if mode == "dynamic":
            quantize_dynamic(
                str(prepped), str(tmp_out), weight_type=QuantType.QInt8, per_channel=per_channel
            )
        else:
            batches = [preprocess(open_image(p), pre)[None] for p in calib_imgs]
            methods = {m.name.lower(): m for m in CalibrationMethod}  # MinMax -> minmax
            sess_in = make_session(model).get_inputs()[0].name
            if engine == "nncf":
                from zoo.deploy.quantize_nncf import nncf_quantize

                nncf_quantize(prepped, tmp_out, batches, sess_in)
            elif target_agreement is not None:
                from zoo.deploy.quantize_search import search

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
                method = searched.calibration.method
                per_channel = searched.calibration.per_channel
            else:
                # the histogram calibrators (entropy, percentile) print progress on stdout,
                # where --json's report goes
                with contextlib.redirect_stdout(sys.stderr):
                    quantize_static(
                        str(prepped),
                        str(tmp_out),
                        CalibReader(batches, sess_in),
                        quant_format=QuantFormat.QDQ,
                        per_channel=per_channel,
                        activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8,
                        calibrate_method=methods[method],
                    )
        import onnx

        q = onnx.load(str(tmp_out))
        set_metadata(
            q,
            {
                **meta,
                "quantization": {
                    "mode": mode,
                    "engine": engine if mode == "static" else "ort",
                    "method": method if mode == "static" else None,
                    "per_channel": per_channel,
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
        report = _measure(model, tmp_out, x_eval, eval_imgs, meta, threads)
        report.update(
            {
                "mode": mode,
                "engine": engine if mode == "static" else "ort",
                "method": method if mode == "static" and engine == "ort" else None,
                "per_channel": per_channel,
                "coverage": coverage(fp32_ops, tmp_out, mode),
                "advice_before": advice,
            }
        )
        after = advice_after(fp32_ops, mode, report["latency_ratio"])
        if searched is not None:
            report["search"] = searched.to_dict(wilson(searched.agreement, searched.n_held_out))
            after = after or search_advice(searched.k, report["latency_ratio"])
        if after:
            report["advice_after"] = after
        if max_accuracy_drop is not None:
            report["gate"] = accuracy_gate(report, max_accuracy_drop)
        os.replace(tmp_out, out)
    report["path"] = str(out)
    return report


def _check_search_options(
    target: float,
    mode: str,
    engine: str,
    method: str,
    per_channel: bool,
    eval_data: str | None,
) -> None:
    """``--target-agreement``'s own checks, made before anything is read or written."""
    from zoo.deploy.quantize_search import check_target

    check_target(target)
    if mode != "static" or engine != "ort":
        raise InputError(
            "--target-agreement keeps nodes float in onnxruntime's static QDQ int8: use "
            f"--mode static --engine ort (got --mode {mode} --engine {engine})."
        )
    if method != "minmax" or not per_channel:
        raise InputError(
            "--target-agreement tries every --method and --per-channel/--no-per-channel "
            "setting itself and reports which won: drop "
            f"{'--method ' + method if method != 'minmax' else '--no-per-channel'}."
        )
    if eval_data is None:
        raise InputError(
            "--target-agreement needs --data DIR: held-out real images, none of them in "
            "--calib, to measure the agreement on."
        )


def search_advice(k: int, latency_ratio: float) -> str | None:
    """The measured verdict on a searched model that came out no faster than fp32."""
    if latency_ratio < 1.0:
        return None
    return (
        f"measured: with {k} node(s) kept float, int8 is {latency_ratio:.2f}× the fp32 latency "
        "(not faster): keep the fp32 model, lower --target-agreement, or try --engine nncf."
    )


def _measure(
    fp32: Path,
    q: Path,
    x: np.ndarray,
    images: list[Path],
    meta: dict[str, Any],
    threads: int | None,
) -> dict[str, Any]:
    s32, s8 = make_session(fp32, threads=threads), make_session(q, threads=threads)
    name = s32.get_inputs()[0].name
    from zoo.deploy.runtime import run_padded, static_batch_of

    batch = static_batch_of(s32) or 1
    y32 = run_padded(lambda a: s32.run(None, {name: a})[0], x, batch)
    y8 = run_padded(lambda a: s8.run(None, {name: a})[0], x, batch)
    one = x[:batch]
    t32 = time_session(lambda: s32.run(None, {name: one}), label="fp32")
    t8 = time_session(lambda: s8.run(None, {name: one}), label="int8")
    report: dict[str, Any] = {
        "size_mb": {
            "fp32": round(fp32.stat().st_size / 2**20, 2),
            "int8": round(q.stat().st_size / 2**20, 2),
        },
        "size_ratio": round(q.stat().st_size / fp32.stat().st_size, 3),
        "latency_ms": {
            "fp32_p50": t32["p50_ms"],
            "int8_p50": t8["p50_ms"],
            "batch": batch,
            "threads": s32.get_session_options().intra_op_num_threads,
        },
        "latency_ratio": round(t8["p50_ms"] / t32["p50_ms"], 3),
        **accuracy_report(y32, y8, _labels_for(images, list(meta.get("class_names") or []))),
        "n_images": len(images),
    }
    return report


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


def accuracy_gate(report: dict[str, Any], max_accuracy_drop: float) -> dict[str, Any]:
    """``--max-accuracy-drop``: the measured drop in accuracy (or, without labels, the share
    of images whose top-1 changed) must not exceed the limit.

    Raises:
        QuantizationError: the drop exceeds the limit (the caller then writes nothing).
    """
    drop = report.get("accuracy_drop")
    measured = drop if drop is not None else 1.0 - report["top1_agreement"]
    if measured > max_accuracy_drop:
        raise QuantizationError(
            f"Accuracy drop {measured:.2%} exceeds --max-accuracy-drop {max_accuracy_drop:.2%} "
            f"(top-1 agreement with fp32 {report['top1_agreement']:.1%}). Nothing was written; "
            "try --mode static --method entropy or --per-channel."
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
