"""The built-in real data sets: digits (sklearn) and photos (scikit-image's photographs)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from tests.conftest import file_sha256, run_zoo
from zoo.samples import PHOTO_SOURCES, write_photo_folder


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*.jpg"))}


def test_photo_folder_is_real_sized_and_the_same_everywhere(tmp_path: Path) -> None:
    a = write_photo_folder(tmp_path / "a", per_class=3)
    b = write_photo_folder(tmp_path / "b", per_class=3, workers=1)
    assert sorted(p.name for p in a.iterdir()) == sorted(PHOTO_SOURCES)
    assert _digest(a) == _digest(b) and len(_digest(a)) == 3 * len(PHOTO_SOURCES)
    sizes = set()
    for p in a.rglob("*.jpg"):
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert 300 <= max(im.size) <= 640
            sizes.add(im.size)
    assert len(sizes) > 10  # crops and scales differ
    assert _digest(write_photo_folder(tmp_path / "c", per_class=3, seed=1)) != _digest(a)


def test_example_command_writes_both_data_sets(tmp_path: Path) -> None:
    r = run_zoo("example", "photos", str(tmp_path / "photos"), "--per-class", "2")
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "photos").rglob("*.jpg"))) == 2 * len(PHOTO_SOURCES)
    r = run_zoo("example", "digits", str(tmp_path / "digits"), "--per-class", "4")
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "digits").rglob("*.png"))) == 40
    r = run_zoo("example", "fish", str(tmp_path / "x"))
    assert r.returncode == 2 and "digits" in r.stderr and "photos" in r.stderr


def test_digits_are_sklearns_own_without_importing_it() -> None:
    """`zoo example digits` reads the file ``load_digits`` reads (its import was 2.5 s of 4):
    the same arrays, and ``sklearn`` left unimported in a fresh process."""
    import subprocess
    import sys

    import numpy as np
    from sklearn.datasets import load_digits

    from zoo.samples import digits_arrays

    images, targets = digits_arrays()
    ref = load_digits()
    assert np.array_equal(images, ref.images) and np.array_equal(targets, ref.target)
    assert images.dtype == ref.images.dtype and targets.dtype == ref.target.dtype
    code = "import sys; from zoo.samples import digits_arrays; digits_arrays(); print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
