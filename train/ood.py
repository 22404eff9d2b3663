"""``zoo eval MODEL --ood DIR``: how well a model's scores tell its own held-out images from a
folder of images outside its classes. Per score kind (:data:`zoo.calibration.SCORE_KINDS`, and
any :class:`ExternalScore` given, such as ``zoo eval --knn``'s distance in embedding space):
AUROC, and the false-positive rate at 95% true-positive rate (the share of outside images a
threshold accepting 95% of the held-out images still accepts); with the model's own rejection
rule, what it accepts of each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zoo.calibration import LOGIT_SCORES, Calibration, ood_score
from zoo.errors import DataError
from zoo.images import list_images
from zoo.train.calibrate import acceptance_cut
from zoo.train.check import FileCheck, Readable, readable
from zoo.train.evaluate import EvalForward, Evaluated, evaluate_with

if TYPE_CHECKING:
    from zoo.knn import KnnBank

TPR = 0.95


@dataclass(frozen=True)
class Separation:
    """How one score kind separates held-out (positive) from outside (negative) images."""

    score: str
    auroc: float
    fpr_at_95_tpr: float

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score, "auroc": self.auroc, "fpr_at_95_tpr": self.fpr_at_95_tpr}


@dataclass(frozen=True)
class OodReport:
    """``zoo eval --ood``'s result.

    Attributes:
        folder: the outside images' folder.
        n_in / n_out: held-out images / outside images scored.
        separations: one per score kind.
        rule: the model's stored rejection rule (None: none fitted).
        accepted_in / rejected_out: with a rule, the share of held-out images it accepts and
            of outside images it rejects.
    """

    folder: str
    n_in: int
    n_out: int
    separations: tuple[Separation, ...]
    rule: dict[str, Any] | None = None
    accepted_in: float | None = None
    rejected_out: float | None = None
    unreadable: tuple[FileCheck, ...] = ()  # outside images left out: they do not decode

    def to_dict(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "n_in": self.n_in,
            "n_out": self.n_out,
            "unreadable": [{"path": fc.path, "error": fc.error} for fc in self.unreadable],
            "scores": {s.score: s.to_dict() for s in self.separations},
            "rule": self.rule,
            "accepted_in": self.accepted_in,
            "rejected_out": self.rejected_out,
        }

    def lines(self) -> list[str]:
        head = f"outside images {self.folder}: {self.n_out} against {self.n_in} held-out images"
        rows = [
            f"  {s.score:<7} AUROC {s.auroc:.4f}  FPR at 95% TPR {s.fpr_at_95_tpr:.4f}"
            for s in self.separations
        ]
        if self.rule is not None:
            rows.append(
                f"  the model's rule ({self.rule['score']} ≥ {self.rule['threshold']:.4g}): "
                f"accepts {self.accepted_in:.1%} of held-out, rejects {self.rejected_out:.1%} "
                "of outside images"
            )
        return [head, *rows]


@dataclass(frozen=True)
class ExternalScore:
    """A score computed beside the logits (the kNN distance in embedding space, by the deploy
    side's index): each held-out and outside image's value, higher more in-distribution."""

    score: str
    inside: np.ndarray
    outside: np.ndarray

    def separation(self) -> Separation:
        pos, neg = self.inside, self.outside
        return Separation(self.score, round(auroc(pos, neg), 6), round(fpr_at_tpr(pos, neg), 6))


def auroc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Area under the ROC curve, positives scoring higher (scikit-learn's)."""
    from sklearn.metrics import roc_auc_score

    y = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    return float(roc_auc_score(y, np.r_[pos, neg]))


def fpr_at_tpr(pos: np.ndarray, neg: np.ndarray, tpr: float = TPR) -> float:
    """The share of negatives at or above the threshold ``--reject`` would fit on the
    positives to accept ``tpr`` (:func:`zoo.train.calibrate.acceptance_cut`)."""
    return float((neg >= acceptance_cut(pos, tpr)).mean())


def separation(
    in_logits: np.ndarray, out_logits: np.ndarray, temperature: float
) -> tuple[Separation, ...]:
    """Each score kind's AUROC and FPR at 95% TPR on these logits."""
    found = []
    for kind in LOGIT_SCORES:
        pos = ood_score(in_logits, kind, temperature)
        neg = ood_score(out_logits, kind, temperature)
        found.append(Separation(kind, round(auroc(pos, neg), 6), round(fpr_at_tpr(pos, neg), 6)))
    return tuple(found)


def outside_images(folder: Path) -> Readable:
    """The images under ``folder`` (any layout) that decode, and those that do not.

    Raises:
        DataError: the folder is missing or holds no readable images.
    """
    if not folder.is_dir():
        raise DataError(
            f"--ood {folder}: no such folder (a folder of images from outside the classes)."
        )
    paths = list_images(folder)
    if not paths:
        raise DataError(f"--ood {folder} holds no images (.jpg, .png, …).")
    found = readable(folder.resolve(), [p.resolve() for p in paths])
    if not found.paths:
        raise DataError(
            f"--ood {folder}: none of its {len(paths)} images decodes (e.g. "
            f"{found.unreadable[0].path}: {found.unreadable[0].error})."
        )
    return found


def folder_logits(
    ev: Evaluated,
    paths: Sequence[Path],
    *,
    scorer: EvalForward | None,
    batch_size: int,
    num_workers: int,
) -> np.ndarray:
    """The logits of ``paths`` by the evaluated model (or ``scorer``: a variant of it)."""
    device = next(ev.model.parameters()).device
    by = scorer or EvalForward(ev.model, "the model")
    batches = by.loader([(p, 0) for p in paths], ev.info, batch_size, num_workers)
    logits, _ = evaluate_with(ev.model, by.forward, batches, device)
    return logits.double().numpy()


def evaluate_ood(
    ev: Evaluated,
    folder: str | Path,
    *,
    scorer: EvalForward | None = None,
    batch_size: int = 64,
    num_workers: int = 0,
    more: tuple[ExternalScore, ...] = (),
    bank: KnnBank | None = None,
) -> OodReport:
    """Score ``folder``'s images against the evaluated split's (see the module docstring).

    Args:
        ev: a single-label evaluation (its logits are the held-out side).
        folder: images from outside the model's classes.
        scorer: the variant that scored ``ev`` (None: the PyTorch model).
        more: scores beside the logits' (``knn``), reported after theirs.
        bank: the model's kNN bank (a ``knn`` rule): its scores judge the rule and are the
            reported ``knn`` score (``more``'s own ``knn`` is then left out).

    Raises:
        DataError: a multi-label model, or no images in ``folder``.
    """
    if ev.info.multi_label:
        raise DataError("--ood covers single-label models (softmax scores).")
    cal = ev.info.calibration or Calibration(temperature=1.0)
    outside = outside_images(Path(folder))
    out = folder_logits(
        ev, outside.paths, scorer=scorer, batch_size=batch_size, num_workers=num_workers
    )
    inside = ev.logits.double().numpy()
    rule = cal.reject
    knn_in = knn_out = None
    if bank is not None:  # the stored rule's own score, from the PyTorch model's features
        from zoo.train.knn_fit import embed_images

        device = next(ev.model.parameters()).device
        held_out = [p for p, _ in ev.samples]
        knn_in = bank.scores(embed_images(ev.model, ev.info, held_out, device=device))
        knn_out = bank.scores(embed_images(ev.model, ev.info, list(outside.paths), device=device))
        more = (ExternalScore("knn", knn_in, knn_out), *(m for m in more if m.score != "knn"))
    judged = rule is not None and (rule.score != "knn" or knn_in is not None)  # else no bank
    return OodReport(
        folder=str(folder),
        n_in=len(inside),
        n_out=len(out),
        separations=separation(inside, out, cal.temperature) + tuple(m.separation() for m in more),
        rule=rule.to_dict() if rule else None,
        accepted_in=float(1 - cal.decide(inside, knn_in)[1].mean()) if judged else None,  # type: ignore[union-attr]
        rejected_out=float(cal.decide(out, knn_out)[1].mean()) if judged else None,  # type: ignore[union-attr]
        unreadable=outside.unreadable,
    )


__all__ = [
    "ExternalScore",
    "OodReport",
    "Separation",
    "auroc",
    "evaluate_ood",
    "fpr_at_tpr",
    "separation",
]
