"""Data scanning, splits and the preflight check (quarantine) on small image folders written
in tmp (a second each): the layouts, every refusal with its message, the seeded stratified
split, and each finding of the check at its threshold. Bigger real-data tests live in
test_data.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from tests.conftest import no_home
from zoo.errors import DataError, NoHomeFolderError, UsageError
from zoo.train import check as chk
from zoo.train.data import (
    IMAGE_EXTENSIONS,
    LABELS_CSV,
    Splits,
    natural_key,
    sample_seed,
    scan,
    scan_multilabel,
    scan_unlabelled,
)


def _img(path: Path, color: int = 128, size: tuple[int, int] = (20, 20), mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fill = (color, 255 - color, color // 2) if mode == "RGB" else color
    Image.new(mode, size, fill).save(path)
    return path


def _flat(root: Path, counts: dict[str, int]) -> Path:
    for cls, n in counts.items():
        for i in range(n):
            _img(root / cls / f"{i}.png", color=(i * 7 + len(cls) * 31) % 256)
    return root


# ---- scanning -----------------------------------------------------------------------------


def test_natural_key() -> None:
    assert natural_key("Img10b2") == ["img", 10, "b", 2, ""]
    assert sorted(["b", "A", "a10", "a9"], key=natural_key) == ["A", "a9", "a10", "b"]


def test_flat_layout_picks_images_only_and_sorts_naturally(tmp_path: Path) -> None:
    root = _flat(tmp_path / "d", {"c10": 2, "c2": 3})
    (root / "c2" / "notes.txt").write_text("x")
    (root / "c2" / "sub").mkdir()
    _img(root / "c2" / "sub" / "deep.JPG")  # nested and upper-case: still an image
    (root / "c2" / "dir.png").mkdir()  # a folder named like an image is not one
    (root / ".hidden").mkdir()
    _img(root / ".hidden" / "x.png")
    (root / "readme.png").write_bytes(b"top-level file, not a class")
    s = scan(root, val_fraction=0.5, seed=0)
    assert s.root == root.resolve() and s.classes == ["c2", "c10"] and s.layout == "flat"
    assert (s.val_fraction, s.seed) == (0.5, 0)
    every = sorted(r for split in s.files.values() for r, _ in split)
    assert every == sorted(
        ["c10/0.png", "c10/1.png", "c2/0.png", "c2/1.png", "c2/2.png", "c2/sub/deep.JPG"]
    )
    assert all(r.startswith(c + "/") for split in s.files.values() for r, c in split)
    for split in s.files.values():  # natural order within each split
        assert [r for r, _ in split] == sorted((r for r, _ in split), key=natural_key)


def test_flat_split_is_stratified_seeded_and_rounded(tmp_path: Path) -> None:
    root = _flat(tmp_path / "d", {"a": 10, "b": 5, "c": 1, "d": 2})
    s = scan(root, val_fraction=0.25, seed=7)
    per_class = {c: sum(1 for _, k in s.files["val"] if k == c) for c in s.classes}
    # round(10·.25)=2 (banker's), round(5·.25)=1, one image: no val, two images: at least one
    assert per_class == {"a": 2, "b": 1, "c": 0, "d": 1}
    assert len(s.files["train"]) == 18 - 4
    assert not {r for r, _ in s.files["train"]} & {r for r, _ in s.files["val"]}
    assert scan(root, val_fraction=0.25, seed=7).files == s.files
    assert any(scan(root, val_fraction=0.25, seed=k).files != s.files for k in range(8, 12))
    tiny_share = scan(root, val_fraction=0.01, seed=0)
    assert sum(1 for _, k in tiny_share.files["val"] if k == "a") == 1  # never zero


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_flat_val_fraction_must_be_inside_0_1(tmp_path: Path, fraction: float) -> None:
    root = _flat(tmp_path / "d", {"a": 2, "b": 2})
    with pytest.raises(UsageError) as exc:
        scan(root, val_fraction=fraction)
    assert str(exc.value) == (
        f"--val-fraction {fraction!r} is out of range: it must be in (0, 1) (usually 0.2)."
    )


def test_split_layout_with_aliases_and_test(tmp_path: Path) -> None:
    for split, names in {"train": ["a", "b"], "validation": ["a"], "test": ["b"]}.items():
        for cls in names:
            _img(tmp_path / split / cls / "x.png")
    s = scan(tmp_path)
    assert s.layout == "split" and s.classes == ["a", "b"]
    assert s.files == {
        "train": [("train/a/x.png", "a"), ("train/b/x.png", "b")],
        "val": [("validation/a/x.png", "a")],
        "test": [("test/b/x.png", "b")],
    }
    assert s.val_fraction is None and s.seed is None


def test_split_layout_lists_files_in_natural_order(tmp_path: Path) -> None:
    for name in ("img10.png", "img2.png", "Img3.png"):
        _img(tmp_path / "train" / "a" / name)
    _img(tmp_path / "train" / "b" / "x.png")
    _img(tmp_path / "val" / "a" / "x.png")
    assert [r for r, _ in scan(tmp_path).files["train"]] == [
        "train/a/img2.png",
        "train/a/Img3.png",
        "train/a/img10.png",
        "train/b/x.png",
    ]


def test_scan_defaults(tmp_path: Path) -> None:
    root = _flat(tmp_path / "d", {"a": 10, "b": 10})
    s = scan(root)
    assert (s.val_fraction, s.seed) == (0.2, 0) and s.files == scan(root, seed=0).files
    assert len(s.files["val"]) == 4


@pytest.mark.parametrize("alias", ["val", "valid", "validation"])
def test_each_val_alias(tmp_path: Path, alias: str) -> None:
    for cls in ("a", "b"):
        _img(tmp_path / "train" / cls / "x.png")
    _img(tmp_path / alias / "a" / "y.png")
    assert scan(tmp_path).files["val"] == [(f"{alias}/a/y.png", "a")]


def test_train_without_val_is_refused(tmp_path: Path) -> None:
    for cls in ("a", "b"):
        _img(tmp_path / "train" / cls / "x.png")
    (tmp_path / "val").write_text("a file, not a folder")
    with pytest.raises(DataError) as exc:
        scan(tmp_path)
    assert str(exc.value) == (
        f"{tmp_path.resolve()} has a train/ folder but no val/ (or valid/, validation/) folder. "
        "Add one, or use a flat DIR/<class>/ layout to have zoo split it."
    )


def test_class_only_in_val_or_test_is_refused(tmp_path: Path) -> None:
    for cls in ("a", "b"):
        _img(tmp_path / "train" / cls / "x.png")
    _img(tmp_path / "val" / "a" / "x.png")
    _img(tmp_path / "test" / "zebra" / "x.png")
    _img(tmp_path / "test" / "yak" / "x.png")
    with pytest.raises(DataError) as exc:
        scan(tmp_path)
    assert str(exc.value) == (
        "Class(es) yak, zebra appear in test/ but not in train/: the model could never predict "
        "them. Add training images or remove them."
    )


def test_empty_class_folder_is_refused_naming_the_split(tmp_path: Path) -> None:
    for cls in ("a", "b"):
        _img(tmp_path / "train" / cls / "x.png")
    _img(tmp_path / "val" / "a" / "x.png")
    (tmp_path / "val" / "b").mkdir()
    (tmp_path / "val" / "b" / "notes.txt").write_text("no images")
    _img(tmp_path / "train" / "c" / "x.png")
    (tmp_path / "val" / "c").mkdir()
    with pytest.raises(DataError) as exc:
        scan(tmp_path)
    exts = ", ".join(sorted(IMAGE_EXTENSIONS))
    assert str(exc.value) == (
        f"Class folder(s) with no images in {tmp_path.resolve()}/val: b, c. Add images "
        f"(extensions: {exts}) or remove the folder."
    )


def test_one_class_is_not_classification(tmp_path: Path) -> None:
    _img(tmp_path / "flat" / "only" / "x.png")
    with pytest.raises(DataError) as exc:
        scan(tmp_path / "flat")
    assert str(exc.value) == (
        f"Found 1 class folder(s) in {(tmp_path / 'flat').resolve()} (only): classification "
        "needs at least 2. Put each class's images in its own folder."
    )
    _img(tmp_path / "split" / "train" / "only" / "x.png")
    _img(tmp_path / "split" / "val" / "only" / "x.png")
    with pytest.raises(DataError, match=r"Found 1 class folder\(s\) in .*split/train \(only\)"):
        scan(tmp_path / "split")


def test_missing_or_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError) as exc:
        scan(tmp_path / "nope")
    assert str(exc.value) == (
        f"Data folder {(tmp_path / 'nope').resolve()} does not exist (or is not a folder)."
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match="does not exist"):
        scan(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError) as exc:
        scan(tmp_path / "empty")
    assert str(exc.value) == (
        f"{(tmp_path / 'empty').resolve()} has no class folders. Expected DIR/<class>/<image> or "
        "DIR/train/<class>/… + DIR/val/<class>/… (images without labels: zoo predict MODEL "
        "DIR answers for them, and zoo distill TEACHER --unlabelled trains on a teacher's "
        "answers)"
    )


def test_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _flat(tmp_path / "d", {"a": 2, "b": 2})
    monkeypatch.setenv("HOME", str(tmp_path))
    assert scan("~/d").root == (tmp_path / "d").resolve()


def test_a_home_folder_nobody_has_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for scanner in (scan, scan_unlabelled, scan_multilabel):
        with pytest.raises(NoHomeFolderError) as err:
            scanner("~no-such-user-zoo/photos")
        assert str(err.value) == (
            "Data folder '~no-such-user-zoo/photos' starts with '~', but no user "
            "'no-such-user-zoo' here to expand it. Give the full path instead."
        )
    no_home(monkeypatch)
    with pytest.raises(NoHomeFolderError) as err:
        scan("~/photos")
    assert str(err.value) == (
        "Data folder '~/photos' starts with '~', but $HOME is unset to expand it. "
        "Give the full path instead."
    )


# ---- splits as data -----------------------------------------------------------------------


def test_splits_round_trip_samples_and_fingerprint(tmp_path: Path) -> None:
    s = scan(_flat(tmp_path / "d", {"b": 3, "a": 3}), val_fraction=0.4, seed=1)
    assert s.class_to_idx() == {"a": 0, "b": 1}
    again = Splits.from_json(json.loads(json.dumps(s.to_json())))
    assert again == s
    moved = Splits.from_json(s.to_json(), root=tmp_path / "elsewhere")
    assert moved.root == tmp_path / "elsewhere" and moved.files == s.files
    samples = s.samples("train")
    assert samples == [(s.root / r, s.class_to_idx()[c]) for r, c in s.files["train"]]
    assert s.samples("test") == []
    fp = s.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{16}", fp), fp
    assert Splits.from_json(s.to_json(), root=tmp_path).fingerprint() == fp  # files, not root
    s.files["val"] = s.files["val"][1:]
    assert s.fingerprint() != fp


def test_multilabel_samples_are_multi_hot() -> None:
    s = Splits(
        Path("/r"), ["cat", "dog", "sky"], {"val": [("a.png", "cat;sky")]}, layout="multilabel"
    )
    [(path, target)] = s.samples("val")
    assert path == Path("/r/a.png") and torch.equal(target, torch.tensor([1.0, 0.0, 1.0]))
    assert s.samples("test") == []


def test_fingerprint_does_not_depend_on_split_order() -> None:
    rows = {"train": [("a.png", "cat")], "val": [("b.png", "dog")]}
    a = Splits(Path("/r"), ["cat", "dog"], rows)
    b = Splits(Path("/r"), ["cat", "dog"], {"val": rows["val"], "train": rows["train"]})
    assert a.fingerprint() == b.fingerprint()


def _labels_csv(root: Path, rows: list[str], header: str = "path,labels") -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / LABELS_CSV).write_text("\n".join([header, *rows]) + "\n")


def test_scan_multilabel(tmp_path: Path) -> None:
    root = tmp_path / "ml"
    for i in range(6):
        _img(root / "img" / f"{i}.png")
    _img(root / "img" / "10.png")
    _labels_csv(
        root,
        [
            "img/0.png,cat;sky",
            "img/1.png,sky cat",
            "img/2.png,dog",
            "img/3.png,dog;;dog",
            "img/4.png,c10 c9",
            "img/5.png,cat",
            "img/10.png,c9",
        ],
    )
    s = scan_multilabel(root, val_fraction=0.5, seed=3)
    assert s.root == root.resolve()
    assert s.layout == "multilabel" and s.classes == ["c9", "c10", "cat", "dog", "sky"]
    rows = dict(s.files["train"] + s.files["val"])
    assert rows == {
        "img/0.png": "cat;sky",
        "img/1.png": "cat;sky",
        "img/2.png": "dog",
        "img/3.png": "dog",
        "img/4.png": "c9;c10",
        "img/5.png": "cat",
        "img/10.png": "c9",
    }
    every = [r for split in s.files.values() for r, _ in split]
    assert "img/10.png" in every
    # stratified by first label: cat ×3 → 2 val (round(1.5)=2), dog ×2 → 1, c9 ×2 → 1
    val = sorted(r for r, _ in s.files["val"])
    assert len(val) == 4 and sum(r in ("img/4.png", "img/10.png") for r in val) == 1
    assert sorted(set(val) - {"img/4.png", "img/10.png"}) in (sorted(x) for x in _val_choices())
    assert s.files == scan_multilabel(root, val_fraction=0.5, seed=3).files
    for split in s.files.values():
        assert [r for r, _ in split] == sorted((r for r, _ in split), key=natural_key)
    assert (s.val_fraction, s.seed) == (0.5, 3)


def _val_choices() -> list[list[str]]:
    cats, dogs = ["img/0.png", "img/1.png", "img/5.png"], ["img/2.png", "img/3.png"]
    return [[a, b, d] for i, a in enumerate(cats) for b in cats[i + 1 :] for d in dogs]


def test_scan_multilabel_refusals(tmp_path: Path) -> None:
    root = tmp_path / "ml"
    _img(root / "a.png")
    with pytest.raises(DataError) as exc:
        scan_multilabel(root)
    assert str(exc.value) == (
        f"--multi-label needs {root.resolve() / LABELS_CSV}: one row per image, header "
        "'path,labels', labels separated by ';' (e.g. 'img/001.jpg,cat;outdoor')."
    )
    _labels_csv(root, ["a.png,cat"], header="file,tags")
    with pytest.raises(DataError) as exc:
        scan_multilabel(root)
    assert str(exc.value) == (
        f"{root.resolve() / LABELS_CSV} needs the header 'path,labels' (got ['file', 'tags'])."
    )
    _labels_csv(root, ["a.png,cat", "a.png, ;"])
    with pytest.raises(DataError) as exc:
        scan_multilabel(root)
    assert str(exc.value) == f"{root.resolve() / LABELS_CSV} line 3: 'a.png' has no labels."
    _labels_csv(root, ["a.png,cat", "b.png,dog"])
    with pytest.raises(DataError) as exc:
        scan_multilabel(root)
    assert str(exc.value) == (
        f"{root.resolve() / LABELS_CSV} line 3: image 'b.png' does not exist under {root.resolve()}."
    )
    _labels_csv(root, ["a.png,cat", "a.png,"])
    with pytest.raises(DataError, match=r"line 3: 'a\.png' has no labels"):
        scan_multilabel(root)
    _labels_csv(root, ["a.png,cat;cat"])
    with pytest.raises(DataError) as exc:
        scan_multilabel(root)
    assert str(exc.value) == (
        f"Found 1 class folder(s) in {root.resolve() / LABELS_CSV} (cat): classification needs "
        "at least 2. Put each class's images in its own folder."
    )
    _labels_csv(root, ["a.png,cat;dog"])
    assert scan_multilabel(root).files == scan_multilabel(root, val_fraction=0.2, seed=0).files
    assert (scan_multilabel(root).val_fraction, scan_multilabel(root).seed) == (0.2, 0)
    for bad in (0.0, 1.0):
        with pytest.raises(UsageError) as usage:
            scan_multilabel(root, val_fraction=bad)
        assert (
            str(usage.value)
            == f"--val-fraction {bad!r} is out of range: it must be in (0, 1) (usually 0.2)."
        )
    (root / LABELS_CSV).write_text("")
    with pytest.raises(DataError, match=r"\(got None\)"):
        scan_multilabel(root)


# ---- the preflight check and quarantine ---------------------------------------------------


@pytest.fixture()
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("ZOO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_check_file_reads_every_pixel(tmp_path: Path) -> None:
    good = _img(tmp_path / "g.jpg", size=(30, 20))
    fc = chk._check_file(good)
    assert fc == chk.FileCheck(
        str(good),
        True,
        None,
        30,
        20,
        "RGB",
        hashlib.sha256(good.read_bytes()).hexdigest(),
    )
    data = good.read_bytes()
    (tmp_path / "t.jpg").write_bytes(data[: len(data) // 2])
    truncated = chk._check_file(tmp_path / "t.jpg")
    assert truncated == chk.FileCheck(str(tmp_path / "t.jpg"), False, error=truncated.error)
    assert truncated.error.startswith("OSError: ")
    (tmp_path / "e.jpg").write_bytes(b"")
    assert chk._check_file(tmp_path / "e.jpg") == chk.FileCheck(
        str(tmp_path / "e.jpg"), False, "empty file"
    )
    (tmp_path / "n.png").write_text("not an image")
    # PIL's own message names a BytesIO object's address; the check says what it means
    assert chk._check_file(tmp_path / "n.png") == chk.FileCheck(
        str(tmp_path / "n.png"),
        False,
        error="UnidentifiedImageError: not a format PIL reads (JPEG, PNG, WebP, BMP, TIFF, GIF, "
        "...)",
    )


def _png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG that declares ``width`` x ``height`` pixels in a few bytes (a decompression bomb's
    header: nothing past it is ever decoded)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    idat = zlib.compress(b"\0" * 64)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )
    return path


def test_decompression_bomb_is_unreadable(tmp_path: Path) -> None:
    bomb = _png_header_only(tmp_path / "big.png", 20_000, 20_000)  # 4e8 pixels, over the limit
    assert bomb.stat().st_size < 200
    fc = chk._check_file(bomb)
    assert not fc.ok and fc.error.startswith("DecompressionBombError: ")
    assert "400000000 pixels" in fc.error


def test_cache_file_location(
    cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = hashlib.sha1(b"/data/x").hexdigest()[:16] + ".json"
    assert chk._cache_file(Path("/data/x")) == cache_home / "zoo" / "datacheck" / name
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert (
        chk._cache_file(Path("/data/x")) == tmp_path / "me" / ".cache" / "zoo" / "datacheck" / name
    )


def test_check_files_cache_hits_and_invalidation(
    cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "d"
    paths = [_img(root / "a.png"), _img(root / "b.png", 10)]
    decoded: list[Path] = []
    real = chk._check_file
    monkeypatch.setattr(chk, "_check_file", lambda p, c=None: decoded.append(p) or real(p, c))
    first = chk.check_files(root, paths, workers=1)
    assert decoded == paths and all(first[str(p)].ok for p in paths)
    cache = json.loads(chk._cache_file(root).read_text())
    assert cache["version"] == chk.CACHE_VERSION and set(cache["files"]) == {str(p) for p in paths}
    entry = cache["files"][str(paths[0])]
    st = paths[0].stat()
    assert (entry["size"], entry["mtime_ns"]) == (st.st_size, st.st_mtime_ns)
    assert entry["check"]["sha256"] == first[str(paths[0])].sha256
    decoded.clear()
    assert chk.check_files(root, paths) == first and decoded == []  # all from the cache
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: decoded again
    chk.check_files(root, paths)
    assert decoded == [paths[1]]
    decoded.clear()
    paths[0].write_bytes(b"now broken!")  # size changes too
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not chk.check_files(root, paths)[str(paths[0])].ok and decoded == [paths[0]]
    decoded.clear()
    assert chk.check_files(root, paths, use_cache=False)  # ignores and keeps the cache
    assert decoded == paths


def test_check_files_cache_drops_files_no_longer_in_the_folder(
    cache_home: Path, tmp_path: Path
) -> None:
    """A rewrite keeps the entries of files a partial check did not name (eval's split), but
    not of files deleted, moved away, or outside the checked folder: the cache does not grow
    without bound as a folder changes."""
    root = tmp_path / "d"
    a, b, c = _img(root / "a.png"), _img(root / "b.png", 10), _img(root / "c.png", 12)
    chk.check_files(root, [a, b, c], workers=1)
    path = chk._cache_file(root)
    cache = json.loads(path.read_text())
    outside = _img(tmp_path / "elsewhere.png")  # a file, but not in the checked folder
    cache["files"][str(outside)] = cache["files"][str(a)]
    path.write_text(json.dumps(cache))
    b.unlink()
    c.rename(root / "moved.png")
    chk.check_files(root, [root / "moved.png"], workers=1)  # a new file: the cache rewritten
    assert set(json.loads(path.read_text())["files"]) == {str(a), str(root / "moved.png")}


def test_check_files_ignores_a_bad_or_old_cache(
    cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "d"
    paths = [_img(root / "a.png")]
    chk.check_files(root, paths)
    path = chk._cache_file(root)
    decoded: list[Path] = []
    real = chk._check_file
    monkeypatch.setattr(chk, "_check_file", lambda p, c=None: decoded.append(p) or real(p, c))
    old = json.loads(path.read_text())
    path.write_text(json.dumps({**old, "version": f"{chk.CACHE_VERSION}-old"}))
    chk.check_files(root, paths)
    assert decoded == paths and json.loads(path.read_text())["version"] == chk.CACHE_VERSION
    for broken in ("{not json", ""):
        decoded.clear()
        path.write_text(broken)
        assert chk.check_files(root, paths)[str(paths[0])].ok and decoded == paths
    decoded.clear()
    path.unlink()
    path.mkdir()  # unreadable as a file: OSError
    with pytest.raises(OSError):  # the rewrite cannot replace a folder: loud, not silent
        chk.check_files(root, paths)
    assert decoded == paths


def test_check_files_no_cache_written_without_use_cache(cache_home: Path, tmp_path: Path) -> None:
    root = tmp_path / "d"
    chk.check_files(root, [_img(root / "a.png")], use_cache=False)
    assert not cache_home.exists()


def _dataset(root: Path) -> Splits:
    """train: a ×6, b ×1 (+ corrupt, tiny, odd mode); val: a ×1, b ×1 (a leaked copy)."""
    for i in range(6):
        _img(root / "train" / "a" / f"{i}.png", color=i * 20)
    _img(root / "train" / "b" / "ok.png", color=200)
    _img(root / "train" / "b" / "gray.png", mode="L")
    _img(root / "train" / "b" / "tiny.png", size=(15, 40))
    _img(root / "train" / "b" / "edge.png", size=(16, 16), color=7)  # exactly 16: not tiny
    (root / "train" / "b" / "broken.png").write_bytes(b"\x89PNG broken")
    _img(root / "train" / "b" / "rgba.png", mode="RGBA")
    _img(root / "val" / "a" / "v.png", color=250)
    _img(root / "val" / "b" / "leak.png", color=200)  # same bytes as train/b/ok.png
    return scan(root)


def test_check_splits_findings(cache_home: Path, tmp_path: Path) -> None:
    report = chk.check_splits(_dataset(tmp_path / "d"), workers=2)
    assert report.root == str((tmp_path / "d").resolve()) and report.n_files == 14
    assert [c["path"] for c in report.corrupt] == ["train/b/broken.png"]
    assert report.corrupt[0]["error"].startswith("UnidentifiedImageError")
    assert report.quarantined == ["train/b/broken.png"]
    assert report.tiny == [{"path": "train/b/tiny.png", "size": [15, 40]}]
    assert report.odd_modes == [{"path": "train/b/rgba.png", "mode": "RGBA"}]  # L is fine
    assert report.duplicates_across_splits == [["train:train/b/ok.png", "val:val/b/leak.png"]]
    assert report.class_counts == {"train": {"a": 6, "b": 5}, "val": {"a": 1, "b": 1}}
    assert report.imbalance == {}  # 6/5
    assert report.problems() == 2
    d = report.to_dict()
    assert d["quarantined"] == ["train/b/broken.png"] and d["n_files"] == 14
    assert d["corrupt"] == report.corrupt and d["class_counts"] == report.class_counts


def test_the_check_fills_the_image_cache_with_its_own_decode(
    cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an image cache, every readable file the check decodes is stored from that decode
    (no second read of the file); the broken one is not."""
    from zoo.train import image_cache as ic

    s = _dataset(tmp_path / "d")
    decoded: list[str] = []
    real_decode = ic.decode

    def decode(src: Any, spec: ic.CacheSpec) -> Any:
        decoded.append(type(src).__name__)
        return real_decode(src, spec)

    monkeypatch.setattr(ic, "decode", decode)
    cache = ic.ImageCache(ic.CacheSpec(16, "bilinear", 3), tmp_path / "cache")
    paths = [s.root / rel for items in s.files.values() for rel, _ in items]
    chk.check_splits(s, workers=2, use_cache=False, image_cache=cache)
    assert cache.missing(paths) == [s.root / "train" / "b" / "broken.png"]
    assert len(decoded) == 13 and not any("Path" in name for name in decoded)


def test_check_splits_caches_by_default_and_passes_workers(
    cache_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = _dataset(tmp_path / "d")
    pools: list[int] = []
    real_pool = chk.ThreadPoolExecutor

    def pool(max_workers: int) -> object:
        pools.append(max_workers)
        return real_pool(max_workers=max_workers)

    monkeypatch.setattr(chk, "ThreadPoolExecutor", pool)
    chk.check_splits(s, workers=3)
    assert pools == [3]
    cache = json.loads(chk._cache_file(s.root).read_text())
    assert len(cache["files"]) == 14
    pools.clear()
    assert chk.check_splits(s).n_files == 14 and pools == []  # every file from the cache


def test_identical_images_within_one_split_are_not_a_leak(cache_home: Path, tmp_path: Path) -> None:
    root = tmp_path / "d"
    _img(root / "train" / "a" / "x.png", color=1)
    _img(root / "train" / "b" / "x.png", color=1)
    _img(root / "val" / "a" / "y.png", color=2)
    assert chk.check_splits(scan(root)).duplicates_across_splits == []


def test_imbalance_with_a_single_image_class(cache_home: Path, tmp_path: Path) -> None:
    root = _flat(tmp_path / "d", {"a": 5, "b": 1})
    files = [(f"a/{i}.png", "a") for i in range(5)] + [("b/0.png", "b")]
    report = chk.check_splits(Splits(root, ["a", "b"], {"train": files}), use_cache=False)
    assert report.imbalance == {"train": 5.0}


@pytest.mark.parametrize(("big", "flagged"), [(9, None), (10, 5.0), (11, 5.5)])
def test_imbalance_threshold(
    cache_home: Path, tmp_path: Path, big: int, flagged: float | None
) -> None:
    root = _flat(tmp_path / "d", {"a": big, "b": 2})
    s = Splits(
        root,
        ["a", "b"],
        {"train": [(f"a/{i}.png", "a") for i in range(big)] + [("b/0.png", "b"), ("b/1.png", "b")]},
    )
    report = chk.check_splits(s, use_cache=False)
    assert report.imbalance == ({} if flagged is None else {"train": flagged})


def test_imbalance_rounds_to_two_places(cache_home: Path, tmp_path: Path) -> None:
    root = _flat(tmp_path / "d", {"a": 16, "b": 3})
    s = Splits(
        root,
        ["a", "b"],
        {
            "train": [(f"a/{i}.png", "a") for i in range(16)]
            + [(f"b/{i}.png", "b") for i in range(3)]
        },
    )
    assert chk.check_splits(s, use_cache=False).imbalance == {"train": 5.33}


def test_multilabel_rows_count_once_per_label(cache_home: Path, tmp_path: Path) -> None:
    root = tmp_path / "m"
    _img(root / "a.png")
    _img(root / "b.png", 3)
    s = Splits(
        root,
        ["cat", "sky"],
        {"train": [("a.png", "cat;sky"), ("b.png", "cat")]},
        layout="multilabel",
    )
    assert chk.check_splits(s, use_cache=False).class_counts == {"train": {"cat": 2, "sky": 1}}


def test_format_report_lines(cache_home: Path, tmp_path: Path) -> None:
    report = chk.check_splits(_dataset(tmp_path / "d"))
    report.imbalance = {"train": 6.0}
    lines = chk.format_report(report)
    root = (tmp_path / "d").resolve()
    assert lines[0] == f"checked 14 images in {root}"
    assert lines[1] == "corrupt or unreadable (quarantined): 1"
    assert lines[2].startswith("  train/b/broken.png: UnidentifiedImageError")
    assert lines[3:] == [
        "exact duplicates across splits (leak): 1",
        "  train:train/b/ok.png = val:val/b/leak.png",
        "tiny images (< 16px): 1",
        "  train/b/tiny.png [15, 40]",
        "unusual modes (converted to the model's channels): 1",
        "  train/b/rgba.png: RGBA",
        "class imbalance in train: largest/smallest class = 6.0×",
        "train: 11 images in 2 classes",
        "val: 2 images in 2 classes",
    ]


def test_format_report_cuts_long_sections(tmp_path: Path) -> None:
    report = chk.CheckReport(root="/r", n_files=30)
    report.tiny = [{"path": f"t{i}.png", "size": [1, 1]} for i in range(12)]
    lines = chk.format_report(report, limit=10)
    assert lines[1] == "tiny images (< 16px): 12"
    assert lines[2:12] == [f"  t{i}.png [1, 1]" for i in range(10)]
    assert lines[12:] == ["  … and 2 more (see --json)"]
    eleven = chk.CheckReport(root="/r", tiny=report.tiny[:11])
    assert chk.format_report(eleven)[-2:] == ["  t9.png [1, 1]", "  … and 1 more (see --json)"]
    exactly = chk.CheckReport(root="/r", tiny=report.tiny[:3])
    assert chk.format_report(exactly, limit=3)[-1] == "  t2.png [1, 1]"
    assert chk.format_report(chk.CheckReport(root="/r")) == ["checked 0 images in /r"]


# ---- edges found by mutation testing (scripts/mutation.sh data) ---------------------------


def test_flat_split_orders_ten_and_more_files_naturally(tmp_path: Path) -> None:
    root = _flat(tmp_path / "d", {"a": 30, "b": 30})
    s = scan(root, val_fraction=0.5, seed=3)
    per_split = [[r for r, c in s.files[split] if c == "a"] for split in ("train", "val")]
    for names in per_split:
        assert len(names) == 15 and names == sorted(names, key=natural_key), names
        assert names != sorted(names)  # each split mixes a/2..a/9 with a/10..: not text order


def test_flat_empty_class_message(tmp_path: Path) -> None:
    _img(tmp_path / "d" / "a" / "x.png")
    (tmp_path / "d" / "b").mkdir()
    with pytest.raises(DataError) as exc:
        scan(tmp_path / "d")
    exts = ", ".join(sorted(IMAGE_EXTENSIONS))
    assert str(exc.value) == (
        f"Class folder(s) with no images in {(tmp_path / 'd').resolve()}/: b. Add images "
        f"(extensions: {exts}) or remove the folder."
    )


def test_multilabel_label_seen_once_goes_to_train(tmp_path: Path) -> None:
    root = tmp_path / "ml"
    rows = ["img/0.png,cat", "img/1.png,cat", "img/2.png,cat", "img/3.png,cat", "img/4.png,owl"]
    for i in range(5):
        _img(root / "img" / f"{i}.png")
    _labels_csv(root, rows)
    s = scan_multilabel(root, val_fraction=0.25, seed=0)
    assert ("img/4.png", "owl") in s.files["train"]
    assert len(s.files["val"]) == 1 and s.files["val"][0][1] == "cat"


def test_check_splits_without_cache_writes_none(cache_home: Path, tmp_path: Path) -> None:
    s = _dataset(tmp_path / "d")
    assert chk.check_splits(s, use_cache=False).n_files == 14
    assert not chk._cache_file(s.root).exists()


# ---- images without labels (zoo distill --unlabelled) ----------------------------------------


def test_unlabelled_images_at_any_depth_are_split_seeded_and_rounded(tmp_path: Path) -> None:
    names = ["a/b/c/deep.JPG", "top.png", "x/y.png", "train/t.png"]  # train/ without val/
    names += [f"many/{i}.png" for i in range(26)]  # thirty images in all
    for n in names:
        _img(tmp_path / "d" / n)
    (tmp_path / "d" / "notes.txt").write_text("not an image")
    root, split = scan_unlabelled(tmp_path / "d" / ".." / "d", val_fraction=0.5, seed=0)
    assert root == (tmp_path / "d").resolve()
    assert list(split) == ["train", "val"] and len(split["val"]) == 15  # round(30 × 0.5)
    assert sorted(split["train"] + split["val"]) == sorted(names)  # relative, each once
    for files in split.values():
        assert files == sorted(files, key=natural_key)
        assert files != sorted(files)  # many/2..9 beside many/10..: not text order
    assert scan_unlabelled(tmp_path / "d", val_fraction=0.5, seed=0)[1] == split  # seeded
    others = [scan_unlabelled(tmp_path / "d", val_fraction=0.5, seed=s)[1] for s in (1, 2, 3)]
    assert any(o != split for o in others)
    assert len(scan_unlabelled(tmp_path / "d")[1]["val"]) == 6  # the default fifth
    assert scan_unlabelled(tmp_path / "d") == scan_unlabelled(tmp_path / "d", seed=0)
    _img(tmp_path / "two" / "1.png")
    _img(tmp_path / "two" / "2.png")
    assert [len(v) for v in scan_unlabelled(tmp_path / "two")[1].values()] == [1, 1]  # ≥ 1 val


def test_unlabelled_train_and_val_folders_are_kept_as_they_are(tmp_path: Path) -> None:
    for n in ["train/b/2.png", "train/10.png", "train/1.png", "valid/v.png"]:
        _img(tmp_path / n)
    root, split = scan_unlabelled(tmp_path, val_fraction=5.0)  # the fraction is not read
    assert split == {
        "train": ["train/1.png", "train/10.png", "train/b/2.png"],
        "val": ["valid/v.png"],
    }
    (tmp_path / "valid" / "v.png").unlink()
    with pytest.raises(DataError) as err:
        scan_unlabelled(tmp_path)
    exts = ", ".join(sorted(IMAGE_EXTENSIONS))
    assert str(err.value) == (
        f"No images for the val split under {root} (extensions: {exts}): add some, or check --data."
    )


def test_unlabelled_refusals(tmp_path: Path) -> None:
    with pytest.raises(DataError) as err:
        scan_unlabelled(tmp_path / "absent")
    assert (
        str(err.value) == f"Data folder {tmp_path / 'absent'} does not exist (or is not a folder)."
    )
    _img(tmp_path / "d" / "1.png")
    for fraction in (0.0, 1.0, -0.5):
        with pytest.raises(UsageError) as usage:
            scan_unlabelled(tmp_path / "d", val_fraction=fraction)
        assert str(usage.value) == (
            f"--val-fraction {fraction!r} is out of range: it must be in (0, 1) (usually 0.2)."
        )
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"^No images for the train split under "):
        scan_unlabelled(tmp_path / "empty")


def test_each_sample_and_epoch_draws_its_own_seed() -> None:
    """The seed of every augmented view: fixed across releases (exact resume reads it) and
    distinct for each (seed, epoch, index) a run meets."""
    assert sample_seed(0, 0, 0) == 0
    assert sample_seed(2, 3, 5) == (2 * 1_000_003 + 3) * 10_000_019 + 5
    grid = [(s, e, i) for s in range(3) for e in range(50) for i in range(2_000)]
    assert len({sample_seed(*g) for g in grid}) == len(grid)
