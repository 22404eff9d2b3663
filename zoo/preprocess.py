"""Eval preprocessing in numpy + PIL only (no torch), built from the same
:class:`~zoo.preprocessing.Preprocessing` as zoo's torchvision transform: convert mode →
resize short side (PIL, same filter) → center crop → /255 → normalise → CHW.

The scaling and normalisation are one table lookup per pixel: a pixel is one of 256 values per
channel, so each output value is computed once, by the same float32 expression as
``(x / 255 - mean) / std`` (bit-identical), 5× faster than the arithmetic on every pixel."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image

from zoo.calibration import Calibration
from zoo.errors import InputError
from zoo.images import to_channels
from zoo.preprocessing import Preprocessing


def pil_filter(name: str) -> Image.Resampling:
    """PIL's filter for a name in :data:`zoo.preprocessing.INTERPOLATIONS`."""
    return Image.Resampling[name.upper()]


@lru_cache(maxsize=16)
def _lookup(mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """(C, 256) float32: ``(v / 255 - mean[c]) / std[c]`` for every uint8 value ``v``."""
    v = np.arange(256, dtype=np.float32) / np.float32(255.0)
    m, s = np.asarray(mean, np.float32)[:, None], np.asarray(std, np.float32)[:, None]
    table: np.ndarray = (v[None, :] - m) / s
    table.flags.writeable = False
    return table


MAX_ASPECT = 100
"""The longest side an image may have, in multiples of its shortest: resizing the short side to
the model's size scales the long one alike, so a 1 × 20,000 strip would become gigabytes."""


def check_aspect(w: int, h: int) -> None:
    """Refuse an image too thin to resize (:data:`MAX_ASPECT`).

    Raises:
        InputError: naming the size and the limit.
    """
    if max(w, h) > MAX_ASPECT * max(1, min(w, h)):
        raise InputError(
            f"The image is {w}x{h} pixels: its long side is more than {MAX_ASPECT} times its "
            "short side, too thin to resize to the model's input. Crop it first."
        )


def resized(im: Image.Image, pre: Preprocessing) -> Image.Image:
    """``im`` in the model's channels, its short side resized to ``pre.resize_size`` (PIL, the
    model's filter), as torchvision's ``Resize(int)``: the long side is truncated.

    Raises:
        InputError: an image too thin to resize (:func:`check_aspect`), or in a pixel mode
            that cannot be converted to the model's channels (:func:`~zoo.images.to_channels`).
    """
    resize = pre.resize_size
    im = to_channels(im, pre.channels)
    w, h = im.size
    check_aspect(w, h)
    if w <= h:
        nw, nh = resize, int(resize * h / w)
    else:
        nw, nh = int(resize * w / h), resize
    return im.resize((nw, nh), pil_filter(pre.interpolation)) if (nw, nh) != (w, h) else im


def center_box(w: int, h: int, size: int) -> tuple[int, int, int, int]:
    """torchvision ``CenterCrop``'s box (round half to even, as Python's ``round()``)."""
    left = round((w - size) / 2.0)
    top = round((h - size) / 2.0)
    return left, top, left + size, top + size


def normalised(im: Image.Image, pre: Preprocessing, out: np.ndarray | None = None) -> np.ndarray:
    """``(C, H, W)`` float32 of an already cropped image: ``(x / 255 - mean) / std``.

    Raises:
        ValueError: ``out`` is not a C-contiguous float32 array of the right shape.
    """
    pixels = np.asarray(im)
    chw = pixels[None] if pixels.ndim == 2 else np.ascontiguousarray(pixels.transpose(2, 0, 1))
    if out is None:
        out = np.empty(chw.shape, np.float32)
    elif out.shape != chw.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous float32 array of shape {chw.shape}, got "
            f"{out.dtype} {out.shape}"
        )
    table = _lookup(tuple(pre.mean), tuple(pre.std))
    for c in range(len(chw)):  # uint8 indices cannot leave the table: "clip" skips a buffer
        np.take(table[c], chw[c], out=out[c], mode="clip")
    return out


def preprocess(im: Image.Image, pre: Preprocessing, out: np.ndarray | None = None) -> np.ndarray:
    """(C, H, W) float32 array for one image, as the model's eval transform makes it.

    Args:
        im: a decoded image, any mode (converted to ``pre.channels``).
        pre: the model's preprocessing.
        out: a C-contiguous float32 (C, H, W) array to write into (e.g. a row of a batch);
            ValueError if it is not one.

    Returns:
        The normalised, center-cropped array (``out`` when given), C-contiguous.
    """
    im = resized(im, pre)
    return normalised(im.crop(center_box(*im.size, pre.crop_size)), pre, out)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def scores(
    logits: np.ndarray, multi_label: bool = False, calibration: Calibration | None = None
) -> np.ndarray:
    """Class scores from raw logits: softmax (at the model's fitted temperature, when it has
    one: :mod:`zoo.calibration`), or an independent sigmoid per class (multi-label)."""
    x = logits.astype(np.float64)
    if multi_label:
        return 1.0 / (1.0 + np.exp(-x))
    return calibration.probabilities(x) if calibration is not None else softmax(x)
