"""Model folders from anything: a registry entry, a training run, or a legacy ``.pth``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from zoo import durable
from zoo.artifact import ALLOWED_FILES, ALLOWED_NAMES, CONFIG_FILE, read_config, save_model_folder
from zoo.cards import finetuned_card
from zoo.catalog import get_entry
from zoo.errors import InputError, UnsafeWeightsError, first_line, some_of
from zoo.factory import create_model, info_of
from zoo.loading import load_strict
from zoo.model_config import ModelConfig
from zoo.profile import count_params
from zoo.ref import ModelRef
from zoo.variants import variants_dir
from zoo.weights import read_state_dict, sha256_file


def _config_for(info: Any, *, base: str, lineage: list[str], extra: dict[str, Any]) -> ModelConfig:
    n = info.num_classes
    config = {
        "base": base,
        "arch": info.arch,
        "tag": info.tag,
        "num_classes": n,
        "class_names": list(info.label_names) if info.label_names else [str(i) for i in range(n)],
        "multi_label": False,
        "params": info.params,
        "preprocessing": info.preprocessing().to_dict(),
        "parent_weights": info.weights.describe(),
        "parent_weights_sha256": info.weights.sha256,
        "lineage": lineage,
        "metrics": dict(info.metrics),
        **extra,
    }
    return ModelConfig(config)


def check_replaceable(out: Path) -> None:
    """Refuse to write a model folder over anything but nothing, an empty folder or a model
    folder: the write replaces ``out`` whole, and a user who names an existing folder of
    other files (their data, a run) must not lose them.

    Raises:
        InputError: ``out`` is a file, or a folder holding files a model folder does not.
    """
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise InputError(
            f"{out} exists and is not a folder: a model folder is written there whole; name a "
            "new path (or remove the file)."
        )
    names = sorted(p.name for p in out.iterdir())
    # a model folder's own hidden files (locks, a copy's scratch) go with it; anything else of
    # a folder that is no model folder (.git too) is the user's
    foreign = [n for n in names if n not in ALLOWED_NAMES and not n.startswith(".")]
    if foreign or (names and CONFIG_FILE not in names):
        shown = some_of(foreign or names)
        raise InputError(
            f"{out} exists and is not a model folder (it holds {shown}): zoo writes a model "
            "folder whole, replacing what is there, so it refuses; name a new or empty folder, "
            "or a model folder to replace."
        )


def bundle(name: str | ModelRef, out: str | Path) -> Path:
    """Write the artifact folder of a model to ``out`` (atomically).

    Args:
        name: a model reference: a run or model folder is copied (after its contract is
            checked), with its ``variants/``; a registry, ``timm:`` or Hub name is built and saved.
        out: the model folder to write: new, empty, or a model folder, replaced whole (a kill
            leaves the old folder or the new one, :func:`zoo.durable.replace_dir`).

    Returns:
        ``out``.

    Raises:
        ModelRefError / UnknownModelError: the reference does not parse, or is an ONNX file.
        ArtifactError: the source folder breaks the artifact contract.
        InputError: ``out`` is a file or a folder of other files (:func:`check_replaceable`).
        Everything :func:`zoo.create_model` raises, for a built model.
    """
    ref = ModelRef.parse(name)
    out = Path(out)
    check_replaceable(out)
    if ref.kind in ("run", "model-folder"):
        folder = ref.model_folder
        read_config(folder)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = durable.temp_path(out, folder=True)
        try:
            for f in folder.iterdir():
                if f.name in ALLOWED_FILES:
                    shutil.copy2(f, tmp / f.name)
            if variants_dir(folder).is_dir():  # derived files travel with their weights
                shutil.copytree(
                    variants_dir(folder), variants_dir(tmp), ignore=shutil.ignore_patterns(".*")
                )
            durable.replace_dir(tmp, out, label=out.name)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return out
    model = create_model(ref)
    info = info_of(model)
    config = _config_for(info, base=info.name, lineage=[], extra={"tag": info.tag})
    return save_model_folder(model, out, config, finetuned_card(info, config), label=out.name)


def convert(
    pth: str | Path,
    arch: str,
    out: str | Path,
    *,
    trust: bool = False,
    num_classes: int | None = None,
) -> Path:
    """A legacy pickle checkpoint → artifact folder. Without ``trust`` only ``weights_only``
    loading is attempted; the source file's sha256 is recorded as provenance."""
    pth = Path(pth)
    if not pth.is_file():
        raise InputError(f"Checkpoint {pth} does not exist.")
    check_replaceable(Path(out))
    if trust:
        try:
            obj = torch.load(pth, map_location="cpu", weights_only=False)  # the user vouched for it
        except Exception as exc:  # torn zip, empty or text file, a class this env lacks
            raise InputError(
                f"{pth} could not be loaded even trusted ({type(exc).__name__}: "
                f"{first_line(exc)}): a truncated file, another kind of file, or a pickle of "
                "classes this environment cannot import."
            ) from exc
        for key in ("state_dict", "model", "model_state_dict"):
            if isinstance(obj, dict) and isinstance(obj.get(key), dict | torch.nn.Module):
                obj = obj[key]
        if isinstance(obj, torch.nn.Module):
            obj = obj.state_dict()
        if not isinstance(obj, dict):
            raise UnsafeWeightsError(f"{pth} holds a {type(obj).__name__}, not a state_dict.")
        state = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    else:
        state = read_state_dict(pth)
    state = {k.removeprefix("module.").removeprefix("_orig_mod."): v for k, v in state.items()}
    entry = get_entry(arch)
    head = entry.info.classifier
    if num_classes is None and head and f"{head}.weight" in state:
        num_classes = int(state[f"{head}.weight"].shape[0])
    info_n = num_classes or entry.info.num_classes
    if info_n < 1:
        raise InputError(
            f"{pth} holds no {head} weights: it is no trained {entry.info.name} to convert "
            f"({entry.info.name} has no head of its own). To train one from these weights: "
            f"zoo finetune {entry.info.name} --weights FILE.safetensors --data DIR."
        )
    model = entry.builder(num_classes=info_n)
    report = load_strict(model, state, head=head, source=str(pth), adapt_head=False)
    from dataclasses import replace

    from zoo.metadata import WeightSource

    info = replace(
        entry.info,
        num_classes=info_n,
        tag=f"converted-{pth.stem}",
        label_names=entry.info.label_names if info_n == entry.info.num_classes else None,
        params=count_params(model),
        weights=WeightSource(kind="local", path=str(pth)),
        parent=entry.info.name,
        unused_weights=(),
    )
    config = _config_for(
        info,
        base=entry.info.name,
        lineage=[entry.info.name],
        extra={
            "provenance": {
                "source": str(pth.resolve()),
                "source_sha256": sha256_file(pth),
                "loaded_tensors": len(report.loaded),
                "trusted_pickle": trust,
            }
        },
    )
    return save_model_folder(model, out, config, finetuned_card(info, config))
