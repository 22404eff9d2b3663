"""The images of a ``zoo enroll`` (:mod:`zoo.train.enroll`): the new class's own (distinct,
readable), the *reference* images of the existing classes the new row is fitted against, and
the run's validation images that check the enrolled model; and their embeddings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo.errors import DataError, InputError

MIN_IMAGES = 5
REFERENCE_LIMIT = 512  # reference images embedded (a seeded sample of the run's training split)
CHECK_LIMIT = 1000  # validation images the enrolled model is checked on
BATCH = 64

Embed = Callable[[list[Path]], tuple[np.ndarray, np.ndarray]]
"""``paths → (logits, embeddings)``: ``(N, C)`` and ``(N, D)`` float64."""


@dataclass(frozen=True)
class Reference:
    """Images of the existing classes to fit the new row against.

    Attributes:
        paths: the image files.
        labels: each one's class index.
        described: where they come from, for the report (``512 of run cnn's 1294 train
            images (seed 0)``).
        run: the run whose validation split can check the enrolled model (None: none).
    """

    paths: tuple[Path, ...]
    labels: tuple[int, ...]
    described: str
    run: Path | None


@dataclass(frozen=True)
class OldClassCheck:
    """The enrolled model on the run's validation images (none of them of the new class).

    Attributes:
        images: how many were scored; total: how many the split has.
        acc_before / acc_after: top-1 on them, before and after enrolment.
        taken: how many of them the new class now answers.
    """

    images: int
    total: int
    acc_before: float
    acc_after: float
    taken: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "total": self.total,
            "acc_before": self.acc_before,
            "acc_after": self.acc_after,
            "taken": self.taken,
        }


def distinct_images(paths: tuple[Path, ...]) -> tuple[list[Path], list[str]]:
    """The images with distinct bytes, and their sha256 digests.

    Raises:
        InputError: an image is missing or cannot be decoded (named), or fewer than
            :data:`MIN_IMAGES` are distinct.
    """
    from zoo.images import open_image

    seen: dict[str, Path] = {}
    for p in paths:
        open_image(p)  # the InputError names the file when it is missing or not an image
        seen.setdefault(hashlib.sha256(Path(p).read_bytes()).hexdigest(), Path(p))
    if len(seen) < MIN_IMAGES:
        raise InputError(
            f"Only {len(seen)} distinct images among the {len(paths)} given (the others repeat "
            f"their bytes): enrolling a class needs at least {MIN_IMAGES} different images."
        )
    return list(seen.values()), list(seen)


def embedder(net: Any, info: Any, device: Any) -> Embed:
    """:data:`Embed` for ``net`` (its declared classifier module's input: the embedding
    :func:`zoo.embeddings.torch_features` hooks), eval preprocessing, batches of :data:`BATCH`."""
    import torch

    from zoo.embeddings import torch_features
    from zoo.images import open_image
    from zoo.transforms import eval_transform

    tf = eval_transform(info)
    features = torch_features(net, info.classifier)

    def run(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
        logits, feats = [], []
        for i in range(0, len(paths), BATCH):
            x = torch.stack([tf(open_image(p)) for p in paths[i : i + BATCH]]).to(device)
            with torch.inference_mode():
                lo, f = features(x)
            logits.append(lo.double().cpu().numpy())
            feats.append(f.astype(np.float64))
        return np.concatenate(logits), np.concatenate(feats)

    return run


def reference_images(
    model: str, folder: Path, config: dict[str, Any], data: Path | None
) -> Reference:
    """The reference images: ``data`` when given, else a seeded sample of the training split
    of the run ``folder`` belongs to (or, for a folder enrolled before, the run recorded).

    Raises:
        InputError: no ``data`` and no run, or ``data`` holds no folder named after a class.
        DataError: the run's split names no image that still exists.
    """
    from zoo.run_images import find_run, run_validation_images

    classes = list(config["class_names"])
    index = {c: i for i, c in enumerate(classes)}
    run = find_run(folder)
    if run is None:  # a folder enrolled before, written away from its run
        recorded = [e.get("reference_run") for e in config.get("enrolled", [])]
        run = next((Path(r) for r in reversed(recorded) if r and find_run(r)), None)
    if data is not None:
        return _data_reference(data, index, run)
    if run is None:
        raise InputError(
            f"{model} belongs to no run, so there are no images of its existing classes to "
            "fit the new class against: pass --data DIR (an image folder with a subfolder per "
            "class, like the one it was trained on)."
        )
    imgs = run_validation_images(run, limit=REFERENCE_LIMIT, split="train")
    pairs = [(p, index[c]) for p, c in zip(imgs.paths, imgs.labels, strict=True) if c in index]
    return Reference(
        paths=tuple(p for p, _ in pairs),
        labels=tuple(i for _, i in pairs),
        described=imgs.describe(),
        run=run,
    )


def _data_reference(data: Path, index: dict[str, int], run: Path | None) -> Reference:
    from zoo.images import list_images

    if not data.is_dir():
        raise InputError(
            f"--data {data} is not a folder: give an image folder, one subfolder per class."
        )
    found = [
        (p, index[d.name])
        for d in sorted(data.iterdir())
        if d.name in index and d.is_dir()  # a class folder may be a link: no rglob across it
        for p in list_images(d)
    ]
    if not found:
        names = list(index)
        raise InputError(
            f"--data {data}: no images in subfolders named after the model's classes "
            f"({', '.join(names[:5])}{'…' if len(names) > 5 else ''})."
        )
    chosen = sorted(np.random.default_rng(0).permutation(len(found))[:REFERENCE_LIMIT])
    return Reference(
        paths=tuple(found[i][0] for i in chosen),
        labels=tuple(found[i][1] for i in chosen),
        described=f"{len(chosen)} of the {len(found)} images in {data} (seed 0)",
        run=run,
    )


def check_old_classes(
    run: Path | None, embed: Embed, classes: list[str], head: Callable[[np.ndarray], np.ndarray]
) -> tuple[OldClassCheck | None, np.ndarray | None]:
    """The old classes on the run's validation images, before and after enrolment, and the
    enrolled model's logits on them (None, None: no run or no validation images at hand).

    Args:
        run: the run folder.
        embed: the model's :data:`Embed` (its logits are the "before").
        classes: the model's classes before enrolment.
        head: embeddings ``(N, D)`` → the enrolled model's logits ``(N, C + 1)``.
    """
    from zoo.run_images import run_validation_images

    if run is None:
        return None, None
    try:
        val = run_validation_images(run, limit=CHECK_LIMIT)
    except DataError:
        return None, None
    index = {c: i for i, c in enumerate(classes)}
    keep = [i for i, label in enumerate(val.labels) if label in index]
    if not keep:
        return None, None
    before, f = embed([val.paths[i] for i in keep])
    after = head(f)
    y = np.array([index[val.labels[i]] for i in keep])
    check = OldClassCheck(
        images=len(keep),
        total=val.total,
        acc_before=round(float((before.argmax(1) == y).mean()), 6),
        acc_after=round(float((after.argmax(1) == y).mean()), 6),
        taken=int((after.argmax(1) == len(classes)).sum()),
    )
    return check, after


__all__ = [
    "BATCH",
    "CHECK_LIMIT",
    "MIN_IMAGES",
    "REFERENCE_LIMIT",
    "Embed",
    "OldClassCheck",
    "Reference",
    "check_old_classes",
    "distinct_images",
    "embedder",
    "reference_images",
]
