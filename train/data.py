"""Image folders → splits, a class map applied by name, datasets and loaders.

Two layouts are accepted:

- ``DIR/train/<class>/…`` + ``DIR/val/<class>/…`` (``valid``/``validation`` too; optional
  ``test``), or
- a flat ``DIR/<class>/…``, split stratified and seeded into train/val; the split is written
  to the run as ``split.json`` and reused on resume and eval.

Images without labels (``zoo distill --unlabelled``: any layout) are split by
:func:`scan_unlabelled` and labelled by the teacher (:func:`zoo.train.distill.label_by_teacher`).

The user's images are never copied or modified.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset, Sampler

from zoo.errors import DataError
from zoo.images import IMAGE_EXTENSIONS, list_images, natural_key, open_image
from zoo.system import expand_home
from zoo.train.config import check_option
from zoo.train.rng import seeded

MULTI_SEP = ";"
LABELS_CSV = "labels.csv"
SPLIT_ALIASES = {"train": ("train",), "val": ("val", "valid", "validation"), "test": ("test",)}


def _class_folders(folder: Path) -> dict[str, list[Path]]:
    classes = {}
    for d in sorted(folder.iterdir(), key=lambda p: natural_key(p.name)):
        if d.is_dir() and not d.name.startswith("."):
            classes[d.name] = list_images(d)
    return classes


@dataclass
class Splits:
    """Relative file paths (to ``root``) and class names for each split."""

    root: Path
    classes: list[str]
    files: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # split -> (rel, cls)
    layout: str = "split"
    val_fraction: float | None = None
    seed: int | None = None

    def class_to_idx(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.classes)}

    def samples(self, split: str) -> list[tuple[Path, Any]]:
        """(path, class index) — or, multi-label, (path, multi-hot float tensor)."""
        idx = self.class_to_idx()
        if self.layout == "multilabel":
            out = []
            for rel, labels in self.files.get(split, []):
                target = torch.zeros(len(self.classes))
                target[[idx[c] for c in labels.split(MULTI_SEP)]] = 1.0
                out.append((self.root / rel, target))
            return out
        return [(self.root / rel, idx[cls]) for rel, cls in self.files.get(split, [])]

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "layout": self.layout,
            "val_fraction": self.val_fraction,
            "seed": self.seed,
            "classes": self.classes,
            "splits": {k: [list(t) for t in v] for k, v in self.files.items()},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], root: Path | None = None) -> Splits:
        return cls(
            root=Path(root or d["root"]),
            classes=list(d["classes"]),
            files={k: [(a, b) for a, b in v] for k, v in d["splits"].items()},
            layout=d["layout"],
            val_fraction=d.get("val_fraction"),
            seed=d.get("seed"),
        )

    def missing(self) -> list[str]:
        """The files of every split no longer under ``root`` (moved, renamed or deleted)."""
        return [
            rel
            for rows in self.files.values()
            for rel, _ in rows
            if not (self.root / rel).is_file()
        ]

    def fingerprint(self) -> str:
        """A short hash of the file list and labels (not the pixels): the data's identity."""
        h = hashlib.sha256(json.dumps(self.files, sort_keys=True).encode())
        return h.hexdigest()[:16]


def _find_split_dir(root: Path, split: str) -> Path | None:
    for alias in SPLIT_ALIASES[split]:
        if (root / alias).is_dir():
            return root / alias
    return None


def _check_classes(split_name: str, classes: dict[str, list[Path]], root: Path) -> None:
    empty = [c for c, files in classes.items() if not files]
    if empty:
        raise DataError(
            f"Class folder(s) with no images in {root}/{split_name}: {', '.join(empty)}. "
            f"Add images (extensions: {', '.join(sorted(IMAGE_EXTENSIONS))}) or remove the folder."
        )


def scan(root: str | Path, *, val_fraction: float = 0.2, seed: int = 0) -> Splits:
    """Build the splits of an image folder (see module docstring)."""
    root = expand_home(root, what="Data folder").resolve()
    if not root.is_dir():
        raise DataError(f"Data folder {root} does not exist (or is not a folder).")
    train_dir = _find_split_dir(root, "train")
    if train_dir is not None:
        val_dir = _find_split_dir(root, "val")
        if val_dir is None:
            raise DataError(
                f"{root} has a train/ folder but no val/ (or valid/, validation/) folder. Add one, "
                "or use a flat DIR/<class>/ layout to have zoo split it."
            )
        per_split = {"train": _class_folders(train_dir), "val": _class_folders(val_dir)}
        test_dir = _find_split_dir(root, "test")
        if test_dir is not None:
            per_split["test"] = _class_folders(test_dir)
        train_classes = list(per_split["train"])
        for name, classes in per_split.items():
            _check_classes(name, classes, root)
            unknown = [c for c in classes if c not in per_split["train"]]
            if unknown:
                raise DataError(
                    f"Class(es) {', '.join(unknown)} appear in {name}/ but not in train/: the "
                    "model could never predict them. Add training images or remove them."
                )
        _need_two(train_classes, root / "train")
        found = {
            name: [(str(p.relative_to(root)), cls) for cls, paths in classes.items() for p in paths]
            for name, classes in per_split.items()
        }
        return Splits(root, train_classes, found, layout="split")
    classes = _class_folders(root)
    if not classes:
        raise DataError(
            f"{root} has no class folders. Expected DIR/<class>/<image> or "
            "DIR/train/<class>/… + DIR/val/<class>/… (images without labels: zoo predict MODEL "
            "DIR answers for them, and zoo distill TEACHER --unlabelled trains on a teacher's "
            "answers)"
        )
    _check_classes("", classes, root)
    _need_two(list(classes), root)
    check_option("val_fraction", val_fraction)
    rng = random.Random(seed)
    files: dict[str, list[tuple[str, str]]] = {"train": [], "val": []}
    for cls, paths in classes.items():
        rels = [str(p.relative_to(root)) for p in paths]
        rng.shuffle(rels)
        n_val = max(1, round(len(rels) * val_fraction)) if len(rels) > 1 else 0
        files["val"] += [(r, cls) for r in sorted(rels[:n_val], key=natural_key)]
        files["train"] += [(r, cls) for r in sorted(rels[n_val:], key=natural_key)]
    return Splits(root, list(classes), files, layout="flat", val_fraction=val_fraction, seed=seed)


def scan_unlabelled(
    root: str | Path, *, val_fraction: float = 0.2, seed: int = 0
) -> tuple[Path, dict[str, list[str]]]:
    """The images of a folder without labels, split: ``DIR/train/…`` + ``DIR/val/…`` as they
    are, else every image under ``DIR`` (any depth) seeded into train/val.

    Returns:
        ``(root resolved, split -> image paths relative to it)``; the labels come later, from
        a teacher.
    """
    root = expand_home(root, what="Data folder").resolve()
    if not root.is_dir():
        raise DataError(f"Data folder {root} does not exist (or is not a folder).")
    train_dir, val_dir = _find_split_dir(root, "train"), _find_split_dir(root, "val")
    if train_dir is not None and val_dir is not None:
        rels = {
            name: [str(p.relative_to(root)) for p in list_images(d)]
            for name, d in (("train", train_dir), ("val", val_dir))
        }
    else:
        check_option("val_fraction", val_fraction)
        every = [str(p.relative_to(root)) for p in list_images(root)]
        random.Random(seed).shuffle(every)
        n_val = max(1, round(len(every) * val_fraction))
        rels = {
            "train": sorted(every[n_val:], key=natural_key),
            "val": sorted(every[:n_val], key=natural_key),
        }
    for name, found in rels.items():
        if not found:
            raise DataError(
                f"No images for the {name} split under {root} (extensions: "
                f"{', '.join(sorted(IMAGE_EXTENSIONS))}): add some, or check --data."
            )
    return root, rels


def scan_multilabel(root: str | Path, *, val_fraction: float = 0.2, seed: int = 0) -> Splits:
    """Multi-label data: ``DIR/labels.csv`` with a ``path,labels`` header, paths relative to DIR,
    labels separated by ``;`` or spaces. Split seeded, stratified by each image's first label."""
    import csv

    root = expand_home(root, what="Data folder").resolve()
    table = root / LABELS_CSV
    if not table.is_file():
        raise DataError(
            f"--multi-label needs {table}: one row per image, header 'path,labels', labels "
            "separated by ';' (e.g. 'img/001.jpg,cat;outdoor')."
        )
    rows: list[tuple[str, list[str]]] = []
    with open(table, newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"path", "labels"} <= set(reader.fieldnames):
            raise DataError(f"{table} needs the header 'path,labels' (got {reader.fieldnames}).")
        for n, row in enumerate(reader, start=2):
            labels = [x for x in re.split(r"[;\s]+", row["labels"] or "") if x]
            if not labels:
                raise DataError(f"{table} line {n}: {row['path']!r} has no labels.")
            if not (root / row["path"]).is_file():
                raise DataError(
                    f"{table} line {n}: image {row['path']!r} does not exist under {root}."
                )
            rows.append((row["path"], sorted(set(labels), key=natural_key)))
    classes = sorted({c for _, labels in rows for c in labels}, key=natural_key)
    _need_two(classes, table)
    check_option("val_fraction", val_fraction)
    rng = random.Random(seed)
    by_first: dict[str, list[tuple[str, list[str]]]] = {}
    for rel, labels in rows:
        by_first.setdefault(labels[0], []).append((rel, labels))
    files: dict[str, list[tuple[str, str]]] = {"train": [], "val": []}
    for group in by_first.values():
        rng.shuffle(group)
        n_val = max(1, round(len(group) * val_fraction)) if len(group) > 1 else 0
        files["val"] += [(r, MULTI_SEP.join(ls)) for r, ls in group[:n_val]]
        files["train"] += [(r, MULTI_SEP.join(ls)) for r, ls in group[n_val:]]
    for split in files:
        files[split].sort(key=lambda t: natural_key(t[0]))
    return Splits(root, classes, files, layout="multilabel", val_fraction=val_fraction, seed=seed)


def _need_two(classes: list[str], where: Path) -> None:
    if len(classes) < 2:
        raise DataError(
            f"Found {len(classes)} class folder(s) in {where} ({', '.join(classes) or 'none'}): "
            "classification needs at least 2. Put each class's images in its own folder."
        )


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one sample's augmentation in one epoch (every image path draws from it)."""
    return (seed * 1_000_003 + epoch) * 10_000_019 + index


class ImageFolderDataset(Dataset[tuple[torch.Tensor, Any, int]]):
    """(image tensor, label, index). Augmentation randomness is seeded per (seed, epoch,
    index), so a batch is the same whichever worker loads it and whenever a run resumes.
    Keys are ``index`` or ``(index, epoch)`` (what :class:`ResumableSampler` yields, so
    persistent workers see the current epoch)."""

    def __init__(
        self,
        samples: Sequence[tuple[Path, Any]],
        transform: Callable[[Image.Image], torch.Tensor],
        *,
        seed: int = 0,
    ) -> None:
        self.samples = list(samples)
        self.transform = transform
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.samples)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, Any, int]:
        i, epoch = key if isinstance(key, tuple) else (key, self.epoch)
        path, label = self.samples[i]
        im = open_image(path)
        with seeded(sample_seed(self.seed, epoch, i)):  # torch's, Python's and NumPy's draws
            x = self.transform(im)
        return x, label, i


class ResumableSampler(Sampler[tuple[int, int]]):
    """Seeded per-epoch permutation, sharded over ranks like ``DistributedSampler`` (padded to
    equal length), that can start part-way through an epoch (``set_position``).

    With ``weights`` (one per sample), an epoch is ``n`` draws with replacement, sample ``i``
    with probability ∝ ``weights[i]`` (torch's ``WeightedRandomSampler``, made a function of
    (seed, epoch) so a resume and every rank see the same draw).
    """

    def __init__(
        self,
        n: int,
        *,
        shuffle: bool,
        seed: int,
        batch_size: int,
        drop_last: bool,
        rank: int = 0,
        world_size: int = 1,
        weights: list[float] | None = None,
    ) -> None:
        if weights is not None and len(weights) != n:
            raise ValueError(f"{len(weights)} sampling weights for {n} samples")
        self.weights = torch.tensor(weights, dtype=torch.float64) if weights is not None else None
        self.n, self.shuffle, self.seed = n, shuffle, seed
        self.batch_size, self.drop_last = batch_size, drop_last
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.start_batch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_position(self, start_batch: int) -> None:
        self.start_batch = start_batch

    def _rank_indices(self) -> list[int]:
        if self.weights is not None:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.multinomial(self.weights, self.n, True, generator=g).tolist()
        elif self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        per_rank = -(-self.n // self.world_size)
        order += order[: per_rank * self.world_size - self.n]  # pad so every rank has as many
        return order[self.rank :: self.world_size]

    def batches_per_epoch(self) -> int:
        per_rank = -(-self.n // self.world_size)
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        idx = self._rank_indices()
        if self.drop_last:
            idx = idx[: self.batches_per_epoch() * self.batch_size]
        return iter([(i, self.epoch) for i in idx[self.start_batch * self.batch_size :]])

    def __len__(self) -> int:
        total = len(self._rank_indices())
        if self.drop_last:
            total = self.batches_per_epoch() * self.batch_size
        return max(0, total - self.start_batch * self.batch_size)
