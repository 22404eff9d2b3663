"""A fine-tuned model's own images: the validation split of the run that trained it.

The one place that answers "which real images belong to this model's distribution?" for the
commands that judge a model after training (``zoo export``'s parity gate, ``zoo quantize``'s
accuracy and agreement). A model fine-tuned on digits is judged on its run's digits, never on
the bundled ImageNet photos alone.

A run is found from any of its artifacts: the run folder, its ``model/`` folder, a file in that
folder (``model.onnx``) or in the folder's ``variants/``. Reads JSON only; never imports torch.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from zoo.errors import DataError, InputError

SPLIT_FILE = "split.json"
Split = Literal["train", "val", "test", "all"]  # what an evaluation scores ("all": every image)
DEFAULT_SAMPLE = 64  # export's gate: enough to catch a wrong graph, cheap on 2 cores
DEFAULT_SEED = 0


@dataclass(frozen=True)
class RunImages:
    """A seeded sample of a run's validation images.

    Attributes:
        run: the run folder they come from.
        paths: the image files, in a seeded order.
        labels: each image's class name (``;``-joined names for a multi-label run).
        total: how many validation images the run has (``len(paths)`` when not sampled).
        seed: the sampling seed.
    """

    run: Path
    paths: tuple[Path, ...]
    labels: tuple[str, ...]
    total: int
    seed: int = DEFAULT_SEED
    split: str = "val"
    unreadable: tuple[Path, ...] = ()  # met while sampling, left out: they no longer decode

    def describe(self, count: int | None = None) -> str:
        """For reports: which images, e.g. ``64 of run digits's 359 validation images (seed 0)``
        (``count``: the first ``count`` of them, those a caller kept)."""
        n = len(self.paths) if count is None else count
        of = f"{n} of" if n < self.total else "all"
        kind = "validation" if self.split == "val" else self.split
        bad = len(self.unreadable)
        return (
            f"{of} run {self.run.name}'s {self.total} {kind} images"
            + (f" (seed {self.seed})" if n < self.total else "")
            + (
                f"; {bad} that no longer {'decodes' if bad == 1 else 'decode'} left out "
                f"(e.g. {self.unreadable[0]})"
                if bad
                else ""
            )
        )


def find_run(path: str | os.PathLike[str]) -> Path | None:
    """The run folder that ``path`` (a run, its model folder, or a file inside those) belongs
    to, or None. A run is a folder holding ``split.json`` and ``model/``."""
    p = Path(path).resolve()
    for candidate in (p, *p.parents)[:4]:  # run / model / variants / file at most
        if (candidate / SPLIT_FILE).is_file() and (candidate / "model").is_dir():
            return candidate
    return None


def run_validation_images(
    run: str | os.PathLike[str],
    *,
    limit: int | None = DEFAULT_SAMPLE,
    seed: int = DEFAULT_SEED,
    split: str = "val",
) -> RunImages:
    """A seeded sample of ``limit`` images (all when None) of ``run``'s validation split (or
    of ``split``: ``train`` gives ``zoo quantize`` calibration images disjoint from them).

    Raises:
        DataError: no ``split.json``, no validation images, or none of them still on disk
            (the message names the folder the split points to).
    """
    run = Path(run)
    try:
        doc = json.loads((run / SPLIT_FILE).read_text())
        root = Path(doc["root"])
        rows = [(str(rel), str(label)) for rel, label in doc["splits"].get(split, [])]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{run / SPLIT_FILE} cannot be read ({exc}): pass --data DIR.") from exc
    present = [(root / rel, label) for rel, label in still_on_disk(rows, root, split, run)]
    random.Random(seed).shuffle(present)
    chosen: list[tuple[Path, str]] = []
    unreadable: list[Path] = []
    for path, label in present:  # in the seeded order, until ``limit`` decode
        if limit is not None and len(chosen) == limit:
            break
        if limit is None or _decodes(path):  # a sample is checked; all: their reader names one
            chosen.append((path, label))
        else:  # damaged since the run: left out, as its data check quarantines
            unreadable.append(path)
    if present and not chosen:
        raise DataError(
            f"None of run {run}'s {split} images under {root} decodes any more (e.g. "
            f"{unreadable[0]}): pass --data DIR with images like the run's."
        )
    return RunImages(
        run=run,
        paths=tuple(p for p, _ in chosen),
        labels=tuple(label for _, label in chosen),
        total=len(present) - (len(unreadable) if limit is None else 0),
        seed=seed,
        split=split,
        unreadable=tuple(unreadable),
    )


def _decodes(path: Path) -> bool:
    """Whether ``path`` decodes (:func:`zoo.images.open_image`; a sample of a few dozen: the
    data check's cache lives in ``zoo.train``, which this torch-free module never imports)."""
    from zoo.images import open_image

    try:
        open_image(path)
    except InputError:
        return False
    return True


def still_on_disk(
    rows: list[tuple[str, str]], root: Path, split: str, run: Path
) -> list[tuple[str, str]]:
    """The (relative path, label) ``rows`` of ``run``'s ``split`` whose file is still under
    ``root`` (images moved or deleted since the run are left out: callers count them).

    Raises:
        DataError: rows were given and none of them is there any more.
    """
    kept = [(rel, label) for rel, label in rows if (root / rel).is_file()]
    if rows and not kept:
        raise DataError(
            f"run {run} has {len(rows)} {split} images in {SPLIT_FILE}, but none exist under "
            f"{root} any more: pass --data DIR with images like the run's."
        )
    return kept


def images_for(
    model: str | os.PathLike[str], *, limit: int | None = DEFAULT_SAMPLE, seed: int = DEFAULT_SEED
) -> RunImages | None:
    """The validation sample of the run ``model`` belongs to; None when it belongs to none
    (a registry entry, a bundle, a pulled model)."""
    run = find_run(model)
    return None if run is None else run_validation_images(run, limit=limit, seed=seed)
