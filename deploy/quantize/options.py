"""``zoo quantize``'s options: :class:`QuantizeOptions`, the one place their defaults and
checks live, and the choices made from them before anything is read (the engine ``auto``
stands for, the output path, onnxruntime's calibration setting).

The defaults come from bench/quantize_defaults.py on a fine-tuned MobileNetV2 (digits, 96 px;
docs/bench/quantize_defaults.json): onnxruntime's best there was U8S8 QDQ, minmax, per-channel
(−2.5 points), with ``reduce_range`` decided here from the CPU's flags (on without VNNI) and a
QAT model's training (on for a model trained for 7-bit weights);
NNCF kept the most (−0.8 points), so a drop below the floor points to ``--engine nncf``.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo import durable
from zoo.deploy.choices import (
    CALIB_METHODS,
    QUANT_ENGINES,
    QUANT_MODES,
    CalibMethod,
    QuantEngine,
    QuantMode,
)
from zoo.errors import ArtifactError, ChoiceError, InputError, UsageError
from zoo.system import int8_weight_bits

if TYPE_CHECKING:
    from zoo.deploy.quantize.calibration import Calibration

DEFAULT_CALIB_SIZE = 300
"""Calibration images by default (the bench's setting; its winner used them all)."""
DEFAULT_METHOD: CalibMethod = "minmax"
"""onnxruntime's activation ranges by default: bench/quantize_defaults.py's best onnxruntime
setting (U8S8 minmax; S8S8 symmetric lost 4–7 points where this lost 2.5)."""


def resolve_engine(
    engine: QuantEngine,
    mode: QuantMode,
    method: CalibMethod | None,
    per_channel: bool | None,
    target_agreement: float | None,
    qat: bool = False,
) -> QuantEngine:
    """``auto`` → ``nncf`` where NNCF is installed and nothing asked for onnxruntime's own
    settings (``method``, ``per_channel``, ``target_agreement``: it kept the most accuracy:
    docs/bench/quantize_defaults.json), else ``ort``; and ``ort`` for a model trained through
    onnxruntime's rounding (``qat``: zoo distill --qat; NNCF's own ranges lost what QAT gained
    there: docs/bench/qat.json). ``--weight-bits`` both engines take."""
    if engine != "auto":
        return engine
    asked = (method, per_channel, target_agreement)
    ort_only = qat or any(a is not None for a in asked)
    if mode != "static" or ort_only:
        return "ort"
    return "nncf" if importlib.util.find_spec("nncf") is not None else "ort"


def trained_weight_bits(model: Path) -> int | None:
    """The int8 weights' bits ``model`` was trained through (``zoo distill --qat``: 8, or 7 as
    ``reduce_range``); None: not quantization-aware. Said by its own metadata
    (``quantization_aware``, ``qat_weight_bits``: 8 where a file from before zoo wrote the
    bits says nothing), wherever the file was copied, and for a file exported before zoo wrote
    either, by the model folder it sits in (:func:`zoo.artifact.qat_weight_bits`).

    Raises:
        InputError: the metadata says quantization-aware with bits other than 8 or 7.
    """
    from zoo.artifact import qat_weight_bits
    from zoo.onnx_meta import read_metadata
    from zoo.variants import model_folder_of

    try:
        meta = read_metadata(model)
    except (InputError, ValueError):  # not readable here: the quantizer reports it
        meta = {}
    said = meta.get("quantization_aware")
    if isinstance(said, bool):
        bits = meta.get("qat_weight_bits")  # None: written before zoo recorded the bits: 8
        if said and bits is not None and (type(bits) is not int or bits not in (7, 8)):
            raise InputError(
                f"{model}'s metadata says qat_weight_bits {bits!r}: 8 or 7 expected. "
                "Export the run again (zoo export RUN) to write it afresh."
            )
        return (bits or 8) if said else None
    folder = model_folder_of(model)
    try:
        return qat_weight_bits(folder) if folder is not None else None
    except ArtifactError:  # a broken folder: its own commands report it
        return None


def variant_name(mode: QuantMode, engine: QuantEngine = "ort") -> str:
    """The one naming rule of a quantized file (:func:`zoo.variants.quantized_variant_name`):
    ``int8-dynamic``, ``int8-static`` (onnxruntime) or ``int8-nncf``."""
    from zoo.variants import quantized_variant_name

    return quantized_variant_name("nncf" if mode == "static" and engine == "nncf" else mode)


def default_output(model: Path, mode: QuantMode, engine: QuantEngine = "ort") -> Path:
    """``FOLDER/variants/NAME.onnx`` for a model in a model folder (a run's ``model/``), which
    stays readable, named after its source when that is a variant
    (:func:`zoo.variants.derived_variant_name`: ``variants/batch4.onnx`` →
    ``variants/batch4-int8-static.onnx``, leaving the ``int8-static`` of ``model.onnx`` alone);
    else ``NAME`` beside the input (``m.onnx`` → ``m.int8-static.onnx``)."""
    from zoo.variants import default_variant_path, derived_variant_name

    name = variant_name(mode, engine)
    return default_variant_path(model, derived_variant_name(model, name)) or model.with_name(
        f"{model.stem}.{name}.onnx"
    )


def default_calibration(
    method: CalibMethod | None = None,
    per_channel: bool | None = None,
    flags: frozenset[str] | None = None,
    weight_bits: int | None = None,
    asked_bits: int | None = None,
) -> Calibration:
    """onnxruntime's static setting: U8S8 QDQ (uint8 asymmetric activations, int8 weights),
    per-channel weights, :data:`DEFAULT_METHOD` ranges, unless given; ``reduce_range`` (7-bit
    weights) on a CPU without VNNI (``flags``: this machine's by default), where uint8 × int8
    sums can saturate. Measured on the digits run (docs/bench/quantize_defaults.json): S8S8
    symmetric ranges lost more accuracy with every method, and ``reduce_range`` on a VNNI CPU
    lost more again. ``weight_bits``: the bits a ``zoo distill --qat`` model trained for; the
    weights get the fewer of those and this CPU's: a model trained for 7 keeps them on a VNNI
    CPU (the rounding it trained through; nothing saturates there), one trained for 8 gets 7 on
    a CPU without VNNI (measured, docs/bench/qat_avx2.json: kept at 8 bits there it scored
    79.7–83.3 %, at 7 bits 96.4–97.5 %: saturation costs far more than the mismatch).
    ``asked_bits``: ``--weight-bits``, which decides instead (:func:`weight_bits_note`)."""
    from zoo.deploy.quantize.calibration import Calibration  # numpy: not at CLI start-up

    return Calibration(
        method=method or DEFAULT_METHOD,
        per_channel=True if per_channel is None else per_channel,
        reduce_range=shipped_weight_bits(weight_bits, asked_bits, flags) == 7,
    )


def shipped_weight_bits(
    trained: int | None, asked: int | None, flags: frozenset[str] | None = None
) -> int:
    """The int8 weights' bits a static quantization gives (onnxruntime's; NNCF's where it
    makes one width, :func:`nncf_weight_bits_to_try`): ``asked`` (``--weight-bits``) when
    given, else the fewer of a QAT model's ``trained`` bits and this CPU's
    (:func:`zoo.system.int8_weight_bits`; ``flags``: this machine's by default)."""
    return asked if asked is not None else min(trained or 8, int8_weight_bits(flags))


def nncf_weight_bits_to_try(
    trained: int | None, asked: int | None, flags: frozenset[str] | None = None
) -> tuple[int, ...]:
    """The int8 weight bits NNCF makes, this CPU's first: both (7, 8) on a CPU without VNNI
    when neither ``--weight-bits`` (``asked``) nor a QAT model's ``trained`` bits decide (neither
    width wins on every model there: :mod:`zoo.deploy.quantize.nncf_engine`), else the one
    :func:`shipped_weight_bits` gives."""
    bits = shipped_weight_bits(trained, asked, flags)
    return (7, 8) if asked is None and trained is None and bits == 7 else (bits,)


def weight_bits_note(reduce_range: bool, trained: int | None, asked: int | None) -> str | None:
    """What ``zoo quantize`` says about the int8 weights' bits (``reduce_range``: 7) when they
    are not plainly right for this CPU: a QAT model trained for 8 given this CPU's 7, or
    ``--weight-bits`` (``asked``) for another CPU or another rounding than the model trained
    through (``trained``); None when there is nothing to say."""
    cpu = int8_weight_bits()
    if asked is None:
        if trained == 8 and reduce_range:
            return (
                "note: this model trained (zoo distill --qat) for 8-bit int8 weights; this CPU "
                "has no VNNI, where int8 kernels saturate 8-bit weights, so they get 7 bits "
                "(with onnxruntime's int8 on the digits 96.4-97.5% against 79.7-83.3% kept at "
                "8: docs/bench/qat_avx2.json). To ship the rounding it trained through, train for "
                "this CPU (zoo distill --qat --qat-weights 7), quantize with --weight-bits 8 "
                "for a VNNI server, or quantize and run on a CPU with VNNI"
            )
        return None
    said = []
    if asked == 8 and cpu == 7:
        said.append(
            "--weight-bits 8 on a CPU without VNNI makes a file for a CPU with VNNI: this one's "
            "kernels saturate 8-bit weights, so the accuracy measured below understates what "
            "it scores there (a QAT model for 8 bits: 79.7-83.3% here against 96.4-97.5% at 7 "
            "bits, docs/bench/qat_avx2.json). Measure it there (zoo eval FILE --data DIR); "
            "--allow-drop writes it should it fall below the floor here"
        )
    elif asked == 7 and cpu == 8:
        said.append(
            "--weight-bits 7 on a CPU with VNNI makes a file for a CPU without it: here 8 bits "
            "would not saturate and keep more accuracy"
        )
    if trained is not None and trained != asked:
        said.append(
            f"this model trained (zoo distill --qat) for {trained}-bit weights: "
            f"--weight-bits {asked} ships another rounding than it learnt"
        )
    return "note: " + "; ".join(said) if said else None


def check_target(target: float) -> float:
    """``target`` if it is a share in (0, 1].

    Raises:
        UsageError: it is not (NaN, ≤ 0 or > 1), quoting it.
    """
    if not (math.isfinite(target) and 0.0 < target <= 1.0):
        raise UsageError(
            f"--target-agreement must be in (0, 1], a share of top-1 answers: got {target!r}. "
            "e.g. 0.98",
            param_hint="--target-agreement",
        )
    return target


@dataclass(frozen=True)
class QuantizeOptions:
    """What ``zoo quantize`` is asked to do; made once, checked on construction.

    Args:
        model: an fp32 ``.onnx`` file exported by zoo (its metadata gives preprocessing and
            class names).
        output: the int8 ``.onnx`` file to write; default :func:`default_output` (a run's
            ``model/variants/int8-static.onnx``, ``variants/SOURCE-int8-static.onnx`` from
            the variant ``SOURCE``, or beside the input).
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
        allow_drop: write the file even when it is below the floor
            (:func:`~zoo.deploy.quantize.verdict.check_floor`).
        weight_bits: static: the int8 weights' bits, 8 or 7 (onnxruntime's ``reduce_range``;
            NNCF's overflow fix: :func:`zoo.deploy.quantize.nncf_engine.overflow_fix`); default
            None: :func:`shipped_weight_bits`' rule (the fewer of a QAT model's and this CPU's;
            NNCF on a CPU without VNNI makes both: :func:`nncf_weight_bits_to_try`). 8 on a
            CPU without VNNI makes a file for a VNNI server; said by :func:`weight_bits_note`.

    Raises:
        ChoiceError: an unknown ``mode``, ``method`` or ``engine``.
        UsageError: ``calib`` with dynamic mode; ``target_agreement`` out of (0, 1]; an
            ``output`` not named ``.onnx``; ``weight_bits`` other than 8 or 7.
        InputError: ``model`` or ``output`` is an existing folder; ``engine`` nncf without static mode or with a ``method``;
            ``target_agreement`` without static ``ort`` mode, or with a ``method`` or
            ``per_channel`` of its own; ``weight_bits`` without static mode.
    """

    model: Path
    output: Path | None = None
    mode: QuantMode = "static"
    calib: str | None = None
    method: CalibMethod | None = None
    per_channel: bool | None = None
    eval_data: str | None = None
    max_accuracy_drop: float | None = None
    threads: int | None = None
    calib_size: int = DEFAULT_CALIB_SIZE
    engine: QuantEngine = "auto"
    target_agreement: float | None = None
    allow_drop: bool = False
    weight_bits: int | None = None

    def __post_init__(self) -> None:
        if self.model.is_dir():
            self._refuse_folder(self.model)
        ChoiceError.check("mode", self.mode, QUANT_MODES)
        if self.method is not None:
            ChoiceError.check("method", self.method, CALIB_METHODS)
        ChoiceError.check("engine", self.engine, QUANT_ENGINES)
        engine = self.resolved_engine
        if engine == "nncf" and self.mode != "static":
            raise InputError("--engine nncf quantizes statically: use --mode static.")
        if engine == "nncf" and self.method is not None:
            raise InputError(
                "--engine nncf picks activation ranges its own way: drop --method (it applies "
                "to --engine ort)."
            )
        if self.target_agreement is not None:
            self._check_search(self.target_agreement, engine)
        if self.weight_bits is not None:
            self._check_weight_bits(self.weight_bits)
        if self.mode == "dynamic" and self.calib is not None:
            raise UsageError(
                "--calib applies to --mode static: it calibrates activations, which --mode "
                "dynamic does not quantize: drop --calib, or use --mode static.",
                param_hint="--calib",
            )
        if self.output is not None:
            self._check_output(self.output)

    @staticmethod
    def _refuse_folder(model: Path) -> None:
        """``model`` is a folder: name the exported file in it, or (a run or model folder) the
        export that makes one."""
        from zoo.artifact import is_model_folder
        from zoo.run_images import find_run

        inside = next(
            (f for f in (model / "model.onnx", model / "model" / "model.onnx") if f.is_file()),
            None,
        )
        what = f"{model} is a folder; zoo quantize takes an exported fp32 .onnx file"
        if inside is not None:
            raise InputError(f"{what}: give {inside}.")
        if find_run(model) is not None or is_model_folder(model):
            raise InputError(f"{what}: export one first (zoo export {model}).")
        raise InputError(f"{what}.")

    def _check_output(self, out: Path) -> None:
        """``output`` names an ``.onnx`` file, refused before any calibration work rather than
        when the finished model is moved there."""
        durable.refuse_folder(
            out, flag="-o", writes="zoo quantize writes one int8 .onnx file", name="model-int8.onnx"
        )
        if out.suffix != ".onnx":
            raise UsageError(
                f"-o {out}: zoo quantize writes an ONNX model, named .onnx: e.g. -o "
                f"{out.with_suffix('.onnx')}",
                param_hint="--output",
            )

    def _check_search(self, target: float, engine: QuantEngine) -> None:
        """``target_agreement``'s own checks."""
        check_target(target)
        if self.mode != "static" or engine != "ort":
            raise InputError(
                "--target-agreement keeps nodes float in onnxruntime's static QDQ int8: use "
                f"--mode static --engine ort (got --mode {self.mode} --engine {engine})."
            )
        if self.method is not None or self.per_channel is not None:
            raise InputError(
                "--target-agreement tries every --method and --per-channel/--no-per-channel "
                "setting itself and reports which won: drop "
                + (
                    f"--method {self.method}."
                    if self.method is not None
                    else "--per-channel/--no-per-channel."
                )
            )

    def _check_weight_bits(self, bits: int) -> None:
        """``weight_bits``' own checks."""
        if bits not in (7, 8):
            raise UsageError(
                f"--weight-bits {bits}: int8 weights take 8 bits, or 7 (for CPUs without VNNI).",
                param_hint="--weight-bits",
            )
        if self.mode != "static":
            raise InputError(
                "--weight-bits sets static int8 weights: use --mode static (got --mode "
                f"{self.mode}). Dynamic mode keeps 8 bits (7 lost 18 points on the digits: "
                "docs/bench/quantize_defaults_avx2.json)."
            )

    @property
    def resolved_engine(self) -> QuantEngine:
        """The engine that quantizes (``auto`` resolved: :func:`resolve_engine`)."""
        return resolve_engine(
            self.engine,
            self.mode,
            self.method,
            self.per_channel,
            self.target_agreement,
            qat=trained_weight_bits(self.model) is not None,
        )

    @property
    def out(self) -> Path:
        """Where the int8 model goes: ``output``, else :func:`default_output`."""
        return self.output or default_output(self.model, self.mode, self.resolved_engine)


def option_defaults() -> dict[str, Any]:
    """Each option's default: the CLI's options read theirs from here."""
    return {f.name: f.default for f in fields(QuantizeOptions) if f.default is not MISSING}
