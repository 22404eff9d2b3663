"""``zoo quantize --engine nncf``: static int8 by NNCF's post-training quantization (ONNX
backend) instead of onnxruntime's, set up so that onnxruntime's CPU kernels run every layer in
int8.

Why NNCF: its ranges (the ``mixed`` preset: symmetric weights, asymmetric activations), bias
correction and overflow fix keep far more of the fp32 answers on depthwise networks. Measured
on the real ImageNet MobileNetV2, 500 held-out photo crops: 85 % top-1 agreement against
onnxruntime's 66 %, at the same ~0.7× fp32 latency (docs/benchmarks.md, "int8").

One setting and one rewrite make its graph fast in onnxruntime (each was measured: without
them NNCF's model ran 2.2× *slower* than fp32): per-tensor activation scales (onnxruntime's
fused ``QLinearConv`` takes one input scale), and NNCF's signed int8 activation pairs rewritten
as uint8 with the zero point moved by 128 — the same real values — because onnxruntime fuses
only uint8 activations on x86 (written here: neither library offers it).

The int8 weights' bits: for 7, NNCF's overflow fix gives 7-bit weights to every dense
convolution and matmul (depthwise ones cannot saturate and keep 8); for 8, to the first layer
alone (NNCF's default). On a CPU with VNNI, 8 (nothing saturates). On one without, whose uint8
× int8 sums can saturate 8-bit weights, neither width wins on every model (measured on an AVX2
CPU: the digits run, bench/quantize_defaults.py, and the ImageNet MobileNetV2 on photo crops,
bench/deploy_bench.py; the README quotes them), so both are made and the one that keeps more
of fp32's top-1 answers on the calibration images is written (:func:`quantize_choosing_bits`);
``--weight-bits`` (or a QAT model's bits) decides instead
(:func:`zoo.deploy.quantize.options.nncf_weight_bits_to_try`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from zoo.errors import InputError

M = TypeVar("M")  # an int8 model: an ONNX file's path, or an OpenVINO model


def require_nncf(what: str) -> Any:
    """The ``nncf`` module.

    Raises:
        InputError: it is not installed: ``what`` (the option that needs it) and how to get it.
    """
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # NNCF imports it
    try:
        import nncf
    except ImportError as exc:
        raise InputError(f"{what} needs NNCF: pip install 'zoo[nncf]' ({exc}).") from None
    return nncf


def nncf_quantize(
    fp32: Path, out: Path, batches: list[np.ndarray], input_name: str, weight_bits: int
) -> None:
    """Quantize the ONNX model at ``fp32`` with NNCF on the calibration ``batches`` and write
    the int8 graph to ``out``, its weights in ``weight_bits`` (8, or 7: :func:`overflow_fix`).

    Raises:
        InputError: NNCF is not installed (the way to get it).
    """
    nncf = require_nncf("--engine nncf")
    import onnx

    dataset = nncf.Dataset(batches, lambda x: {input_name: x})
    # NNCF draws progress bars on stdout, where --json's report goes: they go to stderr
    with contextlib.redirect_stdout(sys.stderr):
        quantized = _quantize(nncf, onnx.load(str(fp32)), dataset, len(batches), weight_bits)
    onnx.save(uint8_activations(quantized), str(out))


@dataclass(frozen=True)
class BitsChoice:
    """The int8 weights' bits NNCF's model was written with, and what decided them.

    Attributes:
        bits: the bits written (8, or 7: :func:`overflow_fix`).
        agreement: each tried bit width's top-1 agreement with fp32 on the calibration images;
            empty where only one was made (a VNNI CPU, ``--weight-bits``, a QAT model's bits).
        n_images: the calibration images the agreement was measured on.
    """

    bits: int
    agreement: dict[int, float] = field(default_factory=dict)
    n_images: int = 0

    def tried(self) -> dict[str, float] | None:
        """``{"7": agreement, "8": agreement}`` for the JSON report and the file's metadata;
        None where one bit width was made."""
        return {str(b): a for b, a in self.agreement.items()} if len(self.agreement) > 1 else None

    def describe(self) -> str:
        """The summary's line: the bits, and where two were made, why these."""
        if len(self.agreement) < 2:
            return f"weights: {self.bits} bits"
        tried = ", ".join(f"{b}-bit {a:.1%}" for b, a in self.agreement.items())
        tie = len(set(self.agreement.values())) == 1
        return (
            f"weights: {self.bits} bits, "
            + ("a tie of the two" if tie else "the better of two")
            + f" on this CPU without VNNI (top-1 agreement with fp32 on the {self.n_images} "
            f"calibration images: {tried}; --weight-bits decides instead)"
        )


def better_bits(agreement: dict[int, float]) -> int:
    """The bits whose model kept the most answers; a tie goes to the first tried."""
    return max(agreement, key=lambda b: agreement[b])


def choose_bits(
    candidates: tuple[int, ...],
    make: Callable[[int], M],
    top1: Callable[[M], np.ndarray],
    fp32_top1: Callable[[], np.ndarray],
    n_images: int,
) -> tuple[M, BitsChoice]:
    """The int8 model at each of ``candidates`` (weight bits, this CPU's first; ``make``) and
    the one whose top-1 answers on the calibration images (``top1``) agree most with fp32's
    (``fp32_top1``; a tie: the first), for an ONNX file (:func:`quantize_choosing_bits`) or an
    OpenVINO model alike. One candidate is made without measuring."""
    if len(candidates) == 1:
        return make(candidates[0]), BitsChoice(candidates[0])
    want = fp32_top1()
    made = {bits: make(bits) for bits in candidates}
    agreement = {bits: float((top1(m) == want).mean()) for bits, m in made.items()}
    best = better_bits(agreement)
    return made[best], BitsChoice(best, agreement, n_images)


def quantize_choosing_bits(
    fp32: Path,
    out: Path,
    batches: list[np.ndarray],
    x_cal: np.ndarray,
    input_name: str,
    candidates: tuple[int, ...],
    threads: int | None,
) -> BitsChoice:
    """:func:`choose_bits` for the ONNX file ``fp32``: :func:`nncf_quantize` at each width
    beside ``out``, the chosen one moved to ``out``, the others removed (on failure too)."""
    from zoo.deploy.quantize.search import logits

    require_nncf("--engine nncf")  # before the fp32 pass, not after it

    def make(bits: int) -> Path:
        path = out.with_name(f"{out.stem}.w{bits}{out.suffix}")
        nncf_quantize(fp32, path, batches, input_name, bits)
        return path

    try:
        chosen, choice = choose_bits(
            candidates,
            make,
            lambda path: logits(path, x_cal, threads).argmax(1),
            lambda: logits(fp32, x_cal, threads).argmax(1),
            len(x_cal),
        )
        os.replace(chosen, out)
    finally:
        for bits in candidates:
            out.with_name(f"{out.stem}.w{bits}{out.suffix}").unlink(missing_ok=True)
    return choice


def overflow_fix(weight_bits: int) -> Any:
    """NNCF's ``OverflowFix`` for int8 weights of ``weight_bits``: 7 bits on every dense
    convolution and matmul (``ENABLE``; NNCF leaves depthwise ones at 8, which cannot saturate)
    for 7, else on the first layer alone (``FIRST_LAYER``, NNCF's default)."""
    from nncf.quantization.advanced_parameters import OverflowFix

    return OverflowFix.ENABLE if weight_bits == 7 else OverflowFix.FIRST_LAYER


def _quantize(nncf: Any, model: Any, dataset: Any, n: int, weight_bits: int) -> Any:
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        QuantizationParameters,
    )

    from zoo.knn import NODE_PREFIX

    return nncf.quantize(
        model,
        dataset,
        preset=nncf.QuantizationPreset.MIXED,
        # the kNN score's nodes stay float, as in the onnxruntime engine (calibration.knn_nodes)
        ignored_scope=nncf.IgnoredScope(patterns=[f"{NODE_PREFIX}.*"], validate=False),
        subset_size=n,
        fast_bias_correction=False,
        advanced_parameters=AdvancedQuantizationParameters(
            overflow_fix=overflow_fix(weight_bits),
            activations_quantization_params=QuantizationParameters(per_channel=False),
        ),
    )


def uint8_activations(model: Any) -> Any:
    """Rewrite int8 activation ``QuantizeLinear``/``DequantizeLinear`` pairs as uint8 with the
    zero point + 128 (the same real values: ``(q + 128) - (z + 128) = q - z``), in place.

    Weights (a ``DequantizeLinear`` of a constant) stay int8, as onnxruntime's kernels want
    them. The graph's recorded intermediate types are dropped: they still say int8.
    """
    from onnx import numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    moved: dict[str, str] = {}
    for node in graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 3:
            continue
        zero = node.input[2]
        if zero not in inits or (node.op_type == "DequantizeLinear" and node.input[0] in inits):
            continue
        z = numpy_helper.to_array(inits[zero])
        if z.dtype != np.int8:
            continue
        if zero not in moved:
            shifted = (z.astype(np.int16) + 128).astype(np.uint8)
            graph.initializer.append(numpy_helper.from_array(shifted, zero + "_u8"))
            moved[zero] = zero + "_u8"
        node.input[2] = moved[zero]
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]  # the int8 zero points replaced
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.value_info[:]
    return model
