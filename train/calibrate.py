"""Fitting a model's :class:`~zoo.calibration.Calibration` on its validation logits: the
temperature (minimum NLL), and with ``--reject`` the threshold that accepts a chosen share of
the validation images. ``zoo finetune`` fits it at the end of a run (:func:`val_logits` over the
shipped weights); ``zoo calibrate`` refits an older run or a model folder
(:func:`calibrate_model`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from zoo.calibration import (
    BOUND_TOLERANCE,
    DEFAULT_ACCEPTANCE,
    MIN_FIT_IMAGES,
    REJECT_MODES,
    TEMPERATURE_RANGE,
    Calibration,
    NotKept,
    Rejection,
    TemperatureFit,
    score_kind,
)
from zoo.errors import InputError, UsageError
from zoo.run_images import Split
from zoo.train.calibration import ece_of
from zoo.train.config import check_option

if TYPE_CHECKING:
    from zoo.train.build import RunParts


def fit_temperature(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The temperature minimising the negative log-likelihood of ``targets`` under
    ``softmax(logits / T)`` (Guo et al. 2017): LBFGS on ``log T``, so T stays positive.

    Args:
        logits: ``(N, K)`` validation logits of the shipped weights.
        targets: ``(N,)`` class indices.

    Returns:
        T in :data:`~zoo.calibration.TEMPERATURE_RANGE` (1.0 for no samples; its lower end
        when every top-1 is right: the NLL then falls all the way to T → 0).
    """
    if not len(logits):
        return 1.0
    x, y = logits.detach().double().cpu(), targets.detach().long().cpu()
    lo, hi = TEMPERATURE_RANGE
    if _separated(x, y):  # LBFGS would stop wherever the gradient flattens out
        return lo
    log_t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.1, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x / log_t.exp(), y)
        loss.backward()
        return loss

    opt.step(closure)
    t = float(log_t.detach().exp())
    return min(max(t, lo), hi) if math.isfinite(t) else 1.0


def _separated(logits: torch.Tensor, targets: torch.Tensor) -> bool:
    """Every row's target logit above all its others: every row's NLL falls as T falls (a
    tie is not separated: all-equal logits are no evidence of anything)."""
    others = logits.scatter(1, targets[:, None], float("-inf"))
    return bool((others < logits.gather(1, targets[:, None])).all())


def judge_temperature(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, ece_before: float
) -> TemperatureFit:
    """Whether a fitted temperature can be trusted: not when every top-1 is right (no finite
    optimum), when it ran to (within :data:`~zoo.calibration.BOUND_TOLERANCE` of) an end of
    :data:`~zoo.calibration.TEMPERATURE_RANGE`, when it does not lower the ECE on the images
    it was fitted on, or when they are fewer than :data:`~zoo.calibration.MIN_FIT_IMAGES`.

    Args:
        temperature: :func:`fit_temperature`'s value on ``logits`` / ``targets``.
        ece_before: their ECE at T = 1 (rounded as stored).
    """
    n = len(logits)
    ece = round(ece_of(logits, targets, temperature), 6) if n else None
    why: list[NotKept] = []
    lo, hi = TEMPERATURE_RANGE
    if n and _separated(logits.detach().double().cpu(), targets.detach().long().cpu()):
        why.append("separated")
    elif math.log(temperature / lo) <= BOUND_TOLERANCE:
        why.append("lower_bound")
    elif math.log(hi / temperature) <= BOUND_TOLERANCE:
        why.append("upper_bound")
    if n and ece is not None and not ece < ece_before:
        why.append("ece_not_lowered")
    if n < MIN_FIT_IMAGES:
        why.append("too_few")
    return TemperatureFit(temperature=temperature, ece=ece, not_kept=tuple(why))


def acceptance_cut(scores: np.ndarray, acceptance: float) -> float:
    """The threshold that accepts a new image like ``scores``' images with probability at
    least ``acceptance``: the ``⌊acceptance'·(N + 1)⌋``-th lowest score, ``acceptance' = 1 −
    acceptance`` (split conformal prediction's quantile; Angelopoulos & Bates 2021, §1.1).

    The empirical quantile (the ``⌊(1 − acceptance)·N⌋ + 1``-th lowest) accepts exactly
    ``acceptance`` of these images but only ``1 − (⌊(1 − acceptance)·N⌋ + 1)/(N + 1)`` of new
    ones: 94.75% of new images for 95% of 323 (``bench/ood.py`` measured 94.9% on held-out
    digits). Fewer than ``1/(1 − acceptance) − 1`` scores: the lowest (all of them accepted).
    """
    s = np.sort(np.asarray(scores, dtype=np.float64))
    rank = math.floor((1.0 - acceptance) * (len(s) + 1) + 1e-9)  # 1-based; 0: accept all
    return float(s[min(len(s) - 1, max(rank - 1, 0))])


def fit_rejection(
    logits: torch.Tensor,
    kind: str,
    temperature: float,
    acceptance: float,
    knn: np.ndarray | None = None,
) -> Rejection:
    """The threshold that accepts a new image like the validation images with probability at
    least ``acceptance`` (:func:`acceptance_cut`: the conformal quantile).

    Args:
        knn: the validation images' kNN scores (:mod:`zoo.train.knn_fit`), for ``knn``.

    Raises:
        UsageError: ``acceptance`` outside (0, 1] (:data:`~zoo.train.config.BOUNDS`).
        InputError: no validation images.
    """
    check_option("acceptance", acceptance)
    if not len(logits):
        raise InputError("No validation images to fit a rejection threshold on.")
    probe = Rejection(score=kind, threshold=0.0, acceptance=acceptance)  # type: ignore[arg-type]
    s = probe.scores(logits.double().cpu().numpy(), temperature, knn)
    cut = acceptance_cut(s, acceptance)
    return Rejection(score=kind, threshold=cut, acceptance=acceptance)  # type: ignore[arg-type]


def fit_calibration(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    reject: str = "off",
    acceptance: float = DEFAULT_ACCEPTANCE,
    knn: np.ndarray | None = None,
    images: str = "validation",
) -> Calibration:
    """Temperature, ECE before and after, and with ``reject`` a rejection rule (fitted at the
    kept temperature). The fitted temperature is kept only when :func:`judge_temperature`
    trusts it; otherwise T = 1 (the model's own softmax) and ``fit`` says why.

    Args:
        logits: ``(N, K)`` validation logits.
        targets: ``(N,)`` class indices.
        reject: one of :data:`REJECT_MODES` (``auto``: :data:`~zoo.calibration.DEFAULT_SCORE`).
        acceptance: the share of new images like the validation images the rule must accept.
        knn: the validation images' kNN scores, for a ``knn`` rule (:func:`score_kind`).
        images: what the fitting images are, in words (:attr:`Calibration.fitted_images`).

    Raises:
        InputError: an unknown ``reject`` or an ``acceptance`` outside (0, 1].
    """
    if reject not in REJECT_MODES:
        raise InputError(f"--reject {reject!r}: one of {', '.join(REJECT_MODES)}.")
    ece_before = round(ece_of(logits, targets, 1.0), 6)
    fit = judge_temperature(logits, targets, fit_temperature(logits, targets), ece_before)
    t = fit.temperature if fit.kept else 1.0
    return Calibration(
        temperature=t,
        reject=None
        if reject == "off"
        else fit_rejection(logits, score_kind(reject), t, acceptance, knn),
        fitted_on=len(logits),
        ece_before=ece_before,
        ece_after=fit.ece if fit.kept else ece_before,
        fit=fit,
        fitted_images=images,
    )


def val_logits(parts: RunParts) -> tuple[torch.Tensor, torch.Tensor]:
    """The shipped weights' logits on the whole validation split, in sample order, in this
    process alone (rank 0 at the end of a run: the loop's loader is a shard under DDP), in
    float32 as an export runs them (no ``--amp``)."""
    from zoo.train.build import loader
    from zoo.train.evaluate import collect_logits

    val = parts.val_set
    batches = loader(val, list(range(len(val))), parts.cfg.batch_size * 2, 0, 0, parts.device)
    module = parts.trained  # the model, or its head over cached features: the same logits
    was = module.training
    module.eval()
    try:
        logits, targets, idx = collect_logits(module, batches, parts.device)
    finally:
        module.train(was)
    order = idx.argsort()
    return logits[order], targets[order]


@dataclass(frozen=True)
class CalibrateResult:
    """What ``zoo calibrate`` did: the fitted value, where it went, and on what."""

    model: str
    config: Path
    split: str
    calibration: Calibration
    accuracy: float  # top-1 on the fitting images (the same before and after: T > 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "config": str(self.config),
            "split": self.split,
            "accuracy": self.accuracy,
            **self.calibration.to_dict(),
        }

    def line(self) -> str:
        c = self.calibration
        why = c.why_not_kept()
        text = (
            f"temperature kept at 1: {why}; ECE {c.ece_before:.4f}"
            if why is not None
            else f"temperature {c.temperature:.4g}: ECE {c.ece_before:.4f} → {c.ece_after:.4f}"
        ) + f" on {c.fitted_on} {c.fitted_images} images (accuracy {self.accuracy:.4f}, unchanged)"
        if c.reject is not None:
            text += (
                f"; rejects below {c.reject.score} {c.reject.threshold:.4g} "
                f"(accepts {c.reject.acceptance:.0%} of them)"
            )
        return text


def calibrate_model(
    model_arg: str,
    *,
    data: str | None = None,
    split: Split | None = None,
    reject: str = "off",
    acceptance: float = DEFAULT_ACCEPTANCE,
    batch_size: int = 64,
    device: str = "auto",
    num_workers: int = 0,
) -> CalibrateResult:
    """``zoo calibrate``: fit the calibration of a run or model folder on held-out images and
    write it into the folder's ``config.json`` (the weights are untouched; exports made before
    carry the old calibration until exported again).

    Args:
        model_arg: a run folder (its own validation split) or a model folder (with ``data``).
        data: the image folder (default: a run's own).
        split: the split to fit on (never the training images); None as in
            :func:`zoo.train.evaluate.evaluate_split`.
        reject / acceptance: as :func:`fit_calibration`.

    Returns:
        The :class:`CalibrateResult`.

    Raises:
        InputError: not a run or model folder, a multi-label model, or the train split.
        DataError: as :func:`zoo.train.evaluate.evaluate_split`.
    """
    from zoo.artifact import write_calibration
    from zoo.ref import ModelRef
    from zoo.train.evaluate import evaluate_split

    ref = ModelRef.parse(model_arg)
    if ref.kind not in ("run", "model-folder"):
        raise InputError(
            f"{model_arg} is not a run or model folder: zoo calibrate writes into the folder's "
            "config.json (fine-tune first, or give the model folder)."
        )
    if split == "train":
        raise UsageError(
            "Calibrating on the training images overfits the temperature: use val.",
            param_hint="--split",
        )
    ev = evaluate_split(
        model_arg, data=data, split=split, batch_size=batch_size, device=device,
        num_workers=num_workers,
    )  # fmt: skip
    if ev.info.multi_label:
        raise InputError(
            f"{model_arg} is multi-label: its per-class thresholds are its calibration "
            "(tuned on validation by zoo finetune)."
        )
    knn = None
    if score_kind(reject) == "knn":  # the bank is written first: the config then names it
        from zoo.train.knn_fit import run_bank_and_scores

        bank, knn = run_bank_and_scores(
            ev.model, ev.info, _train_samples(ref.model_folder, model_arg),
            [p for p, _ in ev.samples], device=next(ev.model.parameters()).device,
        )  # fmt: skip
        bank.save(ref.model_folder)
    split = ev.result["split"]
    if split == "all" and ev.own:
        raise UsageError(
            "--split all of the run's own folder includes its training images, which overfit "
            "the temperature: use val (or test).",
            param_hint="--split",
        )
    cal = fit_calibration(
        ev.logits, ev.targets, reject=reject, acceptance=acceptance, knn=knn,
        images={"val": "validation", "all": "held-out"}.get(split, split),  # all: a new folder
    )  # fmt: skip
    return CalibrateResult(
        model=model_arg,
        config=write_calibration(ref.model_folder, cal),
        split=split,
        calibration=cal,
        accuracy=float(ev.result["acc"]),
    )


def _train_samples(folder: Path, model_arg: str) -> list[tuple[Path, str]]:
    """The training images of the run a model folder belongs to (the kNN bank's rows).

    Raises:
        InputError: the folder belongs to no run.
    """
    from zoo.run_images import find_run, run_validation_images

    run = find_run(folder)
    if run is None:
        raise InputError(
            f"--reject knn embeds the training images of the run, and {model_arg} belongs to "
            "no run: calibrate the run folder, or use --reject msp."
        )
    found = run_validation_images(run, limit=None, split="train")
    return list(zip(found.paths, found.labels, strict=True))


__all__ = [
    "CalibrateResult",
    "acceptance_cut",
    "calibrate_model",
    "fit_calibration",
    "fit_rejection",
    "fit_temperature",
    "judge_temperature",
    "val_logits",
]
