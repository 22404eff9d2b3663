"""A model's eval preprocessing as one typed value, and the one table of interpolation names.

The eval pipeline is: convert the image to ``channels`` → resize its short side to
``resize_size`` (``interpolation``) → center-crop ``crop_size`` → scale to [0, 1] → subtract
``mean``, divide by ``std`` → CHW. Two implementations are built from this value: torchvision
transforms for training and evaluation (:mod:`zoo.transforms`) and numpy + PIL for exported
models (:mod:`zoo.preprocess`); ``tests/test_preprocessing.py`` holds them together.

``resize_size`` is derived from ``crop_pct`` (timm's convention: 224 px at 0.875 → 256); it is
still written into files for readers without zoo, and checked when read back. Nothing here
imports torch, PIL or numpy.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, replace
from typing import Any

from zoo.errors import ArtifactError

INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")
"""Resize filters by name. PIL's ``Image.Resampling[name.upper()]`` and torchvision's
``InterpolationMode(name)`` are the same filter on PIL images (torchvision calls PIL)."""

_REQUIRED = ("input_size", "crop_pct", "interpolation", "mean", "std")
_DERIVED = ("resize_size",)  # written for other readers; checked, never trusted, when read


def resize_for(crop_size: int, crop_pct: float) -> int:
    """Short-side resize before a center crop of ``crop_size`` (224 at 0.875 → 256)."""
    return int(crop_size / crop_pct)


@dataclass(frozen=True)
class Preprocessing:
    """The eval preprocessing of a model.

    Args:
        input_size: the model's input ``(channels, height, width)``; the crop is square,
            ``width`` pixels.
        crop_pct: share of the resized short side that the center crop keeps (0 < p ≤ 1).
        interpolation: a name in :data:`INTERPOLATIONS`.
        mean: per-channel mean subtracted after scaling to [0, 1].
        std: per-channel standard deviation divided by.

    Raises:
        ValueError: the values do not describe a usable pipeline (the message names the field).
    """

    input_size: tuple[int, int, int]
    crop_pct: float
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        size = tuple(self.input_size)
        if len(size) != 3 or not all(isinstance(v, int) and v > 0 for v in size):
            raise ValueError(
                f"preprocessing input_size must be (channels, height, width) of positive "
                f"integers, got {list(self.input_size)!r}."
            )
        if not (isinstance(self.crop_pct, int | float) and 0 < self.crop_pct <= 1):
            raise ValueError(f"preprocessing crop_pct must be in (0, 1], got {self.crop_pct!r}.")
        if self.interpolation not in INTERPOLATIONS:
            close = difflib.get_close_matches(str(self.interpolation), INTERPOLATIONS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"preprocessing interpolation {self.interpolation!r} is not one of "
                f"{', '.join(INTERPOLATIONS)}.{hint}"
            )
        for key in ("mean", "std"):
            values = tuple(getattr(self, key))
            if len(values) != size[0] or not all(math.isfinite(v) for v in values):
                raise ValueError(
                    f"preprocessing {key} needs {size[0]} finite values (one per channel), "
                    f"got {list(values)!r}."
                )
        if any(v <= 0 for v in self.std):
            raise ValueError(f"preprocessing std must be positive, got {list(self.std)!r}.")
        # Normalise list inputs so that equal values compare and hash equal.
        object.__setattr__(self, "input_size", size)
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        object.__setattr__(self, "crop_pct", float(self.crop_pct))

    @property
    def channels(self) -> int:
        return self.input_size[0]

    @property
    def crop_size(self) -> int:
        """Side of the square center crop (the model's input width)."""
        return self.input_size[-1]

    @property
    def resize_size(self) -> int:
        """Short side after the resize, before the crop."""
        return resize_for(self.crop_size, self.crop_pct)

    def at_size(self, side: int) -> Preprocessing:
        """The same pipeline with a ``side × side`` crop (the resize keeps ``crop_pct``)."""
        return replace(self, input_size=(self.channels, side, side))

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``config.json`` and ONNX metadata (the keys of schema 1)."""
        return {
            "input_size": list(self.input_size),
            "resize_size": self.resize_size,
            "crop_pct": self.crop_pct,
            "interpolation": self.interpolation,
            "mean": list(self.mean),
            "std": list(self.std),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str = "preprocessing") -> Preprocessing:
        """Read what :meth:`to_dict` wrote, strictly.

        Args:
            d: the stored mapping.
            where: what to call the mapping in messages (e.g. the file it came from).

        Returns:
            The value.

        Raises:
            ArtifactError: a key is missing or unknown, a value is invalid, or the stored
                ``resize_size`` disagrees with ``input_size`` and ``crop_pct``.
        """
        if not isinstance(d, dict):
            raise ArtifactError(f"{where} must be a JSON object, got {type(d).__name__}.")
        unknown = sorted(set(d) - {*_REQUIRED, *_DERIVED})
        if unknown:
            raise ArtifactError(
                f"{where} has an unknown key {unknown[0]!r}; known keys: "
                f"{', '.join((*_REQUIRED, *_DERIVED))}. Was it written by a newer zoo?"
            )
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise ArtifactError(f"{where} lacks the required key {missing[0]!r}.")
        try:
            pre = cls(
                input_size=tuple(d["input_size"]),
                crop_pct=d["crop_pct"],
                interpolation=d["interpolation"],
                mean=tuple(d["mean"]),
                std=tuple(d["std"]),
            )
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: {exc}") from exc
        if "resize_size" in d and d["resize_size"] != pre.resize_size:
            raise ArtifactError(
                f"{where} says resize_size={d['resize_size']!r}, but input_size "
                f"{list(pre.input_size)} at crop_pct {pre.crop_pct} gives {pre.resize_size}. "
                "Fix one of them (zoo derives resize_size from crop_pct)."
            )
        return pre
