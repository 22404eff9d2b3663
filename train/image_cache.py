"""Decode-once image cache: each image is decoded a single time (EXIF applied, converted to the
model's channels), resized to the model's eval short side (``resize_size``: 256 for a 224 crop,
≈ 1.14×, aspect kept) and stored as uint8 ``H×W×C`` in a ``.npy`` file that later epochs and
runs read from the page cache, instead of decoding the JPEG again.

Entries are keyed by the file's absolute path, size and mtime, the storage spec and the
decoder's version, so an edited file is re-decoded and nothing else is. The store lives under ``$ZOO_CACHE/images``
(default ``~/.cache/zoo``), is shared across runs, and is listed and cleared by
``zoo cache ls|clear``. Writes are a private temporary file renamed into place, so builders
running at once (DDP ranks, two runs) never leave a torn entry; an unreadable entry (a power
cut, a full disk) is decoded again, never trusted. No fsync: losing an entry costs a decode.

The eval view of an entry is exact: a centre crop of the stored array equals
:func:`zoo.transforms.eval_transform`'s pixels, because the stored array *is* its resize.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torchvision import transforms as T

from zoo import durable, images
from zoo.images import open_image, to_channels
from zoo.preprocessing import Preprocessing
from zoo.system import available_cpus, cache_home
from zoo.transforms import interpolation_mode

MEMO_ENTRIES = 200_000  # entry paths remembered per process (≈ 40 MB at most)
# Share of the cache folder's free disk an automatic cache may take (``--image-cache auto``).
DISK_SHARE = 0.5


@dataclass(frozen=True)
class CacheSpec:
    """How entries are stored: short side ``size`` px (``interpolation``), ``channels``."""

    size: int
    interpolation: str
    channels: int

    @classmethod
    def for_model(cls, pre: Preprocessing) -> CacheSpec:
        return cls(pre.resize_size, pre.interpolation, pre.channels)

    @property
    def tag(self) -> str:
        return f"{self.channels}c-{self.size}px-{self.interpolation}"

    def stored_shape(self, width: int, height: int) -> tuple[int, int, int]:
        """``(H, W, C)`` an upright ``width × height`` image is stored at (torchvision's
        short-side resize arithmetic)."""
        if width <= height:
            return int(self.size * height / width), self.size, self.channels
        return self.size, int(self.size * width / height), self.channels


def images_dir() -> Path:
    return cache_home() / "images"


def entry_path(path: Path, spec: CacheSpec, root: Path | None = None) -> Path:
    """Where ``path``'s entry lives: a hash of its absolute path, size, mtime, the spec and
    the decoder's version (:data:`zoo.images.DECODE_VERSION`)."""
    st = path.stat()
    key = f"{os.path.abspath(path)}|{st.st_size}|{st.st_mtime_ns}|{spec.tag}"
    key += f"|decode{images.DECODE_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()
    return (root or images_dir()) / spec.tag / digest[:2] / f"{digest}.npy"


def decode(path: Path | Image.Image, spec: CacheSpec) -> np.ndarray:
    """The stored array: :func:`open_image` (EXIF, channels) → eval resize, ``H×W×C`` uint8."""
    im = path if isinstance(path, Image.Image) else open_image(path)
    im = to_channels(im, spec.channels)
    im = T.Resize(spec.size, interpolation=interpolation_mode(spec.interpolation))(im)
    arr = np.array(im, dtype=np.uint8)  # writable: tensors are made from it
    return arr[:, :, None] if arr.ndim == 2 else arr


def _write(entry: Path, arr: np.ndarray) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = durable.temp_path(entry)
    try:
        with open(tmp, "wb") as f:
            np.save(f, arr, allow_pickle=False)
        os.replace(tmp, entry)  # atomic: a reader sees no entry or a whole one
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# The header np.save writes for our arrays (format 1.0); anything else goes through np.load.
_HEADER = re.compile(
    rb"\{'descr': '\|u1', 'fortran_order': False, 'shape': \((\d+), (\d+), (\d+)\), \}"
)


def _read(entry: Path, spec: CacheSpec) -> np.ndarray | None:
    """The entry's array, or None when it is missing, torn or not what ``spec`` stores. Read
    whole (one copy out of the page cache, as a memory map plus the writable copy a tensor
    needs would cost, without the map's set-up); the header is matched rather than
    ``ast``-parsed, which costs more than the read."""
    try:
        arr: np.ndarray | None
        with open(entry, "rb") as f:
            head = f.read(128)
            m = _HEADER.match(head, 10) if head[:8] == b"\x93NUMPY\x01\x00" else None
            if m is not None:
                h, w, c = (int(g) for g in m.groups())
                f.seek(10 + int.from_bytes(head[8:10], "little"))
                arr = np.fromfile(f, dtype=np.uint8, count=h * w * c)
                arr = arr.reshape(h, w, c) if arr.size == h * w * c else None
            else:
                arr = np.load(entry, allow_pickle=False)
    except (OSError, ValueError, EOFError):  # missing, truncated, empty or not an .npy
        return None
    if arr is None or arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != spec.channels:
        return None
    return arr if min(arr.shape[:2]) == spec.size else None


class ImageCache:
    """Read-through access to the store for one spec: :meth:`get` returns the stored array,
    decoding and storing it first when the entry is missing, stale or unreadable."""

    def __init__(self, spec: CacheSpec, root: Path | None = None) -> None:
        self.spec = spec
        self.root = Path(root) if root is not None else images_dir()
        self._entries: dict[Path, Path] = {}  # per process: a run's files do not change

    def get(self, path: Path, decoded: Image.Image | None = None) -> np.ndarray:
        """The stored array of ``path``; ``decoded``: the image already opened by
        :func:`open_image` (the data check's decode), used on a miss instead of the file.

        Raises:
            InputError / PayloadTooLargeError: as :func:`open_image` (an unreadable file).
        """
        entry = self._entries.get(path)
        if entry is None:
            entry = entry_path(path, self.spec, self.root)
            if len(self._entries) < MEMO_ENTRIES:
                self._entries[path] = entry
        arr = _read(entry, self.spec)
        if arr is None:
            arr = decode(decoded if decoded is not None else path, self.spec)
            _write(entry, arr)
        return arr

    def missing(self, paths: Iterable[Path]) -> list[Path]:
        return [p for p in paths if not entry_path(p, self.spec, self.root).exists()]

    def build(
        self, paths: list[Path], *, workers: int | None = None, progress: bool = False
    ) -> int:
        """Decode every path without an entry, in parallel threads (PIL decodes and resizes
        outside the GIL); returns how many were decoded. Unreadable files are skipped (the
        data check quarantines them)."""
        todo = self.missing(paths)
        if not todo:
            return 0

        def one(p: Path) -> None:
            with contextlib.suppress(Exception):  # the data check reports and quarantines it
                self.get(p)

        with ThreadPoolExecutor(max_workers=workers or available_cpus()) as pool:
            jobs: Iterable[None] = pool.map(one, todo)
            if progress:  # on stderr, as every log line: stdout carries results only
                from rich.console import Console
                from rich.progress import track

                jobs = track(
                    jobs,
                    total=len(todo),
                    description="image cache",
                    transient=True,
                    console=Console(stderr=True),
                )
            for _ in jobs:
                pass
        return len(todo)


def estimate_bytes(n_images: int, spec: CacheSpec) -> int:
    """Bytes ``n_images`` entries take, estimated at a 4:3 aspect."""
    h, w, c = spec.stored_shape(spec.size * 4 // 3, spec.size)
    return n_images * (h * w * c + 128)


def fits(need: int, root: Path | None = None) -> tuple[bool, int]:
    """Whether ``need`` more bytes fit the automatic budget, and that budget (a share of the
    free disk where the cache lives)."""
    where = root or images_dir()
    probe = where
    while not probe.exists():
        probe = probe.parent
    budget = int(shutil.disk_usage(probe).free * DISK_SHARE)
    return need <= budget, budget


def usage(root: Path | None = None) -> list[dict[str, Any]]:
    """One row per storage spec: entries and bytes on disk."""
    root = root or images_dir()
    rows = []
    if root.is_dir():
        for spec_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            files = list(spec_dir.rglob("*.npy"))
            rows.append(
                {
                    "spec": spec_dir.name,
                    "entries": len(files),
                    "bytes": sum(f.stat().st_size for f in files),
                }
            )
    return rows


def clear(root: Path | None = None) -> int:
    """Remove every entry; returns the bytes freed."""
    root = root or images_dir()
    freed = sum(r["bytes"] for r in usage(root))
    shutil.rmtree(root, ignore_errors=True)
    return freed
