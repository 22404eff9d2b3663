"""Eval preprocessing in numpy + PIL only (no torch), matching zoo's torchvision transform:
convert mode → resize short side (PIL, same filter) → center crop → /255 → normalise → CHW."""

from __future__ import annotations

from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from zoo.errors import InputError, PayloadTooLargeError

_FILTERS = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
}
MAX_PIXELS = 40_000_000  # decompression-bomb guard for untrusted uploads


def open_image(src: str | Path | bytes, *, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """Open and fully decode an image from a path or bytes, with a clear error."""
    try:
        im = Image.open(BytesIO(src) if isinstance(src, bytes) else src)
        if im.width * im.height > max_pixels:
            raise PayloadTooLargeError(
                f"Image is {im.width}×{im.height} pixels, over the limit of {max_pixels:,}."
            )
        im.load()
        return im
    except InputError:
        raise
    except Image.DecompressionBombError as exc:
        raise PayloadTooLargeError(f"Image rejected as a decompression bomb: {exc}") from exc
    except FileNotFoundError as exc:
        raise InputError(f"Image file {src!s} does not exist.") from exc
    except Exception as exc:  # PIL raises many types for undecodable data
        where = "the uploaded data" if isinstance(src, bytes) else str(src)
        raise InputError(
            f"Cannot decode {where} as an image ({type(exc).__name__}: {exc})."
        ) from exc


def preprocess(im: Image.Image, pre: dict[str, Any]) -> np.ndarray:
    """(C, H, W) float32 array for one image, as the model's eval transform makes it."""
    channels, size = pre["input_size"][0], pre["input_size"][-1]
    mode = "L" if channels == 1 else "RGB"
    if im.mode in ("I;16", "I"):
        im = im.point(lambda v: v / 256).convert("L")
    if im.mode != mode:
        im = im.convert(mode)
    resize = int(pre["resize_size"])
    w, h = im.size
    # torchvision Resize(int): the short side becomes `resize`, the long side is truncated
    if w <= h:
        nw, nh = resize, int(resize * h / w)
    else:
        nw, nh = int(resize * w / h), resize
    if (nw, nh) != (w, h):
        im = im.resize(
            (nw, nh), _FILTERS.get(pre.get("interpolation", "bilinear"), Image.Resampling.BILINEAR)
        )
    left = round((nw - size) / 2.0)
    top = round((nh - size) / 2.0)
    im = im.crop((left, top, left + size, top + size))
    arr: np.ndarray = np.asarray(im, dtype=np.float32) / np.float32(255.0)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    mean, std = np.asarray(pre["mean"], np.float32), np.asarray(pre["std"], np.float32)
    return np.ascontiguousarray(((arr - mean) / std).transpose(2, 0, 1), dtype=np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def scores(logits: np.ndarray, multi_label: bool = False) -> np.ndarray:
    """Class scores from raw logits: softmax, or an independent sigmoid per class (multi-label)."""
    x = logits.astype(np.float64)
    return 1.0 / (1.0 + np.exp(-x)) if multi_label else softmax(x)
