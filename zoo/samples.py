"""Bundled real images (from scikit-image's public-domain data set) and a built-in real
image-folder data set (scikit-learn's 1,797 handwritten digits)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from zoo.errors import InputError

SAMPLE_IMAGES = {"chelsea": "chelsea.jpg", "coffee": "coffee.jpg"}


def sample_image_paths() -> list[Path]:
    """Paths of the bundled sample images: a tabby cat (chelsea) and a cup of coffee."""
    root = files("zoo") / "sample_images"
    return [Path(str(root / f)) for f in SAMPLE_IMAGES.values()]


def write_digits_folder(out: str | Path, *, size: int = 32, per_class: int | None = None) -> Path:
    """Write sklearn's digits as ``out/<digit>/<i>.png`` (a flat image folder).

    The 8×8 4-bit images are scaled to ``size``×``size`` grayscale PNGs; existing files
    are left alone, so calling twice is cheap.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - sklearn is a declared dependency
        raise InputError("The digits example needs scikit-learn: pip install scikit-learn") from exc
    import numpy as np
    from PIL import Image

    out = Path(out)
    digits = load_digits()
    counts: dict[int, int] = {}
    for img, label in zip(digits.images, digits.target, strict=True):
        label = int(label)
        i = counts.get(label, 0)
        if per_class is not None and i >= per_class:
            continue
        counts[label] = i + 1
        path = out / f"digit_{label}" / f"{i:04d}.png"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        arr = (img / 16.0 * 255).astype(np.uint8)
        Image.fromarray(arr, mode="L").resize((size, size), Image.Resampling.BICUBIC).save(path)
    return out
