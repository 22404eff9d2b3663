"""``zoo quantize``: onnxruntime dynamic or static (QDQ) int8 quantization that reports what it
did to size, latency and accuracy, measured with the same harness as the fp32 model.

Judged on the model's own images (:mod:`zoo.deploy.quantize.images`). Below the floor
(:mod:`zoo.deploy.quantize.verdict`) nothing is written unless ``allow_drop``; when int8 keeps
few nodes in int8 or runs no faster, the report says that it does not pay and what does. The
options and their defaults are :class:`~zoo.deploy.quantize.options.QuantizeOptions`; the
result is a :class:`~zoo.deploy.quantize.report.QuantizeReport`.

On CPUs without VNNI-friendly integer conv kernels, dynamic quantization of a conv-heavy model
(ConvInteger) is usually *slower* than fp32, while static QDQ is faster. zoo says so before
and after with the measured numbers, and never switches modes silently.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from zoo import durable
from zoo.deploy.bench.harness import time_session
from zoo.deploy.choices import QuantEngine, QuantMode
from zoo.deploy.quantize.calibration import (
    Calibration,
    calibrate,
    candidates,
    check_disjoint,
    knn_nodes,
    quantize_qdq,
)
from zoo.deploy.quantize.images import EvalImages, calibration_images, eval_images
from zoo.deploy.quantize.nncf_engine import BitsChoice, quantize_choosing_bits
from zoo.deploy.quantize.options import (
    QuantizeOptions,
    default_calibration,
    nncf_weight_bits_to_try,
    shipped_weight_bits,
    trained_weight_bits,
    weight_bits_note,
)
from zoo.deploy.quantize.report import Latency, QuantizeReport
from zoo.deploy.quantize.search import estimate_seconds, search
from zoo.deploy.quantize.verdict import (
    Coverage,
    accuracy_gate,
    accuracy_report,
    advice_after,
    advice_before,
    check_floor,
    coverage,
    does_not_pay,
    op_counts,
)
from zoo.deploy.runtimes.classifier import padded_chunks
from zoo.deploy.runtimes.loader import make_session, static_batch_of
from zoo.errors import InputError
from zoo.images import open_image
from zoo.onnx_meta import read_metadata, read_preprocessing, set_metadata
from zoo.preprocess import preprocess
from zoo.run_images import find_run
from zoo.system import mib


def quantize(
    options: QuantizeOptions, *, on_plan: Callable[[str], None] | None = None
) -> QuantizeReport:
    """Quantize an exported fp32 ONNX model to int8, measure it against fp32 on the model's
    own images, and write it atomically (nothing is written when a step, the gate or the floor
    fails).

    Args:
        options: what to quantize, how, and where to write it (checked on construction).
        on_plan: told the engine chosen for a QAT model, what the int8 weights' bits mean when
            they are not plainly this CPU's (:func:`weight_bits_note`), and before a
            ``target_agreement`` search starts, its estimated duration.

    Returns:
        The :class:`QuantizeReport`; ``written`` is False when it is below the floor and
        ``allow_drop`` was not given.

    Raises:
        InputError: ``model`` is missing, not ONNX or without zoo metadata; static mode
            without calibration images; ``target_agreement`` without images of the model's
            own; evaluation images that are also calibration images.
        DataError: the model's run lists images that are gone.
        QuantizationError: the accuracy gate failed, or no number of float nodes reaches
            ``target_agreement``.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    o = options
    model, mode, engine, target_agreement = o.model, o.mode, o.resolved_engine, o.target_agreement
    if target_agreement is not None and o.eval_data is None and find_run(model) is None:
        raise InputError(
            "--target-agreement needs --data DIR: held-out real images, none of them in "
            "--calib, to measure the agreement on."
        )
    qat_bits = trained_weight_bits(model)
    if on_plan is not None and o.engine == "auto" and engine == "ort" and qat_bits is not None:
        on_plan(
            "engine: ort, the int8 rounding this model was trained through (zoo distill --qat); "
            "--engine nncf to try NNCF's"
        )
    out = o.out
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
    images = eval_images(model, o.eval_data, list(meta.get("class_names") or []))
    if target_agreement is not None and images.proves_nothing:
        raise InputError(
            "--target-agreement needs --data DIR: held-out real images, none of them in "
            "--calib, to measure the agreement on."
        )
    calib_imgs: list[Path] = []
    calib_description = None
    calibration = None
    bits = None
    choice: BitsChoice | None = None  # NNCF's, where it made both bit widths
    if mode == "static":
        calib_imgs, calib_description = calibration_images(
            model, o.calib, o.calib_size, held_out=images
        )
        if not images.proves_nothing:
            check_disjoint(calib_imgs, list(images.paths), from_run=o.calib is None)
        bits = shipped_weight_bits(qat_bits, o.weight_bits)
        if engine == "ort":
            calibration = default_calibration(
                o.method, o.per_channel, weight_bits=qat_bits, asked_bits=o.weight_bits
            )
        note = weight_bits_note(bits == 7, qat_bits, o.weight_bits)
        if on_plan is not None and note is not None:
            on_plan(note)
    x_eval = np.stack([preprocess(open_image(p), pre) for p in images.paths])
    searched = None
    out.parent.mkdir(parents=True, exist_ok=True)
    with durable.scratch_dir(out) as tmpdir:
        prepped = Path(tmpdir) / "prepped.onnx"
        quant_pre_process(str(model), str(prepped), skip_symbolic_shape=False)
        tmp_out = Path(tmpdir) / "q.onnx"
        if mode == "dynamic":
            # never reduce_range: on a CPU without VNNI it lost more, not less (the digits run:
            # 58.5% against 76.3% without, docs/bench/quantize_defaults_avx2.json)
            quantize_dynamic(
                str(prepped),
                str(tmp_out),
                weight_type=QuantType.QInt8,
                per_channel=True if o.per_channel is None else o.per_channel,
                nodes_to_exclude=knn_nodes(prepped),  # the kNN score stays float
            )
        else:
            x_cal = np.stack([preprocess(open_image(p), pre) for p in calib_imgs])
            batches = list(x_cal[:, None])
            session = make_session(model)
            sess_in = session.get_inputs()[0].name
            fixed = static_batch_of(session)
            if fixed is not None and fixed > 1:  # --static-batch N: calibrated N at a time
                batches = padded_chunks(x_cal, fixed)
            if engine == "nncf":
                choice = quantize_choosing_bits(
                    prepped,
                    tmp_out,
                    batches,
                    x_cal,
                    sess_in,
                    nncf_weight_bits_to_try(qat_bits, o.weight_bits),
                    o.threads,
                )
                bits = choice.bits
            elif target_agreement is not None:
                assert calibration is not None  # engine ort, static: its weight bits
                if on_plan is not None:
                    budget = estimate_seconds(
                        len(candidates(prepped)),
                        len(batches),
                        len(x_eval),
                        _seconds_per_image(model, x_eval[:1], o.threads),
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
                    threads=o.threads,
                    workdir=Path(tmpdir),
                    reduce_range=calibration.reduce_range,
                )
                calibration = searched.calibration
            else:
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
                    "weight_bits": bits,
                    "weight_bits_agreement": None if choice is None else choice.tried(),
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
            o.threads,
            mode=mode,
            engine=engine if mode == "static" else "ort",
            calibration=calibration,
            weight_bits=bits,
            calib_description=calib_description,
            coverage=coverage(fp32_ops, tmp_out, mode),
            out=out,
            allow_drop=o.allow_drop,
        )
        gate = (
            None
            if o.max_accuracy_drop is None
            else accuracy_gate(report.top1_agreement, report.accuracy_drop, o.max_accuracy_drop)
        )
        after = advice_after(fp32_ops, mode, report.latency.ratio)
        report = replace(
            report,
            advice_before=advice,
            advice_after=after,
            gate=gate,
            search=searched,
            bits_choice=choice,
        )
        if not report.failed:
            with durable.file_output(out) as final:
                os.replace(tmp_out, final)
    return report


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
    weight_bits: int | None,
    calib_description: str | None,
    coverage: Coverage,
    out: Path,
    allow_drop: bool,
) -> QuantizeReport:
    """Both models on the evaluation images and timed in turn: the report."""
    from zoo.deploy.runtimes.loader import run_padded

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
    floor = replace(floor, allowed=allow_drop and not floor.passed)
    accuracy = acc.get("accuracy")
    return QuantizeReport(
        path=out,
        written=floor.passed or allow_drop,
        mode=mode,
        engine=engine,
        calibration=calibration,
        weight_bits=weight_bits,
        size_mb=(mib(fp32.stat().st_size), mib(q.stat().st_size)),
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
