"""Searching an index: ``zoo similar INDEX IMAGE…`` (the nearest indexed images by cosine
similarity), and the kNN out-of-distribution score of ``zoo eval --ood --knn`` (Sun et al.
2022, "Out-of-distribution detection with deep nearest neighbors": the distance from an
image's normalised embedding to its k-th nearest training embedding; far means unfamiliar).

A query's embeddings must come from the model that built the index: the model is the one the
index names, or one given whose weights digest (:class:`~.store.ModelIdentity`) is the same;
any other is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo.deploy.index import KNN_K
from zoo.deploy.index.build import embed_paths, folder_images, load_embedder
from zoo.deploy.index.search import Neighbour, Searcher, choose, make_searcher
from zoo.deploy.index.store import IndexManifest, ModelIdentity, read_paths, read_shards
from zoo.deploy.predict.scoring import Scorer
from zoo.errors import InputError, ModelRefError


def query_model(m: IndexManifest, index: str | Path, model: str | None) -> str:
    """The model to embed queries with: ``model``, or the one that built the index.

    Raises:
        InputError: the model's weights are not the index's (another model, or the same
            one retrained since), or the index's model is gone and none is given.
    """
    chosen = model or m.model.ref
    try:
        ident = ModelIdentity.of(chosen)
    except ModelRefError as exc:
        if model is not None:
            raise
        raise InputError(
            f"The model that built {index}, {m.model.ref}, is no longer there ({exc}): pass "
            "--model with the same weights (its copy or export), or rebuild the index."
        ) from exc
    if ident.digest != m.model.digest:
        raise InputError(
            f"{index} holds embeddings of {m.model.ref} (weights sha256 "
            f"{m.model.digest[:12]}…), but {chosen} has other weights ({ident.digest[:12]}…): "
            "embeddings of different models are not comparable. Query with the model that "
            f"built the index, or rebuild it: zoo index {chosen} DIR -o {index} --overwrite."
        )
    return chosen


def check_index(index: str | Path, model: str) -> IndexManifest:
    """``index``'s manifest, once :func:`query_model` accepts ``model`` for it (a command
    refuses a mismatch before its long work, not after it)."""
    m = IndexManifest.read(index)
    query_model(m, index, model)
    return m


def load_searcher(index: str | Path, m: IndexManifest, backend: str, queries: int) -> Searcher:
    """The index's rows in a searcher of ``backend`` (``auto``: by size, see :mod:`.search`)."""
    s = make_searcher(choose(backend, m.rows, queries), m.rows, m.dim)
    for _, rows in read_shards(index, m):
        s.add(rows)
    return s


@dataclass(frozen=True)
class Similar:
    """A query image and its nearest indexed images, best first."""

    image: str
    neighbours: tuple[Neighbour, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"image": self.image, "neighbours": [n.to_dict() for n in self.neighbours]}

    def lines(self) -> list[str]:
        return [f"{self.image}:", *(f"  {n.similarity:.4f}  {n.path}" for n in self.neighbours)]


def similar(
    index: str | Path,
    images: Sequence[str],
    *,
    k: int = 5,
    model: str | None = None,
    backend: str = "auto",
    device: str = "cpu",
) -> list[Similar]:
    """The ``k`` nearest indexed images of each image.

    Raises:
        InputError: not an index, a model with other weights, an unreadable image, ``k < 1``.
        ArtifactError: an incomplete or malformed index.
    """
    if k < 1:
        raise InputError(f"-k must be at least 1, got {k}.")
    m = IndexManifest.read(index)
    scorer = load_embedder(query_model(m, index, model), device=device)
    rows, unreadable = [], []
    for e in embed_paths(scorer, images, batch_size=32):
        rows.append(e.rows)
        unreadable += e.skipped
    if unreadable:
        p, reason = unreadable[0]
        raise InputError(f"Cannot read {p}: {reason}")
    sims, idx = load_searcher(index, m, backend, len(images)).search(np.concatenate(rows), k)
    paths = read_paths(index, m)
    return [
        Similar(
            img, tuple(Neighbour(paths[j], round(float(s), 6)) for s, j in zip(sr, ir, strict=True))
        )
        for img, sr, ir in zip(images, sims, idx, strict=True)
    ]


def knn_scores(searcher: Searcher, rows: np.ndarray, k: int = KNN_K) -> np.ndarray:
    """Each row's negated Euclidean distance to its ``k``-th nearest indexed row (higher: more
    in-distribution; rows unit-norm, so the distance is ``sqrt(2 - 2 cos)``), float64."""
    sims, _ = searcher.search(rows, k)
    kth = np.asarray(sims[:, -1], dtype=np.float64)
    return -np.sqrt(np.clip(2.0 - 2.0 * kth, 0.0, None))


def embed_all(scorer: Scorer, paths: Sequence[str | Path], batch_size: int) -> np.ndarray:
    """``(n, D)`` normalised embeddings of readable ``paths`` (unreadable ones are left out,
    as :func:`zoo.train.ood.outside_images` leaves them out of the logits)."""
    parts = [e.rows for e in embed_paths(scorer, map(str, paths), batch_size=batch_size) if e.paths]
    return np.concatenate(parts)


def train_images(model: str) -> list[Path]:
    """The training images of the run ``model`` belongs to (a run, its model folder, or a file
    in it), for a kNN index built on the fly.

    Raises:
        InputError: ``model`` belongs to no run.
        DataError: the run's split lists no training image still on disk.
    """
    from zoo.run_images import find_run, run_validation_images

    run = find_run(model) if Path(model).exists() else None
    if run is None:
        raise InputError(
            f"--knn embeds the training images of the run, and {model} is not a run: index "
            f"its training images (zoo index {model} DIR -o INDEX) and pass --index INDEX."
        )
    return list(run_validation_images(run, limit=None, split="train").paths)


def knn_ood(
    model: str,
    inside: Sequence[Path],
    outside: str | Path,
    *,
    index: str | Path | None = None,
    k: int = KNN_K,
    batch_size: int = 64,
    device: str = "cpu",
) -> tuple[np.ndarray, np.ndarray]:
    """kNN scores of the held-out (``inside``) images and of the images under ``outside``,
    against ``index`` (an index of the model's training images) or, without one, the training
    images of ``model``'s run embedded here (in memory, nothing written).

    Returns:
        ``(inside scores, outside scores)``, float64.

    Raises:
        InputError: an index of another model's embeddings, no run to take the training
            images from, or no image under ``outside``.
    """

    out_paths = list(folder_images(outside))
    queries = len(inside) + len(out_paths)
    if index is not None:
        m = IndexManifest.read(index)
        scorer = load_embedder(query_model(m, index, model), device=device)
        searcher = load_searcher(index, m, "auto", queries)
    else:
        train = train_images(model)
        scorer = load_embedder(model, device=device)
        pick, found = choose("auto", len(train), queries), None
        for e in embed_paths(scorer, map(str, train), batch_size=batch_size):
            if e.paths:
                found = found or make_searcher(pick, len(train), e.rows.shape[1])
                found.add(e.rows)
        if found is None:
            raise InputError("None of the run's training images could be read.")
        searcher = found
    pos = knn_scores(searcher, embed_all(scorer, inside, batch_size), k)
    neg = knn_scores(searcher, embed_all(scorer, out_paths, batch_size), k)
    return pos, neg


__all__ = [
    "Similar",
    "check_index",
    "knn_ood",
    "knn_scores",
    "load_searcher",
    "query_model",
    "similar",
    "train_images",
]
