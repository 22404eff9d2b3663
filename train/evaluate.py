"""Evaluation: the passes validation and ``zoo eval`` share (eval mode + inference mode,
predictions gathered across ranks without the duplicates sampler padding would add), and
:func:`run_eval`, ``zoo eval`` itself."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, default_collate

from zoo.device import pick_device
from zoo.errors import DataError, UsageError
from zoo.factory import create_model, info_of
from zoo.metadata import ModelInfo
from zoo.ref import ModelRef
from zoo.run_images import SPLIT_FILE, Split, find_run, still_on_disk
from zoo.train.check import FileCheck, readable
from zoo.train.data import MULTI_SEP, ImageFolderDataset, Splits, scan
from zoo.train.metrics import summarize, summarize_multilabel
from zoo.transforms import eval_transform
from zoo.tta import VIEWS, check_tta, check_views, views

Forward = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class EvalForward:
    """What scores an evaluation's images, and the batches it takes: the PyTorch model, or a
    derived file of its folder run by its runtime in its place (``zoo eval RUN --variant
    int8``; the model still gives the class names).

    Attributes:
        forward: a batch as :meth:`loader` forms it → its logits, ``(N, classes)``.
        name: what it is: the file, named in the result (``scored_by``).
        prepare: one decoded image as ``forward`` takes it, batched as a list (a graph that
            resizes decoded pixels itself, ``--embed-preprocessing``: their sizes differ);
            None: the model's own eval crop, batched as one tensor.
    """

    forward: Callable[[Any], torch.Tensor]
    name: str
    prepare: Callable[[Any], Any] | None = None

    def loader(
        self, samples: list[tuple[Path, Any]], info: ModelInfo, batch_size: int, num_workers: int
    ) -> DataLoader[Any]:
        """The batches of ``samples`` that :attr:`forward` takes."""
        if self.prepare is None:
            ds = ImageFolderDataset(samples, eval_transform(info))
            return DataLoader(ds, batch_size, num_workers=num_workers)
        pixels = ImageFolderDataset(samples, self.prepare)
        return DataLoader(pixels, batch_size, num_workers=num_workers, collate_fn=_as_list)


def _as_list(items: list[tuple[Any, Any, int]]) -> tuple[list[Any], Any, torch.Tensor]:
    """A batch of samples that differ in size: the samples as a list, labels collated."""
    xs, ys, idx = zip(*items, strict=True)
    return list(xs), default_collate(list(ys)), torch.tensor(idx)


def collect_logits(
    forward: Forward, batches: Iterable[Any], device: torch.device, *, channels_last: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, targets, indices) on CPU for every sample the batches hold."""
    logits, targets, indices = [], [], []
    with torch.inference_mode():
        for x, y, idx in batches:
            if isinstance(x, torch.Tensor):  # (else a list of pixel arrays: EvalForward.prepare)
                x = x.to(device, non_blocking=True)
            if channels_last and x.ndim == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            logits.append(forward(x).float().cpu())
            targets.append(torch.as_tensor(y))
            indices.append(torch.as_tensor(idx))
    if not logits:
        return torch.zeros(0, 0), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.cat(logits), torch.cat(targets), torch.cat(indices)


def gather_by_index(
    logits: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Under DDP every rank holds a disjoint shard; gather and order by sample index."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (logits, targets, indices))
        logits = torch.cat([p[0] for p in parts if p[0].numel()])
        targets = torch.cat([p[1] for p in parts if p[1].numel()])
        indices = torch.cat([p[2] for p in parts if p[2].numel()])
    order = indices.argsort()
    uniq = torch.unique_consecutive(indices[order])
    if len(uniq) != len(order):
        raise RuntimeError("duplicate samples in an evaluation pass (sharding bug)")
    return logits[order], targets[order]


def evaluate_model(
    model: nn.Module, batches: Iterable[Any], device: torch.device, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    return evaluate_with(model, model, batches, device, **kw)


def evaluate_with(
    model: nn.Module, forward: Forward, batches: Iterable[Any], device: torch.device, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`evaluate_model` through ``forward`` (a wrapper of ``model``)."""
    was_training = model.training
    model.eval()
    try:
        return gather_by_index(*collect_logits(forward, batches, device, **kw))
    finally:
        model.train(was_training)


def _splits_for(model_arg: str, data: str | None) -> tuple[Splits, Path | None]:
    """The folder's splits, and the run when they are the run's own (else a scan of ``data``
    and None): the run's own for a run, its model folder or a file in them (:func:`find_run`),
    also when ``data`` is the run's data folder moved or copied (every file of its
    ``split.json`` is there)."""
    ref = ModelRef.parse(model_arg)
    run = find_run(ref.path) if ref.is_path else None
    if run is not None:
        d = json.loads((run / SPLIT_FILE).read_text())
        saved = Splits.from_json(d)
        if data is None or Path(data).resolve() == saved.root:
            return saved, run
        moved = Splits.from_json(d, root=Path(data).resolve())
        if not moved.missing():
            return moved, run  # the run's own images, moved or copied: its own splits
    if data is None:
        raise DataError(
            f"{model_arg} belongs to no run folder (one with a {SPLIT_FILE}): pass --data DIR."
        )
    return scan(data), None


@dataclass
class Evaluated:
    """One evaluation pass, kept whole for the report: the model, the samples in order and
    their logits."""

    model: nn.Module
    info: ModelInfo
    names: list[str]
    samples: list[tuple[Path, Any]]
    logits: torch.Tensor
    targets: torch.Tensor
    result: dict[str, Any]
    unreadable: tuple[FileCheck, ...] = ()  # images left out: they do not decode (any more)
    own: bool = False  # the images are the run's own splits (its training images among them)


def _combine(logits: torch.Tensor, multi_label: bool) -> torch.Tensor:
    """``(N, V, K)`` per-view logits → ``(N, K)`` logits of the views' mean probability
    (log-probabilities for softmax; the logit of the mean sigmoid per class)."""
    if multi_label:
        return torch.logit(torch.sigmoid(logits).mean(1).clamp(1e-7, 1 - 1e-7))
    return torch.log(torch.softmax(logits, -1).mean(1).clamp_min(1e-30))


def evaluate_split(
    model_arg: str,
    *,
    data: str | None,
    split: Split | None,
    batch_size: int,
    device: str,
    num_workers: int,
    tta: str = "none",
    scorer: EvalForward | None = None,
) -> Evaluated:
    """:func:`run_eval`'s pass, returning everything it computed (see :func:`run_eval`).

    ``scorer`` scores the images in place of the PyTorch model, and is named in the result.

    Raises:
        UsageError: ``tta`` with a scorer that takes decoded pixels (the views are crops).
    """
    if check_tta(tta) != "none" and scorer is not None and scorer.prepare is not None:
        raise UsageError(
            f"--tta with {scorer.name}: that graph resizes decoded pixels itself, and the "
            "views are crops of the model's preprocessed image; drop --tta, or evaluate "
            "model.onnx (the same weights) with it.",
            param_hint="--tta",
        )
    dev = pick_device(device)
    model = create_model(model_arg).to(dev)
    score: Forward = scorer.forward if scorer is not None else model
    info = info_of(model)
    splits, own_run = _splits_for(model_arg, data)
    if split is None:  # a flat folder the model never trained on: every image is held out
        split = "all" if splits.layout == "flat" and own_run is None else "val"
    if split not in splits.files and split != "all":
        raise DataError(f"{splits.root} has no {split!r} split (has: {', '.join(splits.files)}).")
    names = list(info.label_names or [])
    if not names:
        raise DataError(
            f"{model_arg} has no class names to match the folder's classes against: evaluate "
            f"a fine-tuned model (zoo finetune {model_arg} --data DIR, then zoo eval RUN)."
        )
    index = {c: i for i, c in enumerate(names)}
    items = (
        [it for k, v in splits.files.items() for it in v] if split == "all" else splits.files[split]
    )
    if not items:
        raise DataError(f"The {split!r} split of {splits.root} holds no images.")
    missing = 0
    if own_run is not None:
        kept = still_on_disk(items, splits.root, split, own_run)
        items, missing = kept, len(items) - len(kept)
    unknown = sorted({c for _, cls in items for c in cls.split(MULTI_SEP) if c not in index})
    if unknown:
        raise DataError(
            f"Classes {', '.join(unknown)} in {splits.root} are not among the model's "
            f"{len(names)} classes; evaluation matches classes by name."
        )
    if info.multi_label:
        hot = torch.eye(len(names))
        samples: list[tuple[Path, Any]] = [
            (splits.root / rel, hot[[index[c] for c in cls.split(MULTI_SEP)]].sum(0))
            for rel, cls in items
        ]
    else:
        samples = [(splits.root / rel, index[cls]) for rel, cls in items]
    decodes = readable(splits.root, [p for p, _ in samples])  # as training quarantines them
    if decodes.unreadable:
        keep = set(decodes.paths)
        samples = [s for s in samples if s[0] in keep]
        if not samples:
            raise DataError(
                f"None of the {len(decodes.unreadable)} {split} images of {splits.root} decodes "
                f"(e.g. {decodes.unreadable[0].path}: {decodes.unreadable[0].error}): zoo check "
                f"{splits.root} lists them."
            )
    summary = summarize_multilabel if info.multi_label else summarize  # (multi-label:
    # thresholds re-tuned on this split, as in training)
    if check_tta(tta) == "none":
        batches = (scorer or EvalForward(model, model_arg)).loader(
            samples, info, batch_size, num_workers
        )
        logits, targets = evaluate_with(model, score, batches, dev)
        extra: dict[str, Any] = {}
    else:  # every view in one pass; view 0 is the plain eval crop: the gain, measured
        pre = info.preprocessing()
        check_views(pre, tta)
        ds = ImageFolderDataset(samples, lambda im: torch.from_numpy(views(im, pre, tta)))
        n_views = VIEWS[tta]

        def forward(x: torch.Tensor) -> torch.Tensor:  # (N, V, C, H, W) → (N, V, K)
            return score(x.flatten(0, 1)).unflatten(0, (len(x), n_views))

        per_view, targets = evaluate_with(
            model, forward, DataLoader(ds, batch_size, num_workers=num_workers), dev
        )
        logits = _combine(per_view, info.multi_label)
        plain = summary(per_view[:, 0], targets, names)
        extra = {"tta": {"mode": tta, "views": n_views, "without": plain}}
    result = summary(logits, targets, names)
    if info.calibration is not None and not info.multi_label:
        from zoo.train.calibration import ece_of

        t = info.calibration.temperature  # the fitted temperature, judged on this split
        extra["calibration"] = {
            "temperature": t,
            "ece_before": round(ece_of(logits, targets, 1.0), 6),
            "ece_after": round(ece_of(logits, targets, t), 6),
        }
    if missing:
        extra["missing"] = missing  # the run's images no longer on disk, left out
    if decodes.unreadable:  # left out too, each with why
        extra["unreadable"] = [{"path": fc.path, "error": fc.error} for fc in decodes.unreadable]
    result = {"model": model_arg, "data": str(splits.root), "split": split, **result, **extra}
    if scorer is not None:
        result["scored_by"] = scorer.name
    return Evaluated(
        model, info, names, samples, logits, targets, result, decodes.unreadable,
        own=own_run is not None,
    )  # fmt: skip


def run_eval(
    model_arg: str,
    *,
    data: str | None,
    split: Split | None,
    batch_size: int,
    device: str,
    num_workers: int,
    tta: str = "none",
) -> dict[str, Any]:
    """``zoo eval``: a model's metrics on an image folder, its classes matched by name.

    Args:
        model_arg: a model reference (a run folder evaluates its own ``split.json``).
        data: the image folder (default: a run's own data).
        split: ``val``, ``train``, ``test`` or ``all``; None: ``val``, or ``all`` of a flat
            class folder that is not the run's own (the model never saw any of it). A named
            split of such a folder is zoo's seeded split of it, as ``zoo finetune`` makes.
        batch_size: images per forward pass.
        device: ``auto``, ``cpu``, ``cuda``….
        num_workers: DataLoader workers.
        tta: test-time augmentation (:mod:`zoo.tta`): the metrics are those of the
            views' mean probabilities, and ``tta.without`` holds the plain crop's, from the
            same pass.

    Returns:
        The model, data and split, with :func:`summarize`'s (or, multi-label,
        :func:`summarize_multilabel`'s) metrics: accuracy, top-5 (among more than five
        classes), loss, macro-F1, per class.

    Raises:
        DataError: no such split, a class the model does not know, or no class names.
        Everything :func:`zoo.create_model` raises.
    """
    return evaluate_split(
        model_arg,
        data=data,
        split=split,
        batch_size=batch_size,
        device=device,
        num_workers=num_workers,
        tta=tta,
    ).result
