"""The model-folder contract: ``model.safetensors`` + ``config.json`` + ``README.md``
(+ optional ``model.onnx`` and ``variants/``, the files derived from these weights: see
:mod:`zoo.variants`). Written atomically; read back strictly, hash-verified.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from zoo import durable
from zoo.calibration import Calibration
from zoo.errors import ArtifactError
from zoo.metadata import ModelInfo, WeightSource
from zoo.model_config import ModelConfig

if TYPE_CHECKING:  # reading a folder's config must not import torch
    from torch import nn


class SavesInto(Protocol):
    """What writes a file of its own into a model folder being built (:class:`zoo.knn.KnnBank`:
    zoo.knn reads this module's file names, so the type is named here, not imported)."""

    def save(self, folder: Path) -> Path: ...


SCHEMA_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CARD_FILE = "README.md"
ONNX_FILE = "model.onnx"
REQUIRED_FILES = frozenset({WEIGHTS_FILE, CONFIG_FILE, CARD_FILE})
VARIANTS_DIR = "variants"  # derived files (int8, fp16, OpenVINO): zoo.variants owns them
KNN_BANK_FILE = "knn_bank.safetensors"  # a knn rejection rule's training embeddings (zoo/knn.py)
ALLOWED_FILES = REQUIRED_FILES | {ONNX_FILE, KNN_BANK_FILE}
ALLOWED_NAMES = ALLOWED_FILES | {VARIANTS_DIR}
DERIVED_SUFFIXES = frozenset({".onnx", ".xml"})  # exports, which belong in variants/
PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".pkl", ".bin", ".ckpt"})


def zoo_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zoo")
    except PackageNotFoundError:
        return "0+unknown"


def write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as JSON (not a run's fault point: see :mod:`zoo.durable`)."""
    durable.write_json(path, obj, label=None)


def is_model_folder(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    return p.is_dir() and (p / CONFIG_FILE).is_file() and (p / WEIGHTS_FILE).is_file()


def stray_files(folder: Path) -> list[str]:
    """What in ``folder`` is outside the contract, each named with what to do about it
    (empty: nothing). Hidden names are in-flight temporary files of an atomic write."""
    problems = []
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or (
            p.name in ALLOWED_NAMES and p.is_dir() == (p.name == VARIANTS_DIR)
        ):
            continue
        derived = p.suffix in DERIVED_SUFFIXES or (p.is_dir() and (p / "model.xml").is_file())
        if derived:
            todo = (
                f"derived files belong in {VARIANTS_DIR}/: move it to "
                f"{folder / VARIANTS_DIR}/ (zoo quantize writes there by default)"
            )
        elif p.suffix in PICKLE_SUFFIXES:
            todo = "pickle checkpoints are never part of an artifact: move or delete it"
        else:
            todo = "not part of a model folder: move or delete it"
        problems.append(f"{p.name}{'/' if p.is_dir() else ''} ({todo})")
    return problems


def read_config(folder: str | os.PathLike[str]) -> ModelConfig:
    folder = Path(folder)
    missing = sorted(f for f in REQUIRED_FILES if not (folder / f).is_file())
    if missing:
        raise ArtifactError(
            f"{folder} is not a zoo model folder: missing {', '.join(missing)}. A model folder "
            f"holds exactly {', '.join(sorted(REQUIRED_FILES))} (+ optional {ONNX_FILE}, "
            f"{KNN_BANK_FILE} and {VARIANTS_DIR}/)."
        )
    problems = stray_files(folder)
    if problems:
        raise ArtifactError(
            f"{folder} holds files outside the model-folder contract: " + "; ".join(problems)
        )
    path = folder / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # not UTF-8 (UnicodeDecodeError) or not JSON
        raise ArtifactError(f"{path} is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ArtifactError(
            f"{path} holds {json.dumps(config)[:60]}, not the JSON object of keys (zoo_schema, "
            "base, ...) a model folder's config is."
        )
    for key in ("zoo_schema", "base", "num_classes", "class_names", "weights_sha256"):
        if key not in config:
            raise ArtifactError(f"{path} lacks the required key {key!r}.")
    for key, kind in (("zoo_schema", int), ("num_classes", int), ("class_names", list)):
        value = config[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ArtifactError(
                f"{path}: {key!r} is {value!r}, not a JSON "
                f"{'whole number' if kind is int else 'list'}."
            )
    if config["zoo_schema"] > SCHEMA_VERSION:
        raise ArtifactError(
            f"{folder} uses config schema {config['zoo_schema']}, newer than this zoo "
            f"understands ({SCHEMA_VERSION}). Upgrade zoo."
        )
    if len(config["class_names"]) != config["num_classes"]:
        raise ArtifactError(
            f"{path} says num_classes={config['num_classes']} but lists "
            f"{len(config['class_names'])} class names."
        )
    return ModelConfig(config, where=path)


def info_from_config(folder: Path, config: ModelConfig, base: ModelInfo) -> ModelInfo:
    """The registry view of a fine-tuned folder: its parent's metadata, its own head/labels."""
    pre = config.preprocessing  # None only in folders written before it was recorded
    if pre is not None:
        base = base.with_preprocessing(pre)
    tag = config.tag or f"ft-{folder.name}"
    return replace(
        base,
        tag=tag,
        num_classes=config.num_classes,
        label_names=config.class_names,
        params=config.params if config.params is not None else base.params,
        gflops=config.gflops if config.gflops is not None else base.gflops,  # at its own size
        weights=WeightSource(
            kind="local", path=str(folder / WEIGHTS_FILE), sha256=config.weights_sha256
        ),
        metrics=tuple(config.metrics.items()),
        metrics_source="measured by zoo on the run's validation split",
        parent=config.base,
        lineage=(*config.lineage, tag),
        multi_label=config.multi_label,
        thresholds=config.thresholds,
        calibration=config.calibration,
        description=f"{base.arch} fine-tuned by zoo from {config.base}.",
        unused_weights=(),  # the folder's weights are its own: nothing in them is left out
    )


def qat_weight_bits(folder: Path) -> int | None:
    """The int8 weights' bits a model folder's weights were trained through (``zoo distill
    --qat``: 8, or 7 as onnxruntime's ``reduce_range``; 8 for a folder written before zoo
    recorded them); None: not quantization-aware, or not said (:func:`quantization_aware`).

    Raises:
        ArtifactError: ``folder`` is not a valid model folder.
    """
    if not quantization_aware(folder):
        return None
    return read_config(folder).qat_weight_bits or 8


def quantization_aware(folder: Path) -> bool | None:
    """Whether a model folder's weights were trained through int8 rounding (``zoo distill
    --qat``): its ``config.json`` ``train.quantization_aware``, else, for a folder written
    before zoo recorded it there, the run it belongs to (its ``distill.qat``); None where
    neither says (a folder outside any run).

    Raises:
        ArtifactError: ``folder`` is not a valid model folder.
    """
    said = read_config(folder).quantization_aware
    if said is not None:
        return said
    from zoo.run_images import find_run

    run = find_run(folder)
    if run is None:
        return None
    try:
        distill = json.loads((run / "config.json").read_text()).get("distill")
    except (OSError, ValueError):
        return None
    return bool(isinstance(distill, dict) and distill.get("qat"))


def write_calibration(folder: Path, calibration: Calibration) -> Path:
    """Store ``calibration`` in a model folder's ``config.json`` (atomically; the weights and
    their hash are untouched).

    Returns:
        The config file.

    Raises:
        ArtifactError: ``folder`` is not a model folder.
    """
    config = read_config(folder)
    write_json(folder / CONFIG_FILE, {**config.to_dict(), "calibration": calibration.to_dict()})
    return folder / CONFIG_FILE


def save_model_folder(
    model: nn.Module,
    out_dir: str | os.PathLike[str],
    config: ModelConfig,
    card: str,
    onnx_path: Path | None = None,
    *,
    label: str | None = None,
    knn: SavesInto | None = None,
) -> Path:
    """Write the artifact folder atomically: build it beside ``out_dir``, then swap it in
    (:func:`zoo.durable.replace_dir`: a kill leaves the old complete folder or the new one).

    Args:
        model: its ``state_dict`` becomes ``model.safetensors``.
        out_dir: the folder to write (replaced whole if it exists).
        config: ``config.json``'s content (schema, version and weights hash are added).
        card: the README.md model card.
        onnx_path: an exported graph to include. Without it the old folder's
            ``model.onnx`` is kept; its ``variants/`` always are (a user's exports are never
            deleted: when the weights changed they read as stale, see :mod:`zoo.variants`).
        label: the swap's name as a fault point of a run (``None`` outside a run).
        knn: the bank of a ``knn`` rejection rule (:data:`zoo.knn.BANK_FILE`), written with
            the weights it was embedded by.

    Returns:
        ``out_dir``.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = durable.temp_path(out, folder=True)
    from safetensors.torch import save_file

    try:
        tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        from zoo.weights import sha256_file

        stored = {
            "zoo_schema": SCHEMA_VERSION,
            "zoo_version": zoo_version(),
            **config.to_dict(),
            "weights_sha256": sha256_file(tmp / WEIGHTS_FILE),
        }
        (tmp / CONFIG_FILE).write_text(json.dumps(stored, indent=2) + "\n")
        (tmp / CARD_FILE).write_text(card)
        if onnx_path is not None:
            shutil.copy2(onnx_path, tmp / ONNX_FILE)
        if knn is not None:
            knn.save(tmp)
        _carry_exports(out, tmp, onnx=onnx_path is None)
        durable.replace_dir(tmp, out, label=label)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _carry_exports(old: Path, new: Path, *, onnx: bool) -> None:
    """Hard-link (copy across file systems) the old folder's ``variants/`` and, when ``onnx``,
    its ``model.onnx`` into the folder being built, so that replacing it deletes no export."""
    if not old.is_dir():
        return
    if onnx and (old / ONNX_FILE).is_file():
        _link_or_copy(old / ONNX_FILE, new / ONNX_FILE)
    if (old / VARIANTS_DIR).is_dir():
        shutil.copytree(
            old / VARIANTS_DIR,
            new / VARIANTS_DIR,
            copy_function=_link_or_copy,
            ignore=shutil.ignore_patterns(".*"),  # another command's write in flight
        )


def _link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    try:
        os.link(src, dst)  # the same bytes, no copy: the old folder is deleted after the swap
    except OSError:
        shutil.copy2(src, dst)
