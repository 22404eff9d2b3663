"""One finished epoch's numbers, typed: what the loop measures, what ``metrics.csv``,
``metrics.jsonl``, TensorBoard and the checkpoint's history hold (through
:meth:`EpochRow.to_dict`, under the ``train/…``, ``val/…`` names users read), and what a
:class:`zoo.train.observe.RunObserver` receives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class TrainPass:
    """One epoch's training pass, summed over every rank."""

    loss: float
    acc: float  # against each image's larger target share under mixing
    data_wait: float  # the share of the epoch spent waiting for the loader
    img_per_s: float
    epoch_s: float


@dataclass(frozen=True)
class ValScores:
    """Validation metrics of one set of weights (the model's, or its EMA's)."""

    loss: float
    acc: float
    macro_f1: float
    balanced_acc: float | None = None  # single-label only
    top5: float | None = None  # more than five classes only

    @classmethod
    def of(cls, val: dict[str, Any]) -> ValScores:
        """From :func:`zoo.train.metrics.summarize`'s result (or the multi-label one)."""
        return cls(
            loss=float(val["loss"]),
            acc=float(val["acc"]),
            macro_f1=float(val["macro_f1"]),
            balanced_acc=val.get("balanced_acc"),
            top5=val.get("top5"),
        )

    def monitored(self, monitor: str) -> float:
        """The value ``--monitor`` names (``val/acc``, ``val/loss``, …), higher is better."""
        name = monitor.split("/", 1)[1]
        if name == "loss":
            return -self.loss
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"--monitor {monitor}: this run does not measure it")
        return float(value)


@dataclass(frozen=True)
class EpochRow:
    """A finished epoch (``epoch`` counts from 1; ``step``: global steps after it)."""

    epoch: int
    step: int
    train: TrainPass
    val: ValScores
    lr: float
    nonfinite_skipped: int
    ema: ValScores | None = None  # --ema: the average's scores on the same images
    shipped: Literal["model", "ema"] | None = None  # --ema: whose weights this epoch would ship

    def to_dict(self) -> dict[str, Any]:
        """The row as the run folder's files hold it (key order is metrics.csv's columns)."""
        row: dict[str, Any] = {
            "epoch": self.epoch,
            "step": self.step,
            "train/loss": self.train.loss,
            "train/acc": self.train.acc,
            "data_wait": self.train.data_wait,
            "img_per_s": self.train.img_per_s,
            "epoch_s": self.train.epoch_s,
            "val/loss": self.val.loss,
            "val/acc": self.val.acc,
            "val/balanced_acc": self.val.balanced_acc,
            "val/top5": self.val.top5,
            "val/macro_f1": self.val.macro_f1,
            "lr": self.lr,
            "nonfinite_skipped": self.nonfinite_skipped,
        }
        if self.ema is not None:
            row.update(
                {
                    "ema/val/loss": self.ema.loss,
                    "ema/val/acc": self.ema.acc,
                    "ema/val/macro_f1": self.ema.macro_f1,
                    "ema/val/balanced_acc": self.ema.balanced_acc,
                }
            )
        if self.shipped is not None:
            row["shipped"] = self.shipped
        return row

    def scalars(self) -> dict[str, float]:
        """The row's numbers by name (``epoch``/``step`` and unmeasured ones left out): what a
        tracker logs at ``step = epoch``."""
        return {
            k: float(v)
            for k, v in self.to_dict().items()
            if isinstance(v, int | float) and k not in ("epoch", "step")
        }

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> EpochRow:
        """A row back from a checkpoint's history or ``metrics.jsonl``."""
        ema = (
            ValScores(
                loss=row["ema/val/loss"],
                acc=row["ema/val/acc"],
                macro_f1=row["ema/val/macro_f1"],
                balanced_acc=row.get("ema/val/balanced_acc"),
            )
            if "ema/val/loss" in row
            else None
        )
        return cls(
            epoch=int(row["epoch"]),
            step=int(row["step"]),
            train=TrainPass(
                loss=row["train/loss"],
                acc=row["train/acc"],
                data_wait=row["data_wait"],
                img_per_s=row["img_per_s"],
                epoch_s=row["epoch_s"],
            ),
            val=ValScores(
                loss=row["val/loss"],
                acc=row["val/acc"],
                macro_f1=row["val/macro_f1"],
                balanced_acc=row.get("val/balanced_acc"),
                top5=row.get("val/top5"),
            ),
            lr=row["lr"],
            nonfinite_skipped=int(row["nonfinite_skipped"]),
            ema=ema,
            shipped=row.get("shipped"),
        )
