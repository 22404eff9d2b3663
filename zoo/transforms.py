"""torchvision transforms derived from a model's metadata (train: online augmentation;
eval: resize + center crop with the model's crop pct, mean/std)."""

from __future__ import annotations

from PIL import Image
from torchvision import transforms as T

from zoo.images import to_channels
from zoo.metadata import ModelInfo

_INTERP = {
    "bilinear": T.InterpolationMode.BILINEAR,
    "bicubic": T.InterpolationMode.BICUBIC,
    "nearest": T.InterpolationMode.NEAREST,
}


class ConvertMode:
    """Grayscale, palette, CMYK and 16-bit images all become the model's channel count
    (:func:`zoo.images.to_channels`)."""

    def __init__(self, channels: int) -> None:
        self.channels = channels

    def __call__(self, im: Image.Image) -> Image.Image:
        return to_channels(im, self.channels)

    def __repr__(self) -> str:
        return f"ConvertMode(channels={self.channels})"


def _to_mode(info: ModelInfo) -> ConvertMode:
    return ConvertMode(info.input_size[0])


def eval_transform(info: ModelInfo) -> T.Compose:
    size = info.input_size[-1]
    interp = _INTERP.get(info.interpolation, T.InterpolationMode.BILINEAR)
    return T.Compose(
        [
            _to_mode(info),
            T.Resize(info.resize_size, interpolation=interp),
            T.CenterCrop(size),
            T.ToTensor(),
            T.Normalize(info.mean, info.std),
        ]
    )


def train_transform(info: ModelInfo, *, augment: bool = True) -> T.Compose:
    if not augment:
        return eval_transform(info)
    size = info.input_size[-1]
    interp = _INTERP.get(info.interpolation, T.InterpolationMode.BILINEAR)
    steps = [
        _to_mode(info),
        T.RandomResizedCrop(size, scale=(0.5, 1.0), interpolation=interp),
        T.RandomHorizontalFlip(),
    ]
    if info.input_size[0] == 3:
        steps.append(T.ColorJitter(0.2, 0.2, 0.2))
    return T.Compose([*steps, T.ToTensor(), T.Normalize(info.mean, info.std)])
