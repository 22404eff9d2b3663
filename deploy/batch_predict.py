"""``zoo predict MODEL INPUTS --out FILE``: score any number of images into a CSV, JSONL or
Parquet file, in bounded memory, resumable after a kill.

The inputs are listed lazily (:mod:`zoo.deploy.predict_inputs`); a thread pool opens and
preprocesses them ahead of the model (the same :func:`zoo.images.open_image` and the model's
own preprocessing as ``zoo predict`` and ``zoo serve``; PIL's decoding and resizing release the
GIL); the model scores them in batches; every ``chunk_size`` inputs the results are committed
atomically (:class:`zoo.deploy.predict_store.ChunkStore`). A file that cannot be opened goes to
``FILE.errors.jsonl`` with its reason, unless ``strict``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from zoo.deploy.predict import Scorer, load_scorer
from zoo.deploy.predict_inputs import describe_inputs, iter_inputs
from zoo.deploy.predict_store import ChunkStore, columns, digest, format_of
from zoo.errors import InputError
from zoo.images import open_image
from zoo.ref import ModelRef
from zoo.system import available_cpus

Decoded = tuple[str, np.ndarray | None, str | None]  # path, array or None, reason or None


@dataclass(frozen=True)
class BatchSummary:
    """What a ``--out`` job did.

    Attributes:
        out: the output file.
        errors_file: the errors file, or None when every input was scored.
        done: inputs handled by this run (scored or listed as errors).
        skipped: inputs an interrupted run had already committed.
        rows: rows in the output.
        errors: inputs in the errors file (this run's and an interrupted run's).
        seconds: this run's wall time, model loading included.
    """

    out: str
    errors_file: str | None
    done: int
    skipped: int
    rows: int
    errors: int
    seconds: float

    @property
    def images_per_s(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "images_per_s": self.images_per_s}


def _decode(path: str, prepare: Callable[[Image.Image], np.ndarray]) -> Decoded:
    try:
        return path, prepare(open_image(path)), None
    except (OSError, ValueError) as exc:  # InputError (missing, undecodable, a bomb) included
        return path, None, str(exc)


def decoded(
    paths: Iterator[str], prepare: Callable[[Image.Image], np.ndarray], workers: int
) -> Generator[Decoded, None, None]:
    """Open and preprocess ``paths`` in ``workers`` threads, at most a few batches ahead.

    Yields:
        ``(path, array, None)`` or ``(path, None, reason)``, in the order of ``paths``.
    """
    ahead = max(8, 4 * workers)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="zoo-decode")
    pending: deque[Any] = deque()
    try:
        for p in paths:
            pending.append(pool.submit(_decode, p, prepare))
            if len(pending) >= ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _skip(paths: Iterator[str], committed: list[dict[str, Any]], parts: Path) -> int:
    """Consume the inputs the committed chunks cover, checking they are the same ones."""
    for i, marker in enumerate(committed):
        chunk = list(islice(paths, marker["inputs"]))
        if len(chunk) != marker["inputs"] or digest(chunk) != marker["digest"]:
            raise InputError(
                f"The inputs changed since the interrupted job in {parts} (chunk {i} held other "
                "files): restore them and rerun to resume, or add --overwrite to start over."
            )
    return sum(m["inputs"] for m in committed)


def _row(scorer: Scorer, path: str, scores: np.ndarray, k: int) -> dict[str, Any]:
    row: dict[str, Any] = {"path": path}
    for i, t in enumerate(scorer.top(scores, k), 1):
        row.update({f"label_{i}": t["label"], f"index_{i}": t["index"], f"score_{i}": t["score"]})
    if scorer.multi_label:
        row["labels"] = ";".join(scorer.decided(scores))
    return row


def predict_to_file(
    model: str | ModelRef | Scorer,
    inputs: Sequence[str],
    out: str | Path,
    *,
    top_k: int = 5,
    device: str = "cpu",
    chunk_size: int = 1024,
    batch_size: int = 32,
    workers: int | None = None,
    strict: bool = False,
    overwrite: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
) -> BatchSummary:
    """Score every image ``inputs`` name into ``out``, resuming an interrupted job.

    Args:
        model: a model reference (see :func:`zoo.deploy.predict.load_scorer`), or a loaded
            :class:`~zoo.deploy.predict.Scorer`.
        inputs: image files, folders (recursive), globs and text files listing paths.
        out: ``.csv``, ``.jsonl`` or ``.parquet``: one row per scored image (``path``, then
            ``label_i``, ``index_i``, ``score_i`` for the ``top_k`` best classes; a
            multi-label model adds ``labels``, its decided classes joined by ``;``).
        top_k: classes per row (at most the model's number of classes).
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        chunk_size: inputs per committed chunk (what a kill can cost; part of the job's
            identity: a resume needs the same value).
        batch_size: images per model call.
        workers: decoding threads (default: the CPUs available).
        strict: stop at the first input that cannot be scored instead of listing it.
        overwrite: replace an existing ``out`` and discard an interrupted job.
        on_progress: called as ``(handled_this_run, skipped)`` after each batch.

    Returns:
        The :class:`BatchSummary`.

    Raises:
        InputError: an unknown output extension, an existing output (without
            ``overwrite``), an interrupted job with other settings or inputs, a bad input
            spec, an option below 1, or (``strict``) an input that cannot be scored.
        Everything :func:`zoo.deploy.predict.load_scorer` raises.
    """
    t0 = time.perf_counter()
    out = Path(out)
    format_of(out)
    for name, value in (("top_k", top_k), ("chunk_size", chunk_size), ("batch_size", batch_size)):
        if value < 1:
            raise InputError(f"{name} must be at least 1, got {value}.")
    scorer = model if isinstance(model, Scorer) else load_scorer(model, device=device)
    k = min(top_k, scorer.num_classes)
    store = ChunkStore(out, columns(k, scorer.multi_label))
    manifest = {
        "model": scorer.identity,
        "inputs": describe_inputs(inputs),
        "top_k": k,
        "chunk_size": chunk_size,
    }
    committed = store.open(manifest, overwrite=overwrite)
    paths = iter_inputs(inputs)
    skipped = _skip(paths, committed, store.parts)
    rows = sum(m["rows"] for m in committed)
    handled, n_chunks = 0, len(committed)
    if on_progress:
        on_progress(0, skipped)
    with closing(decoded(paths, scorer.prepare, workers or available_cpus())) as stream:
        while True:
            chunk = islice(stream, chunk_size)
            chunk_paths: list[str] = []
            chunk_rows: list[dict[str, Any]] = []
            errors: list[dict[str, str]] = []
            while batch := list(islice(chunk, batch_size)):  # a batch of arrays in memory
                chunk_paths += [p for p, _, _ in batch]
                for p, _, reason in batch:
                    if reason is not None and strict:
                        raise InputError(
                            f"{reason} --strict stops at the first input that cannot be read: "
                            f"fix or remove {p!r}, or drop --strict to list such inputs in "
                            f"{store.errors_file} and go on."
                        )
                    if reason is not None:
                        errors.append({"path": p, "reason": reason})
                ok = [(p, a) for p, a, _ in batch if a is not None]
                if ok:
                    probs = scorer.score(np.stack([a for _, a in ok]))
                    chunk_rows += [
                        _row(scorer, p, s, k) for (p, _), s in zip(ok, probs, strict=True)
                    ]
                if on_progress:
                    on_progress(handled + len(chunk_paths), skipped)
            if not chunk_paths:
                break
            store.commit(n_chunks, chunk_paths, chunk_rows, errors)
            n_chunks += 1
            handled += len(chunk_paths)
            rows += len(chunk_rows)
    n_errors = store.finish(n_chunks)
    return BatchSummary(
        out=str(out),
        errors_file=str(store.errors_file) if n_errors else None,
        done=handled,
        skipped=skipped,
        rows=rows,
        errors=n_errors,
        seconds=time.perf_counter() - t0,
    )


__all__ = ["BatchSummary", "decoded", "predict_to_file"]
