"""Derived variants of a model folder: the one place that knows where they live and whether
they still hold the folder's weights.

A model folder (``model.safetensors`` + ``config.json`` + ``README.md`` [+ ``model.onnx``]) may
hold a ``variants/`` sub-folder of files derived from its weights: ``variants/int8-static.onnx``,
``variants/fp16.onnx``, ``variants/openvino-int8/model.xml`` (+ ``.bin``). Commands that derive
a file write there by default, so the folder stays readable whatever they write; a variant is
named by its file's stem (``int8-static``) or its IR folder (``openvino-int8``). A file made from
another variant is named after it (:func:`derived_variant_name`: ``zoo quantize
variants/batch4.onnx`` writes ``variants/batch4-int8-static.onnx``), so it never takes the place
of the one made from ``model.onnx``.

Staleness is computed, never stored: an export records the sha256 of the weights it was made
from (``source_weights_sha256`` in its zoo metadata); when that differs from the folder's
``config.json`` ``weights_sha256`` (a resumed run shipped new weights), the file is stale.
Imports no torch.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from zoo.artifact import ONNX_FILE, VARIANTS_DIR, is_model_folder, read_config
from zoo.calibration import Calibration
from zoo.errors import ArtifactError, InputError
from zoo.model_config import ModelConfig

IR_FILE = "model.xml"  # the IR inside a variant folder (zoo export --format openvino)
EXPORT_NAME = ONNX_FILE  # the folder's own export, listed by stale_exports only
VariantKind = Literal["onnx", "openvino"]


class _StderrLine(logging.Handler):
    """``warning: MESSAGE`` on the current ``sys.stderr``, whatever the root logger's setup."""

    def emit(self, record: logging.LogRecord) -> None:
        sys.stderr.write(f"{record.levelname.lower()}: {record.getMessage()}\n")


log = logging.getLogger("zoo.variants")
log.addHandler(_StderrLine())
log.propagate = False  # one line, not also the root's formatted copy


def variants_dir(folder: str | os.PathLike[str]) -> Path:
    """The ``variants/`` sub-folder of the model folder ``folder`` (it may not exist yet)."""
    return Path(folder) / VARIANTS_DIR


def model_folder_of(file: str | os.PathLike[str]) -> Path | None:
    """The model folder a derived file belongs to: its parent (``model.onnx``), or the folder
    above ``variants/`` (``variants/x.onnx``, ``variants/openvino-int8/model.xml``); None
    for a file anywhere else."""
    file = Path(file)
    parent = file.parent  # the user's spelling, not resolved: messages show what they typed
    candidates = [parent]
    for up in (parent, parent.parent):  # variants/x.onnx, variants/NAME/model.xml
        if up.name == VARIANTS_DIR:
            candidates.append(up.parent)
        elif up.resolve().name == VARIANTS_DIR:  # "." or ".." spelled inside variants/
            candidates.append(up.resolve().parent)
    return next((c for c in candidates if is_model_folder(c)), None)


def default_variant_path(source_onnx: Path, name: str) -> Path | None:
    """Where a file derived from ``source_onnx`` goes by default.

    Args:
        source_onnx: the graph a command derives from (``runs/X/model/model.onnx``).
        name: the variant's name, without suffix (``int8-static``).

    Returns:
        ``FOLDER/variants/NAME.onnx`` when ``source_onnx`` sits in a model folder or in such
        a folder's ``variants/``; ``None`` for a file elsewhere (the caller picks its own
        default, e.g. beside the source).
    """
    folder = model_folder_of(Path(source_onnx))
    if folder is None:
        return None
    return variants_dir(folder) / f"{name}.onnx"


def quantized_variant_name(quantization: str) -> str:
    """The one naming rule of a quantized file made from a folder's ``model.onnx``:
    ``int8-dynamic``, ``int8-static`` (onnxruntime) or ``int8-nncf``, for ``quantization`` as
    :attr:`Variant.quantization` says it (``dynamic``, ``static``, ``nncf``)."""
    return f"int8-{quantization}"


def derived_variant_name(source_onnx: Path, name: str) -> str:
    """The name of the variant ``name`` (``int8-static``) made from ``source_onnx``.

    Returns:
        ``name`` when ``source_onnx`` is its folder's ``model.onnx`` (or sits in no model
        folder); ``SOURCE-NAME`` when it is the variant ``SOURCE`` (``batch4-int8-static``
        from ``variants/batch4.onnx``): a file made from a variant says which, and never takes
        the place of the one made from ``model.onnx``.
    """
    source_onnx = Path(source_onnx)
    folder = model_folder_of(source_onnx)
    source = None if folder is None else _name_in_folder(source_onnx, folder)
    return name if source in (None, EXPORT_NAME) else f"{source}-{name}"


def _name_in_folder(path: Path, folder: Path) -> str:
    """The name ``path`` goes by among ``folder``'s exports: ``model.onnx``, a variant file's
    stem (``batch4``) or an IR's folder (``openvino-int8``)."""
    parent = path.parent.resolve()  # "." or ".." may be spelled inside variants/
    if parent == folder.resolve():
        return EXPORT_NAME
    return path.stem if parent.name == VARIANTS_DIR else parent.name


@dataclass(frozen=True)
class ExportFlags:
    """The ``zoo export`` flags a graph was made with, besides ``--precision``, as its zoo
    metadata records them (:mod:`zoo.deploy.export.graph_metadata`: ``input``,
    ``static_batch``, ``dynamic_size``, ``slim``): what a refresh must pass again to make the
    same kind of file. A quantized file's metadata is its source's, so its flags are those of
    the export it was quantized from.

    Attributes:
        static_batch: ``--static-batch N``: the graph's fixed batch (None: a dynamic batch).
        dynamic_size: ``--dynamic-size``: dynamic height and width.
        embedded_preprocessing: ``--embed-preprocessing``: the graph takes uint8 pixels.
        fp16_io: ``--fp16-io``: float16 inputs and outputs.
        slim: ``--slim``: simplified by onnxslim.
    """

    static_batch: int | None = None
    dynamic_size: bool = False
    embedded_preprocessing: bool = False
    fp16_io: bool = False
    slim: bool = False

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> ExportFlags:
        """The flags zoo metadata ``meta`` records (none: a file that records none, e.g. one
        not written by zoo, reads as a plain export)."""
        found = meta.get("input")
        dtype = found.get("dtype") if isinstance(found, dict) else None
        batch = _int_or_none(meta.get("static_batch"))
        return cls(
            static_batch=batch if batch is not None and batch > 0 else None,
            dynamic_size=meta.get("dynamic_size") is True,
            embedded_preprocessing=dtype == "uint8",
            fp16_io=dtype == "float16",
            slim=bool(meta.get("slim")),
        )

    def variant_name(self, precision: str = "fp32") -> str | None:
        """The variant an ONNX export with these flags goes to (``fp16-io16``, ``pixels``,
        ``batch4``), or None for the folder's own ``model.onnx``: a plain fp32 graph taking
        float32 NCHW tensors in a dynamic batch (``--dynamic-size`` and ``--slim`` keep that)."""
        parts = [precision] if precision != "fp32" else []
        parts += ["io16"] if self.fp16_io else []
        parts += ["pixels"] if self.embedded_preprocessing else []
        parts += [f"batch{self.static_batch}"] if self.static_batch is not None else []
        return "-".join(parts) or None

    @property
    def contract(self) -> bool:
        """Whether the graph takes what the artifact contract's ``model.onnx`` takes
        (:meth:`variant_name` is None at fp32)."""
        return self.variant_name() is None

    def args(self, precision: str = "fp32") -> str:
        """The flags as ``zoo export`` takes them (`` --precision fp16 --fp16-io``), with
        ``precision`` when it is not fp32; empty for a plain export."""
        parts = [f"--precision {precision}"] if precision != "fp32" else []
        parts += ["--fp16-io"] if self.fp16_io else []
        parts += ["--embed-preprocessing"] if self.embedded_preprocessing else []
        parts += [f"--static-batch {self.static_batch}"] if self.static_batch is not None else []
        parts += ["--dynamic-size"] if self.dynamic_size else []
        parts += ["--slim"] if self.slim else []
        return "".join(f" {p}" for p in parts)


@dataclass(frozen=True)
class Variant:
    """A file derived from a model folder's weights (or the folder's own ``model.onnx``).

    Attributes:
        name: ``int8-static`` for ``variants/int8-static.onnx``, ``openvino-int8`` for
            ``variants/openvino-int8/model.xml``; ``model.onnx`` for the folder's export.
        path: the ``.onnx`` file or the IR's ``.xml``.
        kind: ``onnx`` or ``openvino``.
        folder: the model folder it was derived from.
        source_sha256: the weights it was made from, from its zoo metadata (None: it
            records none, e.g. not written by zoo, or unreadable).
        weights_sha256: the folder's weights now (``config.json``).
        precision: its metadata's ``precision`` (``fp32``, ``fp16``, ``int8``, ``bf16``).
        quantization: how ``zoo quantize`` made it: ``dynamic``, ``static`` or ``nncf`` (None:
            not quantized).
        source_epoch: the training epoch whose weights it holds (its metadata; None: not
            recorded, e.g. made before zoo recorded it, or not from a run).
        folder_epoch: the epoch whose weights the folder holds now (``config.json``).
        flags: the export flags it was made with (a quantized file: its source's), from its
            metadata; its :attr:`refresh` passes them again.
        quantized_from: a quantized file: the fp32 export it was made from, as ``zoo
            quantize`` recorded it (None: not quantized, or not recorded).
        target_agreement: a quantized file: the ``--target-agreement`` it was searched for
            (None: not searched).
        calibration_stale: it carries another calibration (temperature, rejection rule)
            than the folder's ``config.json`` now holds: ``zoo calibrate`` ran after it was
            made (False: the same, or the file records none).
    """

    name: str
    path: Path
    kind: VariantKind
    folder: Path
    source_sha256: str | None
    weights_sha256: str
    precision: str = "fp32"
    quantization: str | None = None
    source_epoch: int | None = None
    folder_epoch: int | None = None
    flags: ExportFlags = field(default_factory=ExportFlags)
    quantized_from: Path | None = None
    target_agreement: float | None = None
    calibration_stale: bool = False

    @property
    def stale(self) -> bool:
        """It holds other weights than the folder's (or cannot say which it holds)."""
        return self.source_sha256 != self.weights_sha256

    @property
    def backend(self) -> str:
        """The ``zoo bench`` backend this file is a build of (``ort_int8``, ``ov_fp32``...)."""
        if self.kind == "openvino":
            return f"ov_{self.precision}"
        return "ort_int8" if self.quantization else f"ort_{self.precision}"

    @property
    def refresh(self) -> str:
        """The command that makes this file again, the same kind of file in the same place,
        from the folder's current weights: the export flags it was made with
        (:attr:`flags`), and for a quantized file the export it was quantized from, then
        ``zoo quantize`` with its engine and mode."""
        run = run_spelling(self.folder)
        own = self.folder / EXPORT_NAME
        if self.name == EXPORT_NAME:
            own_kind = self.flags.contract and self.precision == "fp32"
            elsewhere = "" if own_kind else f" -o {self.path}"
            return f"zoo export {run}{self.flags.args(self.precision)}{elsewhere}"
        if self.quantization:
            source = self._quantized_source()
            there = "" if source == own and self.flags.contract else f" -o {source}"
            return f"zoo export {run}{self.flags.args()}{there} && {self._quantize(source, run)}"
        if self.kind == "openvino":
            return (
                f"zoo export {run} --format openvino --precision {self.precision} "
                f"-o {self.path.parent}"
            )
        return f"zoo export {run}{self.flags.args(self.precision)} -o {self.path}"

    @property
    def made_from_variant(self) -> str | None:
        """The variant a quantized file was made from, when its name says so
        (``batch4`` for ``batch4-int8-static``: :func:`derived_variant_name`); None for one
        made from ``model.onnx``, or named otherwise."""
        made_from = self.quantized_from
        if made_from is None or made_from.name == EXPORT_NAME:
            return None
        return made_from.stem if self.name.startswith(f"{made_from.stem}-") else None

    def _quantized_source(self) -> Path:
        """Where the refresh of a quantized file exports the graph it quantizes: the variant
        it was quantized from (``variants/batch4.onnx``, as recorded), else the folder's
        ``model.onnx`` for a plain export, else the variant its flags name (never a graph of
        another contract over ``model.onnx``)."""
        made_from = self.quantized_from
        if made_from is not None and made_from.name != EXPORT_NAME:
            return variants_dir(self.folder) / made_from.name
        name = self.flags.variant_name()
        return (
            self.folder / EXPORT_NAME
            if name is None
            else variants_dir(self.folder) / f"{name}.onnx"
        )

    def _quantize(self, source: Path, run: str) -> str:
        """``zoo quantize SOURCE`` as this file was made: its mode and engine, a search's
        target, calibration images for a bare folder (a run calibrates on its own), and
        ``-o`` where this file is not where it would go by default."""
        quant = str(self.quantization)
        bare = run == str(self.folder)  # a run's own images calibrate and judge by default
        if quant == "nncf":
            how = "--engine nncf"
        elif quant == "dynamic":
            how = "--mode dynamic"
        else:  # --engine auto would pick NNCF where it is installed
            how = f"--mode {quant} --engine ort"
        if self.target_agreement is not None:
            how += f" --target-agreement {self.target_agreement:g}" + (
                " --data DIR" if bare else ""
            )
        calib = " --calib DIR" if quant != "dynamic" and bare else ""
        name = derived_variant_name(source, quantized_variant_name(quant))
        default = variants_dir(self.folder) / f"{name}.onnx"
        there = "" if self.path.resolve() == default.resolve() else f" -o {self.path}"
        return f"zoo quantize {source} {how}{calib}{there}"

    def warning(self) -> str:
        """One line: which weights (or calibration) it holds and how to refresh it (for a
        stale file)."""
        if not self.stale and self.calibration_stale:
            return (
                f"{self.path} carries another calibration (temperature, rejection rule) than "
                f"{self.folder}'s config.json now holds (zoo calibrate ran after it was made), "
                f"and predict and serve apply the file's; refresh it: {self.refresh}"
            )
        if self.source_epoch is not None and self.folder_epoch is not None:
            return (
                f"{self.path} holds the weights of epoch {self.source_epoch}, but {self.folder} "
                f"now holds epoch {self.folder_epoch}'s (e.g. after --resume/--extend): it is "
                f"stale; refresh it: {self.refresh}"
            )
        held = (
            f"was made from other weights (sha256 {self.source_sha256[:12]}…) than"
            if self.source_sha256
            else "records no source weights, so it may not hold"
        )
        return (
            f"{self.path} {held} {self.folder}'s current ones (sha256 "
            f"{self.weights_sha256[:12]}…, e.g. after --resume/--extend): it is stale; "
            f"refresh it: {self.refresh}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "kind": self.kind,
            "precision": self.precision,
            "quantization": self.quantization,
            "source_weights_sha256": self.source_sha256,
            "stale": self.stale,
            "calibration_stale": self.calibration_stale,
        }


def run_spelling(folder: Path) -> str:
    """How a user names the model folder ``folder`` on the command line: its run when it is
    a run's ``model/`` (``runs/X``), else the folder itself."""
    if folder.name == "model" and (folder.parent / "config.json").is_file():
        return str(folder.parent)
    return str(folder)


def _ir_metadata(xml: Path) -> dict[str, Any]:
    """zoo's metadata of an IR (its ``<rt_info><zoo value=...>``), read from the XML alone:
    listing variants must not start OpenVINO."""
    import xml.etree.ElementTree as ET

    try:
        node = ET.parse(xml).getroot().find("rt_info/zoo")
    except (ET.ParseError, OSError) as exc:
        raise InputError(f"{xml} is not an OpenVINO IR ({exc}).") from exc
    if node is None or node.get("value") is None:
        return {}
    return dict(json.loads(node.get("value", "{}")))


def _metadata(path: Path, kind: VariantKind) -> dict[str, Any]:
    if kind == "openvino":
        return _ir_metadata(path)
    from zoo.onnx_meta import read_metadata

    return read_metadata(path)


def _variant(
    name: str, path: Path, kind: VariantKind, folder: Path, config: ModelConfig
) -> Variant:
    """The file ``path`` of the model folder ``folder``, whose ``config.json`` is ``config``."""
    from zoo.onnx_meta import read_calibration

    try:
        meta = _metadata(path, kind)
    except (InputError, ValueError):  # unreadable: listed, with no source weights
        meta = {}
    quant = meta.get("quantization")
    made = quant if isinstance(quant, dict) else {}  # zoo quantize's record (empty: none)
    source = made.get("source")
    return Variant(
        name=name,
        path=path,
        kind=kind,
        folder=folder,
        source_sha256=meta.get("source_weights_sha256"),
        weights_sha256=str(config.weights_sha256),
        source_epoch=_int_or_none(meta.get("source_epoch")),
        folder_epoch=config.shipped_epoch,
        precision=precision_of(meta),
        quantization=quant_mode(meta),
        flags=ExportFlags.from_metadata(meta),
        quantized_from=Path(source) if isinstance(source, str) and source else None,
        target_agreement=_float_or_none(made.get("target_agreement")),
        calibration_stale=_calibration(lambda: read_calibration(meta, path), meta)
        != _calibration(lambda: config.calibration, config.raw),
    )


def _calibration(
    read: Callable[[], Calibration | None], record: Mapping[str, Any]
) -> Calibration | str | None:
    """The calibration a file's metadata or a folder's config holds (None: none; a
    malformed one: its text, which compares unequal to any other)."""
    try:
        return read()
    except ArtifactError:
        return json.dumps(record.get("calibration"), sort_keys=True)


def _float_or_none(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def quant_mode(meta: Mapping[str, Any]) -> str | None:
    """``dynamic``, ``static`` (onnxruntime) or ``nncf`` for a file ``zoo quantize`` made
    (its metadata's ``quantization`` record); None for any other file."""
    quant = meta.get("quantization")
    if not isinstance(quant, dict):
        return None
    return "nncf" if quant.get("engine") == "nncf" else quant.get("mode")


def precision_of(meta: Mapping[str, Any]) -> str:
    """An exported file's precision from its zoo metadata: ``int8`` for a file ``zoo
    quantize`` made (which keeps its fp32 source's ``precision`` key), else that key
    (``fp32`` where none is recorded)."""
    if isinstance(meta.get("quantization"), dict):
        return "int8"
    return str(meta.get("precision") or "fp32")


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def list_variants(folder: str | os.PathLike[str]) -> list[Variant]:
    """The derived variants in ``folder/variants/``, by name: each ``.onnx`` file, ``.xml``
    IR, and folder holding ``model.xml`` (other files there are ignored).

    Raises:
        ArtifactError: ``folder`` is not a valid model folder.
    """
    folder = Path(folder)
    config = read_config(folder)
    found: list[Variant] = []
    vdir = variants_dir(folder)
    if not vdir.is_dir():
        return found
    # by variant name: batch4 before batch4-int8-static (by file name "-" sorts before ".")
    for p in sorted(vdir.iterdir(), key=lambda p: (p.stem if p.is_file() else p.name, p.name)):
        if p.name.startswith("."):  # an atomic write in flight
            continue
        if p.is_file() and p.suffix == ".onnx":
            found.append(_variant(p.stem, p, "onnx", folder, config))
        elif p.is_file() and p.suffix == ".xml":
            found.append(_variant(p.stem, p, "openvino", folder, config))
        elif p.is_dir() and (p / IR_FILE).is_file():
            found.append(_variant(p.name, p / IR_FILE, "openvino", folder, config))
    return found


def exports(folder: str | os.PathLike[str]) -> list[Variant]:
    """The folder's ``model.onnx`` (when present) and its variants."""
    folder = Path(folder)
    own = folder / EXPORT_NAME
    head = (
        [_variant(EXPORT_NAME, own, "onnx", folder, read_config(folder))] if own.is_file() else []
    )
    return head + list_variants(folder)


def stale_exports(folder: str | os.PathLike[str]) -> list[Variant]:
    """The derived files of ``folder`` (``model.onnx`` and its variants) that hold other
    weights than the folder's now; each says so with :meth:`Variant.warning`.

    Raises:
        ArtifactError: ``folder`` is not a valid model folder.
    """
    return [v for v in exports(folder) if v.stale]


def resolve_variant(folder: str | os.PathLike[str], name: str) -> Path:
    """The file (``.onnx``, or the IR's ``.xml``) of the variant ``name`` of ``folder`` (see
    :func:`find_variant`)."""
    return find_variant(folder, name).path


def find_variant(folder: str | os.PathLike[str], name: str) -> Variant:
    """The variant ``name`` of ``folder``: an exact name, or a prefix that names one variant
    only (``int8`` for ``int8-static``; a file made from another variant starts with that
    variant's name, so ``int8`` never picks ``batch4-int8-static``, ``batch4`` names
    ``batch4`` itself, and ``batch4-int8`` the int8 made from it).

    Raises:
        InputError: no variant, or several, answer to ``name`` (the message lists them and
            how to make one).
        ArtifactError: ``folder`` is not a valid model folder.
    """
    folder = Path(folder)
    variants = list_variants(folder)
    names = [v.name for v in variants]
    exact = [v for v in variants if v.name == name]
    matches = exact or [v for v in variants if v.name.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    run = run_spelling(folder)
    calib = " --calib DIR" if run == str(folder) else ""  # a run calibrates on its own images
    quantize = (  # its default engine's file: int8-nncf, or int8-static where NNCF is absent
        f"`zoo quantize {folder / EXPORT_NAME}{calib}` writes an int8 variant in "
        f"{variants_dir(folder)}/ (int8-nncf.onnx; int8-static.onnx without NNCF or for a "
        "quantization-aware model)"
    )
    make = quantize if (folder / EXPORT_NAME).is_file() else f"`zoo export {run}`, then {quantize}"
    if matches:
        raise InputError(
            f"Variant {name!r} of {folder} is ambiguous: it could be "
            f"{', '.join(v.name for v in matches)}. Give the full name."
        )
    have = (
        f"it has {', '.join(names)}"
        if names
        else f"it has none ({variants_dir(folder)} is empty or absent)"
    )
    made = "; ".join(  # a file made from a variant starts with its name (derived_variant_name)
        f"{v.name} is made from {source}"
        for v in variants
        if (source := v.made_from_variant) and v.name.removeprefix(f"{source}-").startswith(name)
    )
    full = f" ({made}: give its full name)" if made else ""
    raise InputError(f"{folder} has no variant {name!r}: {have}{full}; {make}.")


def warn_if_stale(path: str | os.PathLike[str], meta: dict[str, Any]) -> Variant | None:
    """Log one warning (stderr) when the derived file ``path`` just loaded, with zoo metadata
    ``meta``, sits in a model folder whose weights (or calibration) it does not hold. Once per
    file and process (``zoo serve`` loads its model twice).

    Returns:
        The stale :class:`Variant`, or None (fresh, or not in a model folder).
    """
    path = Path(path)
    folder = model_folder_of(path)
    if folder is None or "source_weights_sha256" not in meta:
        return None
    try:
        config = read_config(folder)
    except ArtifactError:  # a broken folder is for its own commands to report
        return None
    name = _name_in_folder(path, folder)
    v = _variant(name, path, "openvino" if path.suffix == ".xml" else "onnx", folder, config)
    key = str(path.resolve())
    off = not (v.stale or v.calibration_stale)
    if off or key in _warned:
        return None if off else v
    _warned.add(key)
    log.warning("%s", v.warning())
    return v


_warned: set[str] = set()

__all__ = [
    "VARIANTS_DIR",
    "ExportFlags",
    "Variant",
    "default_variant_path",
    "derived_variant_name",
    "exports",
    "find_variant",
    "list_variants",
    "model_folder_of",
    "quantized_variant_name",
    "resolve_variant",
    "run_spelling",
    "stale_exports",
    "variants_dir",
    "warn_if_stale",
]
