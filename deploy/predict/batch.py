"""``zoo predict MODEL INPUTS --out FILE``: score any number of images into a CSV, JSONL or
Parquet file, in bounded memory, resumable after a kill.

The inputs are listed lazily (:mod:`zoo.deploy.predict.inputs`); a thread pool opens and
preprocesses them ahead of the model (the same :func:`zoo.images.open_image` and the model's
own preprocessing as ``zoo predict`` and ``zoo serve``; PIL's decoding and resizing release the
GIL); the model scores them in batches; every ``chunk_size`` inputs the results are committed
atomically (:class:`zoo.deploy.predict.store.ChunkStore`). A file that cannot be opened goes to
``FILE.errors.jsonl`` with its reason, unless ``strict``. With ``engine="ray"`` the decoding and
scoring run on Ray Data actors instead (:mod:`zoo.deploy.predict.ray_engine`); the batches, rows, chunks
and resume are the same.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from zoo.deploy.predict.inputs import check_inputs, describe_inputs, iter_inputs
from zoo.deploy.predict.options import PredictFileOptions
from zoo.deploy.predict.rows import Decoded, Result, decode, score_decoded
from zoo.deploy.predict.scoring import Scorer, load_scorer
from zoo.deploy.predict.store import ChunkStore, columns, digest
from zoo.errors import InputError
from zoo.ref import ModelRef
from zoo.system import available_cpus


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
        """``--json``'s shape."""
        return {**asdict(self), "images_per_s": self.images_per_s}

    def line(self) -> str:
        """The summary the command prints."""
        errors = (
            f"{self.errors:,} unreadable (listed in {self.errors_file})"
            if self.errors_file
            else "none unreadable"
        )
        return (
            f"predicted {self.done:,} inputs → {self.out}: {self.rows:,} rows, "
            f"{self.skipped:,} skipped as already done, {errors}; {self.seconds:.1f} s, "
            f"{self.images_per_s:,.1f} images/s"
        )


def decoded(
    paths: Iterator[str],
    prepare: Callable[[Image.Image], np.ndarray],
    workers: int,
    ahead: int | None = None,
) -> Generator[Decoded, None, None]:
    """Open and preprocess ``paths`` in ``workers`` threads, at most ``ahead - 1`` inputs
    (``ahead`` default: ``4 * workers``, at least 8) decoding or decoded beyond the one just
    yielded.

    Yields:
        ``(path, array, None)`` or ``(path, None, reason)``, in the order of ``paths``.
    """
    if ahead is None:
        ahead = max(8, 4 * workers)
    if ahead < 1:
        raise InputError(f"ahead must be at least 1, got {ahead}.")
    pool = ThreadPoolExecutor(workers, thread_name_prefix="zoo-decode")
    pending: deque[Any] = deque()
    try:
        for p in paths:
            pending.append(pool.submit(decode, p, prepare))
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


def local_results(
    paths: Iterator[str], scorer: Scorer, k: int, *, embeddings: bool, batch_size: int, workers: int
) -> Generator[Result, None, None]:
    """The local engine: ``workers`` decoding threads, batches of ``batch_size`` per model
    call, results in input order. While the model scores a batch the threads decode the whole
    next one, so decoding hides behind inference instead of waiting for it. Memory: the batch
    being scored (its arrays and their stacked copy) and at most ``batch_size + 2 * workers - 1``
    inputs decoding or decoded: about three batches of arrays (with ``tta``, of views)."""
    ahead = batch_size + 2 * workers
    with closing(decoded(paths, scorer.prepare, workers, ahead)) as stream:
        while batch := list(islice(stream, batch_size)):
            yield from score_decoded(scorer, batch, k, embeddings)


def predict_to_file(
    options: PredictFileOptions, *, on_progress: Callable[[int, int], None] | None = None
) -> BatchSummary:
    """Score every image ``options.inputs`` names into ``options.out``, resuming an
    interrupted job.

    Args:
        options: the job (checked on construction: :class:`PredictFileOptions`).
        on_progress: called as ``(handled_this_run, skipped)`` after each batch.

    Returns:
        The :class:`BatchSummary`.

    Raises:
        InputError: inputs that do not exist or name no image, an existing output (without
            ``overwrite``), an interrupted job with other settings or inputs, a bad input
            spec, or (``strict``) an input that cannot be scored.
        BackendUnavailableError: ``engine="ray"`` without Ray installed.
        Everything :func:`zoo.deploy.predict.scoring.load_scorer` raises.
    """
    t0 = time.perf_counter()
    o = options
    model, inputs, out, embeddings, engine = o.model, o.inputs, o.out, o.embeddings, o.engine
    check_inputs(inputs)  # before the sidecar exists: a typo never leaves a job to resume
    scorer = (
        model
        if isinstance(model, Scorer)
        else load_scorer(
            model,
            device=o.device,
            embeddings=embeddings and engine == "local",
            tta=o.tta,
            spin=False,  # the decoding threads share the cores ORT's idle threads would spin on
            reject=o.reject,
        )
    )
    k = min(o.top_k, scorer.num_classes)
    rule = scorer.rule if o.reject else None
    store = ChunkStore(out, columns(k, scorer.multi_label, embeddings, judged=rule is not None))
    manifest = {
        "model": scorer.identity,
        "inputs": describe_inputs(inputs),
        "top_k": k,
        "chunk_size": o.chunk_size,
        "embeddings": embeddings,
        **({"rejection": rule.to_dict()} if rule else {}),  # absent: as before rules existed
    }
    committed = store.open(manifest, overwrite=o.overwrite)
    paths = iter_inputs(inputs)
    skipped = _skip(paths, committed, store.parts)
    rows = sum(m["rows"] for m in committed)
    handled, n_chunks = 0, len(committed)
    if on_progress:
        on_progress(0, skipped)
    if engine == "ray":
        from zoo.deploy.predict.ray_engine import ray_results

        ref = ModelRef.parse(model)  # type: ignore[arg-type]  # a Scorer was refused above
        results = ray_results(
            paths, str(ref.path.resolve()) if ref.is_path else str(ref), k,
            embeddings=embeddings, device=o.device, batch_size=o.batch_size, actors=o.workers,
            address=o.address, multi_label=scorer.multi_label, tta=o.tta, reject=o.reject,
            judged=rule is not None,
        )  # fmt: skip
    else:
        if scorer.rule is not None and rule is None:  # a loaded Scorer, with reject=False
            scorer = replace(scorer, rule=None)
        results = local_results(
            paths, scorer, k, embeddings=embeddings, batch_size=o.batch_size,
            workers=o.workers or available_cpus(),
        )  # fmt: skip
    with closing(results):
        while True:
            chunk_paths: list[str] = []
            chunk_rows: list[dict[str, Any]] = []
            errors: list[dict[str, str]] = []
            for p, row, reason in islice(results, o.chunk_size):
                chunk_paths.append(p)
                if reason is not None and o.strict:
                    raise InputError(
                        f"{reason} --strict stops at the first input that cannot be read: "
                        f"fix or remove {p!r}, or drop --strict to list such inputs in "
                        f"{store.errors_file} and go on."
                    )
                if reason is not None:
                    errors.append({"path": p, "reason": reason})
                else:
                    chunk_rows.append(row)  # type: ignore[arg-type]  # scored: a row
                if on_progress and len(chunk_paths) % o.batch_size == 0:
                    on_progress(handled + len(chunk_paths), skipped)
            if not chunk_paths:
                break
            store.commit(n_chunks, chunk_paths, chunk_rows, errors)
            n_chunks += 1
            handled += len(chunk_paths)
            rows += len(chunk_rows)
            if on_progress:
                on_progress(handled, skipped)
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


__all__ = ["BatchSummary", "decoded", "local_results", "predict_to_file"]
