"""The image cache's key and store (train/image_cache.py) on small images in tmp: an entry is
read back without a second decode (and by its header, not ``np.load``), under the store's
layout; every entry that is not what the spec stores (another size, channel count, dtype or
rank) is decoded again; the spec's arithmetic and the decode's channels and interpolation.
Selected with the fast tests of tests/test_image_cache.py by scripts/mutation.sh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms import InterpolationMode

import zoo
from zoo.train import image_cache as ic

SPEC = ic.CacheSpec(16, "bilinear", 3)


def _photo(path: Path, size: tuple[int, int]) -> Path:
    """A smooth colour gradient (resizing it shows the interpolation)."""
    w, h = size
    x = np.linspace(0, 255, w)[None, :, None]
    y = np.linspace(0, 255, h)[:, None, None]
    rgb = np.concatenate([x + 0 * y, y + 0 * x, (x + y) / 2], axis=2).astype(np.uint8)
    Image.fromarray(rgb).save(path)
    return path


@pytest.fixture()
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources :func:`ic.decode` is called with (a path or an image), in order."""
    seen: list[str] = []
    real = ic.decode

    def decode(src: Any, spec: ic.CacheSpec) -> np.ndarray:
        seen.append("image" if isinstance(src, Image.Image) else "path")
        return real(src, spec)

    monkeypatch.setattr(ic, "decode", decode)
    return seen


@pytest.mark.parametrize("size", [(40, 24), (24, 40), (30, 30)])
@pytest.mark.parametrize("channels", [3, 1])
def test_an_entry_is_read_back_by_its_header_without_a_second_decode(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    decodes: list[str],
    size: tuple[int, int],
    channels: int,
) -> None:
    spec = ic.CacheSpec(16, "bilinear", channels)
    path = _photo(tmp_path / "p.png", size)
    first = ic.ImageCache(spec, tmp_path / "store").get(path).copy()
    assert decodes == ["path"] and first.dtype == np.uint8
    assert first.shape == spec.stored_shape(*size)

    def no_load(*a: Any, **k: Any) -> None:
        raise AssertionError("our own entries are read by their header, not np.load")

    monkeypatch.setattr(ic.np, "load", no_load)
    again = ic.ImageCache(spec, tmp_path / "store").get(path)  # a new process's cache
    assert decodes == ["path"] and np.array_equal(again, first)


def test_the_store_layout_is_root_tag_two_hex_digits_digest(tmp_path: Path) -> None:
    path = _photo(tmp_path / "p.png", (20, 20))
    entry = ic.entry_path(path, SPEC, tmp_path / "store")
    digest = entry.stem
    assert entry == tmp_path / "store" / SPEC.tag / digest[:2] / f"{digest}.npy"
    assert len(digest) == 64 and SPEC.tag == "3c-16px-bilinear"
    assert ic.entry_path(path, SPEC).is_relative_to(ic.images_dir())  # no root: the user's


def test_an_entry_that_is_not_what_the_spec_stores_is_decoded_again(
    tmp_path: Path, decodes: list[str]
) -> None:
    path = _photo(tmp_path / "p.png", (40, 24))
    cache = ic.ImageCache(SPEC, tmp_path / "store")
    good = cache.get(path).copy()  # (16, 26, 3)
    entry = ic.entry_path(path, SPEC, cache.root)
    wrong = {
        "another size": np.zeros((10, 17, 3), np.uint8),
        "another dtype": good.astype(np.float32),
        "another rank": good[:, :, 0],
        "fortran order, another size": np.asfortranarray(np.zeros((20, 33, 3), np.uint8)),
    }
    for what, arr in wrong.items():
        np.save(entry, arr)
        n = len(decodes)
        assert np.array_equal(ic.ImageCache(SPEC, cache.root).get(path), good), what
        assert len(decodes) == n + 1, what
    np.save(entry, np.asfortranarray(good))  # a sound entry in another layout: np.load reads it
    n = len(decodes)
    assert np.array_equal(ic.ImageCache(SPEC, cache.root).get(path), good)
    assert len(decodes) == n


def test_the_checks_decode_is_stored_instead_of_reading_the_file(
    tmp_path: Path, decodes: list[str]
) -> None:
    path = _photo(tmp_path / "p.png", (40, 24))
    other = Image.new("RGB", (40, 24), (9, 99, 199))  # what the data check decoded
    got = ic.ImageCache(SPEC, tmp_path / "store").get(path, other)
    assert decodes == ["image"] and tuple(got[0, 0]) == (9, 99, 199)


def test_stored_shape_is_torchvisions_short_side_arithmetic() -> None:
    spec = ic.CacheSpec(32, "bilinear", 3)
    assert spec.stored_shape(64, 100) == (50, 32, 3)  # portrait: H = 32 × 100 / 64
    assert spec.stored_shape(100, 64) == (32, 50, 3)
    assert spec.stored_shape(45, 45) == (32, 32, 3)
    assert ic.CacheSpec(7, "nearest", 1).stored_shape(10, 33) == (23, 7, 1)  # int() floors


def test_the_spec_of_a_model_is_its_preprocessing() -> None:
    pre = zoo.model_info("mobilenet_v2").preprocessing()
    spec = ic.CacheSpec.for_model(pre)
    assert spec == ic.CacheSpec(pre.resize_size, pre.interpolation, pre.channels)
    assert (spec.size, spec.channels) == (256, 3)


@pytest.mark.parametrize("interpolation", ["nearest", "bicubic", "bilinear"])
def test_decode_resizes_with_the_specs_interpolation_and_channels(
    tmp_path: Path, interpolation: str
) -> None:
    path = _photo(tmp_path / "p.png", (50, 30))
    im = Image.open(path).convert("RGB")
    mode = InterpolationMode(interpolation)
    want = np.asarray(T.Resize(12, interpolation=mode)(im))
    assert np.array_equal(ic.decode(path, ic.CacheSpec(12, interpolation, 3)), want)
    grey = ic.decode(path, ic.CacheSpec(12, interpolation, 1))
    assert grey.shape == (12, 20, 1) and grey.dtype == np.uint8
    want_grey = np.asarray(T.Resize(12, interpolation=mode)(im.convert("L")))
    assert np.array_equal(grey[:, :, 0], want_grey)


def test_a_write_that_cannot_start_raises_its_own_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary file is removed on failure; when it was never created (the open itself
    failed), that clean-up does not replace the real error with its own."""

    def full(*a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ic, "open", full, raising=False)  # shadows the builtin in the module
    entry = tmp_path / "store" / "ab" / "x.npy"
    with pytest.raises(OSError, match="No space left on device"):
        ic._write(entry, np.zeros((2, 2, 3), np.uint8))
    assert list(entry.parent.iterdir()) == []
