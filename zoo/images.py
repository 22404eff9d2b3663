"""Finding and opening images: the one place every part of zoo (train, check, eval, predict,
serve, export parity, quantize calibration) gets its pixels from.

``open_image`` decodes fully, applies the EXIF orientation (phones store portrait photos as
landscape pixels plus a tag), refuses decompression bombs before decoding, and can convert to
the model's channel count (``to_channels``: 16-bit scaled rather than clipped, palette and
transparency flattened, CMYK converted).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from io import BytesIO
from pathlib import Path
from typing import IO, Any

from PIL import Image, ImageOps, UnidentifiedImageError

from zoo.errors import InputError, PayloadTooLargeError

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
# Pixels a local file may have before it is refused (PIL's own error threshold); uploads to
# the server get a lower, configurable limit (``zoo serve --max-image-pixels``).
MAX_PIXELS = 2 * 89_478_485
# What ``open_image``/``to_channels`` make of a file's bytes, versioned: every cache of decoded
# pixels or of what a model computed from them (image cache, feature cache, teacher logits,
# ``zoo check``'s results) keys on it, so a change here is never served from an old entry.
# 1: first; 2: RGBa/La, LAB and big-endian 16-bit modes convert instead of failing.
DECODE_VERSION = 2

ImageSource = str | Path | bytes | IO[bytes]


def natural_key(s: str) -> list[Any]:
    """``c2`` sorts before ``c10``."""
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", s)]


def is_image_file(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS


def list_images(folder: Path) -> list[Path]:
    """Image files under ``folder`` (recursive, hidden files skipped), in natural order."""
    return sorted(
        (
            p
            for p in folder.rglob("*")
            if p.is_file() and is_image_file(p) and not p.name.startswith(".")
        ),
        key=lambda p: natural_key(str(p.relative_to(folder))),
    )


def image_files(paths: Sequence[Path]) -> tuple[Path, ...]:
    """``paths`` with each folder replaced by the images directly in it (not its subfolders:
    a data root's class folders are not one class); files (and paths that do not exist, for
    the caller to name) kept as given."""
    return tuple(
        p
        for given in paths
        for p in (
            [q for q in list_images(given) if q.parent == given] if given.is_dir() else [given]
        )
    )


def open_image(
    src: ImageSource, *, max_pixels: int = MAX_PIXELS, channels: int | None = None
) -> Image.Image:
    """Open and fully decode an image, upright.

    Args:
        src: a path, the encoded bytes, or a binary file object.
        max_pixels: refuse images with more pixels than this, before decoding them.
        channels: 1 or 3 to convert to ``L`` or ``RGB`` (see :func:`to_channels`); ``None``
            keeps the file's own mode.

    Returns:
        The decoded image with its EXIF orientation applied.

    Raises:
        PayloadTooLargeError: the image has more than ``max_pixels`` pixels.
        InputError: the file does not exist, cannot be decoded as an image, or has a pixel
            mode that cannot be converted to ``channels``.
    """
    if isinstance(src, bytes):
        where, subject = "the uploaded data", "The uploaded image"
    else:
        where = str(src if isinstance(src, str | Path) else getattr(src, "name", "the file"))
        subject = f"Image {where}"
    try:
        with warnings.catch_warnings():
            # our own limit is checked below; PIL's warning would only duplicate it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(BytesIO(src) if isinstance(src, bytes) else src)
        if im.width * im.height > max_pixels:
            raise PayloadTooLargeError(
                f"{subject} is {im.width}×{im.height} pixels, over the limit of "
                f"{max_pixels:,}: downscale it first."
            )
        im.load()
        ImageOps.exif_transpose(im, in_place=True)
    except InputError:
        raise
    except Image.DecompressionBombError as exc:
        raise PayloadTooLargeError(
            f"{subject} declares more pixels than PIL decodes safely (a possible decompression "
            f"bomb), over the limit of {max_pixels:,}: downscale it first."
        ) from exc
    except FileNotFoundError as exc:
        raise InputError(f"Image file {where} does not exist.") from exc
    except UnidentifiedImageError as exc:  # its message names a BytesIO object's address
        raise InputError(
            f"Cannot decode {where} as an image: not a format PIL reads (JPEG, PNG, WebP, "
            "BMP, TIFF, GIF, ...)."
        ) from exc
    except Exception as exc:  # PIL raises many types for undecodable data
        raise InputError(
            f"Cannot decode {where} as an image ({type(exc).__name__}: {exc})."
        ) from exc
    return to_channels(im, channels, subject=subject) if channels else im


def to_channels(im: Image.Image, channels: int, *, subject: str | None = None) -> Image.Image:
    """``L`` for 1 channel, ``RGB`` for 3: 16/32-bit greyscale (either byte order) is scaled to
    8 bits (not clipped), transparency (premultiplied too) is flattened onto white, palette and
    CMYK are converted, CIELab goes through sRGB (PIL converts it to RGB only).

    Args:
        subject: the image as messages name it ("Image photo.tif"); default: its file name.

    Raises:
        InputError: PIL cannot convert the image's mode (CIELab without PIL's ImageCms).
    """
    mode = "L" if channels == 1 else "RGB"
    source, file = im.mode, getattr(im, "filename", "")
    try:
        if im.mode in ("I;16", "I;16B", "I;16L", "I;16N"):
            im = im.convert("I")  # point() refuses big-endian 16-bit
        if im.mode == "I":
            im = im.point(lambda v: v / 256).convert("L")
        elif im.mode == "F":
            im = im.convert("L")
        elif im.mode == "LAB":
            im = im.convert("RGB")
        elif im.mode in ("La", "RGBa"):
            im = im.convert({"La": "LA", "RGBa": "RGBA"}[im.mode])
        if im.mode == "P" and "transparency" in im.info:
            im = im.convert("RGBA")
        if im.mode in ("RGBA", "LA", "PA"):
            background = Image.new("RGBA", im.size, (255, 255, 255, 255))
            im = Image.alpha_composite(background, im.convert("RGBA"))
        return im.convert(mode) if im.mode != mode else im
    except (ValueError, ImportError) as exc:  # ImportError: PIL built without ImageCms
        name = subject or (f"Image {file}" if file else "The image")
        raise InputError(
            f"{name} has pixel mode {source!r}, which cannot be converted to {mode} here "
            f"({exc}). Convert it to an 8-bit RGB or greyscale PNG or JPEG and use that."
        ) from exc
