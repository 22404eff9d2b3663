"""The kNN rejection score stored with a model (``--reject knn``): how close an image's
embedding comes to the model's own training images (Sun et al. 2022, "Out-of-distribution
detection with deep nearest neighbors").

The score is the cosine similarity between the image's L2-normalised penultimate features and
its ``k``-th nearest row of a *bank*: a class-stratified sample of at most :data:`MAX_BANK`
normalised training embeddings (higher: more like the training images). The bank is fitted at
the end of ``zoo finetune --reject knn|auto`` or by ``zoo calibrate``, kept in the model folder
as :data:`BANK_FILE` (safetensors), and ``zoo export`` builds the same score into the graph as a
second output, :data:`KNN_OUTPUT` (:func:`add_to_graph`), so an exported file needs nothing
beside it. Measured against max-softmax and energy in ``bench/ood.py`` (docs/bench/ood.json).

Nothing here imports torch: the runtimes (ONNX Runtime, OpenVINO) score with numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo.artifact import KNN_BANK_FILE as BANK_FILE  # the bank in a model folder
from zoo.calibration import KNN_K as DEFAULT_K
from zoo.errors import ArtifactError

KNN_OUTPUT = "knn_score"
"""The exported graph's second output: ``(N,)`` float32, each image's kNN score."""
MAX_BANK = 2048
"""Rows kept at most: a class-stratified sample beyond it (Sun et al.: a 1 % sample of
ImageNet loses little). 2,048 × 1,280 float32 features (MobileNetV2) add 10 MB to a file."""
NODE_PREFIX = "zoo_knn/"
"""Names of the graph nodes :func:`add_to_graph` adds (int8 quantization keeps them float)."""


def normalise(features: np.ndarray) -> np.ndarray:
    """``(N, ...)`` features as ``(N, D)`` float32 rows of unit L2 norm (a zero row stays 0)."""
    x = np.asarray(features, dtype=np.float32).reshape(len(features), -1)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, np.float32(1e-12))


@dataclass(frozen=True)
class KnnBank:
    """Normalised training embeddings and the ``k`` of the score.

    Attributes:
        rows: ``(M, D)`` float32, unit L2 norm.
        k: the neighbour whose similarity is the score (1 ≤ k ≤ M).
    """

    rows: np.ndarray
    k: int = DEFAULT_K

    def __post_init__(self) -> None:
        if self.rows.ndim != 2 or not len(self.rows):
            raise ArtifactError(f"A kNN bank needs (M, D) rows, got shape {self.rows.shape}.")
        if not 1 <= self.k <= len(self.rows):
            raise ArtifactError(f"k = {self.k} for a bank of {len(self.rows)} rows: use 1..M.")

    @property
    def dim(self) -> int:
        return int(self.rows.shape[1])

    def scores(self, features: np.ndarray) -> np.ndarray:
        """Each image's cosine similarity to its ``k``-th nearest bank row, ``(N,)`` float64.

        Raises:
            ArtifactError: the features' width is not the bank's (another model's features).
        """
        x = normalise(features)
        if x.shape[1] != self.dim:
            raise ArtifactError(
                f"Features of width {x.shape[1]} against a kNN bank of width {self.dim}: the "
                "bank belongs to another model; refit it (zoo calibrate RUN --reject knn)."
            )
        sims = x @ self.rows.T
        kth = np.partition(sims, len(self.rows) - self.k, axis=1)[:, len(self.rows) - self.k]
        return kth.astype(np.float64)

    @classmethod
    def of(cls, features: np.ndarray, *, k: int = DEFAULT_K) -> KnnBank:
        """A bank of these embeddings (``k`` lowered to the bank's size for a tiny split)."""
        x = normalise(features)
        return cls(np.ascontiguousarray(x), k=max(1, min(k, len(x))))

    def extended(self, features: np.ndarray, *, k: int | None = None) -> KnnBank:
        """This bank with more rows (``zoo enroll``'s new class joins the training images) and
        ``k`` (None: this bank's)."""
        return KnnBank(np.concatenate([self.rows, normalise(features)]), k=k or self.k)

    def save(self, folder: Path) -> Path:
        """Write :data:`BANK_FILE` into a model folder (atomically)."""
        from safetensors.numpy import save

        from zoo import durable

        path = folder / BANK_FILE
        durable.write_bytes(
            path, save({"rows": self.rows}, metadata={"k": str(self.k)}), label=BANK_FILE
        )
        return path

    @classmethod
    def load(cls, folder: Path) -> KnnBank:
        """Read a model folder's :data:`BANK_FILE`.

        Raises:
            ArtifactError: the file is missing or malformed.
        """
        from safetensors import SafetensorError, safe_open

        path = folder / BANK_FILE
        if not path.is_file():
            raise ArtifactError(
                f"{folder} has a kNN rejection rule but no {BANK_FILE}: refit it "
                f"(zoo calibrate {folder} --reject knn)."
            )
        try:
            with safe_open(str(path), framework="numpy") as f:
                k = int((f.metadata() or {}).get("k", DEFAULT_K))
                return cls(np.ascontiguousarray(f.get_tensor("rows"), dtype=np.float32), k=k)
        except (SafetensorError, KeyError, ValueError, OSError) as exc:
            raise ArtifactError(f"{path} is not a readable kNN bank ({exc}).") from exc


def rule_bank(calibration: Any, multi_label: bool, folder: Callable[[], Path]) -> KnnBank | None:
    """A model folder's bank when its rejection rule is ``knn`` (None for any other rule, no
    rule, or a multi-label model): what export, predict and eval load beside the weights.
    ``folder`` is asked only for a knn rule (a registry model has no folder).

    Raises:
        ArtifactError: a ``knn`` rule whose bank file is missing or malformed.
    """
    rule = calibration.reject if calibration is not None and not multi_label else None
    return KnnBank.load(folder()) if rule is not None and rule.score == "knn" else None


def stratified(labels: np.ndarray, cap: int = MAX_BANK, seed: int = 0) -> np.ndarray:
    """Sorted indices of at most ``cap`` samples, each class keeping its share (at least one
    each), seeded: which training images a bank embeds.

    Args:
        labels: ``(N,)`` class of each training image.
    """
    y = np.asarray(labels)
    if len(y) <= cap:
        return np.arange(len(y))
    rng = np.random.default_rng(seed)
    keep = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        n = max(1, round(cap * len(idx) / len(y)))
        keep.append(rng.choice(idx, size=min(n, len(idx)), replace=False))
    return np.sort(np.concatenate(keep))


def add_to_graph(model: Any, features: str, bank: KnnBank) -> None:
    """Add :data:`KNN_OUTPUT` to an ONNX model: ``features`` (the classifier's input) cast to
    float, flattened, L2-normalised, times the bank's rows, and the ``k``-th largest of the
    similarities. Written by hand because no exporter adds a score that lives outside the
    PyTorch module; :func:`zoo.deploy.export.knn.check_knn` proves it against :meth:`scores`.

    Args:
        model: an ``onnx.ModelProto`` (changed in place).
        features: the name of the float tensor the classifier reads.
        bank: the rows and k.
    """
    from onnx import TensorProto, helper, numpy_helper

    p = NODE_PREFIX
    g = model.graph
    g.initializer.extend(
        [
            numpy_helper.from_array(np.ascontiguousarray(bank.rows.T), name=f"{p}bank_t"),
            numpy_helper.from_array(np.array([bank.k], dtype=np.int64), name=f"{p}k"),
            numpy_helper.from_array(np.array(bank.k - 1, dtype=np.int64), name=f"{p}last"),
        ]
    )
    g.node.extend(
        [
            helper.make_node(
                "Cast", [features], [f"{p}f32"], name=f"{p}cast", to=TensorProto.FLOAT
            ),
            helper.make_node("Flatten", [f"{p}f32"], [f"{p}flat"], name=f"{p}flatten", axis=1),
            helper.make_node(
                "LpNormalization", [f"{p}flat"], [f"{p}unit"], name=f"{p}normalise", axis=1, p=2
            ),
            helper.make_node("MatMul", [f"{p}unit", f"{p}bank_t"], [f"{p}sims"], name=f"{p}sims"),
            helper.make_node(
                "TopK", [f"{p}sims", f"{p}k"], [f"{p}top", f"{p}top_idx"], name=f"{p}topk", axis=1
            ),
            helper.make_node(
                "Gather", [f"{p}top", f"{p}last"], [KNN_OUTPUT], name=f"{p}kth", axis=1
            ),
        ]
    )
    out = helper.make_tensor_value_info(KNN_OUTPUT, TensorProto.FLOAT, [None])
    # the batch dimension as the logits have it (fixed, or named)
    out.type.tensor_type.shape.dim[0].CopyFrom(g.output[0].type.tensor_type.shape.dim[0])
    g.output.append(out)


__all__ = [
    "BANK_FILE",
    "DEFAULT_K",
    "KNN_OUTPUT",
    "MAX_BANK",
    "NODE_PREFIX",
    "KnnBank",
    "add_to_graph",
    "normalise",
    "rule_bank",
    "stratified",
]
