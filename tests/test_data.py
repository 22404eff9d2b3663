"""Image-folder scanning, splits, the class map and the preflight check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import file_sha256, no_home
from zoo.errors import DataError
from zoo.train.check import check_splits
from zoo.train.data import ResumableSampler, natural_key, scan


def _img(path: Path, color: int = 128, size: int = 40, mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(
        mode, (size, size), color if mode != "RGB" else (color, 255 - color, color // 2)
    ).save(path)
    return path


def test_natural_sort() -> None:
    assert sorted(["c10", "c2", "c1"], key=natural_key) == ["c1", "c2", "c10"]


def test_flat_layout_split_is_stratified_and_seeded(digits_dir: Path) -> None:
    a, b = scan(digits_dir, seed=3), scan(digits_dir, seed=3)
    assert a.files == b.files and a.layout == "flat"
    assert a.files != scan(digits_dir, seed=4).files
    assert a.classes == [f"digit_{i}" for i in range(10)]
    for cls in a.classes:
        n_val = sum(1 for _, c in a.files["val"] if c == cls)
        n_all = n_val + sum(1 for _, c in a.files["train"] if c == cls)
        assert abs(n_val - 0.2 * n_all) <= 1
    assert not set(a.files["train"]) & set(a.files["val"])


def test_split_layout_and_aliases(tmp_path: Path) -> None:
    for split in ("train", "valid", "test"):
        for cls in ("c10", "c2"):
            _img(tmp_path / split / cls / "a.png")
    s = scan(tmp_path)
    assert s.layout == "split" and s.classes == ["c2", "c10"]
    assert set(s.files) == {"train", "val", "test"}


def test_val_only_class_is_an_error(tmp_path: Path) -> None:
    for cls in ("a", "b"):
        _img(tmp_path / "train" / cls / "x.png")
    _img(tmp_path / "val" / "a" / "x.png")
    _img(tmp_path / "val" / "zebra" / "x.png")
    with pytest.raises(DataError, match=r"zebra.*not in train"):
        scan(tmp_path)


def test_empty_class_and_single_class(tmp_path: Path) -> None:
    _img(tmp_path / "flat" / "a" / "x.png")
    with pytest.raises(DataError, match="at least 2"):
        scan(tmp_path / "flat")
    (tmp_path / "flat" / "empty_cls").mkdir()
    with pytest.raises(DataError, match="empty_cls"):
        scan(tmp_path / "flat")
    with pytest.raises(DataError, match="does not exist"):
        scan(tmp_path / "missing")


def test_a_cache_home_nobody_has_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The data scanners' own case is in test_gates_data.py (mutation testing selects it)."""
    from zoo.errors import NoHomeFolderError
    from zoo.system import cache_home

    monkeypatch.setenv("ZOO_CACHE", "~no-such-user-zoo/cache")
    with pytest.raises(NoHomeFolderError, match=r"^ZOO_CACHE '~no-such-user-zoo/cache' starts"):
        cache_home()
    # a container's user with no home: the cache says which variable to set
    for name in ("ZOO_CACHE", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)
    no_home(monkeypatch)
    with pytest.raises(NoHomeFolderError) as err:
        cache_home()
    assert str(err.value) == (
        "zoo's cache folder '~/.cache' starts with '~', but $HOME is unset to expand it. "
        "Set ZOO_CACHE (or HOME) to a folder."
    )


def _corrupt_set(root: Path) -> None:
    """Truncated JPEG, a text file named .jpg, a zero-byte file."""
    good = _img(root / "a" / "good.jpg")
    data = good.read_bytes()
    (root / "a" / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (root / "b" / "notes.jpg").parent.mkdir(parents=True, exist_ok=True)
    (root / "b" / "notes.jpg").write_text("this is not an image")
    (root / "b" / "empty.jpg").write_bytes(b"")


def test_check_finds_corrupt_odd_tiny_duplicates(tmp_path: Path) -> None:
    root = tmp_path / "d"
    _corrupt_set(root / "train")
    _img(root / "train" / "b" / "ok.png", 10)
    _img(root / "train" / "b" / "cmyk.jpg", mode="CMYK")
    _img(root / "train" / "b" / "tiny.png", size=8)
    _img(root / "val" / "a" / "v.png", 50)
    (root / "val" / "b").mkdir(parents=True)
    shutil.copy(root / "train" / "b" / "ok.png", root / "val" / "b" / "leak.png")
    before = {p: file_sha256(p) for p in root.rglob("*") if p.is_file()}
    report = check_splits(scan(root), use_cache=False)
    assert sorted(Path(c["path"]).name for c in report.corrupt) == [
        "empty.jpg",
        "notes.jpg",
        "truncated.jpg",
    ]
    assert any("empty file" in c["error"] for c in report.corrupt)
    assert [Path(o["path"]).name for o in report.odd_modes] == ["cmyk.jpg"]
    assert [Path(t["path"]).name for t in report.tiny] == ["tiny.png"]
    assert report.duplicates_across_splits == [["train:train/b/ok.png", "val:val/b/leak.png"]]
    after = {p: file_sha256(p) for p in root.rglob("*") if p.is_file()}
    assert before == after, "the user's images are never modified"


def test_check_cache_reuses_and_invalidates(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ZOO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "d"
    _img(root / "a" / "1.png")
    _img(root / "b" / "1.png")
    assert not check_splits(scan(root)).corrupt
    cache = next((tmp_path / "cache").rglob("*.json"))
    assert len(json.loads(cache.read_text())["files"]) == 2
    (root / "b" / "1.png").write_bytes(b"broken now")
    assert [c["path"] for c in check_splits(scan(root)).corrupt] == ["b/1.png"]


def test_resumable_sampler_positions_and_shards() -> None:
    full = list(ResumableSampler(10, shuffle=True, seed=1, batch_size=3, drop_last=True))
    assert len(full) == 9
    s = ResumableSampler(10, shuffle=True, seed=1, batch_size=3, drop_last=True)
    s.set_position(2)
    assert list(s) == full[6:]
    shards = [
        list(
            ResumableSampler(
                10, shuffle=True, seed=1, batch_size=5, drop_last=False, rank=r, world_size=2
            )
        )
        for r in range(2)
    ]
    assert len(shards[0]) == len(shards[1]) == 5
    assert {i for sh in shards for i, _ in sh} == set(range(10))
