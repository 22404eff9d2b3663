"""Every durable write (a training run's folder, ``zoo predict --out``'s chunks, every artifact
zoo writes) goes through this module: atomic, and, where a crash test walks them, countable.

A write is built in a hidden temporary file (``.<name>.<random>.tmp``) beside its target,
flushed and fsynced, given the umask's modes (:func:`share_modes`: 0644 under umask 022,
whatever the writer created it with), then ``os.replace``-d over it: a kill at any moment leaves either the
old file or the new one, never a half-written one, plus at most a stale temporary file that
:func:`remove_stale_temps` deletes on resume. A folder (a model folder, a bundle, a Triton
model, an OpenVINO IR) is built the same way in a hidden temporary folder and swapped in whole
(:func:`replace_dir`): the old folder or the new one, never neither.

Each write passes two *fault points*: inside (the temporary file is complete, the target is
not yet replaced) and after (the new content is visible). For crash tests,
``ZOO_FAULT_KILL_AT=N`` makes the process SIGKILL itself right after the Nth durable write of
the process (``N:inside``: between its temporary write and its rename), and
``ZOO_FAULT_TRACE=FILE`` appends ``N<TAB>label`` for every write, which counts the write
boundaries of a run exactly. Hand-written because no library offers a countable,
killable atomic-write primitive; the atomic write itself is the standard temp + fsync + rename.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from zoo.errors import InputError

KILL_ENV = "ZOO_FAULT_KILL_AT"
TRACE_ENV = "ZOO_FAULT_TRACE"
TMP_SUFFIX = ".tmp"
TOKEN_BYTES = 4  # a temporary name's random part: 8 hex digits
TEMP_NAME = re.compile(rf"\.(?P<name>.+)\.(?:[a-z0-9_]{{8}}|old){re.escape(TMP_SUFFIX)}")
"""The temporary names zoo makes beside a target ``NAME``: ``.NAME.<token>.tmp``
(:func:`temp_path`: 8 hex digits; :func:`scratch_dir`: :mod:`tempfile`'s 8 characters) and
``.NAME.old.tmp`` (:func:`replace_dir`'s parked old folder)."""

_writes = 0  # durable writes done by this process


def _fault_point(n: int, *, inside: bool) -> None:
    """SIGKILL this process if ``ZOO_FAULT_KILL_AT`` names write ``n`` and this side of it."""
    target = os.environ.get(KILL_ENV)
    if not target:
        return
    at, _, where = target.partition(":")
    if int(at) == n and (where == "inside") == inside:
        os.kill(os.getpid(), signal.SIGKILL)


def boundary(label: str) -> None:
    """Count one durable write (already visible) and pass its 'after' fault point.

    Args:
        label: what was written, relative to the run folder (for the trace).
    """
    global _writes
    _writes += 1
    trace = os.environ.get(TRACE_ENV)
    if trace:
        with open(trace, "a") as f:
            f.write(f"{_writes}\t{label}\n")
    _fault_point(_writes, inside=False)


def inside() -> None:
    """The 'inside' fault point of the write being made (the next one): call it once that
    write has begun and before it is complete (for a temporary file: before its rename)."""
    _fault_point(_writes + 1, inside=True)


def _sync_dir(folder: Path) -> None:
    """fsync a folder, so that a rename in it reaches the disk in order (a power cut, not
    only a kill, then leaves the old or the new file)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process's umask: Linux shows it in /proc (read without changing it); elsewhere it
    is read by setting it and putting it back, as POSIX has no getter."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    with _UMASK_LOCK:  # set and put back: two threads at once must not leave 022 behind
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def share_modes(root: Path) -> None:
    """Give ``root`` (a file, or a folder and everything in it) the modes a plain ``open``
    would: ``0o666``/``0o777`` less the umask (0644/0755 under umask 022). Writers such as
    safetensors create their files 0600, which would leave one file of a folder unreadable
    to the group when the rest is readable; an execute bit a file has is kept."""
    mask = _umask()
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    for p in paths:
        if p.is_symlink():
            continue
        if p.is_dir():
            os.chmod(p, 0o777 & ~mask)
        else:
            os.chmod(p, (0o666 | (p.stat().st_mode & 0o111)) & ~mask)


def temp_path(target: Path, *, folder: bool = False) -> Path:
    """Create a fresh hidden temporary file (or folder) beside ``target``, with the usual
    umask permissions (removed on resume if a kill leaves it)."""
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(TOKEN_BYTES)}{TMP_SUFFIX}")
        try:
            if folder:
                os.mkdir(tmp)
            else:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def scratch_dir(target: Path) -> tempfile.TemporaryDirectory[str]:
    """A hidden scratch folder beside ``target`` for the work that makes it (on its file
    system, so the result moves in by rename), removed on exit: ``.NAME.<random>.tmp``, a
    :data:`TEMP_NAME`, so an error inside it names ``target`` (:func:`destination_of`) and a
    kill's leftover is swept with the other temporary files (:func:`remove_stale_temps`)."""
    return tempfile.TemporaryDirectory(
        dir=target.parent, prefix=f".{target.name}.", suffix=TMP_SUFFIX
    )


def destination_of(path: str | os.PathLike[str]) -> Path | None:
    """The path a user asked for, when ``path`` is one of this module's temporary files or
    folders (:data:`TEMP_NAME`) or lies inside one: ``out/.m.onnx.1a2b3c4d.tmp`` →
    ``out/m.onnx``, ``runs/.model.1a2b3c4d.tmp/config.json`` → ``runs/model/config.json``.
    A message about a failed write (a full disk, a permission) names that path, not a hidden
    name the user never gave and that is gone once the write fails.

    Returns:
        None: no part of ``path`` is such a temporary name.
    """
    parts = Path(path).parts
    named = [m["name"] if (m := TEMP_NAME.fullmatch(part)) else part for part in parts]
    return None if named == list(parts) else Path(*named)


def write_with(
    path: Path, fill: Callable[[IO[bytes]], object], *, label: str | None, sync: bool = True
) -> None:
    """Atomically write ``path`` with what ``fill(file)`` writes into a binary file.

    ``label`` names the write for fault injection; ``None`` for a write outside a run folder
    (a cache, a lock file): atomic, but not a fault point. ``sync=False`` skips the fsyncs:
    still whole or absent after a kill, not after a power cut; for many small files a rerun
    makes again (``zoo example``'s 1,797 digits took 12 s fsynced, 2 s without).

    Raises:
        Whatever ``fill`` raises; the temporary file is removed and ``path`` is untouched.
    """
    with file_output(path, label=label, sync=sync) as tmp, open(tmp, "wb") as f:
        fill(f)


def refuse_folder(path: Path, *, flag: str, writes: str, name: str) -> None:
    """Refuse a file output that names a folder, before any work is done for it (else the
    final rename fails once the work is done). The one place for this message.

    Args:
        flag: the option that named ``path`` (``-o``, ``--report-out``).
        writes: what goes there, for the message ("zoo quantize writes one int8 .onnx file").
        name: a file name to suggest inside the folder.

    Raises:
        InputError: ``path`` is a folder, or a folder above it is a file.
    """
    if path.is_dir():
        raise InputError(
            f"{flag} {path} is a folder; {writes}: name the file (e.g. {flag} {path / name})."
        )
    refuse_file_above(path, flag=flag)


def refuse_file_above(path: Path, *, flag: str) -> None:
    """Refuse an output path under an existing file (``ev.json/r.html``), before any work:
    no folder can be made there.

    Raises:
        InputError: a parent of ``path`` is a file (not a folder).
    """
    for parent in Path(path).parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(
                    f"{flag} {path}: {parent} is a file, not a folder, so nothing can be "
                    "written under it; name a path in a folder."
                )
            return


@contextmanager
def file_output(path: Path, *, label: str | None = None, sync: bool = True) -> Iterator[Path]:
    """A fresh temporary path beside ``path`` for a writer that takes a file name (an ONNX
    exporter). When the block succeeds the file is fsynced, given the umask's modes and moved
    over ``path`` in one step; when it raises, the temporary file goes and ``path`` is
    untouched. ``label``, ``sync``: as for :func:`write_with`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        if sync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        share_modes(tmp)
        if label is not None:
            inside()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        _sync_dir(path.parent)
    if label is not None:
        boundary(label)


def write_bytes(path: Path, data: bytes, *, label: str | None, sync: bool = True) -> None:
    write_with(path, lambda f: f.write(data), label=label, sync=sync)


def write_text(path: Path, text: str, *, label: str | None) -> None:
    write_bytes(path, text.encode("utf-8"), label=label)


def write_json(path: Path, obj: Any, *, label: str | None) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n", label=label)


def copy_file(src: Path, dst: Path, *, label: str) -> None:
    """Atomically make ``dst`` a byte copy of ``src``."""
    with open(src, "rb") as s:
        write_with(dst, lambda f: shutil.copyfileobj(s, f, 1 << 20), label=label)


def remove(path: Path, *, label: str) -> None:
    """Delete ``path`` (a durable write too: the run folder changes)."""
    if path.exists():
        path.unlink()
        _sync_dir(path.parent)
        boundary(label)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns:
        False where the platform or the file system cannot (nothing moved).

    Raises:
        OSError: the swap was possible but failed (a missing path, a permission).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # a C library older than glibc 2.28
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def replace_dir(src: Path, dst: Path, *, label: str | None) -> None:
    """Move the complete folder ``src`` to ``dst``, replacing an old ``dst``.

    An old ``dst`` is swapped with ``src`` in one atomic step (:func:`_exchange`), then
    deleted from ``src``'s hidden name: a kill leaves either the old complete folder or the
    new complete one, never neither (plus a stale temporary folder). Where the file system
    cannot swap, the old folder is first renamed to ``.<dst>.old.tmp``: between the two
    renames there is no ``dst`` at all.

    Args:
        src: the complete new folder (a hidden temporary one, on ``dst``'s file system).
        dst: the folder to replace or create.
        label: as for :func:`write_with`.
    """
    share_modes(src)
    if label is not None:
        inside()
    parked = dst.with_name(f".{dst.name}.old{TMP_SUFFIX}")  # the fallback's, maybe stale
    shutil.rmtree(parked, ignore_errors=True)
    old = None
    if dst.exists():
        if _exchange(src, dst):
            old = src  # now holding the old folder
        else:
            old = parked
            os.replace(dst, old)
            os.replace(src, dst)
    else:
        os.replace(src, dst)
    _sync_dir(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    if label is not None:
        boundary(label)


def publish_dir(src: Path, dst: Path, *, label: str) -> bool:
    """Rename the complete folder ``src`` to the new name ``dst`` (one atomic step).

    Returns:
        False when ``dst`` is already taken (nothing moved): pick another name.
    """
    share_modes(src)
    inside()
    if dst.exists():
        return False
    try:
        os.rename(src, dst)  # onto a non-empty folder fails: two runs never share one
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise
    _sync_dir(dst.parent)
    boundary(label)
    return True


def remove_stale_temps(root: Path) -> list[Path]:
    """Delete the hidden ``.*.tmp`` files and folders a killed process left under ``root``.

    Returns:
        What was removed.
    """
    stale = sorted(root.rglob(f".*{TMP_SUFFIX}"), key=lambda p: len(p.parts), reverse=True)
    for p in stale:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return stale


__all__ = [
    "KILL_ENV",
    "TRACE_ENV",
    "boundary",
    "copy_file",
    "destination_of",
    "inside",
    "publish_dir",
    "remove",
    "remove_stale_temps",
    "replace_dir",
    "share_modes",
    "temp_path",
    "write_bytes",
    "write_json",
    "write_text",
    "write_with",
]
