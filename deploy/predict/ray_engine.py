"""``zoo predict ... --out FILE --engine ray``: the scoring runs on Ray Data, the file is
written by the same resumable chunk store as the local engine.

:class:`ZooPredictor` is a plain callable class for ``Dataset.map_batches``: each Ray actor
loads the model once and scores batches with the same code as the local engine (image opening,
preprocessing, one model call per batch, the same row fields), so the rows agree. Use it in
your own pipelines too::

    import ray
    from zoo.deploy.predict.ray_engine import ZooPredictor

    ds = ray.data.read_binary_files("s3://bucket/images/", include_paths=True)
    ds = ds.map_batches(ZooPredictor, fn_constructor_kwargs={"model": "resnet18.onnx"},
                        batch_size=32, num_cpus=1,  # leave CPUs free for the read tasks
                        compute=ray.data.ActorPoolStrategy(size=8))
    ds.filter(lambda r: not r["error"]).write_parquet("s3://bucket/predictions/")

A batch holds ``path`` and, optionally, ``bytes`` (the encoded image: opened instead of the
path). Out come ``path``, ``error`` (empty when scored) and the output file's columns; a row
that could not be read has its reason in ``error`` and empty labels, index -1, NaN scores.

The same callable serves Spark in a few lines (not built here): ``pyspark.ml.functions.
predict_batch_udf(make_predict_fn=lambda: ZooPredictor(model), ...)`` around a function that
turns Spark's column arrays into ``{"path": ...}`` and returns the columns it needs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np

from zoo.deploy.predict.rows import Result, decode, score_decoded
from zoo.deploy.predict.scoring import load_scorer
from zoo.deploy.predict.store import columns
from zoo.errors import BackendUnavailableError, InputError
from zoo.system import available_cpus

MISSING = {"str": "", "int": -1, "float": float("nan"), "bool": False}


class ZooPredictor:
    """Score Ray Data batches with a zoo model, loaded once per actor.

    Args:
        model: any model reference ``zoo predict`` accepts (paths as the workers see them).
        top_k: classes per row (at most the model's number of classes).
        embeddings: add ``embedding``, the penultimate features (``(N, D)`` float32).
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        threads: the runtime's threads in this actor (default: its CPUs; 1 suits one actor
            per core).
        tta: test-time augmentation (:mod:`zoo.tta`).
        reject: apply the model's rejection rule (``label``, ``accepted``, ``score``).
    """

    def __init__(
        self,
        model: str,
        *,
        top_k: int = 5,
        embeddings: bool = False,
        device: str = "cpu",
        threads: int | None = None,
        tta: str = "none",
        reject: bool = True,
    ) -> None:
        self.scorer = load_scorer(
            model, device=device, embeddings=embeddings, threads=threads, tta=tta, reject=reject
        )
        if threads is not None and not model.endswith((".onnx", ".xml")):
            import torch

            torch.set_num_threads(threads)
        self.k = min(top_k, self.scorer.num_classes)
        self.embeddings = embeddings
        judged = self.scorer.rule is not None
        self.cols = columns(self.k, self.scorer.multi_label, embeddings, judged=judged)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        paths = [str(p) for p in batch["path"]]
        sources = list(batch["bytes"]) if "bytes" in batch else paths
        decoded = [
            decode(p, self.scorer.prepare, src if isinstance(src, str) else bytes(src))
            for p, src in zip(paths, sources, strict=True)
        ]
        return self._columns(score_decoded(self.scorer, decoded, self.k, self.embeddings))

    def _columns(self, results: list[Result]) -> dict[str, Any]:
        out: dict[str, Any] = {"error": np.array([reason or "" for _, _, reason in results])}
        for name, kind in self.cols:
            if kind == "floats":
                width = next((len(r["embedding"]) for _, r, _ in results if r), 0)
                nan = [float("nan")] * width
                values = [r["embedding"] if r else nan for _, r, _ in results]
                out[name] = np.array(values, dtype=np.float32).reshape(len(results), width)
            elif name == "path":
                out[name] = np.array([p for p, _, _ in results])
            else:
                out[name] = np.array([r[name] if r else MISSING[kind] for _, r, _ in results])
        return out


def _rows(batch: dict[str, np.ndarray], cols: list[tuple[str, str]]) -> Iterator[Result]:
    """A result batch back into the local engine's ``(path, row, reason)`` items."""
    values = {name: batch[name].tolist() for name, _ in cols}
    for i, reason in enumerate(batch["error"].tolist()):
        row = {name: values[name][i] for name, _ in cols}
        yield row["path"], (None if reason else row), (reason or None)


def ray_results(
    paths: Iterator[str],
    model: str,
    k: int,
    *,
    embeddings: bool,
    device: str,
    batch_size: int,
    actors: int | None,
    address: str | None,
    multi_label: bool,
    tta: str = "none",
    reject: bool = True,
    judged: bool = False,
) -> Generator[Result, None, None]:
    """The Ray engine: the same ``(path, row, reason)`` items as the local engine, in order.

    A local Ray is started for the job (and stopped after it) unless one is running or
    ``address`` names a cluster. The paths are listed here and opened by the actors: on a
    cluster they must be readable there (a shared filesystem).

    Raises:
        BackendUnavailableError: Ray is not installed.
        InputError: the cluster cannot be reached.
    """
    try:
        import ray
        import ray.data  # configures its loggers: quieten them after
    except ImportError as exc:
        raise BackendUnavailableError(
            "--engine ray needs Ray Data: pip install 'zoo[ray]' (or use --engine local)."
        ) from exc
    todo = list(paths)  # Ray Data reads a list; a million paths are ~100 MB here
    if not todo:
        return
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(
                address=address,
                num_cpus=None if address else available_cpus(),
                include_dashboard=False,
                logging_level=logging.ERROR,
                log_to_driver=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise InputError(f"Cannot reach the Ray cluster at {address!r}: {exc}") from exc
    try:
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True  # rows in input order, as locally
        ctx.enable_progress_bars = False  # zoo draws its own
        n = actors or max(1, int(ray.cluster_resources().get("CPU", 1)))
        gpu = device.startswith("cuda")
        items = ray.data.from_items([{"path": os.path.abspath(p)} for p in todo])
        ds = items.map_batches(
            ZooPredictor,
            fn_constructor_kwargs={
                "model": model, "top_k": k, "embeddings": embeddings, "device": device,
                "threads": 1, "tta": tta, "reject": reject,
            },
            batch_size=batch_size, batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=n), num_cpus=1, num_gpus=1 if gpu else 0,
        )  # fmt: skip
        cols = columns(k, multi_label, embeddings, judged=judged)
        given = iter(todo)
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            for path, row, reason in _rows(batch, cols):
                original = next(given)  # rows hold the paths as listed, like the local engine
                assert path == os.path.abspath(original), (path, original)
                if row is not None:
                    row["path"] = original
                yield original, row, reason and reason.replace(path, original)
    finally:
        if started:
            ray.shutdown()


__all__ = ["ZooPredictor", "ray_results"]
