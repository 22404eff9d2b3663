"""torchvision transforms derived from a model's metadata (train: online augmentation;
eval: resize + center crop with the model's crop pct, mean/std)."""

from __future__ import annotations

from PIL import Image
from torchvision import transforms as T

from zoo.metadata import ModelInfo

_INTERP = {
    "bilinear": T.InterpolationMode.BILINEAR,
    "bicubic": T.InterpolationMode.BICUBIC,
    "nearest": T.InterpolationMode.NEAREST,
}


class ConvertMode:
    """Grayscale, palette, CMYK and 16-bit images all become the model's channel count."""

    def __init__(self, channels: int) -> None:
        self.mode = "L" if channels == 1 else "RGB"

    def __call__(self, im: Image.Image) -> Image.Image:
        if im.mode == "I;16" or im.mode == "I":  # 16-bit: scale to 8 bits, don't clip
            im = im.point(lambda v: v / 256).convert("L")
        return im.convert(self.mode) if im.mode != self.mode else im

    def __repr__(self) -> str:
        return f"ConvertMode({self.mode!r})"


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
