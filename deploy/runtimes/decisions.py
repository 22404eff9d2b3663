"""A multi-label model's decisions: every class whose sigmoid score reaches its own threshold
(tuned on validation by ``zoo finetune --multi-label`` and stored in ``config.json`` and the
graph's metadata as ``thresholds``; 0.5 for each class of a model that stores none). The one
rule ``zoo predict`` (``--json``, the ``labels`` column of ``--out``) and ``zoo serve`` (the
``labels`` output) apply, so they give the same labels for the same image."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zoo.errors import ArtifactError

DEFAULT_THRESHOLD = 0.5
"""A class's threshold when the model stores none (as ``zoo predict``)."""
SEPARATOR = ";"
"""Between the decided labels of one image, as the ``labels`` column of ``zoo predict --out``."""


@dataclass(frozen=True)
class Decisions:
    """The per-class decision rule of a multi-label model.

    Attributes:
        thresholds: each class's threshold, in class order: the metadata's, or
            :data:`DEFAULT_THRESHOLD` for each class when it stores none (empty: a graph whose
            width is unknown until it runs, with no class names; the default for each then).
        classes: the class names (may be empty: an index then names its class).
    """

    thresholds: tuple[float, ...]
    classes: tuple[str, ...]

    def label(self, i: int) -> str:
        """Class ``i``'s name (its index as text when the model has no names)."""
        return self.classes[i] if i < len(self.classes) else str(i)

    def mask(self, probs: np.ndarray) -> np.ndarray:
        """``(N, classes)`` bool: each score at or over its class's threshold.

        Args:
            probs: ``(N, classes)`` float64 sigmoid scores
                (:meth:`zoo.deploy.runtimes.classifier.Classifier.judge`).
        """
        cut = np.asarray(self.thresholds or (DEFAULT_THRESHOLD,) * probs.shape[-1], np.float64)
        return probs >= cut

    def labels(self, probs: np.ndarray) -> list[list[str]]:
        """Each row's decided classes, in class order (an empty list: none reached its
        threshold)."""
        return [[self.label(int(i)) for i in np.flatnonzero(row)] for row in self.mask(probs)]

    def joined(self, probs: np.ndarray) -> np.ndarray:
        """The ``labels`` output: a BYTES ``[N]`` tensor (object array of str), each row's
        decided classes joined by :data:`SEPARATOR` (empty: none)."""
        return np.array([SEPARATOR.join(ls) for ls in self.labels(probs)], dtype=object)


def decision_rule(
    found: object, classes: tuple[str, ...], width: int, *, where: str, fix: str
) -> Decisions:
    """A multi-label model's rule from its stored ``thresholds`` (None or empty: the default
    for each of its ``width`` classes), checked.

    Args:
        found: the stored value, as read from JSON.
        classes: the class names.
        width: the model's number of outputs (0: not known until it runs).
        where: names the stored value in an error; ``fix`` says what to do.

    Raises:
        ArtifactError: not one finite number per class.
    """
    if not found:
        return Decisions((DEFAULT_THRESHOLD,) * width, classes)
    if not isinstance(found, list | tuple):
        raise ArtifactError(f"{where} are {found!r}, not a list of one number per class; {fix}")
    values = list(found)
    bad = [t for t in values if not _a_threshold(t)]
    if bad:
        raise ArtifactError(
            f"{where} hold {bad[0]!r}, not a number in [0, 1]: one threshold per class is "
            f"needed; {fix}"
        )
    if width and len(values) != width:
        raise ArtifactError(
            f"{where} are {len(values)} values for the model's {width} classes: one threshold "
            f"per class is needed; {fix}"
        )
    return Decisions(tuple(float(t) for t in values), classes)


def _a_threshold(value: object) -> bool:
    """A JSON number in [0, 1], a sigmoid score's range (``true``/``false`` are not numbers
    here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and 0.0 <= value <= 1.0
