"""Eval preprocessing in numpy + PIL only (no torch), built from the same
:class:`~zoo.preprocessing.Preprocessing` as zoo's torchvision transform: convert mode →
resize short side (PIL, same filter) → center crop → /255 → normalise → CHW."""

from __future__ import annotations

import numpy as np
from PIL import Image

from zoo.images import to_channels
from zoo.preprocessing import Preprocessing


def pil_filter(name: str) -> Image.Resampling:
    """PIL's filter for a name in :data:`zoo.preprocessing.INTERPOLATIONS`."""
    return Image.Resampling[name.upper()]


def preprocess(im: Image.Image, pre: Preprocessing) -> np.ndarray:
    """(C, H, W) float32 array for one image, as the model's eval transform makes it.

    Args:
        im: a decoded image, any mode (converted to ``pre.channels``).
        pre: the model's preprocessing.

    Returns:
        The normalised, center-cropped array, C-contiguous.
    """
    size, resize = pre.crop_size, pre.resize_size
    im = to_channels(im, pre.channels)
    w, h = im.size
    # torchvision Resize(int): the short side becomes `resize`, the long side is truncated
    if w <= h:
        nw, nh = resize, int(resize * h / w)
    else:
        nw, nh = int(resize * w / h), resize
    if (nw, nh) != (w, h):
        im = im.resize((nw, nh), pil_filter(pre.interpolation))
    # torchvision CenterCrop: round half to even, as Python's round()
    left = round((nw - size) / 2.0)
    top = round((nh - size) / 2.0)
    im = im.crop((left, top, left + size, top + size))
    arr: np.ndarray = np.asarray(im, dtype=np.float32) / np.float32(255.0)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    mean, std = np.asarray(pre.mean, np.float32), np.asarray(pre.std, np.float32)
    return np.ascontiguousarray(((arr - mean) / std).transpose(2, 0, 1), dtype=np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def scores(logits: np.ndarray, multi_label: bool = False) -> np.ndarray:
    """Class scores from raw logits: softmax, or an independent sigmoid per class (multi-label)."""
    x = logits.astype(np.float64)
    return 1.0 / (1.0 + np.exp(-x)) if multi_label else softmax(x)
