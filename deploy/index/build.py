"""``zoo index MODEL DIR -o INDEX``: every image under a folder through the model's
penultimate layer, L2-normalised, streamed into an index folder (:mod:`.store`).

The model is loaded as ``zoo predict`` loads it (:func:`zoo.deploy.predict.scoring.load_scorer`
with ``embeddings=True``: the classifier layer's input, from PyTorch or an ONNX file) and the
images are decoded by the same threads as ``zoo predict --out``
(:func:`zoo.deploy.predict.batch.decoded`). Memory: one batch being embedded, the images
decoding ahead of it, and one shard of rows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import asdict, dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Any

import numpy as np

from zoo.deploy.index.search import normalise
from zoo.deploy.index.store import MANIFEST, IndexWriter, ModelIdentity, fresh_index_name
from zoo.deploy.predict.scoring import Scorer
from zoo.errors import InputError


@dataclass(frozen=True)
class Embedded:
    """One batch: the readable images' paths and their normalised ``(n, D)`` embeddings, and
    the unreadable ones with their reasons."""

    paths: list[str]
    rows: np.ndarray
    skipped: list[tuple[str, str]]


def load_embedder(model: str, *, device: str = "cpu") -> Scorer:
    """``model`` loaded for its embeddings (no rejection rule: every image gets its row)."""
    from zoo.deploy.predict.scoring import load_scorer

    return load_scorer(model, device=device, embeddings=True, spin=False, reject=False)


def embed_paths(
    scorer: Scorer, paths: Iterable[str], *, batch_size: int = 32, workers: int | None = None
) -> Iterator[Embedded]:
    """The images' embeddings, batch by batch, in order (decoded ahead by ``workers``
    threads, default the CPUs available)."""
    from zoo.deploy.predict.batch import decoded
    from zoo.system import available_cpus

    workers = workers or available_cpus()
    with closing(decoded(iter(paths), scorer.prepare, workers, batch_size + 2 * workers)) as s:
        while batch := list(islice(s, batch_size)):
            ok = [(p, a) for p, a, _ in batch if a is not None]
            bad = [(p, str(r)) for p, a, r in batch if a is None]
            rows = np.zeros((0, 0), dtype=np.float32)
            if ok:
                feats = scorer.scored(scorer.batch([a for _, a in ok]), features=True).features
                assert feats is not None, "load the scorer with embeddings=True"
                rows = normalise(feats)
            yield Embedded([p for p, _ in ok], rows, bad)


def folder_images(folder: str | Path) -> Iterator[str]:
    """The image files under ``folder``, listed lazily as ``zoo predict`` lists a folder
    (:func:`zoo.deploy.predict.inputs.iter_inputs`: natural order, symlinked folders followed).

    Raises:
        InputError: no such folder, or no image in it.
    """
    from zoo.deploy.predict.inputs import iter_inputs

    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"{root}: no such folder (a folder of images).")
    found = iter_inputs([str(root)])
    first = next(found, None)
    if first is None:
        raise InputError(f"{root} holds no images (.jpg, .png, …).")
    return chain([first], found)


@dataclass(frozen=True)
class IndexSummary:
    """What ``zoo index`` wrote."""

    out: str
    model: str
    rows: int
    dim: int
    shards: int
    skipped: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        skipped = f", {self.skipped} unreadable (listed in index.json)" if self.skipped else ""
        return (
            f"indexed {self.rows:,} images → {self.out}: {self.dim}-d embeddings of "
            f"{self.model}, {self.shards} shard(s){skipped}; {self.seconds:.1f} s"
        )


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def build_index(
    model: str,
    folder: str | Path,
    out: str | Path,
    *,
    batch_size: int = 32,
    workers: int | None = None,
    device: str = "cpu",
    overwrite: bool = False,
) -> IndexSummary:
    """Index every image under ``folder`` into ``out``.

    Args:
        model: a model reference as ``zoo predict`` takes it (registry name, run or model
            folder, ``.onnx`` file, OpenVINO IR).
        folder: the images (recursive); the index keeps their paths relative to it.
        out: the index folder to write.
        batch_size: images per model call.
        workers: decoding threads (default: the CPUs available).
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        overwrite: replace an existing ``out``.

    Returns:
        The :class:`IndexSummary`.

    Raises:
        InputError: no such folder or no image in it, none readable, ``out`` exists
            (without ``overwrite``; with it, unless ``out`` is an index), or a model without
            embeddings or trained weights.
    """
    t0 = time.perf_counter()
    root, out = Path(folder).resolve(), Path(out)
    if out.exists() and not _empty_dir(out):  # an empty folder has nothing to lose
        if not (out / MANIFEST).is_file():  # --overwrite or not: not ours to delete
            raise InputError(
                f"-o {out} exists and is not a zoo index (no {MANIFEST}): --overwrite replaces "
                f"an index only. Name a new folder, e.g. -o {fresh_index_name(out)}"
            )
        if not overwrite:
            raise InputError(f"{out} already exists: pass --overwrite to replace it.")
    images = folder_images(root)
    identity = ModelIdentity.of(model)  # before loading: a random-weights entry is refused
    scorer = load_embedder(model, device=device)
    with IndexWriter(out, identity, root) as writer:
        for e in embed_paths(scorer, images, batch_size=batch_size, workers=workers):
            if e.paths:
                writer.add([os.path.relpath(p, root) for p in e.paths], e.rows)
            for p, reason in e.skipped:
                writer.skip(os.path.relpath(p, root), reason)
        m = writer.publish()
    return IndexSummary(
        str(out), identity.ref, m.rows, m.dim, len(m.shards), len(m.skipped),
        round(time.perf_counter() - t0, 3),
    )  # fmt: skip


__all__ = ["Embedded", "IndexSummary", "build_index", "embed_paths", "folder_images"]
