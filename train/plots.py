"""PNG plots a person can look at: loss/accuracy curves and the confusion matrix.

Drawn with Pillow (already loaded for the images), not matplotlib: matplotlib's import and
first draw cost ~2.4 s of every run's wall clock, half the whole-run overhead budget of a
1-minute fine-tune (docs/benchmarks.md); these two fixed layouts take a few milliseconds."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from zoo import durable

TRAIN, VAL = (31, 119, 180), (255, 127, 14)  # the usual blue and orange
_INK, _GRID = (40, 40, 40), (225, 225, 225)
# matplotlib's "Blues" colour map at 9 stops (ColorBrewer), interpolated linearly
_BLUES = ("#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5",
          "#08519c", "#08306b")  # fmt: skip


@lru_cache
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _save(im: Image.Image, out: Path) -> None:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    durable.write_bytes(out, buf.getvalue(), label=out.name)


def _text(draw: ImageDraw.ImageDraw, xy: tuple[float, float], s: str, size: int = 13,
          anchor: str = "la", fill: tuple[int, int, int] = _INK) -> None:  # fmt: skip
    draw.text(xy, s, font=_font(size), fill=fill, anchor=anchor)


def nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """About ``n`` round values (1, 2 or 5 × 10^k apart), the first ≤ ``lo``, the last ≥ ``hi``."""
    if not hi - lo > 1e-9 * max(1.0, abs(lo), abs(hi)):  # one value (to float noise): a unit
        lo, hi = lo - 0.5, lo + 0.5  # range around it (a 1e-20 spread would loop for ever)
    raw = (hi - lo) / max(1, n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks: list[float] = []
    i = 0
    while (not ticks or ticks[-1] < hi - step * 1e-9) and i <= 4 * n:
        ticks.append(round((first + i * step) / step) * step)  # whole steps: no float drift
        i += 1
    return ticks


def _label(v: float) -> str:
    return f"{v:g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.0e}"


def _panel(
    draw: ImageDraw.ImageDraw,
    box: tuple[int, int, int, int],
    series: list[tuple[str, list[tuple[float, float]], tuple[int, int, int]]],
    title: str,
    ylabel: str,
    ylim: tuple[float, float] | None = None,
    legend_at_top: bool = True,
    xlabel: str = "epoch",
    xtick: Callable[[float], str] = lambda t: str(int(t)),
) -> None:
    """One line chart in ``box`` (left, top, right, bottom): axes, grid, ticks, legend; x
    ticks at the whole numbers, labelled by ``xtick``."""
    left, top, right, bottom = box
    pts = [p for _, ps, _ in series for p in ps]
    xs = [x for x, _ in pts] or [1.0]
    ys = [y for _, y in pts] or [0.0]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1)
    y0, y1 = ylim or (min(ys), max(ys))
    yt = nice_ticks(y0, y1)
    if ylim is None:
        y0, y1 = yt[0], yt[-1]
    yt = [t for t in yt if y0 <= t <= y1]
    pad = (x1 - x0) * 0.04

    def at(x: float, y: float) -> tuple[float, float]:
        px = left + (x - x0 + pad) / (x1 - x0 + 2 * pad) * (right - left)
        py = bottom - (y - y0) / ((y1 - y0) or 1.0) * (bottom - top)
        return px, py

    _text(draw, ((left + right) / 2, top - 14), title, 15, "ms")
    for t in yt:
        py = at(x0, t)[1]
        draw.line([(left, py), (right, py)], fill=_GRID)
        _text(draw, (left - 6, py), _label(t), 12, "rm")
    for t in nice_ticks(x0, x1, 8):
        if x0 <= t <= x1 and float(t).is_integer():
            px = at(t, y0)[0]
            draw.line([(px, bottom), (px, bottom + 4)], fill=_INK)
            _text(draw, (px, bottom + 6), xtick(t), 12, "mt")
    draw.rectangle(box, outline=_INK)
    _text(draw, ((left + right) / 2, bottom + 24), xlabel, 13, "mt")
    _text(draw, (left - 48, (top + bottom) / 2), ylabel, 13, "rm")
    for _, ps, color in series:
        xy = [at(x, y) for x, y in ps]
        if len(xy) > 1:
            draw.line(xy, fill=color, width=2)
        for px, py in xy:
            draw.ellipse([px - 3, py - 3, px + 3, py + 3], fill=color)
    text_x = right - 8 - max(_font(12).getlength(name) for name, _, _ in series)
    for i, (name, _, color) in enumerate(series):  # legend, away from where curves usually go
        y = top + 12 + 18 * i if legend_at_top else bottom - 12 - 18 * (len(series) - 1 - i)
        draw.line([(text_x - 28, y), (text_x - 6, y)], fill=color, width=2)
        _text(draw, (text_x, y), name, 12, "lm")


def _finite(history: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(epoch, value) for the epochs where ``key`` is a finite number (gaps left out)."""
    out = []
    for h in history:
        v = h.get(key)
        if isinstance(v, int | float) and math.isfinite(v):
            out.append((float(h["epoch"]), float(v)))
    return out


def curves_image(history: list[dict[str, Any]]) -> Image.Image:
    im = Image.new("RGB", (1000, 400), "white")
    draw = ImageDraw.Draw(im)
    for box, metric, title, ylim in (
        ((110, 40, 480, 340), "loss", "Loss", None),
        ((610, 40, 980, 340), "acc", "Accuracy", (0.0, 1.0)),
    ):
        series = [
            ("train", _finite(history, f"train/{metric}"), TRAIN),
            ("val", _finite(history, f"val/{metric}"), VAL),
        ]
        ylabel = "loss" if metric == "loss" else "accuracy"  # loss falls, accuracy rises
        _panel(draw, box, series, title, ylabel, ylim, legend_at_top=metric == "loss")
    return im


def plot_curves(history: list[dict[str, Any]], out: Path) -> None:
    _save(curves_image(history), out)


# matplotlib's tab10: one colour per run in a comparison
_RUN_COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
                (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))  # fmt: skip


def plot_runs_curves(runs: list[tuple[str, list[dict[str, Any]]]], out: Path) -> None:
    """Several runs' validation loss and accuracy in one PNG (``zoo runs compare --plot``):
    ``runs`` is (name, epoch rows) each, one colour a run."""
    im = Image.new("RGB", (1000, 400), "white")
    draw = ImageDraw.Draw(im)
    for box, metric, title, ylim in (
        ((110, 40, 480, 340), "loss", "Validation loss", None),
        ((610, 40, 980, 340), "acc", "Validation accuracy", (0.0, 1.0)),
    ):
        series = [
            (name, _finite(history, f"val/{metric}"), _RUN_COLOURS[i % len(_RUN_COLOURS)])
            for i, (name, history) in enumerate(runs)
        ]
        ylabel = "loss" if metric == "loss" else "accuracy"
        _panel(draw, box, series, title, ylabel, ylim, legend_at_top=metric == "loss")
    _save(im, out)


def plot_lr_curve(lrs: list[float], loss: list[float], suggested: float, out: Path) -> None:
    """``zoo lr-find``'s curve: loss against the learning rate (log scale), the suggestion
    marked."""
    im = Image.new("RGB", (700, 420), "white")
    curve = [(math.log10(lr), v) for lr, v in zip(lrs, loss, strict=True) if math.isfinite(v)]
    at = min(range(len(lrs)), key=lambda i: abs(math.log(lrs[i] / suggested)))
    series = [
        ("loss (averaged, smoothed)", curve, TRAIN),
        (f"suggested {suggested:.2g}", [(math.log10(lrs[at]), loss[at])], (214, 39, 40)),
    ]
    _panel(ImageDraw.Draw(im), (90, 40, 680, 350), series, "LR range test", "loss",
           xlabel="learning rate", xtick=lambda t: f"1e{int(t)}")  # fmt: skip
    _save(im, out)


_STOPS = np.array([[int(c[k : k + 2], 16) for k in (1, 3, 5)] for c in _BLUES], np.float64)


def blues_array(t: np.ndarray) -> np.ndarray:
    """The Blues map of every value of ``t`` (clipped to [0, 1]): uint8 RGB, one more axis."""
    s = np.clip(np.asarray(t, np.float64), 0.0, 1.0) * (len(_BLUES) - 1)
    i = np.minimum(s.astype(int), len(_BLUES) - 2)
    f = (s - i)[..., None]
    return np.round(_STOPS[i] + (_STOPS[i + 1] - _STOPS[i]) * f).astype(np.uint8)


def blues(t: float) -> tuple[int, int, int]:
    """Colour of ``t`` in [0, 1] on the Blues map (0: near white, 1: dark blue)."""
    r, g, b = blues_array(np.array(t)).tolist()
    return r, g, b


def _short(name: str, n: int = 18) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def confusion_layout(n: int) -> tuple[float, int, int]:
    """``(cell, left, top)``: cell size in pixels (below 1 for more than 900 classes: the
    grid stays 900 px wide) and the grid's top-left corner."""
    cell = min(56, 900 // max(1, n)) or 900 / n
    label_room = 150 if cell >= 10 else 40
    return cell, label_room + 20, 50


def confusion_image(cm: list[list[int]], classes: list[str]) -> Image.Image:
    """Rows are the true class, columns the predicted one; darker is more images."""
    n = len(classes)
    cell, left, top = confusion_layout(n)
    size = round(n * cell)
    label_room = left - 20
    im = Image.new("RGB", (left + size + 110, top + size + label_room + 30), "white")
    draw = ImageDraw.Draw(im)
    counts = np.asarray(cm, np.float64).reshape(n, n)
    peak = float(counts.max(initial=0)) or 1.0
    grid = Image.fromarray(blues_array(counts / peak))  # one pixel a cell, then scaled
    im.paste(grid.resize((size, size), Image.Resampling.NEAREST), (left, top))
    if n <= 30:
        font_size = max(7, min(13, int(cell * 0.4)))
        for i in range(n):
            for j in range(n):
                v = cm[i][j]
                ink = (255, 255, 255) if v > peak / 2 else (0, 0, 0)
                xy = (left + (j + 0.5) * cell, top + (i + 0.5) * cell)
                _text(draw, xy, str(v), font_size, "mm", ink)
    draw.rectangle([left - 1, top - 1, left + size, top + size], outline=_INK)
    _text(draw, (left + size / 2, top - 28), "Confusion matrix (validation)", 15, "ms")
    if cell >= 10:
        ticks = int(max(8, min(12, cell - 2)))
        for k, name in enumerate(classes):
            c = top + k * cell + cell / 2
            _text(draw, (left - 6, c), _short(name), ticks, "rm")
            label = Image.new("RGB", (label_room, int(cell)), "white")  # x labels bottom-up
            _text(
                ImageDraw.Draw(label),
                (label_room - 2, cell / 2),
                _short(name),
                ticks,
                "rm",
            )
            im.paste(label.rotate(90, expand=True), (int(left + k * cell), top + size + 4))
    _text(draw, (left + size / 2, im.height - 8), "predicted", 13, "ms")
    _text(draw, (12, top + size / 2), "true", 13, "lm")
    bar_x, bar_h = left + size + 24, size  # colour bar: 0 at the bottom, the peak at the top
    shades = blues_array(1 - np.arange(bar_h) / max(1, bar_h - 1))
    im.paste(Image.fromarray(np.repeat(shades[:, None], 15, axis=1)), (bar_x, top))
    draw.rectangle([bar_x, top, bar_x + 14, top + bar_h], outline=_INK)
    _text(draw, (bar_x + 20, top), f"{peak:g}", 12, "lm")
    _text(draw, (bar_x + 20, top + bar_h), "0", 12, "lm")
    return im


def plot_confusion(cm: list[list[int]], classes: list[str], out: Path) -> None:
    _save(confusion_image(cm, classes), out)
