"""``zoo eval``: a model (run, folder or registry entry) on an image folder, classes matched
by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from zoo.device import pick_device
from zoo.errors import DataError
from zoo.factory import create_model, info_of
from zoo.ref import ModelRef
from zoo.train.data import MULTI_SEP, ImageFolderDataset, Splits, scan
from zoo.train.evaluate import evaluate_model
from zoo.train.metrics import summarize, summarize_multilabel
from zoo.transforms import eval_transform


def _splits_for(model_arg: str, data: str | None) -> Splits:
    ref = ModelRef.parse(model_arg)
    split_file = ref.path / "split.json" if ref.kind == "run" else None
    if split_file is not None and split_file.exists():
        import json

        saved = Splits.from_json(json.loads(split_file.read_text()))
        if data is None or Path(data).resolve() == saved.root:
            return saved
    if data is None:
        raise DataError(f"{model_arg} is not a run folder with a split.json: pass --data DIR.")
    return scan(data)


def run_eval(
    model_arg: str, *, data: str | None, split: str, batch_size: int, device: str, num_workers: int
) -> dict[str, Any]:
    dev = pick_device(device)
    model = create_model(model_arg).to(dev)
    info = info_of(model)
    splits = _splits_for(model_arg, data)
    if split not in splits.files:
        if splits.layout == "flat" and data is not None and split == "val":
            split = "all"  # a foreign flat folder: evaluate every image
        else:
            raise DataError(
                f"{splits.root} has no {split!r} split (has: {', '.join(splits.files)})."
            )
    names = list(info.label_names or [])
    if not names:
        raise DataError(f"{model_arg} has no class names to match the folder's classes against.")
    index = {c: i for i, c in enumerate(names)}
    items = (
        [it for k, v in splits.files.items() for it in v] if split == "all" else splits.files[split]
    )
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
    ds = ImageFolderDataset(samples, eval_transform(info))
    loader = DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
    logits, targets = evaluate_model(model, loader, dev)
    if info.multi_label:  # thresholds re-tuned on this split, as in training
        result = summarize_multilabel(logits, targets, names)
    else:
        result = summarize(logits, targets, names)
    return {"model": model_arg, "data": str(splits.root), "split": split, **result}
