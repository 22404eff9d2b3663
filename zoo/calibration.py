"""A model's calibration as one typed value: the temperature its logits are divided by before
the softmax, and the optional rejection rule that answers ``unknown`` for an image from outside
its classes. Stored in a model folder's ``config.json`` and in an exported graph's zoo metadata
(:mod:`zoo.onnx_meta`) under ``calibration``; fitted by ``zoo finetune`` / ``zoo calibrate``
(:mod:`zoo.train.calibrate`); applied by ``zoo predict``, ``zoo serve`` and the report.

Nothing here imports numpy at module level (``zoo --help`` reads model metadata): the array
functions import it when called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from zoo.errors import ArtifactError

if TYPE_CHECKING:
    import numpy as np

ScoreKind = Literal["msp", "energy", "knn"]
"""How in-distribution an image looks, higher is more: ``msp`` the calibrated top-1
probability (max softmax of logits / T), ``energy`` the negative free energy, ``logsumexp`` of
the raw logits (Liu et al. 2020, at T = 1), ``knn`` the cosine similarity of the image's
embedding to its k-th nearest training embedding (:mod:`zoo.knn`; needs the features, not the
logits: an exported graph computes it as a second output)."""
SCORE_KINDS: tuple[str, ...] = ("msp", "energy", "knn")
LOGIT_SCORES: tuple[str, ...] = ("msp", "energy")
"""The kinds computed from the logits alone (:func:`ood_score`)."""
DEFAULT_SCORE: ScoreKind = "knn"
"""What ``--reject auto`` uses: the lowest mean FPR at 95% TPR in ``bench/ood.py``
(docs/bench/ood.json, 3 seeds: knn 0.06, msp 0.62, energy 0.64; energy separates photographs
from a digits model better than msp but fails the other way, FPR 1.0 for a photos model
against digits)."""
KNN_K = 1
"""The kNN score's k: the nearest training embedding. Sun et al. use 50 of CIFAR-10's 50,000
training images; our splits hold hundreds to thousands, and ``bench/ood.py``'s sweep
(docs/bench/ood.json ``knn_k_sweep``, 3 seeds both ways) rejects the most outside images at
k = 1 for the same acceptance, falling as k grows (a digits CNN against photographs: 96% at
k = 1, 88% at k = 10). It also lets a class enrolled from 5 images (``zoo enroll``) find
neighbours of its own."""
DEFAULT_ACCEPTANCE = 0.95
RejectMode = Literal["off", "auto", "msp", "energy", "knn"]
"""``--reject``: no rejection, the measured default score (:data:`DEFAULT_SCORE`), or a named
one."""


def score_kind(reject: str) -> str:
    """The score a ``--reject`` mode fits (``auto``: :data:`DEFAULT_SCORE`; ``off``: none, the
    empty string)."""
    return "" if reject == "off" else DEFAULT_SCORE if reject == "auto" else reject


REJECT_MODES: tuple[str, ...] = ("off", "auto", *SCORE_KINDS)
TEMPERATURE_RANGE: tuple[float, float] = (1e-2, 1e2)
"""The temperatures a fit may reach; one that runs to either end is not kept
(:class:`TemperatureFit`)."""
BOUND_TOLERANCE = 0.05
"""How near a bound, in ``log T``, counts as at it (5%: LBFGS flattens out before the end)."""
MIN_FIT_IMAGES = 20
"""Fewer fitting images than this: the temperature is not kept. One parameter fitted on them
follows single images, and the 10-bin ECE that judges it is mostly noise (≈ 0.24/√N ≥ 0.05)."""
NotKept = Literal["separated", "lower_bound", "upper_bound", "ece_not_lowered", "too_few"]
"""Why a fitted temperature was not kept: every top-1 right (the NLL falls all the way to
T → 0), the fit ran to the lower or the upper end of :data:`TEMPERATURE_RANGE`, it did not
lower the ECE on the images it was fitted on, or fewer than :data:`MIN_FIT_IMAGES` of them.
A file a newer zoo wrote may hold a reason not listed here: it still reads (the temperature not
kept, T = 1), the reason said by name (:meth:`Calibration.why_not_kept`)."""
NOT_KEPT: tuple[str, ...] = (
    "separated",
    "lower_bound",
    "upper_bound",
    "ece_not_lowered",
    "too_few",
)
UNKNOWN_LABEL = "unknown"
"""The label ``zoo predict`` and ``zoo serve`` answer for a rejected image. A model may have a
class of that name: the answers' ``accepted`` field, never the label, says which it is."""


@dataclass(frozen=True)
class Rejection:
    """Answer ``unknown`` when an image's score falls below a threshold fitted on validation.

    Attributes:
        score: the score kind (:data:`SCORE_KINDS`).
        threshold: images scoring below it are rejected.
        acceptance: the share of the validation images the threshold was fitted to accept.
    """

    score: ScoreKind
    threshold: float
    acceptance: float

    def __post_init__(self) -> None:
        if self.score not in SCORE_KINDS:
            raise ArtifactError(
                f"Unknown rejection score {self.score!r}: one of {', '.join(SCORE_KINDS)}."
            )
        if not math.isfinite(self.threshold):
            raise ArtifactError(f"The rejection threshold must be finite, got {self.threshold}.")
        if not 0.0 < self.acceptance <= 1.0:
            raise ArtifactError(f"The acceptance must be in (0, 1], got {self.acceptance}.")

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score, "threshold": self.threshold, "acceptance": self.acceptance}

    def scores(
        self, logits: np.ndarray, temperature: float = 1.0, knn: np.ndarray | None = None
    ) -> np.ndarray:
        """Each row's score of this rule's kind, ``(N,)`` float64: :func:`ood_score` of the
        logits, or for ``knn`` the kNN scores the model computed beside them.

        Raises:
            ArtifactError: a ``knn`` rule without the kNN scores (the graph lacks the output).
        """
        if self.score != "knn":
            return ood_score(logits, self.score, temperature)
        if knn is None:
            raise ArtifactError(
                "This model's rejection rule is knn, but its graph has no knn_score output: "
                "export it again from the model folder (zoo export), which adds it."
            )
        import numpy as np

        return np.asarray(knn, dtype=np.float64).reshape(-1)

    def verdict(self, score: float) -> Verdict:
        """One image's verdict from its score: accepted when it reaches the threshold."""
        return Verdict(accepted=bool(score >= self.threshold), score=float(score), rule=self)


@dataclass(frozen=True)
class Verdict:
    """One image judged by a :class:`Rejection`: what ``zoo predict`` and ``zoo serve`` answer
    beside the top-k (a rejected image's answer is :data:`UNKNOWN_LABEL`).

    Attributes:
        accepted: the score reaches the threshold (the image gets a class).
        score: the image's score of the rule's kind.
        rule: the rule that judged it.
    """

    accepted: bool
    score: float
    rule: Rejection

    def reason(self) -> str:
        """``energy 2.1 < threshold 4.0``: the score against the threshold."""
        sign = ">=" if self.accepted else "<"
        return f"{self.rule.score} {self.score:.4g} {sign} threshold {self.rule.threshold:.4g}"

    def to_dict(self) -> dict[str, Any]:
        """``{"accepted", "score", "score_kind", "threshold"}``: the JSON answers' fields."""
        return {
            "accepted": self.accepted,
            "score": self.score,
            "score_kind": self.rule.score,
            "threshold": self.rule.threshold,
        }


@dataclass(frozen=True)
class TemperatureFit:
    """What the temperature fit reached, and whether the :class:`Calibration` kept it.

    Attributes:
        temperature: the NLL-minimising temperature, clamped to :data:`TEMPERATURE_RANGE`.
        ece: the expected calibration error at it on the fitting images (None: no images).
        not_kept: why it was not kept, the main reason first (empty: kept, the calibration's
            temperature is this one; otherwise the calibration keeps T = 1, the raw softmax).
            :data:`NOT_KEPT`'s reasons, or, read from a newer zoo's file, one this version
            does not know (kept by name, so the file reads and writes back unchanged).
    """

    temperature: float
    ece: float | None = None
    not_kept: tuple[NotKept, ...] = ()

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ArtifactError(
                f"The fitted temperature must be a positive number, got {self.temperature}."
            )
        # any name reads (forward compatible: not kept is not kept, whatever the reason);
        # what is not a name at all is a damaged file
        bad = [r for r in self.not_kept if not (isinstance(r, str) and r)]
        if bad:
            raise ArtifactError(
                f"A reason the temperature was not kept must be a name such as "
                f"{', '.join(NOT_KEPT)}; got {bad[0]!r}."
            )

    @property
    def kept(self) -> bool:
        return not self.not_kept

    def to_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "ece": self.ece,
            "kept": self.kept,
            "not_kept": list(self.not_kept),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TemperatureFit:
        """Read :meth:`to_dict`'s JSON back (``kept`` follows from ``not_kept``).

        Raises:
            ArtifactError: ``not_kept`` is not a list of names.
        """
        not_kept = d.get("not_kept") or []
        if not isinstance(not_kept, list):
            raise ArtifactError(
                f"The reasons the temperature was not kept must be a list of names, got "
                f"{not_kept!r}."
            )
        # a newer zoo's reason reads as written (typed NotKept for the code that makes fits)
        return cls(temperature=float(d["temperature"]), ece=d.get("ece"), not_kept=tuple(not_kept))


@dataclass(frozen=True)
class Calibration:
    """Temperature scaling (Guo et al. 2017) and the optional rejection rule of a model.

    Attributes:
        temperature: logits are divided by it before the softmax (> 0: the top-1 never
            changes, only how confident it reads).
        reject: the rule answering ``unknown`` (None: every image gets a class).
        fitted_on: how many validation images it was fitted on.
        ece_before / ece_after: the expected calibration error on them, raw and at
            ``temperature`` (the same when the fit was not kept).
        fit: the temperature fit and whether it was kept (None: not recorded, as written
            before zoo checked its fits, or set by hand).
        fitted_images: what the fitting images were, in words: ``validation`` (a run's end),
            or the split ``zoo calibrate --split`` named.
    """

    temperature: float
    reject: Rejection | None = None
    fitted_on: int = 0
    ece_before: float | None = None
    ece_after: float | None = None
    fit: TemperatureFit | None = None
    fitted_images: str = "validation"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ArtifactError(
                f"The temperature must be a positive number, got {self.temperature}."
            )

    def to_dict(self) -> dict[str, Any]:
        """The JSON written to ``config.json`` and the ONNX metadata."""
        return {
            "temperature": self.temperature,
            "reject": self.reject.to_dict() if self.reject else None,
            "fitted_on": self.fitted_on,
            "ece_before": self.ece_before,
            "ece_after": self.ece_after,
            "fit": None if self.fit is None else {**self.fit.to_dict(), "why": self.why_not_kept()},
            "fitted_images": self.fitted_images,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str) -> Calibration:
        """Read :meth:`to_dict`'s JSON back, a fit not kept for a reason this version does not
        know (a newer zoo's) included: its temperature as written (T = 1 with any fit not
        kept, as :func:`zoo.train.calibrate.fit_calibration` writes it).

        Raises:
            ArtifactError: a field is missing or out of range (``where`` names the file).
        """
        try:
            reject = d.get("reject")
            fit = TemperatureFit.from_dict(d["fit"]) if d.get("fit") else None
            return cls(
                temperature=float(d["temperature"]),
                reject=Rejection(
                    score=reject["score"],
                    threshold=float(reject["threshold"]),
                    acceptance=float(reject["acceptance"]),
                )
                if reject
                else None,
                fitted_on=int(d.get("fitted_on", 0)),
                ece_before=d.get("ece_before"),
                ece_after=d.get("ece_after"),
                fit=fit,
                fitted_images=str(d.get("fitted_images") or "validation"),
            )
        except (KeyError, TypeError, ValueError, ArtifactError) as exc:
            raise ArtifactError(f"{where}: calibration is malformed ({exc}).") from exc

    def why_not_kept(self) -> str | None:
        """Why the fitted temperature was not kept, in words (None: kept, or no fit recorded):
        ``the fit ran to the bound 0.01 (validation perfectly separated, 15 images: too few to
        calibrate)``."""
        if self.fit is None or self.fit.kept:
            return None
        images = self.fitted_images
        f, why = self.fit, self.fit.not_kept
        lo, hi = TEMPERATURE_RANGE
        notes = {
            "separated": f"{images} perfectly separated",
            "lower_bound": "the NLL optimum lies below it",
            "upper_bound": "the logits carry no usable confidence",
        }
        if why[0] in ("separated", "lower_bound"):
            head = f"the fit ran to the bound {lo:g}"
        elif why[0] == "upper_bound":
            head = f"the fit ran to the bound {hi:g}"
        elif why[0] == "ece_not_lowered":
            verb = "raised" if (f.ece or 0.0) > (self.ece_before or 0.0) else "did not lower"
            head = (
                f"the fit (T {f.temperature:.4g}) {verb} the ECE {self.ece_before or 0.0:.4f} "
                f"→ {f.ece or 0.0:.4f}"
            )
        else:
            head = f"the fit (T {f.temperature:.4g}) is not trusted"
        said = [notes[r] for r in why if r in notes]
        if "too_few" in why:
            said.append(f"{self.fitted_on} images: too few to calibrate")
        said += [f"a reason this zoo version does not know: {r}" for r in why if r not in NOT_KEPT]
        return head + (f" ({', '.join(said)})" if said else "")

    def temperature_line(self) -> str:
        """The fit in one line, as ``zoo finetune`` ends: ``temperature 1.8, expected
        calibration error 0.1200 → 0.0300 on 400 validation images``, or ``temperature kept
        at 1: <why>; expected calibration error 0.1435 on 7 validation images``."""
        why = self.why_not_kept()
        images = self.fitted_images
        if why is not None:
            return (
                f"temperature kept at 1: {why}; expected calibration error "
                f"{self.ece_before or 0.0:.4f} on {self.fitted_on} {images} images"
            )
        return (
            f"temperature {self.temperature:.4g}, expected calibration error "
            f"{self.ece_before or 0.0:.4f} → {self.ece_after or 0.0:.4f} on {self.fitted_on} "
            f"{images} images"
        )

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """Calibrated softmax of ``(N, K)`` logits, float64."""
        return softmax(logits, self.temperature)

    def decide(
        self, logits: np.ndarray, knn: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Calibrated probabilities and, with a rejection rule, which rows it rejects.

        Args:
            logits: ``(N, K)`` raw logits.
            knn: ``(N,)`` kNN scores (a ``knn`` rule needs them).

        Returns:
            ``(probs, rejected)``: ``rejected`` is a boolean ``(N,)`` (None without a rule).
        """
        probs = self.probabilities(logits)
        if self.reject is None:
            return probs, None
        s = self.reject.scores(logits, self.temperature, knn)
        return probs, s < self.reject.threshold


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Softmax of ``logits / temperature`` over the last axis, float64."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64) / temperature
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def ood_score(logits: np.ndarray, kind: str, temperature: float = 1.0) -> np.ndarray:
    """Each row's in-distribution score (higher: more like the training classes).

    Args:
        logits: ``(N, K)`` raw logits.
        kind: ``msp`` (max of the softmax at ``temperature``) or ``energy`` (``logsumexp`` of
            the raw logits); ``knn`` needs the features (:meth:`zoo.knn.KnnBank.scores`).
        temperature: the model's fitted temperature (``msp`` only).

    Returns:
        ``(N,)`` float64 scores.
    """
    import numpy as np

    x = np.asarray(logits, dtype=np.float64)
    if kind == "msp":
        return softmax(x, temperature).max(axis=-1)
    if kind == "energy":
        top = x.max(axis=-1)
        return top + np.log(np.exp(x - top[:, None]).sum(axis=-1))
    raise ArtifactError(
        f"Score kind {kind!r} is not one of the logits': {', '.join(LOGIT_SCORES)}."
    )


__all__ = [
    "BOUND_TOLERANCE",
    "DEFAULT_ACCEPTANCE",
    "DEFAULT_SCORE",
    "KNN_K",
    "LOGIT_SCORES",
    "MIN_FIT_IMAGES",
    "NOT_KEPT",
    "REJECT_MODES",
    "SCORE_KINDS",
    "TEMPERATURE_RANGE",
    "UNKNOWN_LABEL",
    "Calibration",
    "NotKept",
    "RejectMode",
    "Rejection",
    "ScoreKind",
    "TemperatureFit",
    "Verdict",
    "ood_score",
    "score_kind",
    "softmax",
]
