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

from zoo.errors import DataError, InputError, some_of
from zoo.model_config import ModelConfig

MIN_IMAGES = 5
REFERENCE_LIMIT = 512  # reference images embedded (a seeded sample of the run's training split)
CHECK_LIMIT = 1000  # validation images the enrolled model is checked on
BATCH = 64
VIEWS = 4
"""Augmented views of each new-class image the row is fitted on, beside its eval view (the
training augmentation: :func:`zoo.transforms.train_transform`; on digits, 3 seeds, no cap:
recall 0.86 with 4 views, 0.85 with 8, 0.83 with 16)."""
BANK_VIEWS = 16
"""Augmented views of each new-class image added to a ``knn`` rule's bank beside its eval
view: five images cover little of a class, so its held-out images score low against them and
are answered unknown (digits, 5 seeds: 52% of held-out images accepted with the eval views
alone, 66% with 16 views each; the old classes' test images 94% either way)."""
REFERENCE_VIEWS = 1
"""Augmented views of each reference image, so that "augmented" is not what tells the new
class from the old ones (digits, 3 seeds, 8 views: +2 points of recall, and 0.3 point less
lost by the old classes)."""

Embed = Callable[[list[Path]], tuple[np.ndarray, np.ndarray]]
"""``paths → (logits, embeddings)``: ``(N, C)`` and ``(N, D)`` float64."""
Views = Callable[[list[Path], int], np.ndarray]
"""``(paths, n) → embeddings`` of ``n`` random views of each path, in order: ``(N·n, D)``."""


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
class Validation:
    """The run's validation images of the old classes, embedded once.

    Attributes:
        labels: ``(N,)`` class indices.
        logits: ``(N, C)`` the model's logits before enrolment.
        features: ``(N, D)`` their embeddings.
        total: how many images the split has (``N`` may be fewer: :data:`CHECK_LIMIT`).
    """

    labels: np.ndarray
    logits: np.ndarray
    features: np.ndarray
    total: int


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


def view_embedder(net: Any, info: Any, device: Any, seed: int = 0) -> Views:
    """:data:`Views` for ``net``: the training augmentation's random views (seeded: the same
    images give the same views), embedded like :func:`embedder`'s."""
    import torch

    from zoo.embeddings import torch_features
    from zoo.images import open_image
    from zoo.train.rng import seeded
    from zoo.transforms import train_transform

    tf = train_transform(info)
    features = torch_features(net, info.classifier)

    def run(paths: list[Path], views: int) -> np.ndarray:
        items = [p for p in paths for _ in range(views)]
        feats = []
        with seeded(seed):
            for i in range(0, len(items), BATCH):
                x = torch.stack([tf(open_image(p)) for p in items[i : i + BATCH]]).to(device)
                with torch.inference_mode():
                    feats.append(features(x)[1].astype(np.float64))
        return np.concatenate(feats)

    return run


def reference_images(model: str, folder: Path, config: ModelConfig, data: Path | None) -> Reference:
    """The reference images: ``data`` when given, else a seeded sample of the training split
    of the run ``folder`` belongs to (or, for a folder enrolled before, the run recorded).

    Raises:
        InputError: no ``data`` and no run, or ``data`` holds no folder named after a class.
        DataError: the run's split names no image that still exists.
    """
    from zoo.run_images import find_run, run_validation_images

    classes = list(config.class_names)
    index = {c: i for i, c in enumerate(classes)}
    run = find_run(folder)
    if run is None:  # a folder enrolled before, written away from its run
        recorded = [e.get("reference_run") for e in config.enrolled]
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
            f"({some_of(names)})."
        )
    chosen = sorted(np.random.default_rng(0).permutation(len(found))[:REFERENCE_LIMIT])
    return Reference(
        paths=tuple(found[i][0] for i in chosen),
        labels=tuple(found[i][1] for i in chosen),
        described=f"{len(chosen)} of the {len(found)} images in {data} (seed 0)",
        run=run,
    )


def old_class_validation(run: Path | None, embed: Embed, classes: list[str]) -> Validation | None:
    """The run's validation images of ``classes``, embedded (None: no run, or no validation
    image of those classes at hand)."""
    from zoo.run_images import run_validation_images

    if run is None:
        return None
    try:
        val = run_validation_images(run, limit=CHECK_LIMIT)
    except DataError:
        return None
    index = {c: i for i, c in enumerate(classes)}
    keep = [i for i, label in enumerate(val.labels) if label in index]
    if not keep:
        return None
    logits, features = embed([val.paths[i] for i in keep])
    labels = np.array([index[val.labels[i]] for i in keep])
    return Validation(labels=labels, logits=logits, features=features, total=val.total)


def check_old_classes(val: Validation, after: np.ndarray) -> OldClassCheck:
    """The old classes' top-1 before and after enrolment on ``val``.

    Args:
        val: the validation images.
        after: the enrolled model's logits on them, ``(N, C + 1)``.
    """
    new = val.logits.shape[1]
    return OldClassCheck(
        images=len(val.labels),
        total=val.total,
        acc_before=round(float((val.logits.argmax(1) == val.labels).mean()), 6),
        acc_after=round(float((after.argmax(1) == val.labels).mean()), 6),
        taken=int((after.argmax(1) == new).sum()),
    )


__all__ = [
    "BANK_VIEWS",
    "BATCH",
    "CHECK_LIMIT",
    "MIN_IMAGES",
    "REFERENCE_LIMIT",
    "REFERENCE_VIEWS",
    "VIEWS",
    "Embed",
    "OldClassCheck",
    "Reference",
    "Validation",
    "Views",
    "check_old_classes",
    "distinct_images",
    "embedder",
    "old_class_validation",
    "reference_images",
    "view_embedder",
]
