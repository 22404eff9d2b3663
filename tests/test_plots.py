"""The run folder's PNGs, checked by their pixels: rows of the confusion matrix are the true
class, colours follow the counts, curves go where their values go, and the bytes are the same
every time (the crash walk compares run folders bit for bit)."""

from __future__ import annotations

import io
import math
from itertools import pairwise
from pathlib import Path

import pytest
from PIL import Image

from zoo.train.plots import (
    TRAIN,
    VAL,
    blues,
    confusion_image,
    confusion_layout,
    curves_image,
    nice_ticks,
    plot_confusion,
    plot_curves,
)


def test_confusion_rows_are_true_and_colours_follow_the_counts() -> None:
    cm = [[9, 0, 1], [6, 3, 0], [0, 0, 4]]  # asymmetric: a transpose shows
    im = confusion_image(cm, ["a", "b", "c"])
    cell, left, top = confusion_layout(3)
    for i in range(3):
        for j in range(3):  # a corner of the cell: away from the printed count
            assert im.getpixel((left + j * cell + 2, top + i * cell + 2)) == blues(cm[i][j] / 9)


def test_blues_runs_from_near_white_to_dark_blue() -> None:
    assert blues(0.0) == (247, 251, 255) and blues(1.0) == (8, 48, 107)
    assert blues(-1.0) == blues(0.0) and blues(2.0) == blues(1.0)
    shades = [sum(blues(k / 20)) for k in range(21)]
    assert all(a > b for a, b in pairwise(shades))


@pytest.mark.parametrize("n", [300, 2000])
def test_many_classes_fit_in_a_bounded_image(n: int) -> None:
    cm = [[(i * 7 + j) % 5 for j in range(n)] for i in range(n)]
    cell, left, top = confusion_layout(n)
    im = confusion_image(cm, [f"class {k}" for k in range(n)])
    assert im.width < 1200 and im.height < 1200  # 2,000 classes: 900 px, not 8,000
    size = round(n * cell)
    for x in (0, size // 3, size - 1):  # each pixel shows the cell under its centre
        k = int((x + 0.5) * n / size)
        assert im.getpixel((left + x, top + x)) == blues(cm[k][k] / 4)


def _centroid_y(im: Image.Image, colour: tuple[int, int, int], x0: int, x1: int) -> float:
    ys = [y for x in range(x0, x1) for y in range(im.height) if im.getpixel((x, y)) == colour]
    assert ys, f"no {colour} pixels in x {x0}..{x1}"
    return sum(ys) / len(ys)


def test_curves_go_where_their_values_go() -> None:
    hist = [
        {"epoch": e, "train/loss": 2 / e, "val/loss": 1.0, "train/acc": e / 10, "val/acc": 0.3}
        for e in range(1, 11)
    ]
    im = curves_image(hist)
    # loss panel (x 110..480, its legend at x 402..424): train falls, the flat val does not
    assert _centroid_y(im, TRAIN, 130, 200) < _centroid_y(im, TRAIN, 340, 400) - 100
    assert abs(_centroid_y(im, VAL, 130, 200) - _centroid_y(im, VAL, 300, 380)) < 3
    # accuracy panel (x 610..980, 0 at y 340, 1 at y 40): val sits at 0.3
    assert abs(_centroid_y(im, VAL, 700, 850) - (340 - 0.3 * 300)) < 3


def test_non_finite_values_leave_gaps_not_errors() -> None:
    nan = math.nan
    hist = [
        {"epoch": 1, "train/loss": nan, "val/loss": 1.0, "train/acc": 0.1, "val/acc": 0.2},
        {"epoch": 2, "train/loss": math.inf, "val/loss": 0.5, "train/acc": 0.2, "val/acc": 0.4},
    ]
    im = curves_image(hist)
    with pytest.raises(AssertionError, match="no"):  # no train loss point is drawn at all
        _centroid_y(im, TRAIN, 112, 400)  # left of the legend's sample line
    _centroid_y(im, VAL, 112, 400)


@pytest.mark.parametrize(
    "lo, hi",
    [(0.16, 2.2), (0.0, 1.0), (0.5, 0.5), (0.0012, 0.0031), (-1.0, 3.0), (3.0, 7e4), (0, 1e-20)],
)
def test_ticks_cover_the_range_in_round_even_steps(lo: float, hi: float) -> None:
    t = nice_ticks(lo, hi)
    assert t[0] <= lo and t[-1] >= hi and 3 <= len(t) <= 8
    steps = {round(b - a, 12) for a, b in pairwise(t)}
    assert len(steps) == 1
    (step,) = steps
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 5))


def test_a_loss_flat_to_float_noise_still_plots() -> None:
    hist = [
        {"epoch": e, "train/loss": v, "val/loss": 0.0, "train/acc": 1.0, "val/acc": 1.0}
        for e, v in ((1, 1e-20), (2, 0.0), (3, 3e-16))
    ]
    assert curves_image(hist).size == (1000, 400)  # it hung once: ticks 1e-20 apart


def test_the_same_run_writes_the_same_bytes(tmp_path: Path) -> None:
    hist = [{"epoch": 1, "train/loss": 1.0, "val/loss": 0.9, "train/acc": 0.5, "val/acc": 0.6}]
    for k in (1, 2):
        plot_curves(hist, tmp_path / f"c{k}.png")
        plot_confusion([[1, 2], [3, 4]], ["x", "y"], tmp_path / f"m{k}.png")
    assert (tmp_path / "c1.png").read_bytes() == (tmp_path / "c2.png").read_bytes()
    assert (tmp_path / "m1.png").read_bytes() == (tmp_path / "m2.png").read_bytes()
    assert Image.open(io.BytesIO((tmp_path / "m1.png").read_bytes())).format == "PNG"
