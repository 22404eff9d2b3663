"""The kNN rejection score inside an exported graph: :func:`add_knn_file` appends it as a second
output (:func:`zoo.knn.add_to_graph`) to the graph the gate judges, and :func:`check_knn`
proves that output against the PyTorch model's features scored by the same bank, on the
gate's real images, before anything is written."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoo.deploy.export.gate_images import GateImages
from zoo.deploy.export.parity_report import KnnCheck
from zoo.deploy.predict.embeddings import feature_tensor
from zoo.deploy.runtimes.classifier import run_padded
from zoo.images import open_image
from zoo.knn import KNN_OUTPUT, KnnBank, add_to_graph
from zoo.metadata import ModelInfo
from zoo.preprocess import preprocess

KNN_MAX_ABS = {"fp32": 1e-4, "fp16": 1e-2, "embedded": 2e-2}
"""How far the graph's kNN score may be from PyTorch's (a cosine similarity, in [-1, 1]).
fp32: float rounding only (measured 1e-6 on ResNet-18 and MobileNetV2 features). fp16, and
graphs that resize in float where PIL works in 8-bit (``--embed-preprocessing``): the features
themselves move by the parity gate's fp16 bounds, the score with them."""


def add_knn_file(path: Path, bank: KnnBank) -> dict[str, Any]:
    """Add the kNN output to the graph at ``path`` (in place).

    Returns:
        What the export reports: the bank's rows, width and k, and the feature tensor read.
    """
    import onnx

    model = onnx.load(str(path))
    features = feature_tensor(model.graph)
    add_to_graph(model, features, bank)
    onnx.save(model, str(path))
    return {"rows": len(bank.rows), "dim": bank.dim, "k": bank.k, "features": features}


def check_knn(
    model: torch.nn.Module,
    info: ModelInfo,
    session: Any,
    images: GateImages | Sequence[Path],
    bank: KnnBank,
    *,
    export_batch: int,
    static: bool,
    kind: str,
) -> KnnCheck:
    """Compare the graph's :data:`~zoo.knn.KNN_OUTPUT` with ``bank.scores`` of the PyTorch
    model's features, each side on the same preprocessed real images (an embedded graph on
    their pixels).

    Args:
        session: an ONNX Runtime session of the graph.
        static: the graph's batch is fixed at ``export_batch`` (fed padded chunks).
        kind: ``fp32``, ``fp16`` or ``embedded`` (:data:`KNN_MAX_ABS`).
    """
    from zoo.deploy.export.graph_preprocess import pixels
    from zoo.train.knn_fit import embed_images

    paths = images.paths if isinstance(images, GateImages) else tuple(images)
    reference = bank.scores(embed_images(model, info, paths))
    inp = session.get_inputs()[0]
    pre = info.preprocessing()

    def graph(x: np.ndarray) -> np.ndarray:
        if inp.type == "tensor(float16)":
            x = x.astype(np.float16)
        out = session.run([KNN_OUTPUT], {inp.name: x})[0]
        return np.asarray(out, np.float64).reshape(-1, 1)

    run: Callable[[np.ndarray], np.ndarray] = graph
    pil = [open_image(p) for p in paths]
    if inp.type == "tensor(uint8)":  # pixels of any size: one image per call
        got = np.concatenate([run(pixels(im, pre.channels)[None]) for im in pil])
    else:
        x = np.stack([preprocess(im, pre) for im in pil]).astype(np.float32)
        got = run_padded(run, x, export_batch) if static else run(x)
    diff = float(np.abs(got[:, 0] - reference).max()) if len(paths) else 0.0
    return KnnCheck(images=len(paths), max_abs=round(diff, 8), bound=KNN_MAX_ABS[kind])


__all__ = ["KNN_MAX_ABS", "add_knn_file", "check_knn"]
