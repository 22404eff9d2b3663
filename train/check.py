"""Preflight for an image folder: decode every image (in parallel) and report what would hurt
training. The trainer runs the same check, cached by file size + mtime, and quarantines
undecodable files instead of crashing mid-epoch."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from zoo.images import DECODE_VERSION, open_image, to_channels
from zoo.system import available_cpus, cache_home
from zoo.train.data import MULTI_SEP, Splits
from zoo.train.image_cache import ImageCache

TINY_SIDE = 16
# Pixel modes a model reads as stored; every other mode is converted by
# :func:`zoo.images.to_channels` and reported (``odd_modes``), so the two never disagree.
PLAIN_MODES = frozenset({"RGB", "L"})
IMBALANCE_RATIO = 5.0
# 2: sizes are upright (EXIF orientation applied); 3: the decoder's version is part of it.
CACHE_VERSION = f"3-decode{DECODE_VERSION}"


@dataclass
class FileCheck:
    path: str
    ok: bool
    error: str | None = None
    width: int = 0
    height: int = 0
    mode: str | None = None
    sha256: str | None = None


@dataclass
class CheckReport:
    root: str
    n_files: int = 0
    corrupt: list[dict[str, str]] = field(default_factory=list)
    tiny: list[dict[str, Any]] = field(default_factory=list)
    odd_modes: list[dict[str, str]] = field(default_factory=list)
    duplicates_across_splits: list[list[str]] = field(default_factory=list)
    class_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    imbalance: dict[str, float] = field(default_factory=dict)

    @property
    def quarantined(self) -> list[str]:
        return [c["path"] for c in self.corrupt]

    def problems(self) -> int:
        return len(self.corrupt) + len(self.duplicates_across_splits)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["quarantined"] = self.quarantined
        return d


def _check_file(path: Path, cache: ImageCache | None = None) -> FileCheck:
    """Decode one file exactly as training will (``open_image``: EXIF applied, same pixel
    limit; an unusual mode converted to 1 and 3 channels), after PIL's structural ``verify``;
    sizes are the upright ones. With ``cache``, the decoded image is also stored there (the
    decode-once cache costs no second decode)."""
    try:
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        with Image.open(BytesIO(data)) as raw:
            raw.verify()  # structure
        im = open_image(data)  # every pixel: catches truncated files
        if im.mode not in PLAIN_MODES:  # a mode PIL opens may still not convert
            for channels in (1, 3):
                to_channels(im, channels, subject="The image")  # the report names it
        if cache is not None:
            cache.get(path, im)
        return FileCheck(
            str(path), True, width=im.width, height=im.height, mode=im.mode, sha256=digest
        )
    except Exception as exc:  # PIL raises many types for broken files; all mean "unreadable"
        kind = (
            "empty file"
            if path.stat().st_size == 0
            # PIL's message names a BytesIO object's address: say what it means instead
            else "UnidentifiedImageError: not a format PIL reads (JPEG, PNG, WebP, BMP, TIFF, "
            "GIF, ...)"
            if isinstance(exc, UnidentifiedImageError)
            else f"{type(exc).__name__}: {exc}"
        )
        return FileCheck(str(path), False, error=kind)


def _cache_file(root: Path) -> Path:
    return (
        cache_home() / "datacheck" / (hashlib.sha1(str(root).encode()).hexdigest()[:16] + ".json")
    )


def _kept_entries(root: Path, entries: dict[str, Any], *, checked: set[str]) -> dict[str, Any]:
    """The cache entries a rewrite carries over besides this check's own (``checked``): those
    of files still in ``root``. A check of part of the folder (eval's split) must not drop the
    rest, but a deleted, moved or renamed file's entry would otherwise stay in the cache
    forever, and the file (read whole on every check) grow with every change to the folder."""
    return {
        key: entry
        for key, entry in entries.items()
        # os.path.isfile: False on an unreadable folder (Path.is_file raises there on 3.11)
        if key not in checked and Path(key).is_relative_to(root) and os.path.isfile(key)
    }


def check_files(
    root: Path,
    paths: list[Path],
    *,
    workers: int | None = None,
    use_cache: bool = True,
    image_cache: ImageCache | None = None,
) -> dict[str, FileCheck]:
    """Decode ``paths`` in parallel; results are cached by (size, mtime) per data folder.
    ``image_cache``: store each image decoded into it."""
    cache_path = _cache_file(root)
    cache: dict[str, Any] = {}
    if use_cache and cache_path.exists():
        try:
            cache = json.loads(cache_path.read_text())
            if cache.get("version") != CACHE_VERSION:
                cache = {}
        except (OSError, json.JSONDecodeError):
            cache = {}
    entries = cache.get("files", {})
    results: dict[str, FileCheck] = {}
    todo = []
    for p in paths:
        st = p.stat()
        key = str(p)
        hit = entries.get(key)
        if hit and hit["size"] == st.st_size and hit["mtime_ns"] == st.st_mtime_ns:
            results[key] = FileCheck(**hit["check"])
        else:
            todo.append(p)
    if todo:
        with ThreadPoolExecutor(max_workers=workers or max(2, available_cpus() * 2)) as pool:
            for fc in pool.map(lambda p: _check_file(p, image_cache), todo):
                results[fc.path] = fc
        if use_cache:  # merged: a check of some files (eval's split) keeps the others' entries
            new = _kept_entries(root, entries, checked={str(p) for p in paths})
            for p in paths:
                st = p.stat()
                new[str(p)] = {
                    "size": st.st_size,
                    "mtime_ns": st.st_mtime_ns,
                    "check": asdict(results[str(p)]),
                }
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            from zoo.artifact import write_json

            write_json(cache_path, {"version": CACHE_VERSION, "files": new})
    return results


@dataclass(frozen=True)
class Readable:
    """The files of a list that decode, in order, and those that do not (each with why)."""

    paths: tuple[Path, ...]
    unreadable: tuple[FileCheck, ...]


def left_out_note(unreadable: tuple[FileCheck, ...], what: str) -> str | None:
    """A line for stderr naming the ``unreadable`` files of ``what`` left out (None: none)."""
    if not unreadable:
        return None
    first = unreadable[0]
    n = len(unreadable)
    return (
        f"note: {n} of {what} {'does' if n == 1 else 'do'} not decode (changed or damaged; "
        f"e.g. {first.path}: {first.error}) and {'is' if n == 1 else 'are'} left out, as zoo "
        "finetune quarantines them: zoo check DIR lists them all"
    )


def readable(root: Path, paths: list[Path]) -> Readable:
    """``paths`` (under ``root``) decoded as training decodes them (:func:`check_files`:
    cached by size and mtime, so the images of a run's own check cost no second decode)."""
    checks = check_files(root, paths)
    bad = tuple(checks[str(p)] for p in paths if not checks[str(p)].ok)
    if not bad:
        return Readable(tuple(paths), ())
    gone = {fc.path for fc in bad}
    return Readable(tuple(p for p in paths if str(p) not in gone), bad)


def check_splits(
    splits: Splits,
    *,
    workers: int | None = None,
    use_cache: bool = True,
    image_cache: ImageCache | None = None,
) -> CheckReport:
    report = CheckReport(root=str(splits.root))
    all_paths = [
        (split, splits.root / rel, cls)
        for split, items in splits.files.items()
        for rel, cls in items
    ]
    checks = check_files(
        splits.root,
        [p for _, p, _ in all_paths],
        workers=workers,
        use_cache=use_cache,
        image_cache=image_cache,
    )
    report.n_files = len(all_paths)
    by_hash: dict[str, set[tuple[str, str]]] = defaultdict(set)
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for split, p, cls in all_paths:
        fc = checks[str(p)]
        rel = str(p.relative_to(splits.root))
        if not fc.ok:
            report.corrupt.append({"path": rel, "error": fc.error or "unreadable"})
            continue
        for label in cls.split(MULTI_SEP):  # multi-label rows count once per label
            counts[split][label] += 1
        if min(fc.width, fc.height) < TINY_SIDE:
            report.tiny.append({"path": rel, "size": [fc.width, fc.height]})
        if fc.mode not in PLAIN_MODES:
            report.odd_modes.append({"path": rel, "mode": fc.mode or "?"})
        if fc.sha256:
            by_hash[fc.sha256].add((split, rel))
    for group in by_hash.values():
        if len({s for s, _ in group}) > 1:
            report.duplicates_across_splits.append(sorted(f"{s}:{r}" for s, r in group))
    report.class_counts = {s: dict(c) for s, c in counts.items()}
    for split, c in counts.items():
        if c and min(c.values()) > 0:
            ratio = max(c.values()) / min(c.values())
            if ratio >= IMBALANCE_RATIO:
                report.imbalance[split] = round(ratio, 2)
    return report


def format_report(report: CheckReport, limit: int = 10) -> list[str]:
    """Human-readable lines, most serious first."""
    lines = [f"checked {report.n_files} images in {report.root}"]

    def section(title: str, items: list[Any], fmt: Any) -> None:
        if items:
            lines.append(f"{title}: {len(items)}")
            lines.extend("  " + fmt(i) for i in items[:limit])
            if len(items) > limit:
                lines.append(f"  … and {len(items) - limit} more (see --json)")

    section(
        "corrupt or unreadable (quarantined)",
        report.corrupt,
        lambda c: f"{c['path']}: {c['error']}",
    )
    section("exact duplicates across splits (leak)", report.duplicates_across_splits, " = ".join)
    section(f"tiny images (< {TINY_SIDE}px)", report.tiny, lambda t: f"{t['path']} {t['size']}")
    section(
        "unusual modes (converted to the model's channels)",
        report.odd_modes,
        lambda o: f"{o['path']}: {o['mode']}",
    )
    for split, ratio in report.imbalance.items():
        lines.append(f"class imbalance in {split}: largest/smallest class = {ratio}×")
    for split, c in report.class_counts.items():
        lines.append(f"{split}: {sum(c.values())} images in {len(c)} classes")
    return lines
