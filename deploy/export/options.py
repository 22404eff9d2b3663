"""``zoo export``'s options: :class:`ExportOptions`, the one place their defaults and checks
live, and the choices made from them before anything is loaded (the variant a run's export
goes to, the output path). :data:`OPTION_FORMATS` says which ``--format`` uses which option and
:data:`OUTPUT_SUFFIXES` what each format's ``-o`` is named: an option the format would ignore,
or an output named as another format's, is refused before any work.

Nothing here imports torch, numpy or onnx: the CLI reads the defaults at start-up.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo import durable
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

_EXTENSIONS = {  # of the default output's name (:func:`default_output`)
    "onnx": ".onnx",
    "torchscript": ".ts",
    "pt2": ".pt2",
    "triton": "",
    "openvino": "",
    "kserve": ".isvc.yaml",
}

OUTPUT_SUFFIXES: dict[str, tuple[str, ...]] = {
    "onnx": (".onnx",),  # how zoo predict, serve, quantize and bench know an ONNX file (zoo.ref)
    "torchscript": (".ts", ".pt", ".torchscript"),  # zoo's; PyTorch's docs'; Ultralytics'
    "pt2": (".pt2",),  # torch.export.save's own
    "triton": (),  # a folder: the model repository
    "openvino": (),  # a folder: model.xml and model.bin
    "kserve": (".yaml", ".yml"),  # the InferenceService manifest (default NAME.isvc.yaml)
}
"""The suffixes ``-o`` may end in, per ``--format`` (the first: the one to suggest); ``()``: a
folder, whose name may not end in a file's suffix (:data:`_FILE_SUFFIXES`)."""

_WRITES = {
    "onnx": "an ONNX file",
    "torchscript": "a TorchScript file",
    "pt2": "a torch.export archive",
    "triton": "a Triton model repository, a folder",
    "openvino": "an OpenVINO IR folder (model.xml and model.bin)",
    "kserve": "an InferenceService manifest, a YAML file (its Triton repository beside it)",
}
_IR_FILES = (".xml", ".bin")  # what an OpenVINO IR folder holds
_FILE_SUFFIXES = frozenset(s for each in OUTPUT_SUFFIXES.values() for s in each) | set(_IR_FILES)


@dataclass(frozen=True)
class Uses:
    """Which ``--format`` values use one ``zoo export`` option (a row of
    :data:`OPTION_FORMATS`).

    Attributes:
        flag: the option as typed.
        formats: the formats whose export the option changes.
        implied: formats that always do what ``value`` of the option says: there the option is
            accepted with that value (it changes nothing and says nothing false), refused
            with any other.
        value: what ``implied`` formats always do.
        condition: the rest of its condition, said in the refusal and checked on its own.
        why: what ``--format FMT`` does with it, said in the refusal.
        note: said after the refusal (``{fmt}``: the format).
    """

    flag: str
    formats: tuple[Format, ...]
    implied: tuple[Format, ...] = ()
    value: object = None
    condition: str = ""
    why: str = "ignores it"
    note: str = ""

    def refusal(self, fmt: str) -> str:
        """The usage error's message for ``--format fmt``."""
        uses = _either(self.formats) + (f" {self.condition}" if self.condition else "")
        why = self.why
        if fmt in self.implied:
            said = self.flag if self.value is True else f"{self.flag} {self.value}"
            if self.value is False:
                said = "--no-" + self.flag.removeprefix("--")
            why = f"always does what {said} says"
        return (
            f"{self.flag} applies to --format {uses}, not {fmt!r} (--format {fmt} {why}): "
            f"drop {self.flag}, or use --format {uses}" + self.note.format(fmt=fmt)
        )


def _either(items: tuple[str, ...]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


_FROM_ONNX: tuple[Format, ...] = ("onnx", "openvino", "triton", "kserve")  # an ONNX export inside
_FP32_ONLY: tuple[Format, ...] = ("torchscript", "pt2", "triton", "kserve")  # no other precision
# never write what fails parity (torchscript/pt2: ParityError; triton/kserve: the ONNX gate's)
_GATE_NEVER_WAIVED: tuple[Format, ...] = ("torchscript", "pt2", "triton", "kserve")

OPTION_FORMATS: dict[str, Uses] = {
    "static_batch": Uses("--static-batch", ("onnx",)),
    # the batch is dynamic by default; the formats built from the ONNX export all have one
    "dynamic_batch": Uses("--dynamic-batch", ("onnx",), implied=_FROM_ONNX[1:], value=True),
    "dynamic_size": Uses("--dynamic-size", ("onnx",)),
    "opset": Uses("--opset", ("onnx", "triton", "kserve")),  # openvino: the tested opset
    "exporter": Uses("--exporter", ("onnx",), implied=_FROM_ONNX[1:], value="auto"),
    "jit": Uses("--jit", ("torchscript",)),  # pt2: torch.export
    "data": Uses("--data", _FROM_ONNX),  # torchscript, pt2: compared with eager on seeded noise
    "allow_mismatch": Uses(
        "--allow-mismatch", ("onnx", "openvino"), implied=_GATE_NEVER_WAIVED, value=False
    ),
    "max_batch": Uses("--max-batch", ("triton", "kserve")),
    "precision": Uses("--precision", ("onnx", "openvino"), implied=_FP32_ONLY, value="fp32"),
    "calib": Uses(
        "--calib", ("openvino",), condition="--precision int8", note=" (ONNX int8: zoo quantize)"
    ),
    "min_agreement": Uses("--min-agreement", ("openvino",), condition="--precision bf16 or int8"),
    "slim": Uses("--slim", ("onnx",)),
    "embed_preprocessing": Uses("--embed-preprocessing", ("onnx", "triton", "kserve")),
    "fp16_io": Uses("--fp16-io", ("onnx",), condition="--precision fp16"),
    "kserve_runtime": Uses("--kserve-runtime", ("kserve",)),
    "storage_uri": Uses("--storage-uri", ("kserve",)),
    "image": Uses("--image", ("kserve",), condition="--kserve-runtime zoo"),
    # the CLI's (zoo.cli.tracking): it registers the one file written
    "register": Uses(
        "--register",
        ("onnx", "torchscript", "pt2"),
        why="writes no single model file to register",
        note=" (register the ONNX file: zoo export RUN --register NAME, then export --format "
        "{fmt} without --register)",
    ),
}
"""Which ``--format`` uses which option: one given to a format that neither uses it
(``formats``) nor always does what its value says (``implied``) is a usage error naming the
option, the format and the formats that use it. Options not here apply to every format (the
model, ``--format``, ``-o``, ``--weights``, ``--json``). Keys: :class:`ExportOptions`' fields,
and ``register`` (the CLI's ``--register``, which only ``given`` can name)."""


def applies_to(name: str) -> str:
    """``onnx/triton/kserve``: the formats option ``name`` applies to, for its help text."""
    return "/".join(OPTION_FORMATS[name].formats)


def export_variant_name(
    fmt: str, precision: str, *, embed: bool, static_batch: int | None, fp16_io: bool
) -> str | None:
    """The variant a run's export goes to (``FOLDER/variants/NAME``), or None for the folder's
    own ``model.onnx`` (a plain fp32 ONNX graph, the artifact contract's one export)."""
    if fmt == "openvino":
        return f"openvino-{precision}"
    if fmt != "onnx":
        return None
    from zoo.variants import ExportFlags

    flags = ExportFlags(static_batch=static_batch, embedded_preprocessing=embed, fp16_io=fp16_io)
    return flags.variant_name(precision)


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
        given: the options typed (the CLI's: field names, and ``register``), so that one
            typed at its default value is judged as given; an option that differs from its
            default is given anyway.

    Raises:
        ChoiceError: an unknown ``format``, ``exporter``, ``jit``, ``precision`` or
            ``kserve_runtime``.
        UsageError: options that contradict each other; one the format does not use
            (:data:`OPTION_FORMATS`); ``output`` named as another format's
            (:data:`OUTPUT_SUFFIXES`). Each quotes the option.
        InputError: ``output`` is a folder where the format writes a file.
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
    given: frozenset[str] = field(default=frozenset(), compare=False, metadata={"cli": False})

    def __post_init__(self) -> None:
        ChoiceError.check("format", self.format, FORMATS)
        ChoiceError.check("exporter", self.exporter, EXPORTERS)
        ChoiceError.check("jit", self.jit, JIT_MODES)
        ChoiceError.check("precision", self.precision, PRECISIONS)
        ChoiceError.check("kserve_runtime", self.kserve_runtime, KSERVE_RUNTIMES)
        self._check_formats()
        self._check_output()
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
        self._check_precision()
        if self.fp16_io and (self.precision != "fp16" or self.embed_preprocessing):
            raise UsageError(
                "--fp16-io needs --format onnx and --precision fp16, without --embed-preprocessing",
                param_hint="--fp16-io",
            )
        if self.embed_preprocessing:
            self._check_embedded()
        self._check_kserve()

    def _check_formats(self) -> None:
        """Each option given (typed, or other than its default) is one ``format`` uses, or
        one whose value it always honours (:data:`OPTION_FORMATS`)."""
        given = self.given | {
            f.name
            for f in fields(self)
            if f.default is not MISSING and getattr(self, f.name) != f.default
        }
        for name, uses in OPTION_FORMATS.items():
            if name not in given or self.format in uses.formats:
                continue
            if self.format in uses.implied and getattr(self, name, None) == uses.value:
                continue
            raise UsageError(uses.refusal(self.format), param_hint=uses.flag)

    def _check_output(self) -> None:
        """``output`` is named as ``format`` writes it (:data:`OUTPUT_SUFFIXES`): a file with
        one of its suffixes, or a folder not named as a file."""
        out, fmt = self.output, self.format
        if out is None:  # default_output names it right
            return
        suffixes, suffix = OUTPUT_SUFFIXES[fmt], out.suffix
        known = suffix.lower() in _FILE_SUFFIXES
        theirs = tuple(f for f, each in OUTPUT_SUFFIXES.items() if f != fmt and suffix in each)
        whose = (
            f" ({suffix} is --format {_either(theirs)}'s)"
            if theirs
            else f" ({suffix} is a file in an OpenVINO IR folder)"
            if suffix.lower() in _IR_FILES
            else ""
        )
        if suffixes:
            durable.refuse_folder(
                out,
                flag="-o",
                writes=f"--format {fmt} writes {_WRITES[fmt]}",
                name=f"model{suffixes[0]}",
            )
        if suffixes and suffix not in suffixes:
            named = out.with_suffix(suffixes[0]) if known else Path(f"{out}{suffixes[0]}")
            raise UsageError(
                f"-o {out}: --format {fmt} writes {_WRITES[fmt]}, named "
                f"{_either(suffixes)}{whose}: e.g. -o {named}",
                param_hint="--output",
            )
        if not suffixes and known:
            folder = f"{out.with_suffix('')}" + ("_openvino" if fmt == "openvino" else "")
            raise UsageError(
                f"-o {out}: --format {fmt} writes {_WRITES[fmt]}, not a {suffix} file{whose}: "
                f"name a folder, e.g. -o {folder}",
                param_hint="--output",
            )

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
        if self.calib is not None and not int8_ir:  # the format: OPTION_FORMATS
            raise UsageError(
                "--calib applies to --format openvino --precision int8 (ONNX int8: zoo quantize)",
                param_hint="--calib",
            )
        if agree is not None and not 0 < agree <= 1:
            raise UsageError("give a share in (0, 1], e.g. 0.98", param_hint="--min-agreement")
        if agree is not None and precision == "fp32":  # the format: OPTION_FORMATS
            raise UsageError(
                "--min-agreement applies to --format openvino --precision bf16 or int8 (fp32 "
                "must agree on every image)",
                param_hint="--min-agreement",
            )

    def _check_kserve(self) -> None:
        """``storage_uri`` and ``image`` (``--format kserve``'s: :data:`OPTION_FORMATS`)."""
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
        """``embed_preprocessing``: a dynamic batch and size (its formats:
        :data:`OPTION_FORMATS`)."""
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
    return {
        f.name: f.default
        for f in fields(ExportOptions)
        if f.default is not MISSING and f.metadata.get("cli", True)
    }


__all__ = [
    "OPTION_FORMATS",
    "OUTPUT_SUFFIXES",
    "ExportOptions",
    "Uses",
    "applies_to",
    "default_output",
    "export_variant_name",
    "option_defaults",
]
