"""Calibration: does a confidence of 0.8 mean right 80% of the time? The reliability diagram's
bins and the expected calibration error (ECE), from top-1 confidences and correctness (or from
logits at a temperature: :func:`ece_of`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


def reliability(
    confidence: np.ndarray, correct: np.ndarray, bins: int = 10
) -> tuple[list[dict[str, Any]], float]:
    """Equal-width confidence bins and the expected calibration error.

    Args:
        confidence: each sample's top-1 probability, in [0, 1].
        correct: whether each sample's top-1 was right.
        bins: bins over [0, 1]; bin ``b`` holds confidences in ``(b/bins, (b+1)/bins]`` (the
            first also holds 0).

    Returns:
        ``(rows, ece)``: per bin ``lo``, ``hi``, ``count``, ``confidence`` (mean) and
        ``accuracy`` (None for an empty bin); ``ece = Σ_b (count_b / N) · |accuracy_b −
        confidence_b|`` (0 for no samples).
    """
    conf = np.asarray(confidence, dtype=np.float64)
    ok = np.asarray(correct, dtype=np.float64)
    idx = np.clip(np.ceil(conf * bins).astype(int) - 1, 0, bins - 1)
    rows, ece = [], 0.0
    for b in range(bins):
        mask = idx == b
        n = int(mask.sum())
        row: dict[str, Any] = {"lo": b / bins, "hi": (b + 1) / bins, "count": n}
        row["confidence"] = float(conf[mask].mean()) if n else None
        row["accuracy"] = float(ok[mask].mean()) if n else None
        if n:
            ece += n / len(conf) * abs(row["accuracy"] - row["confidence"])
        rows.append(row)
    return rows, ece


def ece_of(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> float:
    """The expected calibration error of ``softmax(logits / temperature)`` (10 bins)."""
    import torch

    probs = torch.softmax(logits.double() / temperature, 1)
    conf, pred = probs.max(1)
    return reliability(conf.numpy(), (pred == targets).numpy())[1]


__all__ = ["ece_of", "reliability"]
