"""One builder that resolves a name, instantiates, loads weights, adapts the head and
reports what it did."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.artifact import WEIGHTS_FILE, info_from_config, read_config
from zoo.catalog import get_entry
from zoo.errors import InputError, ModelRefError
from zoo.metadata import ModelInfo, WeightSource
from zoo.ref import ModelRef
from zoo.registry import Entry

if TYPE_CHECKING:  # torch is imported when a model is built, not when a name is resolved
    from torch import nn

    from zoo.loading import LoadReport

RANDOM = ("none", "random", "scratch")


def resolve(name: str | ModelRef) -> tuple[Entry, Path | None]:
    """The registry entry a model reference builds.

    Args:
        name: a model reference (see :mod:`zoo.ref`), as text or parsed.

    Returns:
        ``(entry, folder)``: for a registry, ``timm:`` or ``hf-hub:`` name its entry and
        None; for a run, a model folder or ``hf:ORG/REPO[@REV]`` (pulled and verified), the
        base entry adapted by the folder's config (head, labels, weights, lineage), and the
        model folder beside it.

    Raises:
        ModelRefError / UnknownModelError: the reference does not parse (see
            :meth:`ModelRef.parse`), or names an ONNX file (no PyTorch model to build).
        ArtifactError: a model folder breaks the artifact contract.
        WeightsNotFoundError / WeightsIntegrityError / UnsafeWeightsError: pulling ``hf:``.
    """
    ref = ModelRef.parse(name)
    if ref.kind == "registry":
        return get_entry(ref.name), None
    if ref.kind in ("timm", "hf-hub"):
        return get_entry(f"timm:{ref.timm_name}"), None
    if ref.kind in ("onnx", "openvino"):
        from zoo.variants import model_folder_of

        owner = model_folder_of(ref.path)
        raise ModelRefError(
            ref.shown,
            f"is an {'ONNX file' if ref.kind == 'onnx' else 'OpenVINO IR'}, and this command "
            "needs the PyTorch model: give "
            + (
                f"the model folder it belongs to, {owner}"
                if owner is not None
                else "the registry name, run or model folder it was exported from"
            ),
            forms=False,
        )
    if ref.kind == "hf":
        from zoo.hub import pull

        folder = pull(ref)
    else:
        folder = ref.model_folder
    config = read_config(folder)  # raises with the precise contract violation
    base = get_entry(config.base)
    return Entry(info_from_config(folder, config, base.info), base.builder), folder


def weight_source(info: ModelInfo, weights: str | None) -> WeightSource:
    """Where the weights of ``info``'s model come from, given the ``weights`` option.

    Args:
        info: the entry's metadata (its own weights are the default).
        weights: ``None`` for the entry's own, ``"none"`` (or ``random``/``scratch``) for
            random initialisation, else a safetensors file or a folder holding one.

    Returns:
        The source; ``kind == "none"`` means random initialisation.
    """
    if weights is None:
        return info.weights
    if weights.lower() in RANDOM:
        return WeightSource()
    wpath = Path(weights)
    if wpath.is_dir():
        wpath = wpath / WEIGHTS_FILE
    return WeightSource(kind="local", path=str(wpath))


def require_weights(source: WeightSource) -> None:
    """Make sure ``source``'s weights file is here and sound (downloaded now when the network
    allows), so that a command fails on missing weights before any slow work on its data.

    Raises:
        WeightsNotFoundError: not cached and not downloadable (offline); the message names
            the entries whose weights are usable here and ``--weights none``.
        WeightsIntegrityError / UnsafeWeightsError: as :func:`zoo.weights.fetch_weights`.
    """
    if source.kind == "none":
        return
    from zoo.catalog import usable_here
    from zoo.errors import WeightsNotFoundError
    from zoo.weights import fetch_weights

    try:
        fetch_weights(source)
    except WeightsNotFoundError as exc:
        here = usable_here()
        raise WeightsNotFoundError(
            f"{exc} Pretrained weights usable here without the network: "
            f"{', '.join(here) if here else 'none'} (`zoo list` marks them); or train from "
            "random weights with --weights none."
        ) from exc


def create_model_with_report(
    name: str | ModelRef | Entry,
    *,
    num_classes: int | None = None,
    weights: str | None = None,
    label_names: tuple[str, ...] | list[str] | None = None,
    **kwargs: Any,
) -> tuple[nn.Module, ModelInfo, LoadReport | None]:
    """Like :func:`create_model`, but the model is left in the builder's mode and the
    effective metadata and load report are returned beside it, not attached.

    Args:
        name: as for :func:`create_model`, or the :class:`Entry` a caller already resolved
            (:func:`resolve`; the trainer resolves its model once) — built as it is.
        num_classes: as for :func:`create_model`.
        weights: as for :func:`create_model`.
        label_names: class names of a new head (default: the entry's when the class count
            is unchanged, else none).
        **kwargs: passed to the architecture's builder.

    Returns:
        ``(model, info, report)``: the module; its effective :class:`ModelInfo` (class count,
        labels and weight source as built; ``parent`` set when the head was replaced); the
        :class:`LoadReport`, or ``None`` for random initialisation.

    Raises:
        InputError: ``num_classes`` < 1 or missing for a headless entry, or ``label_names``
            of the wrong length.
        Everything :func:`create_model` raises.
    """
    from zoo.loading import load_strict
    from zoo.weights import fetch_weights, load_weights, read_state_dict

    entry = name if isinstance(name, Entry) else resolve(name)[0]
    info = entry.info
    source = weight_source(info, weights)
    n = num_classes if num_classes is not None else info.num_classes
    if info.headless and not info.classifier:
        raise InputError(
            f"{info.name} has no head of its own and declares no classifier module to make "
            "one in: zoo cannot give it one (use a registry entry or timm model with a "
            "classifier)."
        )
    if num_classes is None and info.headless:
        raise InputError(
            f"{info.name} is a pretrained backbone without a classifier head, so it needs a "
            f"class count: fine-tune it (zoo finetune {info.name} --data DIR), distil into it "
            f"(zoo distill TEACHER --student {info.name} --data DIR) or, in Python, "
            f'zoo.create_model("{info.name}", num_classes=N).'
        )
    if n < 1:
        raise InputError(f"num_classes must be at least 1, got {n}.")
    model = entry.builder(num_classes=n, **kwargs)
    report = None
    if source.kind != "none":
        state = (
            load_weights(source)
            if source.kind != "local"
            else read_state_dict(fetch_weights(source))
        )
        report = load_strict(
            model,
            state,
            head=info.classifier,
            source=source.describe(),
            adapt_head=n != info.num_classes,
            unused=info.unused_weights,
            fresh_head=info.headless and weights is None,  # the entry's file: another head
        )
    labels = (
        tuple(label_names) if label_names else (info.label_names if n == info.num_classes else None)
    )
    if labels is not None and len(labels) != n:
        raise InputError(f"{len(labels)} label names given for {n} classes.")
    eff = replace(info, num_classes=n, label_names=labels, weights=source)
    if n != info.num_classes:
        from zoo.profile import count_params

        eff = replace(eff, params=count_params(model), metrics=(), parent=info.name)
    return model, eff, report


def create_model(
    name: str | ModelRef,
    *,
    num_classes: int | None = None,
    weights: str | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build a registry entry (``arch`` or ``arch.tag``), a ``timm:`` model, a zoo model
    folder or ``hf:ORG/REPO[@REV]``, with its weights loaded strictly.

    Args:
        name: what to build, a model reference (:class:`zoo.ref.ModelRef` or its text):
            ``arch``, ``arch.tag``, ``timm:<name>``, ``hf:ORG/REPO[@REV]``,
            ``hf-hub:ORG/NAME``, or a run / model folder (not an ONNX file).
        num_classes: a different number of classes re-initialises the classifier head;
            every other tensor still loads strictly. Required for a headless entry
            (:attr:`ModelInfo.headless`: a pretrained backbone without a head).
        weights: ``None`` for the entry's own weights (random init when it has none),
            ``"none"`` for random initialisation, or a path to a safetensors file / folder.
        **kwargs: passed to the architecture's builder.

    Returns:
        The model in eval mode, with ``zoo_info`` (effective :class:`ModelInfo`) and
        ``zoo_load_report`` (:class:`LoadReport` or ``None``) attributes.

    Raises:
        UnknownModelError: the name is not registered (with did-you-mean suggestions).
        ModelRefError: a malformed reference, a missing path, or an ONNX file.
        ArtifactError: a model folder breaks the artifact contract.
        WeightsNotFoundError / WeightsIntegrityError: weights missing or failing their hash.
        UnsafeWeightsError: the weights could only be loaded by unpickling.
        StateDictMismatchError: weights do not fit outside the declared head.
        InputError: ``num_classes`` < 1, or missing for a headless entry (ModelRefError is
            one too).
    """
    model, info, report = create_model_with_report(
        name, num_classes=num_classes, weights=weights, **kwargs
    )
    model.zoo_info = info  # type: ignore[assignment]
    model.zoo_load_report = report  # type: ignore[assignment]
    return model.eval()


def info_of(model: nn.Module) -> ModelInfo:
    """The effective :class:`ModelInfo` that :func:`create_model` attached to ``model``.

    Raises:
        InputError: the model was not built by :func:`create_model`.
    """
    info = getattr(model, "zoo_info", None)
    if not isinstance(info, ModelInfo):
        raise InputError("This model was not built by zoo.create_model (it has no zoo_info).")
    return info
