"""``zoo export``'s options: :class:`ExportOptions`, the one place their defaults and checks
live, and the choices made from them before anything is loaded (the variant a run's export
goes to, the output path).

Nothing here imports torch, numpy or onnx: the CLI reads the defaults at start-up.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.deploy.choices import (
    EXPORTERS,
    FORMATS,
    JIT_MODES,
    KSERVE_RUNTIMES,
    ONNX_PRECISIONS,
    OPENVINO_PRECISIONS,
    PRECISIONS,
    Exporter,
    Format,
    JitMode,
    KServeRuntime,
    Precision,
)
from zoo.errors import ChoiceError, UsageError

if TYPE_CHECKING:
    from zoo.ref import ModelRef

_EXTENSIONS = {
    "onnx": ".onnx",
    "torchscript": ".ts",
    "pt2": ".pt2",
    "triton": "",
    "openvino": "",
    "kserve": ".isvc.yaml",
}


def export_variant_name(
    fmt: str, precision: str, *, embed: bool, static_batch: int | None, fp16_io: bool
) -> str | None:
    """The variant a run's export goes to (``FOLDER/variants/NAME``), or None for the folder's
    own ``model.onnx`` (a plain fp32 ONNX graph, the artifact contract's one export)."""
    if fmt == "openvino":
        return f"openvino-{precision}"
    if fmt != "onnx":
        return None
    parts = [precision] if precision != "fp32" else []
    parts += ["io16"] if fp16_io else []
    parts += ["pixels"] if embed else []
    parts += [f"batch{static_batch}"] if static_batch is not None else []
    return "-".join(parts) or None


def default_output(ref: ModelRef, fmt: str, variant: str | None) -> Path:
    """Where an export goes without ``-o``: a run's or model folder's ``model.onnx`` or
    ``variants/NAME``, ``model_repository`` for Triton, else a file named after the model in
    the working folder (an OpenVINO IR: a ``NAME_openvino`` folder; KServe: ``NAME.isvc.yaml``)."""
    if fmt == "triton":
        return Path("model_repository")
    if ref.kind in ("run", "model-folder"):
        folder = ref.model_folder
        if variant is not None:  # derived files never land beside the contract's files
            from zoo.variants import variants_dir

            return variants_dir(folder) / (variant + _EXTENSIONS[fmt])
        if fmt == "onnx":
            return folder / "model.onnx"  # part of the artifact contract
        stem = (folder.parent if folder.name == "model" else folder).resolve().name
    else:
        stem = ref.shown.replace(":", "_").replace("/", "_").replace("@", "_")
    if fmt == "openvino":  # an IR folder: model.xml + model.bin
        return Path(f"{stem}_openvino")
    return Path(f"{stem}{_EXTENSIONS[fmt]}")


@dataclass(frozen=True)
class ExportOptions:
    """What ``zoo export`` is asked to do; made once, checked on construction.

    Args:
        model: what to export, a model reference's text (:meth:`zoo.ref.ModelRef.parse`).
        format: ``onnx``, ``torchscript``, ``pt2``, ``triton``, ``openvino`` or ``kserve``.
        output: the file (Triton: repository folder; OpenVINO: IR folder; KServe: the
            manifest, its Triton repository beside it); default :func:`default_output`.
        static_batch: onnx: fix the batch at this size; default: a dynamic batch axis.
        dynamic_batch: onnx: the default, kept for old scripts (refused with ``static_batch``).
        dynamic_size: dynamic height and width, proven at two resolutions.
        opset: the ONNX opset; default the tested one
            (:data:`zoo.deploy.export.onnx_export.DEFAULT_OPSET`).
        exporter: ``auto`` (dynamo, then legacy), ``dynamo`` or ``legacy``.
        jit: torchscript: ``trace`` or ``script``.
        data: real images for the gate; default the bundled photos and, for a run, a seeded
            sample of its validation images (:func:`zoo.deploy.export.parity.gate_images`).
        allow_mismatch: write the file even when parity fails.
        max_batch: triton: ``max_batch_size``.
        precision: onnx ``fp32``/``fp16``; openvino ``fp32``/``bf16``/``int8``.
        calib: openvino int8: real calibration images, disjoint from ``data``.
        min_agreement: openvino bf16/int8: top-1 agreement with PyTorch on the gate's real
            images, in (0, 1] (default 0.98).
        slim: onnx: simplify the graph with onnxslim; the checks judge the result.
        embed_preprocessing: onnx/triton: the graph takes uint8 NHWC pixels of any size.
        fp16_io: onnx, fp16: float16 inputs and outputs too.
        weights: ``none`` for random init, or a safetensors file; default the entry's own.
        kserve_runtime: kserve: ``triton`` (KServe's Triton runtime) or ``zoo`` (a
            ``zoo serve`` container built from the repository's ``Dockerfile``).
        storage_uri: kserve: where the Triton repository will be (``s3://…``, ``gs://…``,
            ``pvc://…``); default the ``file://`` URI of the one written beside the manifest.
        image: kserve, runtime ``zoo``: the container image; default
            :data:`zoo.deploy.export.kserve.DEFAULT_IMAGE`.

    Raises:
        ChoiceError: an unknown ``format``, ``exporter``, ``jit``, ``precision`` or
            ``kserve_runtime``.
        UsageError: options that contradict each other or the format, quoting the option.
    """

    model: str
    format: Format = "onnx"
    output: Path | None = None
    static_batch: int | None = None
    dynamic_batch: bool = False
    dynamic_size: bool = False
    opset: int | None = None
    exporter: Exporter = "auto"
    jit: JitMode = "trace"
    data: str | None = None
    allow_mismatch: bool = False
    max_batch: int = 32
    precision: Precision = "fp32"
    calib: str | None = None
    min_agreement: float | None = None
    slim: bool = False
    embed_preprocessing: bool = False
    fp16_io: bool = False
    weights: str | None = None
    kserve_runtime: KServeRuntime = "triton"
    storage_uri: str | None = None
    image: str | None = None

    def __post_init__(self) -> None:
        ChoiceError.check("format", self.format, FORMATS)
        ChoiceError.check("exporter", self.exporter, EXPORTERS)
        ChoiceError.check("jit", self.jit, JIT_MODES)
        ChoiceError.check("precision", self.precision, PRECISIONS)
        ChoiceError.check("kserve_runtime", self.kserve_runtime, KSERVE_RUNTIMES)
        fmt = self.format
        if self.static_batch is not None and self.static_batch < 1:
            raise UsageError(
                f"{self.static_batch}: use a batch size of 1 or more", param_hint="--static-batch"
            )
        if self.dynamic_batch and self.static_batch is not None:
            raise UsageError(
                "--dynamic-batch and --static-batch contradict each other: the batch is dynamic "
                "by default, pass only --static-batch N to fix it",
                param_hint="--static-batch",
            )
        for given, flag in (
            (self.static_batch is not None, "--static-batch"),
            (self.slim, "--slim"),
        ):
            if given and fmt != "onnx":
                raise UsageError(f"{flag} applies to --format onnx, not {fmt!r}", param_hint=flag)
        self._check_precision()
        if self.fp16_io and (fmt != "onnx" or self.precision != "fp16" or self.embed_preprocessing):
            raise UsageError(
                "--fp16-io needs --format onnx and --precision fp16, without --embed-preprocessing",
                param_hint="--fp16-io",
            )
        if self.embed_preprocessing:
            self._check_embedded()
        self._check_kserve()

    def _check_precision(self) -> None:
        """``precision``, ``calib`` and ``min_agreement`` for the chosen ``format``."""
        fmt, precision, agree = self.format, self.precision, self.min_agreement
        allowed = {"onnx": ONNX_PRECISIONS, "openvino": OPENVINO_PRECISIONS}.get(fmt, ("fp32",))
        if precision not in allowed:
            raise UsageError(
                f"--precision {precision} is not one of --format {fmt}'s: {', '.join(allowed)}"
                + (" (int8 ONNX: zoo quantize)" if fmt == "onnx" and precision == "int8" else ""),
                param_hint="--precision",
            )
        int8_ir = (fmt, precision) == ("openvino", "int8")
        if self.calib is None and int8_ir:
            raise UsageError(
                "--format openvino --precision int8 needs --calib DIR: real images like the ones "
                "the model will see, not the --data images the gate judges it on",
                param_hint="--calib",
            )
        if self.calib is not None and not int8_ir:
            raise UsageError(
                "--calib applies to --format openvino --precision int8 (ONNX int8: zoo quantize)",
                param_hint="--calib",
            )
        if agree is not None and not 0 < agree <= 1:
            raise UsageError("give a share in (0, 1], e.g. 0.98", param_hint="--min-agreement")
        if agree is not None and (fmt != "openvino" or precision == "fp32"):
            raise UsageError(
                "--min-agreement applies to --format openvino --precision bf16 or int8 (fp32 "
                "must agree on every image)",
                param_hint="--min-agreement",
            )

    def _check_kserve(self) -> None:
        """``kserve_runtime``, ``storage_uri`` and ``image``: for ``--format kserve`` only."""
        given = (
            (self.kserve_runtime != "triton", "--kserve-runtime"),
            (self.storage_uri is not None, "--storage-uri"),
            (self.image is not None, "--image"),
        )
        for was_given, flag in given:
            if was_given and self.format != "kserve":
                raise UsageError(
                    f"{flag} applies to --format kserve, not {self.format!r}", param_hint=flag
                )
        uri = self.storage_uri
        if uri is not None and "://" not in uri[1:]:
            raise UsageError(
                f"{uri!r} is not a storage URI: give where the Triton repository will be, "
                "e.g. s3://bucket/models, gs://bucket/models or pvc://claim/models",
                param_hint="--storage-uri",
            )
        if self.image is not None and (self.kserve_runtime != "zoo" or not self.image.strip()):
            raise UsageError(
                "--image names the zoo serve container: give a non-empty image with "
                "--kserve-runtime zoo (the triton runtime brings its own)",
                param_hint="--image",
            )

    def _check_embedded(self) -> None:
        """``embed_preprocessing``: a format that carries it, a dynamic batch and size."""
        if self.format not in ("onnx", "triton", "kserve"):
            raise UsageError(
                "--embed-preprocessing applies to --format onnx, triton or kserve, "
                f"not {self.format!r}",
                param_hint="--embed-preprocessing",
            )
        fixed = (
            (self.static_batch is not None, "--static-batch"),
            (self.dynamic_size, "--dynamic-size"),
        )
        for given, flag in fixed:
            if given:
                raise UsageError(
                    f"--embed-preprocessing takes images of any size in a dynamic batch: "
                    f"drop {flag}",
                    param_hint=flag,
                )

    @property
    def variant(self) -> str | None:
        """The variant a run's export goes to (:func:`export_variant_name`); None: the folder's
        own ``model.onnx``, or not a variant at all."""
        return export_variant_name(
            self.format,
            self.precision,
            embed=self.embed_preprocessing,
            static_batch=self.static_batch,
            fp16_io=self.fp16_io,
        )

    def destination(self, ref: ModelRef) -> Path:
        """Where the export goes: ``output``, else :func:`default_output` for ``ref``."""
        return self.output or default_output(ref, self.format, self.variant)


def option_defaults() -> dict[str, Any]:
    """Each option's default: the CLI's options read theirs from here."""
    return {f.name: f.default for f in fields(ExportOptions) if f.default is not MISSING}


__all__ = ["ExportOptions", "default_output", "export_variant_name", "option_defaults"]
