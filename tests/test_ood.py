"""Images from outside the classes (issue #33): the separation figures ``zoo eval --ood``
reports, against hand computations and scikit-learn's definition."""

from __future__ import annotations

import numpy as np
import pytest

from zoo.calibration import Calibration, Rejection
from zoo.train.ood import auroc, fpr_at_tpr, separation


def test_auroc_and_fpr_by_hand() -> None:
    pos = np.array([0.9, 0.8, 0.7, 0.6])
    neg = np.array([0.85, 0.5, 0.4, 0.1])
    # pairs (pos > neg): 0.9 beats all 4, 0.8/0.7/0.6 beat 3 each → 13 of 16
    assert auroc(pos, neg) == pytest.approx(13 / 16)
    # 95% of 4 positives: the threshold is the lowest positive (0.6); 0.85 passes it
    assert fpr_at_tpr(pos, neg) == pytest.approx(1 / 4)
    assert fpr_at_tpr(pos, neg, tpr=0.5) == pytest.approx(
        1 / 4
    )  # cut at 0.7 (⌊0.5·5⌋ = 2nd lowest)
    assert auroc(pos, pos - 10) == 1.0 and fpr_at_tpr(pos, pos - 10) == 0.0


def test_fpr_uses_the_rule_reject_fits() -> None:
    from zoo.train.calibrate import fit_rejection

    rng = np.random.default_rng(0)
    inside = rng.normal(size=(200, 5)) * 4
    outside = rng.normal(size=(300, 5))
    import torch

    rule = fit_rejection(torch.from_numpy(inside), "energy", 1.0, 0.95)
    cal = Calibration(1.0, rule)
    rejected_out = cal.decide(outside)[1]
    energy = next(s for s in separation(inside, outside, 1.0) if s.score == "energy")
    # FPR at 95% TPR is exactly the share of outside images such a rule lets through
    assert energy.fpr_at_95_tpr == pytest.approx(1 - rejected_out.mean(), abs=1e-6)
    assert (~cal.decide(inside)[1]).mean() >= 0.95


def test_no_rule_rejects_nothing() -> None:
    probs, rejected = Calibration(2.0).decide(np.array([[1.0, 0.0]]))
    assert rejected is None and probs[0, 0] == pytest.approx(1 / (1 + np.exp(-0.5)))
    _, rejected = Calibration(1.0, Rejection("msp", 0.99, 0.95)).decide(np.array([[1.0, 0.0]]))
    assert rejected is not None and rejected.tolist() == [True]
