"""Classification metrics from logits: top-k accuracy, confusion matrix, per-class P/R/F1."""

from __future__ import annotations

from typing import Any

import torch

TOP5_MIN_CLASSES = 6
"""Top-5 accuracy is measured only among more than five classes: with five or fewer, every
label is in the top five, so it would read 100% whatever the model does."""


def topk_correct(logits: torch.Tensor, target: torch.Tensor, k: int) -> int:
    k = min(k, logits.shape[1])
    return int((logits.topk(k, dim=1).indices == target[:, None]).any(dim=1).sum())


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, n: int) -> torch.Tensor:
    """``cm[true, pred]`` counts."""
    return torch.bincount(target * n + pred, minlength=n * n).reshape(n, n)


def per_class(cm: torch.Tensor, classes: list[str]) -> list[dict[str, Any]]:
    tp = cm.diag().double()
    precision = tp / cm.sum(0).clamp(min=1)
    recall = tp / cm.sum(1).clamp(min=1)
    f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
    return [
        {
            "class": c,
            "precision": round(float(precision[i]), 4),
            "recall": round(float(recall[i]), 4),
            "f1": round(float(f1[i]), 4),
            "support": int(cm[i].sum()),
            "predicted": int(cm[:, i].sum()),
        }
        for i, c in enumerate(classes)
    ]


def balanced_accuracy(cm: torch.Tensor) -> float:
    """Mean recall over the classes present in the targets (scikit-learn's
    ``balanced_accuracy_score``): every class counts the same, however rare."""
    support = cm.sum(1)
    present = support > 0
    if not bool(present.any()):
        return 0.0
    recall = cm.diag().double()[present] / support[present].double()
    return float(recall.mean())


def macro_f1(rows: list[dict[str, Any]]) -> float:
    """Mean F1 over the classes that occur, as targets or predictions (scikit-learn's
    ``f1_score(average="macro")``): a 1000-class model scored on a 5-class folder is judged on
    the classes it met, not diluted by 995 zeros."""
    met = [r["f1"] for r in rows if r["support"] or r["predicted"]]
    return sum(met) / max(1, len(met))


def summarize(logits: torch.Tensor, target: torch.Tensor, classes: list[str]) -> dict[str, Any]:
    """All eval metrics for single-label classification from the full set of logits
    (``top5`` only among :data:`TOP5_MIN_CLASSES` classes or more)."""
    n = len(classes)
    pred = logits.argmax(1)
    cm = confusion_matrix(pred, target, n)
    rows = per_class(cm, classes)
    total = max(1, len(target))
    # top-5 only where it can miss (:data:`TOP5_MIN_CLASSES`): left out, not a vacuous 1.0
    top5 = {"top5": topk_correct(logits, target, 5) / total} if n >= TOP5_MIN_CLASSES else {}
    return {
        "acc": topk_correct(logits, target, 1) / total,
        "balanced_acc": balanced_accuracy(cm),
        **top5,
        "loss": float(torch.nn.functional.cross_entropy(logits, target)) if len(target) else 0.0,
        "macro_f1": macro_f1(rows),
        "per_class": rows,
        "confusion_matrix": cm.tolist(),
        "n": len(target),
    }


def summarize_multilabel(
    logits: torch.Tensor, target: torch.Tensor, classes: list[str]
) -> dict[str, Any]:
    """Multi-label: per-class sigmoid thresholds chosen on this split to maximise F1."""
    probs = logits.sigmoid()
    thresholds: list[float] = []
    rows: list[dict[str, Any]] = []
    for i, c in enumerate(classes):
        best: tuple[float, float] = (0.0, 0.5)
        for t in torch.linspace(0.05, 0.95, 19).tolist():
            p = probs[:, i] >= t
            y = target[:, i] > 0.5
            tp = float((p & y).sum())
            f1 = 2 * tp / max(1.0, float(p.sum() + y.sum()))
            best = max(best, (f1, t))
        thresholds.append(round(best[1], 2))
        rows.append(
            {
                "class": c,
                "f1": round(best[0], 4),
                "threshold": round(best[1], 2),
                "support": int(target[:, i].sum()),
            }
        )
    pred = probs >= torch.tensor(thresholds, dtype=probs.dtype)
    exact = float((pred == (target > 0.5)).all(1).float().mean()) if len(target) else 0.0
    return {
        "acc": exact,
        "loss": float(torch.nn.functional.binary_cross_entropy_with_logits(logits, target))
        if len(target)
        else 0.0,
        "macro_f1": sum(r["f1"] for r in rows) / max(1, len(classes)),
        "thresholds": thresholds,
        "per_class": rows,
        "n": len(target),
    }
