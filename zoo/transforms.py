"""torchvision transforms built from a model's :class:`~zoo.preprocessing.Preprocessing`
(train: online augmentation; eval: resize + center crop + normalise).

The eval transform is the reference the numpy implementation for exported models
(:mod:`zoo.preprocess`) is tested against, per interpolation, on real images.
"""

from __future__ import annotations

from collections.abc import Callable

from PIL import Image
from torchvision import transforms as T

from zoo.images import to_channels
from zoo.metadata import ModelInfo
from zoo.preprocessing import Preprocessing


class ConvertMode:
    """Grayscale, palette, CMYK and 16-bit images all become the model's channel count
    (:func:`zoo.images.to_channels`)."""

    def __init__(self, channels: int) -> None:
        self.channels = channels

    def __call__(self, im: Image.Image) -> Image.Image:
        return to_channels(im, self.channels)

    def __repr__(self) -> str:
        return f"ConvertMode(channels={self.channels})"


def _pre(source: Preprocessing | ModelInfo) -> Preprocessing:
    return source.preprocessing() if isinstance(source, ModelInfo) else source


def interpolation_mode(name: str) -> T.InterpolationMode:
    """torchvision's mode for a name in :data:`zoo.preprocessing.INTERPOLATIONS`."""
    return T.InterpolationMode(name)


def eval_transform(source: Preprocessing | ModelInfo) -> T.Compose:
    """PIL image → normalised ``(C, H, W)`` float tensor, as the model expects at eval.

    Args:
        source: the preprocessing, or a model's metadata (meaning its ``preprocessing()``).
    """
    pre = _pre(source)
    return T.Compose(
        [
            ConvertMode(pre.channels),
            T.Resize(pre.resize_size, interpolation=interpolation_mode(pre.interpolation)),
            T.CenterCrop(pre.crop_size),
            T.ToTensor(),
            T.Normalize(pre.mean, pre.std),
        ]
    )


def train_transform(
    source: Preprocessing | ModelInfo,
    *,
    augment: bool = True,
    policy: Callable[[Image.Image], Image.Image] | None = None,
) -> T.Compose:
    """The training transform: random resized crop, flip and (RGB) colour jitter, or the eval
    transform when ``augment`` is false.

    Args:
        source: the preprocessing, or a model's metadata (meaning its ``preprocessing()``).
        augment: online augmentation on or off.
        policy: a PIL auto-augment policy applied after the flip, instead of the jitter.
    """
    pre = _pre(source)
    if not augment:
        return eval_transform(pre)
    steps = [
        ConvertMode(pre.channels),
        T.RandomResizedCrop(
            pre.crop_size, scale=(0.5, 1.0), interpolation=interpolation_mode(pre.interpolation)
        ),
        T.RandomHorizontalFlip(),
    ]
    if policy is not None:
        steps.append(policy)
    elif pre.channels == 3:
        steps.append(T.ColorJitter(0.2, 0.2, 0.2))
    return T.Compose([*steps, T.ToTensor(), T.Normalize(pre.mean, pre.std)])
