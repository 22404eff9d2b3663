"""``zoo enroll``: add a class to a trained model from a few images, without retraining it.

The model's classifier layer gains one row (:mod:`zoo.train.imprint`: a centred weight imprint,
then that row alone fitted with the old rows fixed on the images and augmented views of them,
its bias capped on validation), so the result is an ordinary model folder
with one class more: export, its parity gate, predict, serve and eval work on it unchanged, and
its ONNX file simply answers the new class. The row is fitted against embeddings of images of
the existing classes (the *reference*): a sample of the run's training split, or ``--data``.
When the run's validation split is at hand, the enrolled model is measured on it before it is
written (the old classes' top-1 before and after) and a rejection threshold is refitted on it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from zoo.errors import InputError, UsageError
from zoo.model_config import ModelConfig
from zoo.train.enroll_images import MIN_IMAGES, OldClassCheck


@dataclass(frozen=True)
class EnrollOptions:
    """What to enrol, into what, and where to write it.

    Attributes:
        model: a run or model folder (its weights are read, never changed unless
            ``in_place``).
        class_name: the new class's label (not one of the model's classes).
        images: at least :data:`MIN_IMAGES` distinct images of it.
        out: the model folder to write (default: :func:`default_out`).
        in_place: replace the source's own model folder instead.
        data: an image folder of the existing classes (one subfolder per class) to fit
            against, instead of the run's training split.
        device: ``auto``, ``cpu``, ``cuda``…
    """

    model: str
    class_name: str
    images: tuple[Path, ...]
    out: Path | None = None
    in_place: bool = False
    data: Path | None = None
    device: str = "auto"

    def __post_init__(self) -> None:
        name = self.class_name.strip()
        if not name or name != self.class_name:
            raise UsageError(
                f"--class {self.class_name!r}: give a non-empty name without surrounding spaces.",
                param_hint="--class",
            )
        if len(self.images) < MIN_IMAGES:
            raise UsageError(
                f"{len(self.images)} image(s) given for {self.class_name!r}: enrolling a class "
                f"needs at least {MIN_IMAGES} (more images, better recall).",
                param_hint="IMAGES",
            )
        if self.in_place and self.out is not None:
            raise UsageError("Give -o OUT or --in-place, not both.", param_hint="--in-place")


@dataclass(frozen=True)
class EnrollResult:
    """What ``zoo enroll`` wrote and measured.

    Attributes:
        out: the model folder written.
        class_name / index: the new class and its output index.
        num_classes: the model's classes now.
        images: the distinct images it was enrolled from; answered: how many of them the
            enrolled model answers with the new class (the images it was fitted on).
        reference: which images of the existing classes the row was fitted against.
        check: the old classes on the run's validation images (None: none at hand).
        rejection: what became of the rejection rule (None: the model has none).
    """

    out: Path
    class_name: str
    index: int
    num_classes: int
    images: int
    answered: int
    reference: str
    check: OldClassCheck | None
    rejection: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "class": self.class_name,
            "index": self.index,
            "num_classes": self.num_classes,
            "images": self.images,
            "answered": self.answered,
            "reference": self.reference,
            "old_classes": self.check.to_dict() if self.check else None,
            "rejection": self.rejection,
        }

    def lines(self) -> list[str]:
        text = [
            f"enrolled {self.class_name!r} as class {self.index} of {self.num_classes} from "
            f"{self.images} images → {self.out}",
            f"new class: {self.answered} of the {self.images} given images answer it (the "
            "images it was fitted on; held-out recall needs held-out images: zoo eval)",
        ]
        if self.check is not None:
            from zoo.train.imprint import MAX_COST

            c = self.check
            text.append(
                f"old classes: top-1 {c.acc_before:.4f} → {c.acc_after:.4f} on {c.images} of the "
                f"run's {c.total} validation images (the new class took {c.taken}; its bias is "
                f"capped to cost at most {MAX_COST:.0%})"
            )
        else:
            text.append("old classes: not measured (no run validation split at hand)")
        text.append(f"fitted against {self.reference}")
        if self.rejection:
            text.append(f"rejection: {self.rejection}")
        return text


def class_slug(name: str) -> str:
    """``name`` as a file-name and tag part (``golden retriever`` → ``golden_retriever``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "class"


def default_out(folder: Path, class_name: str) -> Path:
    """``<folder>+<class>`` beside the model folder (a run's ``model+<class>``: inside the run,
    so that export's gate and a later enrolment find the run's images)."""
    folder = folder.resolve()
    return folder.parent / f"{folder.name}+{class_slug(class_name)}"


def enroll(opts: EnrollOptions) -> EnrollResult:
    """Add ``opts.class_name`` to ``opts.model`` and write the result (see the module
    docstring).

    Returns:
        The :class:`EnrollResult`.

    Raises:
        InputError: not a run or model folder, a multi-label model, a class that exists, a
            classifier that is not a linear layer, unreadable or too few distinct images, no
            reference images, or an output folder that exists.
        ArtifactError: the source folder breaks the model-folder contract.
    """
    from zoo.artifact import read_config
    from zoo.ref import ModelRef
    from zoo.train.enroll_images import distinct_images, reference_images

    ref = ModelRef.parse(opts.model)  # the cheap checks first: a refusal imports no torch
    if ref.kind not in ("run", "model-folder"):
        raise InputError(
            f"{opts.model} is a {ref.kind} reference: zoo enroll writes a model folder from "
            "PyTorch weights, so give the run or model folder (export the result afterwards)."
        )
    folder = ref.model_folder
    config = read_config(folder)
    classes = list(config.class_names)
    if config.multi_label:
        raise InputError(f"{opts.model} is multi-label: zoo enroll adds single-label classes.")
    if opts.class_name in classes:
        raise InputError(
            f"{opts.model} already has a class {opts.class_name!r} (one of its {len(classes)}): "
            "give the new class another name."
        )
    out = folder if opts.in_place else (opts.out or default_out(folder, opts.class_name))
    if not opts.in_place and out.exists():
        raise InputError(f"{out} exists: give -o a new folder, or remove it first.")
    images, digests = distinct_images(opts.images)
    reference = reference_images(opts.model, folder, config, opts.data)

    import torch

    from zoo.artifact import save_model_folder
    from zoo.cards import finetuned_card
    from zoo.device import pick_device
    from zoo.factory import create_model, info_of
    from zoo.train.enroll_images import (
        BANK_VIEWS,
        REFERENCE_VIEWS,
        VIEWS,
        check_old_classes,
        embedder,
        old_class_validation,
        view_embedder,
    )
    from zoo.train.imprint import MAX_COST, cap_bias, fit_new_row

    net = create_model(ref).eval()
    info = info_of(net)
    head_name = info.classifier
    head = net.get_submodule(head_name) if head_name else None
    if head_name is None or not isinstance(head, torch.nn.Linear):
        raise InputError(
            f"{opts.model}'s classifier ({info.classifier or 'none declared'}) is not a linear "
            "layer, so zoo enroll cannot add a row to it."
        )
    device = pick_device(opts.device)
    embed = embedder(net.to(device), info, device)
    views = view_embedder(net, info, device)
    weight = head.weight.detach().double().cpu().numpy()
    bias = head.bias.detach().double().cpu().numpy()
    _, pos = embed(images)
    ref_paths, ref_labels = list(reference.paths), np.asarray(reference.labels)
    _, ref_f = embed(ref_paths)
    row = fit_new_row(
        np.concatenate([pos, views(images, VIEWS)]),
        np.concatenate([ref_f, views(ref_paths, REFERENCE_VIEWS)]),
        np.concatenate([ref_labels, np.repeat(ref_labels, REFERENCE_VIEWS)]),
        weight,
        bias,
    )
    val = old_class_validation(reference.run, embed, classes)
    if val is not None:
        row = cap_bias(row, val.features, val.logits, val.labels)

    def enrolled_logits(f: np.ndarray) -> np.ndarray:
        return np.concatenate([f @ weight.T + bias, row.logits(f)[:, None]], axis=1)

    answered = int((enrolled_logits(pos).argmax(1) == len(classes)).sum())
    val_logits, check = None, None
    if val is not None:
        val_logits = enrolled_logits(val.features)
        check = check_old_classes(val, val_logits)
    bank = _knn_bank(
        config, folder, len(images), lambda: np.concatenate([pos, views(images, BANK_VIEWS)])
    )
    calibration, rejection = _calibration(
        config,
        folder,
        val_logits,
        check,
        bank.scores(val.features) if bank is not None and val is not None else None,
    )
    record = {
        "class": opts.class_name,
        "index": len(classes),
        "images": len(images),
        "sha256": digests,
        "method": f"centred weight imprint, then the new row fitted with the old rows fixed "
        f"on each image and {VIEWS} augmented views of it"
        + (
            f"; bias capped to cost the old classes at most {MAX_COST:.0%} of validation top-1"
            if val
            else ""
        ),
        "reference": reference.described,
        "reference_run": str(reference.run) if reference.run else None,
        "old_classes": check.to_dict() if check else None,
        "calibration": "temperature fitted before enrolment (kept)"
        + (f"; rejection {rejection}" if rejection else ""),
    }
    new_config = _config(config, opts.class_name, head.in_features, record, check, calibration)
    new_info = replace(
        info,
        tag=new_config.tag or info.tag,
        num_classes=len(classes) + 1,
        label_names=(*classes, opts.class_name),
        params=new_config.params or info.params,
        gflops=new_config.gflops if new_config.gflops is not None else info.gflops,
    )
    card = finetuned_card(new_info, new_config) + _card_section(new_config.enrolled)
    enrolled = _build(config.base, len(classes) + 1, net, head_name, row)
    save_model_folder(enrolled, out, new_config, card, knn=bank)
    return EnrollResult(
        out=out,
        class_name=opts.class_name,
        index=len(classes),
        num_classes=len(classes) + 1,
        images=len(images),
        answered=answered,
        reference=reference.described,
        check=check,
        rejection=rejection,
    )


def _knn_bank(config: ModelConfig, folder: Path, images: int, new: Callable[[], np.ndarray]) -> Any:
    """For a ``knn`` rule, the bank with the new class's embeddings added (``new()``: each
    image's eval view and :data:`~zoo.train.enroll_images.BANK_VIEWS` augmented views) and k
    lowered to the number of its ``images`` (a class of 5 images has no 10th neighbour of
    its own); None otherwise."""
    from zoo.knn import KnnBank

    cal = config.calibration
    if cal is None or cal.reject is None or cal.reject.score != "knn":
        return None
    old = KnnBank.load(folder)
    return old.extended(new(), k=min(old.k, images))


def _calibration(
    config: ModelConfig,
    folder: Path,
    val_logits: np.ndarray | None,
    check: OldClassCheck | None,
    knn: np.ndarray | None = None,
) -> tuple[dict[str, Any] | None, str | None]:
    """The enrolled model's calibration: the temperature kept; a rejection threshold refitted
    on the run's validation images when they are at hand (``knn``: their scores against the
    enrolled bank), else kept as fitted before."""
    import torch

    from zoo.train.calibrate import fit_rejection

    cal = config.calibration
    if cal is None:
        return None, None
    if cal.reject is None:
        return cal.to_dict(), None
    if val_logits is None or check is None or (cal.reject.score == "knn" and knn is None):
        rule = cal.reject
        return cal.to_dict(), (
            f"threshold {rule.score} {rule.threshold:.4g} fitted before enrolment (no validation "
            "images at hand to refit it)"
        )
    rule = fit_rejection(
        torch.as_tensor(val_logits), cal.reject.score, cal.temperature, cal.reject.acceptance, knn
    )
    text = (
        f"threshold {rule.score} {cal.reject.threshold:.4g} → {rule.threshold:.4g}, refitted to "
        f"accept {rule.acceptance:.0%} of {check.images} validation images of the old classes"
    )
    return replace(cal, reject=rule).to_dict(), text


def _build(base: str, num_classes: int, net: Any, head: str, row: Any) -> Any:
    """``base``'s architecture with ``num_classes`` outputs holding ``net``'s weights plus the
    new row."""
    import torch

    from zoo.catalog import get_entry

    state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    w, b = f"{head}.weight", f"{head}.bias"
    state[w] = torch.cat([state[w], torch.as_tensor(row.weight, dtype=state[w].dtype)[None]])
    state[b] = torch.cat([state[b], torch.tensor([row.bias], dtype=state[b].dtype)])
    model = get_entry(base).builder(num_classes=num_classes)
    model.load_state_dict(state, strict=True)
    return model.eval()


def _config(
    config: ModelConfig,
    class_name: str,
    features: int,
    record: dict[str, Any],
    check: OldClassCheck | None,
    calibration: dict[str, Any] | None,
) -> ModelConfig:
    """``config.json`` of the enrolled folder: one class more, its record appended (the
    weights hash and schema are the new folder's, added when it is written)."""
    skip = ("zoo_schema", "zoo_version", "weights_sha256")
    new = {k: v for k, v in config.to_dict().items() if k not in skip}
    tag = config.tag or "model"
    new.update(
        tag=f"{tag}-{class_slug(class_name)}",
        num_classes=config.num_classes + 1,
        class_names=[*config.class_names, class_name],
        params=(config.params or 0) + features + 1,
        gflops=round((config.gflops or 0.0) + features / 1e9, 9),
        lineage=[*config.lineage, tag],
        calibration=calibration,
        enrolled=[*config.enrolled, record],
        # the validation metrics were the old model's; after enrolment only top-1 is measured
        metrics={"val/acc": check.acc_after} if check else {},
    )
    return ModelConfig(new)


def _card_section(records: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for r in records:
        old = r.get("old_classes")
        measured = (
            f"{old['acc_before']:.4f} → {old['acc_after']:.4f} on {old['images']} images"
            if old
            else "not measured"
        )
        rows.append(f"| {r['class']} | {r['index']} | {r['images']} | {measured} |")
    digests = "\n".join(
        f"- {r['class']}: " + ", ".join(f"`{d[:16]}`" for d in r["sha256"]) for r in records
    )
    return f"""
## Enrolled classes
Added by `zoo enroll` without retraining: a centred weight imprint of the classifier row, then
that row alone fitted with the old rows fixed, on each image and augmented views of it; with
the run's validation images at hand, its bias capped so that the old classes lose at most 1
point of top-1 on them. Temperature and rejection threshold: see each record's `calibration`
in config.json. The validation metric above is the old classes' top-1 after enrolment (the
validation split holds no image of an enrolled class).

| class | index | images | old classes' top-1 (run validation split) |
| --- | --- | --- | --- |
{chr(10).join(rows)}

Images (sha256, first 16 hex digits; config.json has them whole):
{digests}
"""


__all__ = [
    "EnrollOptions",
    "EnrollResult",
    "class_slug",
    "default_out",
    "enroll",
]
