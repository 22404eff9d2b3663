"""Exact nearest neighbours by inner product (cosine similarity, the rows being L2-normalised):
numpy by default, FAISS's ``IndexFlatIP`` (``pip install 'zoo[faiss]'``) for a big index
searched by many queries at once.

Why by size and by queries: both are BLAS-bound exact searches. Measured on 2 loaded cores
(unit rows, D 512, median of 7): FAISS was 0.2–0.5× numpy's speed for 1–32 queries at every
size up to 300k rows, and 1.1–1.8× for 1,024 queries from 100k rows up; so ``auto`` picks FAISS
only there (``bench/index_scale.py`` re-measures the table by size; these constants follow it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from zoo.deploy.choices import SEARCH_BACKENDS
from zoo.errors import BackendUnavailableError, InputError

FAISS_MIN_ROWS = 100_000
FAISS_MIN_QUERIES = 1_000
BLOCK = 1 << 22  # numpy: similarities computed per block of queries × rows (16 MiB)


class Searcher(Protocol):
    """Rows added shard by shard, then searched."""

    name: str

    def add(self, rows: np.ndarray) -> None: ...

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(similarities, row indices)``, each ``(Q, k)``, best first."""
        ...


class NumpySearcher:
    """Exact search with one matrix product per block of queries (memory: the rows, in one
    preallocated array, and one :data:`BLOCK` of similarities)."""

    name = "numpy"

    def __init__(self, rows: int, dim: int) -> None:
        self.rows = np.empty((rows, dim), dtype=np.float32)
        self.filled = 0

    def add(self, rows: np.ndarray) -> None:
        self.rows[self.filled : self.filled + len(rows)] = rows
        self.filled += len(rows)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self.rows[: self.filled]
        k = min(k, len(rows))
        step = max(1, BLOCK // max(1, len(rows)))
        sims, idx = [], []
        for start in range(0, len(queries), step):
            s = queries[start : start + step] @ rows.T
            top = np.argpartition(-s, k - 1, axis=1)[:, :k]
            top_s = np.take_along_axis(s, top, axis=1)
            order = np.argsort(-top_s, axis=1, kind="stable")
            sims.append(np.take_along_axis(top_s, order, axis=1))
            idx.append(np.take_along_axis(top, order, axis=1))
        return np.concatenate(sims), np.concatenate(idx)


class FaissSearcher:
    """FAISS's exact ``IndexFlatIP`` (the rows held by FAISS only)."""

    name = "faiss"

    def __init__(self, dim: int) -> None:
        import faiss

        self.index = faiss.IndexFlatIP(dim)

    def add(self, rows: np.ndarray) -> None:
        self.index.add(np.ascontiguousarray(rows, dtype=np.float32))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.index.ntotal)
        sims, idx = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return sims, idx


def faiss_installed() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def choose(backend: str, rows: int, queries: int) -> str:
    """The backend to use: ``numpy`` or ``faiss`` (``auto``: see the module docstring).

    Raises:
        InputError: an unknown name.
        BackendUnavailableError: ``faiss`` asked for and not installed.
    """
    if backend not in SEARCH_BACKENDS:
        raise InputError(
            f"Unknown search backend {backend!r}: one of {', '.join(SEARCH_BACKENDS)}."
        )
    if backend == "faiss" and not faiss_installed():
        raise BackendUnavailableError(
            "--backend faiss needs FAISS: pip install 'zoo[faiss]' (or use --backend numpy)."
        )
    if backend != "auto":
        return backend
    big = rows >= FAISS_MIN_ROWS and queries >= FAISS_MIN_QUERIES
    return "faiss" if big and faiss_installed() else "numpy"


def make_searcher(name: str, rows: int, dim: int) -> Searcher:
    """An empty searcher of :func:`choose`'s pick, for ``rows`` rows of width ``dim``."""
    return FaissSearcher(dim) if name == "faiss" else NumpySearcher(rows, dim)


def normalise(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, float32 (an all-zero row stays zero)."""
    x = np.asarray(x, dtype=np.float32)
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(n, 1e-12)


@dataclass(frozen=True)
class Neighbour:
    """One nearest indexed image: its path (relative to the indexed folder) and the cosine
    similarity of its embedding to the query's."""

    path: str
    similarity: float

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "similarity": self.similarity}


__all__ = [
    "FaissSearcher",
    "Neighbour",
    "NumpySearcher",
    "Searcher",
    "choose",
    "make_searcher",
    "normalise",
]
