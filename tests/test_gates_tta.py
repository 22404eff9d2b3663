"""Test-time augmentation on plain arrays and a tiny ONNX classifier (milliseconds): which
views, in which order (the plain eval crop first, bit-identical to preprocess), the corner
boxes, the mean of probabilities for predict, and the log-mean-probability logits for eval.
The real runs are in test_report.py and test_predict_out.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.test_gates_embeddings import _classifier
from zoo.deploy.predict.scoring import load_scorer
from zoo.errors import InputError
from zoo.preprocess import normalised, preprocess, resized, scores
from zoo.preprocessing import Preprocessing
from zoo.train.evaluate import _combine
from zoo.tta import VIEWS, average, views

PRE = Preprocessing(
    input_size=(3, 4, 4), crop_pct=0.5, interpolation="nearest", mean=(0.5,) * 3, std=(0.25,) * 3
)


def _image() -> Image.Image:
    """12×8: resized (short side 8, the 4-px crop is half of it) to 12×8, all pixels distinct."""
    px = np.arange(12 * 8 * 3, dtype=np.uint8).reshape(8, 12, 3)
    return Image.fromarray(px)


@pytest.mark.parametrize("mode", list(VIEWS))
def test_views_start_with_the_plain_crop(mode: str) -> None:
    v = views(_image(), PRE, mode)
    assert v.shape == (VIEWS[mode], 3, 4, 4) and v.dtype == np.float32 and v.flags.c_contiguous
    np.testing.assert_array_equal(v[0], preprocess(_image(), PRE))


def test_corner_crops_and_mirrors() -> None:
    big = resized(_image(), PRE)
    assert big.size == (12, 8)
    five, ten = views(_image(), PRE, "five-crop"), views(_image(), PRE, "ten-crop")
    boxes = [(0, 0, 4, 4), (8, 0, 12, 4), (0, 4, 4, 8), (8, 4, 12, 8)]  # tl, tr, bl, br
    for view, box in zip(five[1:], boxes, strict=True):
        np.testing.assert_array_equal(view, normalised(big.crop(box), PRE))
    np.testing.assert_array_equal(ten[:5], five)
    np.testing.assert_array_equal(ten[5:], five[..., ::-1])
    flip = views(_image(), PRE, "flip")
    np.testing.assert_array_equal(flip[1], flip[0][..., ::-1])
    assert len({v.tobytes() for v in ten}) == 10  # ten different views
    with pytest.raises(InputError, match="none, flip, five-crop, ten-crop"):
        views(_image(), PRE, "flips")
    whole = Preprocessing((3, 4, 4), 1.0, "nearest", (0.5,) * 3, (0.25,) * 3)
    assert views(_image(), whole, "flip").shape == (2, 3, 4, 4)
    with pytest.raises(InputError, match=r"resizes to its crop size \(4 px, crop_pct 1.0\)"):
        views(_image(), whole, "ten-crop")


def test_average_and_eval_logits() -> None:
    rng = np.random.default_rng(0)
    logits = torch.from_numpy(rng.standard_normal((3, 4, 5)))
    probs = torch.softmax(logits, -1)
    np.testing.assert_allclose(average(probs.numpy()), probs.mean(1).numpy())
    combined = _combine(logits, multi_label=False)  # log of the mean probability
    torch.testing.assert_close(torch.softmax(combined, -1), probs.mean(1))
    torch.testing.assert_close(combined.exp(), probs.mean(1))
    multi = _combine(logits, multi_label=True)  # the logit of the mean sigmoid, per class
    torch.testing.assert_close(torch.sigmoid(multi), torch.sigmoid(logits).mean(1))


def test_predict_with_tta_averages_the_views_probabilities(tmp_path: Path) -> None:
    path = _classifier(tmp_path, "N")  # a real ONNX classifier on 2×2 inputs
    plain, flip = load_scorer(str(path), threads=1), load_scorer(str(path), threads=1, tta="flip")
    im = Image.fromarray(np.arange(5 * 4 * 3, dtype=np.uint8).reshape(4, 5, 3) * 4)
    x = flip.prepare(im)
    assert x.shape == (2, 3, 2, 2)
    got = flip.score(np.stack([x, x[::-1]]))  # two images, two views each
    want = [(plain.score(x[:1]) + plain.score(x[1:])) / 2] * 2
    np.testing.assert_allclose(got, np.concatenate(want), rtol=0, atol=1e-7)
    assert flip.identity["tta"] == "flip" and "tta" not in plain.identity
    with pytest.raises(InputError, match="drop --tta or --embeddings"):
        load_scorer(str(path), tta="flip", embeddings=True)
    assert scores(np.zeros((1, 3))).sum() == pytest.approx(1.0)


def test_crops_are_refused_at_load_for_a_model_that_resizes_to_its_crop(tmp_path: Path) -> None:
    path = _classifier(tmp_path, "N")  # crop_pct 1.0: the resized image is the crop
    with pytest.raises(InputError, match="Use --tta flip"):
        load_scorer(str(path), threads=1, tta="five-crop")
