"""One batch of ``zoo predict --out``: decode an input, score a batch of them in one model
call, and the rows they give. The local engine (:mod:`zoo.deploy.predict.batch`) and the Ray
actors (:mod:`zoo.deploy.predict.ray_engine`) both run exactly this, so their rows agree."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

from zoo.calibration import UNKNOWN_LABEL, Verdict
from zoo.deploy.predict.inputs import unreadable_reason
from zoo.deploy.predict.scoring import Scorer
from zoo.deploy.runtimes.decisions import SEPARATOR
from zoo.images import open_image

Decoded = tuple[str, np.ndarray | None, str | None]  # path, array or None, reason or None
Result = tuple[str, dict[str, Any] | None, str | None]  # path, row or None, reason or None


def decode(
    path: str, prepare: Callable[[Image.Image], np.ndarray], source: str | bytes | None = None
) -> Decoded:
    """Open (``source``: the encoded bytes, or another path to read; default ``path``) and
    preprocess one input; a file that cannot be read gives its reason instead of an array (a
    path from a list of paths: naming its line, :func:`~zoo.deploy.predict.inputs.unreadable_reason`)."""
    try:
        return path, prepare(open_image(path if source is None else source)), None
    except (OSError, ValueError) as exc:  # InputError (missing, undecodable, a bomb) included
        return path, None, unreadable_reason(path, exc) if source is None else str(exc)


def _row(
    scorer: Scorer, path: str, scores: np.ndarray, k: int, verdict: Verdict | None
) -> dict[str, Any]:
    row: dict[str, Any] = {"path": path}
    top = scorer.top(scores, k)
    for i, t in enumerate(top, 1):
        row.update({f"label_{i}": t.label, f"index_{i}": t.index, f"score_{i}": t.score})
    if scorer.multi_label:
        row["labels"] = SEPARATOR.join(scorer.decided(scores) or ())
    if verdict is not None:  # the columns of store.columns(judged=True)
        row["label"] = top[0].label if verdict.accepted else UNKNOWN_LABEL
        row["accepted"] = verdict.accepted
        row["score"] = verdict.score
    return row


def score_decoded(
    scorer: Scorer, batch: Sequence[Decoded], k: int, embeddings: bool = False
) -> list[Result]:
    """Score one batch of decoded inputs in one model call.

    Returns:
        ``(path, row, None)`` per scored input (with ``embedding``, a list of floats, when
        ``embeddings``; with ``label``, ``accepted`` and ``score`` when the scorer has a
        rejection rule) and ``(path, None, reason)`` per input that could not be read, in order.
    """
    ok = [i for i, (_, a, _) in enumerate(batch) if a is not None]
    results: list[Result] = [(p, None, reason) for p, _, reason in batch]
    if not ok:
        return results
    x = scorer.batch([batch[i][1] for i in ok])  # type: ignore[misc]  # ok: arrays only
    a = scorer.scored(x, features=embeddings)
    probs, feats, verdicts = a.probs, a.features, scorer.verdicts(a)
    for j, i in enumerate(ok):
        row = _row(scorer, batch[i][0], probs[j], k, verdicts[j])
        if feats is not None:
            row["embedding"] = feats[j].tolist()
        results[i] = (batch[i][0], row, None)
    return results


__all__ = ["Decoded", "Result", "decode", "score_decoded"]
