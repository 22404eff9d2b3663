"""Bundled real images (from scikit-image's public-domain data set) and a built-in real
image-folder data set (scikit-learn's 1,797 handwritten digits)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from zoo import durable
from zoo.errors import InputError
from zoo.system import available_cpus

if TYPE_CHECKING:
    import numpy as np
    from PIL.Image import Image

SAMPLE_IMAGES = {"chelsea": "chelsea.jpg", "coffee": "coffee.jpg"}
Example = Literal["digits", "photos"]
"""Built-in data sets ``zoo example`` writes."""


def sample_image_paths() -> list[Path]:
    """Paths of the bundled sample images: a tabby cat (chelsea) and a cup of coffee."""
    root = Path(__file__).parent / "sample_images"  # package data, installed beside this file
    return [root / f for f in SAMPLE_IMAGES.values()]


def _example_folder(out: str | Path) -> Path:
    """``out`` as a folder to write an example into.

    Raises:
        InputError: ``out``, or the nearest of its parents that exists, is not a folder.
    """
    out = Path(out)
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise InputError(
            f"Cannot write the example into {out}: {existing} is a file, not a folder. Give a "
            "folder that does not exist yet (or one an earlier zoo example wrote)."
        )
    return out


def _in_threads(write: Callable[[Any], None], jobs: list[Any], workers: int) -> None:
    """``write`` each job from ``workers`` threads (an example's files; each written whole by
    :func:`_write_image`); the first failure is raised."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(write, jobs))


def _write_image(path: Path, im: Image, fmt: str, **params: Any) -> None:
    """Encode ``im`` and write it atomically (:mod:`zoo.durable`, not fsynced: sample data a
    rerun makes again): a killed run leaves no truncated file for the next one to keep."""
    buf = BytesIO()
    im.save(buf, fmt, **params)
    durable.write_bytes(path, buf.getvalue(), label=None, sync=False)


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``load_digits`` returns them (images ``(1797, 8, 8)`` of 0–16,
    integer targets), read from the file it reads. Found without importing ``sklearn``: that
    import was 2.5 s of a 4 s ``zoo example digits`` (the main job's first step);
    ``load_digits`` itself where the file is not where it has been since scikit-learn 0.x.

    Raises:
        InputError: scikit-learn is not installed.
    """
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    if spec is None:  # pragma: no cover - sklearn is a declared dependency
        raise InputError("The digits example needs scikit-learn: pip install scikit-learn")
    for root in spec.submodule_search_locations or ():
        csv = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            data = np.loadtxt(csv, delimiter=",")
            return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images, digits.target


def write_digits_folder(out: str | Path, *, size: int = 32, per_class: int | None = None) -> Path:
    """Write sklearn's digits as ``out/<digit>/<i>.png`` (a flat image folder).

    The 8×8 4-bit images are scaled to ``size``×``size`` grayscale PNGs; existing files
    are left alone, so calling twice is cheap.

    Raises:
        InputError: ``out`` is a file.
    """
    import numpy as np
    from PIL import Image

    out = _example_folder(out)
    images, targets = digits_arrays()
    counts: dict[int, int] = {}
    todo: list[tuple[Path, np.ndarray]] = []
    for img, label in zip(images, targets, strict=True):
        label = int(label)
        i = counts.get(label, 0)
        if per_class is not None and i >= per_class:
            continue
        counts[label] = i + 1
        path = out / f"digit_{label}" / f"{i:04d}.png"
        if not path.exists():
            todo.append((path, img))

    def write(job: tuple[Path, np.ndarray]) -> None:
        arr = (job[1] / 16.0 * 255).astype(np.uint8)
        im = Image.fromarray(arr, mode="L").resize((size, size), Image.Resampling.BICUBIC)
        _write_image(job[0], im, "PNG")

    # PNG's zlib and the file system calls leave the GIL: 3.1 → 2.3 s on 2 cores
    _in_threads(write, todo, max(2, available_cpus()))
    return out


# scikit-image's colour photographs (public domain / CC0, shipped inside the package): one
# class per source photo.
PHOTO_SOURCES = (
    "astronaut",
    "chelsea",
    "coffee",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "rocket",
)


def write_photo_folder(
    out: str | Path, *, per_class: int = 300, seed: int = 0, workers: int | None = None
) -> Path:
    """Write ``out/<photo>/<i>.jpg``: real photographs at realistic sizes for benchmarks.

    Each file is a seeded random crop (25–100% of the area, aspect 3/4–4/3) of one of
    scikit-image's colour photographs, randomly flipped, resized so its long side is
    300–640 px and saved as JPEG (quality 85–95). Seven classes (one per source photo);
    ``per_class=300`` gives 2,100 files (≈ 90 MB). The same seed gives the same files on every
    machine; existing files are left alone, so calling twice is cheap.

    Raises:
        InputError: scikit-image is not installed (``pip install 'zoo[examples]'``); ``out``
            is a file.
    """
    try:
        import skimage.data
    except ImportError as exc:
        raise InputError(
            "The photos example needs scikit-image: pip install 'zoo[examples]'"
        ) from exc
    import numpy as np
    from PIL import Image

    out = _example_folder(out)

    def write_class(cls_index: int, name: str) -> None:
        todo = [i for i in range(per_class) if not (out / name / f"{i:04d}.jpg").exists()]
        if not todo:
            return
        src = Image.fromarray(getattr(skimage.data, name)()).convert("RGB")
        for i in todo:
            path = out / name / f"{i:04d}.jpg"
            rng = np.random.default_rng([seed, cls_index, i])
            w, h = src.size
            area = w * h * rng.uniform(0.25, 1.0)
            aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
            cw = int(min(w, round((area * aspect) ** 0.5)))
            ch = int(min(h, round((area / aspect) ** 0.5)))
            x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            im = src.crop((x0, y0, x0 + cw, y0 + ch))
            if rng.random() < 0.5:
                im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            long_side = int(rng.integers(300, 641))
            scale = long_side / max(cw, ch)
            im = im.resize(
                (max(1, round(cw * scale)), max(1, round(ch * scale))), Image.Resampling.BICUBIC
            )
            _write_image(path, im, "JPEG", quality=int(rng.integers(85, 96)))

    _in_threads(
        lambda a: write_class(*a), list(enumerate(PHOTO_SOURCES)), workers or available_cpus()
    )
    return out
