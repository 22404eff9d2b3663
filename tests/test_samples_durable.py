"""``zoo example``'s writers: a destination that is a file is refused, and a run killed while
it encodes an image leaves no truncated file for the next run to keep as done."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import file_sha256, zoo_here
from zoo.images import open_image
from zoo.samples import write_digits_folder

KILLED_MID_SAVE = """
import os, signal, sys
from io import BytesIO

from PIL import Image, PngImagePlugin  # noqa: F401  (registers PNG's writer)

from zoo.samples import write_digits_folder

real, saved = Image.SAVE["PNG"], []


def dying(im, fp, filename, *args, **kwargs):
    saved.append(filename)
    if len(saved) < 5:
        return real(im, fp, filename, *args, **kwargs)
    buf = BytesIO()
    real(im, buf, filename, *args, **kwargs)
    fp.write(buf.getvalue()[: len(buf.getvalue()) // 2])
    fp.flush()
    os.kill(os.getpid(), signal.SIGKILL)


Image.SAVE["PNG"] = dying
write_digits_folder(sys.argv[1], per_class=1)
"""


@pytest.mark.parametrize("example", ["digits", "photos"])
def test_example_refuses_a_destination_that_is_a_file(tmp_path: Path, example: str) -> None:
    dest = tmp_path / "notes.txt"
    dest.write_text("keep me\n")
    for given in (dest, dest / "sub"):
        r = zoo_here("example", example, str(given), "--per-class", "1")
        assert r.returncode == 1, r.stderr
        assert f"{dest} is a file, not a folder" in r.stderr and "Traceback" not in r.stderr
    assert dest.read_text() == "keep me\n"


def test_a_run_killed_mid_save_leaves_no_truncated_digit(tmp_path: Path) -> None:
    out = tmp_path / "digits"
    child = subprocess.run(
        [sys.executable, "-c", KILLED_MID_SAVE, str(out)], capture_output=True, text=True
    )
    assert child.returncode == -9, child.stderr
    # the fifth died half-encoded: not there (nor those the other threads were still writing)
    before = list(out.rglob("*.png"))
    assert len(before) <= 4 and all(open_image(p).size == (32, 32) for p in before)
    write_digits_folder(out, per_class=1)
    fresh = write_digits_folder(tmp_path / "fresh", per_class=1)
    pngs = sorted(p.relative_to(out) for p in out.rglob("*.png"))
    assert pngs == sorted(p.relative_to(fresh) for p in fresh.rglob("*.png")) and len(pngs) == 10
    for rel in pngs:
        assert open_image(out / rel).size == (32, 32)  # decodes fully
        assert file_sha256(out / rel) == file_sha256(fresh / rel)
