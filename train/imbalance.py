"""Class imbalance: loss weights (``--class-weights auto``), per-sample draw weights
(``--sampler balanced``) and the hint ``zoo finetune`` prints when ``zoo check``'s ratio says
the folder is imbalanced. The weights are scikit-learn's "balanced" heuristic
(``compute_class_weight``), not a formula of our own."""

from __future__ import annotations

import numpy as np

from zoo.train.check import CheckReport


def class_weights(labels: list[int], n_classes: int) -> list[float]:
    """``n_samples / (n_classes_present × count)`` per class (scikit-learn's "balanced");
    1.0 for a class with no training image (it is never a target, so it never weighs)."""
    from sklearn.utils.class_weight import compute_class_weight

    y = np.asarray(labels)
    present = np.unique(y)
    weights = np.ones(n_classes)
    weights[present] = compute_class_weight("balanced", classes=present, y=y)
    return [float(w) for w in weights]


def sample_weights(labels: list[int], n_classes: int) -> list[float]:
    """Each sample's draw weight for ``--sampler balanced``: its class's balanced weight, so
    every class present is drawn equally often in expectation."""
    per_class = class_weights(labels, n_classes)
    return [per_class[y] for y in labels]


# the monitors that already pick the best epoch by every class equally
CLASS_EQUAL_MONITORS = ("val/balanced_acc", "val/macro_f1")


def imbalance_hint(
    check: CheckReport, class_weights: str, sampler: str, monitor: str | None = None
) -> str | None:
    """What to say about the training split's imbalance (None when balanced, or when an
    option already acts on it). Never suggests an option already given: with ``monitor``
    (``--monitor``) already one that weighs every class equally, it is named as in effect."""
    ratio = check.imbalance.get("train")
    if ratio is None:
        return None
    acting = [
        opt
        for opt, on in (
            ("--class-weights auto", class_weights != "none"),
            ("--sampler balanced", sampler != "shuffle"),
        )
        if on
    ]
    if len(acting) == 2:
        return (
            f"imbalance: the largest class has {ratio}× the smallest; --class-weights auto and "
            "--sampler balanced act on it, and together weigh rare classes twice (loss × "
            "draws): one of them is usually enough (docs/benchmarks.md, class imbalance)"
        )
    if acting:
        return f"imbalance: the largest class has {ratio}× the smallest; {acting[0]} acts on it"
    if monitor in CLASS_EQUAL_MONITORS:
        return (
            f"hint: class imbalance in train (largest/smallest class = {ratio}×): --monitor "
            f"{monitor} already picks the best epoch by every class equally; to also train "
            "rare classes more, try --sampler balanced or --class-weights auto (one of them)"
        )
    return (
        f"hint: class imbalance in train (largest/smallest class = {ratio}×): try "
        "--sampler balanced or --class-weights auto (one of them), and --monitor "
        "val/balanced_acc to pick the best epoch by every class equally"
    )
