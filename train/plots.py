"""PNG plots a person can look at: loss/accuracy curves and the confusion matrix."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure  # not pyplot: no GUI backend machinery to import (~1 s)

from zoo import durable


def _save(fig: Figure, out: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    durable.write_bytes(out, buf.getvalue(), label=out.name)


def plot_curves(history: list[dict[str, Any]], out: Path) -> None:
    epochs = [h["epoch"] for h in history]
    fig = Figure(figsize=(10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(epochs, [h["train/loss"] for h in history], "o-", label="train")
    ax1.plot(epochs, [h["val/loss"] for h in history], "o-", label="val")
    ax1.set(xlabel="epoch", ylabel="loss", title="Loss")
    ax2.plot(epochs, [h["train/acc"] for h in history], "o-", label="train")
    ax2.plot(epochs, [h["val/acc"] for h in history], "o-", label="val")
    ax2.set(xlabel="epoch", ylabel="accuracy", title="Accuracy", ylim=(0, 1.02))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    _save(fig, out)


def plot_confusion(cm: list[list[int]], classes: list[str], out: Path) -> None:
    n = len(classes)
    size = max(4.0, min(16.0, 0.5 * n + 2))
    fig = Figure(figsize=(size, size))
    ax = fig.subplots()
    im = ax.imshow(cm, cmap="Blues")
    ax.set(
        xticks=range(n),
        yticks=range(n),
        xlabel="predicted",
        ylabel="true",
        title="Confusion matrix (validation)",
    )
    ax.set_xticklabels(classes, rotation=90)
    ax.set_yticklabels(classes)
    if n <= 30:
        peak = max(max(r) for r in cm) or 1
        for i in range(n):
            for j in range(n):
                ax.text(
                    j,
                    i,
                    str(cm[i][j]),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if cm[i][j] > peak / 2 else "black",
                )
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    _save(fig, out)
