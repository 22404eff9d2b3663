"""Test-time augmentation: several views of each image, their scores averaged.

- ``flip``: the eval crop and its mirror image (2 views);
- ``five-crop``: the eval (center) crop and the four corner crops of the same resized image;
- ``ten-crop``: those five and their mirror images.

The first view is always the plain eval crop (bit-identical to ``preprocess``), so one pass
measures the gain: view 0 alone is the model without TTA. Scores are averaged as
probabilities (softmax, or one sigmoid per class), the usual TTA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, get_args

from zoo.errors import InputError

if TYPE_CHECKING:  # the CLI reads the modes at start-up: numpy and PIL load with the views
    import numpy as np
    from PIL import Image

    from zoo.preprocessing import Preprocessing

Tta = Literal["none", "flip", "five-crop", "ten-crop"]
"""Test-time augmentation of ``zoo eval`` and ``zoo predict``."""
TTAS: tuple[str, ...] = get_args(Tta)
VIEWS = {"none": 1, "flip": 2, "five-crop": 5, "ten-crop": 10}


def check_tta(mode: str) -> str:
    """``mode`` if it is a TTA mode, else InputError naming the choices."""
    if mode not in TTAS:
        raise InputError(f"Unknown test-time augmentation {mode!r}: use {', '.join(TTAS)}.")
    return mode


def check_views(pre: Preprocessing, mode: str) -> str:
    """``mode`` if it suits a model with preprocessing ``pre``.

    Raises:
        InputError: an unknown mode, or crops for a model that resizes to its crop size (the
            crops would all be the same image).
    """
    check_tta(mode)
    if mode in ("five-crop", "ten-crop") and pre.resize_size <= pre.crop_size:
        raise InputError(
            f"--tta {mode} takes crops of a larger resized image, but this model resizes to "
            f"its crop size ({pre.crop_size} px, crop_pct {pre.crop_pct}): the crops would be "
            "the same image. Use --tta flip."
        )
    return mode


def views(im: Image.Image, pre: Preprocessing, mode: str) -> np.ndarray:
    """``(V, C, H, W)`` float32: the views of one image, the plain eval crop first."""
    import numpy as np

    from zoo.preprocess import center_box, normalised, resized

    check_views(pre, mode)
    big = resized(im, pre)
    w, h, size = *big.size, pre.crop_size
    boxes = [center_box(w, h, size)]
    if mode in ("five-crop", "ten-crop"):
        boxes += [(0, 0, size, size), (w - size, 0, w, size)]
        boxes += [(0, h - size, size, h), (w - size, h - size, w, h)]
    crops = np.stack([normalised(big.crop(b), pre) for b in boxes])
    if mode in ("flip", "ten-crop"):
        crops = np.concatenate([crops, crops[..., ::-1]])
    return np.ascontiguousarray(crops)


def average(scores: np.ndarray) -> np.ndarray:
    """``(N, V, K)`` per-view probabilities → ``(N, K)``, their mean."""
    return scores.mean(axis=1)


__all__ = ["VIEWS", "average", "check_tta", "check_views", "views"]
