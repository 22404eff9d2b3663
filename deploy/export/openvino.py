"""``zoo export --format openvino``: an OpenVINO IR (``model.xml`` + ``model.bin`` in a folder)
converted from zoo's parity-proven ONNX export, optionally int8 by NNCF, judged by the same
gate against PyTorch at the precision it will run in, and written atomically.

The folder is built beside its destination and swapped in whole (:func:`zoo.durable.replace_dir`):
a kill leaves the old IR or the new one, never a new ``.bin`` under an old ``.xml``.
Weights are saved in fp32 (``compress_to_fp16=False``): the precision is the runtime's, set
explicitly (:mod:`zoo.deploy.runtimes.openvino`), never a side effect of saving.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from zoo import durable
from zoo.deploy.choices import OPENVINO_PRECISIONS
from zoo.deploy.export.graph_metadata import parity_summary
from zoo.deploy.export.onnx_export import export_onnx, load_for_export
from zoo.deploy.export.parity import TOLERANCES, check_parity, gate_images, real_images
from zoo.deploy.export.result import ExportResult
from zoo.deploy.quantize.nncf_engine import (
    BitsChoice,
    choose_bits,
    overflow_fix,
    require_nncf,
)
from zoo.deploy.quantize.options import nncf_weight_bits_to_try, trained_weight_bits
from zoo.deploy.runtimes.openvino import (
    HINTS,
    META_KEY,
    compile_cpu,
    openvino,
    require_precision,
)
from zoo.errors import ChoiceError, InputError, ParityError
from zoo.ref import ModelRef
from zoo.system import mib

IR_FILES = ("model.xml", "model.bin")
GATE_BATCH = 2  # the batch the tensor check feeds (the axis is dynamic: 1, 2, 5 checked too)


def _calibration(calib: str | None, gate_images: list[Path], pre: Any, limit: int) -> list[Any]:
    """Calibration batches for int8, from images none of which the gate judges with."""
    from zoo.deploy.quantize.calibration import check_disjoint
    from zoo.images import open_image
    from zoo.preprocess import preprocess

    if calib is None:
        raise InputError(
            "--precision int8 needs --calib DIR: a folder of real images like the ones the model "
            "will see (a few hundred; not the --data images the gate judges it on)."
        )
    images = real_images(calib, limit=limit)
    if not images:
        raise InputError(f"No images found for calibration in {calib}.")
    check_disjoint(images, gate_images)
    return [preprocess(open_image(p), pre)[None] for p in images]


def _nncf_int8(model: Any, batches: list[Any], weight_bits: int) -> Any:
    """NNCF's post-training int8 of an OpenVINO model (its native backend: FakeQuantize nodes
    that the CPU plugin runs as int8 kernels), its weights in ``weight_bits``
    (:func:`zoo.deploy.quantize.nncf_engine.overflow_fix`; both widths measured side by side by
    bench/quantize_defaults.py, rows ``openvino-nncf-weights-*``); the kNN score's nodes stay
    float, as in ``zoo quantize`` (:func:`zoo.deploy.quantize.calibration.knn_nodes`)."""
    nncf = require_nncf("--precision int8")
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters

    from zoo.knn import NODE_PREFIX

    name = model.inputs[0].get_any_name()
    # NNCF draws progress bars on stdout, where --json's report goes: they go to stderr
    with contextlib.redirect_stdout(sys.stderr):
        return nncf.quantize(
            model,
            nncf.Dataset(batches, lambda x: {name: x}),
            preset=nncf.QuantizationPreset.MIXED,
            ignored_scope=nncf.IgnoredScope(patterns=[f"{NODE_PREFIX}.*"], validate=False),
            subset_size=len(batches),
            fast_bias_correction=False,
            advanced_parameters=AdvancedQuantizationParameters(
                overflow_fix=overflow_fix(weight_bits)
            ),
        )


def _int8_choosing_bits(
    core: Any, ir: Any, batches: list[Any], trained: int | None
) -> tuple[Any, BitsChoice]:
    """NNCF's int8 of ``ir`` at the weight bits ``zoo quantize``'s NNCF engine takes here
    (:func:`~zoo.deploy.quantize.options.nncf_weight_bits_to_try`; ``trained``: a QAT model's
    bits): where there are two (a CPU without VNNI), the one whose top-1 answers on the
    calibration images agree more with fp32's (:func:`~zoo.deploy.quantize.nncf_engine.choose_bits`)."""
    require_nncf("--precision int8")  # before the fp32 pass, not after it

    def top1(model: Any, precision: str) -> np.ndarray:
        compiled = compile_cpu(core, model, precision, None)
        return np.concatenate([compiled(b)[0] for b in batches]).argmax(1)

    return choose_bits(
        nncf_weight_bits_to_try(trained, None),
        lambda bits: _nncf_int8(ir.clone(), batches, bits),
        lambda model: top1(model, "int8"),
        lambda: top1(ir, "fp32"),
        len(batches),
    )


def export_openvino(
    name: str | ModelRef,
    out: Path,
    *,
    precision: str = "fp32",
    data: str | None = None,
    calib: str | None = None,
    calib_size: int = 300,
    min_agreement: float | None = None,
    allow_mismatch: bool = False,
    weights: str | None = None,
    model: Any = None,
) -> ExportResult:
    """Export an OpenVINO IR folder (``out/model.xml``, ``out/model.bin``) that runs at
    ``precision``, proven against PyTorch by the parity gate at that precision.

    Args:
        name: what to export (a model reference, as for :func:`zoo.deploy.export.onnx_export.export_onnx`).
        out: the IR folder to write (replaced whole; it must hold only an IR if it exists).
        precision: ``fp32``, ``bf16`` (on a CPU that runs it) or ``int8`` (NNCF, needs
            ``calib``); judged by :data:`zoo.deploy.export.parity.TOLERANCES` of that precision.
        data: real images for the gate (default: the bundled samples).
        calib: int8: a folder of calibration images, disjoint from ``data``.
        calib_size: int8: at most this many calibration images.
        min_agreement: bf16/int8: the share of the gate's real images whose top-1 must agree
            with PyTorch (default 0.98); fp32 always needs all of them.
        allow_mismatch, weights, model: as for :func:`zoo.deploy.export.onnx_export.export_onnx` (``model``:
            this instance, not a fresh one: a randomly initialised entry differs each time).

    Returns:
        What was written, with the gate's report of the IR (``parity``) and of the ONNX step
        (``attempts[0]``).

    Raises:
        ChoiceError: an unknown precision.
        InputError: ``out`` holds other files; int8 without (disjoint) calibration images.
        BackendUnavailableError: OpenVINO (or NNCF) missing, or a precision this CPU cannot run.
        ParityError: the IR does not match PyTorch at its precision (nothing is written).
        Everything :func:`zoo.deploy.export.onnx_export.export_onnx` raises.
    """
    ChoiceError.check("precision", precision, OPENVINO_PRECISIONS)
    tolerances = TOLERANCES[precision]
    if min_agreement is not None:
        if precision == "fp32" or not 0 < min_agreement <= 1:
            raise InputError(
                f"--min-agreement {min_agreement}: give a share in (0, 1] for --precision bf16 or "
                "int8 (fp32 must agree on every image)."
            )
        tolerances = replace(tolerances, min_agreement=min_agreement)
    if out.suffix in (".xml", ".bin", ".onnx"):
        raise InputError(
            f"-o {out}: an OpenVINO export is a folder (it holds {' and '.join(IR_FILES)}): give "
            f"a folder, e.g. -o {out.with_suffix('')}_openvino."
        )
    ov = openvino()
    core = ov.Core()
    if out.exists() and (not out.is_dir() or set(p.name for p in out.iterdir()) - set(IR_FILES)):
        raise InputError(
            f"{out} exists and is not an OpenVINO IR folder: give a new folder (-o DIR); zoo "
            f"replaces a folder holding only {' and '.join(IR_FILES)}."
        )
    require_precision(core, precision)  # before the work, not after it
    ref = ModelRef.parse(name)
    fresh, info, _ = load_for_export(ref, weights)
    model = (model if model is not None else fresh).eval()
    images = gate_images(ref, data)
    batches = (
        _calibration(calib, list(images.paths), info.preprocessing(), calib_size)
        if precision == "int8"
        else None
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with durable.scratch_dir(out) as work:
        onnx_file = Path(work) / "model.onnx"
        step = export_onnx(ref, onnx_file, data=data, weights=weights, model=model)
        from zoo.onnx_meta import read_metadata

        meta = read_metadata(onnx_file)
        trained = trained_weight_bits(onnx_file)  # a QAT model's (its export's metadata)
        ir = ov.convert_model(str(onnx_file))
    choice = None
    if batches is not None:
        ir, choice = _int8_choosing_bits(core, ir, batches, trained)
    compiled = compile_cpu(core, ir, precision, None)
    request = compiled.create_infer_request()

    def run(x: np.ndarray) -> np.ndarray:
        request.infer({0: x})
        return np.array(request.get_output_tensor(0).data, dtype=np.float32)

    parity = check_parity(
        model,
        info,
        run,
        export_batch=GATE_BATCH,
        dynamic_batch=True,
        dynamic_size=False,
        images=images,
        tolerances=tolerances,
    )
    result = ExportResult(
        path=str(out / IR_FILES[0]),
        format="openvino",
        model=ref.shown,
        opset=step.opset,
        exporter=f"{step.exporter} → openvino.convert_model",
        attempts=[{"onnx": step.to_dict()}],
        parity=parity,
        precision=precision,
    )
    if not parity.passed and not allow_mismatch:
        raise ParityError(
            f"OpenVINO {precision} IR of {ref.shown} does not match PyTorch: "
            + "; ".join(parity.failures())
            + ". Nothing was written; --allow-mismatch writes it anyway."
        )
    ir_meta = {
        **meta,
        "format": "openvino",
        "precision": precision,
        "openvino": {
            "version": ov.__version__,
            "inference_precision": HINTS[precision],
            "int8": {
                "engine": "nncf",
                "preset": "mixed",
                "calib_images": len(batches),
                "weight_bits": choice.bits,
                "weight_bits_agreement": choice.tried(),
            }
            if batches is not None and choice is not None
            else None,
        },
        "parity": {**meta["parity"], **parity_summary(parity)},
    }
    ir.set_rt_info(json.dumps(ir_meta), META_KEY)
    tmp = durable.temp_path(out, folder=True)
    try:
        ov.save_model(ir, str(tmp / IR_FILES[0]), compress_to_fp16=False)
        durable.replace_dir(tmp, out, label=out.name)  # a kill: the old IR or the new one
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result.size_mb = mib(sum((out / f).stat().st_size for f in IR_FILES))
    return result


__all__ = ["IR_FILES", "export_openvino"]
