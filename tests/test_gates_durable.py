"""zoo/durable.py on small files in tmp (no training, no subprocess, seconds): the atomic
writes, their order (file fsync, rename, folder fsync), the fault points and the trace that
counts them, the folder swaps and the stale-temporary sweep. The fast tests
scripts/mutation.sh runs against zoo/durable.py; a real SIGKILL at a fault point is
test_crash_consistency.py's ``test_fault_point_kills_at_the_named_side_of_the_named_write``.

Here ``os.kill`` is replaced by a recorder that snapshots the folder at the moment the
process would have died, so each fault point is checked for *where* it lies, not only that
it fires."""

from __future__ import annotations

import errno
import os
import re
import signal
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from zoo import durable
from zoo.errors import InputError


class Killed(BaseException):
    """What the recorder raises when a test wants the 'process' to stop at the kill."""


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative name → text), folders as ``name/``."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel + ("/" if p.is_dir() else "")] = "" if p.is_dir() else p.read_text()
    return out


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(pid, signal) of each self-kill, recorded instead of dying; a fresh write count."""
    got: list[tuple[int, int]] = []
    monkeypatch.setattr(durable, "_writes", 0)
    monkeypatch.delenv(durable.KILL_ENV, raising=False)
    monkeypatch.delenv(durable.TRACE_ENV, raising=False)
    monkeypatch.setattr(durable.os, "kill", lambda pid, sig: got.append((pid, sig)))
    return got


@pytest.fixture
def trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The ``ZOO_FAULT_TRACE`` file, set for the test."""
    path = tmp_path / "trace.tsv"
    monkeypatch.setenv(durable.TRACE_ENV, str(path))
    return path


def _trace(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# ---- the fault points ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "fires"),
    [
        (None, []),
        ("", []),
        ("3", [(3, False)]),
        ("3:inside", [(3, True)]),
        ("2", [(2, False)]),
        ("2:inside", [(2, True)]),
    ],
)
def test_fault_point_fires_at_one_write_and_one_side(
    env: str | None,
    fires: list[tuple[int, bool]],
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if env is not None:
        monkeypatch.setenv(durable.KILL_ENV, env)
    fired = []
    for n in (1, 2, 3, 4):
        for inside in (True, False):
            before = len(kills)
            durable._fault_point(n, inside=inside)
            if len(kills) > before:
                fired.append((n, inside))
    assert fired == fires
    assert all(k == (os.getpid(), signal.SIGKILL) for k in kills)


def test_boundary_counts_traces_and_fires_after(
    tmp_path: Path, kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "trace.tsv"
    trace.write_text("0\tearlier\n")  # the trace is appended to, never truncated
    monkeypatch.setenv(durable.TRACE_ENV, str(trace))
    monkeypatch.setenv(durable.KILL_ENV, "2")
    durable.boundary("a")
    assert kills == []
    durable.boundary("b/c.pt")
    assert kills == [(os.getpid(), signal.SIGKILL)]
    durable.boundary("d")
    assert durable._writes == 3 and len(kills) == 1
    assert trace.read_text() == "0\tearlier\n1\ta\n2\tb/c.pt\n3\td\n"


def test_inside_names_the_next_write(
    kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(durable.KILL_ENV, "2:inside")
    durable.inside()  # write 1 begins
    assert kills == []
    durable.boundary("one")
    durable.inside()  # write 2 begins
    assert kills == [(os.getpid(), signal.SIGKILL)]
    assert durable._writes == 1  # inside() does not count a write


# ---- atomic writes ------------------------------------------------------------------------


def test_write_with_order_fsync_file_then_rename_then_fsync_folder(
    tmp_path: Path, kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a" / "sub" / "f.bin"  # the parent folders are created
    events: list[Any] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        events.append(("fsync dir",) if stat.S_ISDIR(st.st_mode) else ("fsync file", st.st_size))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(("replace", Path(src).parent == Path(dst).parent, Path(dst).name))
        real_replace(src, dst)

    def fault(n: int, *, inside: bool) -> None:
        events.append(("fault", n, inside))

    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(durable.os, "replace", replace)
    monkeypatch.setattr(durable, "_fault_point", fault)

    def fill(f: Any) -> None:
        events.append("fill")
        f.write(b"12345")

    durable.write_with(target, fill, label="sub/f.bin")
    assert events == [
        "fill",
        ("fsync file", 5),  # flushed before the fsync: the whole content reaches the disk
        ("fault", 1, True),
        ("replace", True, "f.bin"),  # a rename within the folder
        ("fsync dir",),  # then the folder, so that the rename reaches the disk too
        ("fault", 1, False),
    ]
    assert target.read_bytes() == b"12345" and _temps(target.parent) == []
    events.clear()
    durable.write_with(target, fill, label=None)  # atomic, but not a fault point
    assert [e if isinstance(e, str) else e[0] for e in events] == [
        "fill",
        "fsync file",
        "replace",
        "fsync dir",
    ]
    events.clear()
    durable.write_with(target, fill, label=None, sync=False)  # atomic against a kill only
    assert [e if isinstance(e, str) else e[0] for e in events] == ["fill", "replace"]
    for write, sync in [
        (lambda **kw: durable.write_bytes(target, b"bytes", label=None, **kw), True),
        (lambda **kw: durable.write_text(target, "text", label=None, **kw), True),
        (lambda **kw: durable.write_bytes(target, b"bytes", label=None, sync=False, **kw), False),
    ]:
        events.clear()
        write()
        assert [e[0] for e in events] == (
            ["fsync file", "replace", "fsync dir"] if sync else ["replace"]
        )
    assert target.read_bytes() == b"bytes"
    assert durable._writes == 1


def test_fill_failing_leaves_the_old_file_and_no_temporary(
    tmp_path: Path,
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    trace: Path,
) -> None:
    target = tmp_path / "run" / "f.txt"
    target.parent.mkdir()
    target.write_text("old")

    def half(f: Any) -> None:
        f.write(b"half of the new")
        raise OSError(errno.ENOSPC, "disk full")

    with pytest.raises(OSError, match="disk full"):
        durable.write_with(target, half, label="f.txt")

    def interrupted(f: Any) -> None:
        f.write(b"half")
        raise KeyboardInterrupt  # not an Exception: cleaned up all the same

    with pytest.raises(KeyboardInterrupt):
        durable.write_with(target, interrupted, label="f.txt")
    assert target.read_text() == "old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.txt"]
    assert _trace(trace) == [] and durable._writes == 0 and kills == []


def test_kill_inside_a_write_sees_old_target_and_complete_temporary(
    tmp_path: Path, kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old")
    seen: list[dict[str, str]] = []
    monkeypatch.setattr(durable.os, "kill", lambda pid, sig: seen.append(_snapshot(tmp_path)))
    monkeypatch.setenv(durable.KILL_ENV, "2:inside")
    durable.write_text(target, "first", label="f.txt")
    durable.write_text(target, "second", label="f.txt")
    assert len(seen) == 1
    temp = [k for k in seen[0] if k != "f.txt"]
    assert seen[0]["f.txt"] == "first"  # the old content at the moment of the kill
    assert len(temp) == 1 and re.fullmatch(r"\.f\.txt\.[0-9a-f]{8}\.tmp", temp[0])
    assert seen[0][temp[0]] == "second"  # the new one complete beside it, not yet renamed
    assert target.read_text() == "second" and _temps(tmp_path) == []


def test_kill_after_a_write_sees_the_new_file_and_no_temporary(
    tmp_path: Path, kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.txt"
    seen: list[dict[str, str]] = []
    monkeypatch.setattr(durable.os, "kill", lambda pid, sig: seen.append(_snapshot(tmp_path)))
    monkeypatch.setenv(durable.KILL_ENV, "1")
    durable.write_text(target, "new", label="f.txt")
    assert seen == [{"f.txt": "new"}]


def test_unlabelled_writes_are_atomic_but_neither_counted_nor_killed(
    tmp_path: Path,
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    trace: Path,
) -> None:
    monkeypatch.setenv(durable.KILL_ENV, "1:inside")
    out = tmp_path / "out"
    durable.write_bytes(out / "a.bin", b"\x00\x01", label=None)
    durable.write_json(out / "b.json", {"k": [1]}, label=None)
    src = out / "new"
    src.mkdir()
    durable.replace_dir(src, out / "model", label=None)
    assert kills == [] and _trace(trace) == [] and durable._writes == 0
    monkeypatch.setenv(durable.KILL_ENV, "1")
    durable.write_text(out / "c.txt", "x", label=None)
    assert kills == []
    durable.write_text(out / "c.txt", "y", label="c.txt")  # now write 1, after side
    assert kills == [(os.getpid(), signal.SIGKILL)] and _trace(trace) == ["1\tc.txt"]


def test_the_trace_counts_every_kind_of_write_exactly(
    tmp_path: Path,
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    trace: Path,
) -> None:
    run = tmp_path / "run"
    durable.write_bytes(run / "a.bin", b"a", label="a.bin")
    durable.write_text(run / "b.txt", "b", label="b.txt")
    durable.write_json(run / "c.json", [1], label="c.json")
    durable.copy_file(run / "a.bin", run / "d.bin", label="d.bin")
    durable.remove(run / "d.bin", label="d.bin")
    durable.remove(run / "never-there", label="never-there")  # nothing removed: no write
    src = run / ".m.new"
    src.mkdir()
    durable.replace_dir(src, run / "model", label="model")
    dst = tmp_path / "pub"
    (tmp_path / "folder").mkdir()
    assert durable.publish_dir(tmp_path / "folder", dst, label=".")
    assert _trace(trace) == [
        "1\ta.bin",
        "2\tb.txt",
        "3\tc.json",
        "4\td.bin",
        "5\td.bin",
        "6\tmodel",
        "7\t.",
    ]


def test_text_and_json_encodings(tmp_path: Path, kills: list[tuple[int, int]]) -> None:
    durable.write_text(tmp_path / "t.txt", "é\n", label="t.txt")
    assert (tmp_path / "t.txt").read_bytes() == b"\xc3\xa9\n"
    durable.write_json(tmp_path / "c.json", {"a": [1, 2], "b": "é"}, label="c.json")
    assert (tmp_path / "c.json").read_text() == (
        '{\n  "a": [\n    1,\n    2\n  ],\n  "b": "\\u00e9"\n}\n'
    )


# ---- temporary names ----------------------------------------------------------------------


def test_temp_path_is_fresh_hidden_beside_the_target(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        f = durable.temp_path(tmp_path / "last.pt")
        d = durable.temp_path(tmp_path / "model", folder=True)
    finally:
        os.umask(old)
    assert f.parent == d.parent == tmp_path
    assert re.fullmatch(r"\.last\.pt\.[0-9a-f]{8}\.tmp", f.name), f.name
    assert re.fullmatch(r"\.model\.[0-9a-f]{8}\.tmp", d.name), d.name
    assert f.is_file() and f.read_bytes() == b"" and d.is_dir() and not any(d.iterdir())
    assert stat.S_IMODE(f.stat().st_mode) == 0o644  # 0o666 less the umask
    assert stat.S_IMODE(d.stat().st_mode) == 0o755


def test_destination_of_maps_a_temporary_name_back_to_its_target(tmp_path: Path) -> None:
    """Every temporary name this module makes reads back as the path it was made for, with
    what lies inside a temporary folder; any other path is not one."""
    f = durable.temp_path(tmp_path / "m.onnx")
    d = durable.temp_path(tmp_path / "model", folder=True)
    assert durable.destination_of(f) == tmp_path / "m.onnx"
    assert durable.destination_of(d / "config.json") == tmp_path / "model" / "config.json"
    assert durable.destination_of(tmp_path / ".model.old.tmp") == tmp_path / "model"
    with durable.scratch_dir(tmp_path / "m.int8.onnx") as scratch:
        inside = Path(scratch) / "q.onnx"
        assert durable.destination_of(inside) == tmp_path / "m.int8.onnx" / "q.onnx"
    for other in ("m.onnx", ".bashrc", "b.tmp", ".x.tmp", ".x.zzzzzzzzz.tmp", "tmp_outputs"):
        assert durable.destination_of(tmp_path / other) is None, other


@pytest.mark.parametrize("folder", [False, True])
def test_temp_path_retries_a_taken_name(
    folder: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = iter(["aaaaaaaa", "aaaaaaaa", "bbbbbbbb"])
    asked: list[int] = []

    def token_hex(n: int) -> str:
        asked.append(n)
        return next(names)

    monkeypatch.setattr(durable.secrets, "token_hex", token_hex)
    taken = tmp_path / ".x.aaaaaaaa.tmp"
    taken.write_text("someone else's")
    got = durable.temp_path(tmp_path / "x", folder=folder)
    assert got == tmp_path / ".x.bbbbbbbb.tmp" and asked == [4, 4, 4]  # taken twice, then free
    assert taken.read_text() == "someone else's"  # never truncated nor reused
    assert got.is_dir() == folder


# ---- copy, remove -------------------------------------------------------------------------


def test_copy_file_is_a_byte_copy(tmp_path: Path, kills: list[tuple[int, int]]) -> None:
    src = tmp_path / "last.pt"
    data = os.urandom((1 << 20) + 123)  # more than one chunk
    src.write_bytes(data)
    dst = tmp_path / "ckpt" / "best.pt"
    durable.copy_file(src, dst, label="checkpoints/best.pt")
    assert dst.read_bytes() == data and src.read_bytes() == data
    assert _temps(dst.parent) == []
    with pytest.raises(FileNotFoundError):
        durable.copy_file(tmp_path / "missing", tmp_path / "x", label="x")
    assert not (tmp_path / "x").exists() and _temps(tmp_path) == []


def test_remove_deletes_and_counts_only_what_exists(
    tmp_path: Path,
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    trace: Path,
) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(durable, "_sync_dir", synced.append)
    f = tmp_path / "ck" / "epoch001.pt"
    f.parent.mkdir()
    f.write_text("x")
    durable.remove(f, label="checkpoints/epoch001.pt")
    durable.remove(f, label="checkpoints/epoch001.pt")
    assert not f.exists() and synced == [f.parent]
    assert _trace(trace) == ["1\tcheckpoints/epoch001.pt"]


# ---- folders ------------------------------------------------------------------------------


def _folder(path: Path, **files: str) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def test_replace_dir_onto_nothing_and_onto_an_old_folder(
    tmp_path: Path,
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    trace: Path,
) -> None:
    run = tmp_path / "run"
    durable.replace_dir(_folder(run / ".a.tmp", w="1"), run / "model", label="model")
    assert _snapshot(run) == {"model/": "", "model/w": "1"}
    # a stale .old.tmp from an earlier kill is cleared first, and the old folder goes
    _folder(run / ".model.old.tmp", junk="stale")
    durable.replace_dir(_folder(run / ".b.tmp", w="2", x="3"), run / "model", label="model")
    assert _snapshot(run) == {"model/": "", "model/w": "2", "model/x": "3"}
    assert _trace(trace) == ["1\tmodel", "2\tmodel"]


@pytest.mark.parametrize("at", ["inside", "after"])
def test_replace_dir_swaps_old_for_new_in_one_step(
    at: str, tmp_path: Path, kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the file system swaps (Linux's RENAME_EXCHANGE): a kill leaves the old complete
    folder or the new complete one, never neither; the old one waits under the new one's
    temporary name until it is deleted."""
    run = tmp_path / "run"
    _folder(run / "model", w="old")
    _folder(run / ".new.tmp", w="new")
    swaps: list[dict[str, str]] = []
    real_exchange = durable._exchange

    def exchange(a: Path, b: Path) -> bool:
        assert real_exchange(a, b)
        swaps.append(_snapshot(run))
        return True

    def kill(pid: int, sig: int) -> None:
        raise Killed

    monkeypatch.setattr(durable, "_exchange", exchange)
    monkeypatch.setattr(durable.os, "kill", kill)
    monkeypatch.setenv(durable.KILL_ENV, {"inside": "1:inside", "after": "1"}[at])
    with pytest.raises(Killed):
        durable.replace_dir(run / ".new.tmp", run / "model", label="model")
    if at == "inside":  # nothing moved yet: the old complete folder
        assert swaps == []
        assert _snapshot(run) == {
            ".new.tmp/": "",
            ".new.tmp/w": "new",
            "model/": "",
            "model/w": "old",
        }
    else:  # the new complete one, the old one already gone
        assert swaps == [{".new.tmp/": "", ".new.tmp/w": "old", "model/": "", "model/w": "new"}]
        assert _snapshot(run) == {"model/": "", "model/w": "new"}
    removed = durable.remove_stale_temps(run)
    assert not [p for p in run.iterdir() if p.name.startswith(".")]
    assert len(removed) == {"inside": 1, "after": 0}[at]


def test_exchange_swaps_two_folders_and_says_when_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _folder(tmp_path / "a", w="a"), _folder(tmp_path / "b", w="b", x="x")
    assert durable._exchange(a, b) is True
    assert _snapshot(tmp_path) == {"a/": "", "a/w": "b", "a/x": "x", "b/": "", "b/w": "a"}
    with pytest.raises(FileNotFoundError):
        durable._exchange(tmp_path / "missing", a)
    monkeypatch.setattr(durable.sys, "platform", "darwin")
    assert durable._exchange(a, b) is False
    assert _snapshot(tmp_path) == {"a/": "", "a/w": "b", "a/x": "x", "b/": "", "b/w": "a"}


@pytest.mark.parametrize("at", ["inside", "between", "after"])
def test_replace_dir_without_a_swap_leaves_old_none_or_new(
    at: str, tmp_path: Path, kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the file system cannot swap: two renames, with no folder between them."""
    run = tmp_path / "run"
    _folder(run / "model", w="old")
    _folder(run / ".new.tmp", w="new")
    real_replace = os.replace
    calls: list[str] = []

    def replace(src: Any, dst: Any) -> None:
        calls.append(Path(dst).name)
        if at == "between" and len(calls) == 2:
            raise Killed  # killed between the two renames
        real_replace(src, dst)

    def kill(pid: int, sig: int) -> None:
        raise Killed

    monkeypatch.setattr(durable, "_exchange", lambda a, b: False)
    monkeypatch.setattr(durable.os, "replace", replace)
    monkeypatch.setattr(durable.os, "kill", kill)
    monkeypatch.setenv(durable.KILL_ENV, {"inside": "1:inside", "between": "", "after": "1"}[at])
    with pytest.raises(Killed):
        durable.replace_dir(run / ".new.tmp", run / "model", label="model")
    if at == "inside":  # nothing moved yet: the old complete folder
        assert calls == []
        assert _snapshot(run) == {
            ".new.tmp/": "",
            ".new.tmp/w": "new",
            "model/": "",
            "model/w": "old",
        }
    elif at == "between":  # no model at all: the old one waits under its .old.tmp name
        assert calls == [".model.old.tmp", "model"]
        assert _snapshot(run) == {
            ".model.old.tmp/": "",
            ".model.old.tmp/w": "old",
            ".new.tmp/": "",
            ".new.tmp/w": "new",
        }
    else:  # the new complete one, the old one already gone
        assert _snapshot(run) == {"model/": "", "model/w": "new"}
    removed = durable.remove_stale_temps(run)
    assert not [p for p in run.iterdir() if p.name.startswith(".")]
    assert len(removed) == {"inside": 1, "between": 2, "after": 0}[at]


def test_publish_dir_moves_a_complete_folder_to_a_free_name(
    tmp_path: Path,
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    trace: Path,
) -> None:
    monkeypatch.setenv(durable.KILL_ENV, "1:inside")
    root = tmp_path / "runs"
    src = _folder(root / ".r.tmp", c="1")
    assert durable.publish_dir(src, root / "r", label=".") is True
    assert kills == [(os.getpid(), signal.SIGKILL)]  # the inside point precedes the rename
    assert _snapshot(root) == {"r/": "", "r/c": "1"}
    assert _trace(trace) == ["1\t."]


def test_publish_dir_refuses_a_taken_name(
    tmp_path: Path,
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    trace: Path,
) -> None:
    root = tmp_path / "runs"
    src = _folder(root / ".r.tmp", c="new")
    _folder(root / "r", c="other run")
    (root / "e").mkdir()  # even an empty folder is someone's
    assert durable.publish_dir(src, root / "r", label=".") is False
    assert durable.publish_dir(src, root / "e", label=".") is False
    assert (root / "r" / "c").read_text() == "other run" and (src / "c").read_text() == "new"
    assert not any((root / "e").iterdir())
    assert _trace(trace) == []


def _racing_rename(make: Callable[[Path], None]) -> Callable[[Any, Any], None]:
    """``os.rename`` that lets another process take ``dst`` just before it renames."""
    real = os.rename

    def rename(src: Any, dst: Any) -> None:
        make(Path(dst))
        real(src, dst)

    return rename


def test_publish_dir_loses_a_race_for_the_name(
    tmp_path: Path,
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    trace: Path,
) -> None:
    root = tmp_path / "runs"
    src = _folder(root / ".r.tmp", c="new")
    taken = lambda dst: _folder(dst, c="theirs")  # noqa: E731  (rename: ENOTEMPTY)
    monkeypatch.setattr(durable.os, "rename", _racing_rename(taken))
    assert durable.publish_dir(src, root / "r", label=".") is False
    assert (root / "r" / "c").read_text() == "theirs" and (src / "c").read_text() == "new"
    for code in (errno.EEXIST, errno.ENOTEMPTY):

        def refused(src: Any, dst: Any, code: int = code) -> None:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(durable.os, "rename", refused)
        assert durable.publish_dir(src, root / "s", label=".") is False

    def no_access(src: Any, dst: Any) -> None:
        raise OSError(errno.EACCES, "permission denied")

    monkeypatch.setattr(durable.os, "rename", no_access)  # any other failure is raised
    with pytest.raises(OSError) as exc:
        durable.publish_dir(src, root / "s", label=".")
    assert exc.value.errno == errno.EACCES
    assert _trace(trace) == []


# ---- the stale-temporary sweep ------------------------------------------------------------


def test_remove_stale_temps_deepest_first_and_only_hidden_tmp(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / ".last.pt.1234abcd.tmp").write_text("half")
    _folder(run / ".model.5678.tmp" / ".inner.x.tmp", a="1")
    (run / ".model.5678.tmp" / "w").write_text("w")
    keep = ["report.tmp", ".hidden", "checkpoints/last.pt", "x.tmp.bak"]
    for name in keep:
        (run / name).write_text("keep")
    removed = durable.remove_stale_temps(run)
    assert [p.relative_to(run).as_posix() for p in removed] == [
        ".model.5678.tmp/.inner.x.tmp",  # deepest first
        "checkpoints/.last.pt.1234abcd.tmp",
        ".model.5678.tmp",
    ]
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()) == sorted(
        keep
    )
    assert durable.remove_stale_temps(run) == []


def test_remove_stale_temps_unlinks_symlinks_never_their_target(tmp_path: Path) -> None:
    outside = _folder(tmp_path / "outside", precious="yes")
    (outside / ".own.tmp").write_text("not the run's")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".link.tmp").symlink_to(outside, target_is_directory=True)
    (run / ".dangling.tmp").symlink_to(tmp_path / "nowhere")
    removed = durable.remove_stale_temps(run)
    assert sorted(p.name for p in removed) == [".dangling.tmp", ".link.tmp"]
    assert list(run.iterdir()) == []
    assert _snapshot(outside) == {".own.tmp": "not the run's", "precious": "yes"}


def test_a_temporary_removed_by_someone_else_meanwhile_is_no_error(
    tmp_path: Path, kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process (a second sweep of the same folder) removes each temporary just
    before this one does: the sweep and the folder swap still complete."""
    real_rmtree, real_unlink = durable.shutil.rmtree, Path.unlink
    gone: list[str] = []

    def rmtree(path: Any, **kw: Any) -> None:
        if Path(path).exists():
            real_rmtree(path)
            gone.append(Path(path).name)
        real_rmtree(path, **kw)

    def unlink(self: Path, **kw: Any) -> None:
        if self.is_symlink() or self.exists():
            os.remove(self)
            gone.append(self.name)
        real_unlink(self, **kw)

    monkeypatch.setattr(durable.shutil, "rmtree", rmtree)
    monkeypatch.setattr(Path, "unlink", unlink)
    run = tmp_path / "run"
    _folder(run / ".model.1234.tmp", w="half")
    (run / ".last.pt.5678.tmp").write_text("half")
    assert len(durable.remove_stale_temps(run)) == 2
    _folder(run / "model", w="old")
    durable.replace_dir(_folder(run / ".new.tmp", w="new"), run / "model", label="model")
    assert _snapshot(run) == {"model/": "", "model/w": "new"}
    assert sorted(gone) == [".last.pt.5678.tmp", ".model.1234.tmp", ".new.tmp"]  # the old model


# ---- modes: the umask's, whatever the writer created ----------------------------------------


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    """Set this process's umask for the test (``umask(0o027)``); the old one comes back."""
    set_umask = os.umask  # the real one, whatever a test patches
    old = set_umask(0o022)
    set_umask(old)
    yield set_umask
    set_umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_umask_is_read_from_proc_without_setting_it(
    mask: int, umask: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    umask(mask)
    set_to: list[int] = []
    monkeypatch.setattr(durable.os, "umask", set_to.append)  # a read must not set it
    assert durable._umask() == mask
    assert set_to == []


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_umask_without_proc_is_set_and_put_back(
    mask: int, umask: Callable[[int], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where /proc is absent (macOS) or unreadable, the umask is read by setting it."""
    umask(mask)
    real_read_text = Path.read_text

    def read_text(self: Path, *args: Any, **kw: Any) -> str:
        if str(self).startswith("/proc/"):
            raise FileNotFoundError(errno.ENOENT, "no /proc here", str(self))
        return real_read_text(self, *args, **kw)

    monkeypatch.setattr(Path, "read_text", read_text)
    assert durable._umask() == mask
    assert os.umask(mask) == mask  # put back as it was


@pytest.mark.parametrize(("mask", "file", "exe", "folder"), [
    (0o022, 0o644, 0o755, 0o755),
    (0o027, 0o640, 0o750, 0o750),
    (0o077, 0o600, 0o700, 0o700),
])  # fmt: skip
def test_share_modes_gives_a_folder_the_umask_modes(
    mask: int, file: int, exe: int, folder: int, tmp_path: Path, umask: Callable[[int], None]
) -> None:
    """Every file and folder under the root, however deep and whatever it was created with;
    an execute bit a file has is kept; a symlink's target (outside) is never touched."""
    outside = tmp_path / "outside.txt"
    outside.write_text("theirs")
    os.chmod(outside, 0o600)
    root = _folder(tmp_path / "model", w="w")
    (root / "a_link").symlink_to(outside)  # the root's entries all come before sub's
    deep = _folder(root / "sub" / "deeper", x="x")
    (root / "sub" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "w", 0o600)  # as safetensors creates its files
    os.chmod(deep / "x", 0o666)
    os.chmod(root / "sub" / "run.sh", 0o755)
    for d in (root, root / "sub", deep):
        os.chmod(d, 0o700)
    umask(mask)
    durable.share_modes(root)
    assert {str(p.relative_to(root)): _mode(p) for p in root.rglob("*") if not p.is_symlink()} == {
        "w": file,
        "sub": folder,
        "sub/deeper": folder,
        "sub/deeper/x": file,
        "sub/run.sh": exe,
    }
    assert _mode(root) == folder and _mode(outside) == 0o600


@pytest.mark.parametrize(("created", "mask", "want"), [
    (0o600, 0o022, 0o644),
    (0o666, 0o077, 0o600),
    (0o755, 0o022, 0o755),  # every execute bit kept
    (0o711, 0o027, 0o750),  # the umask takes the others' one
    (0o700, 0o022, 0o744),  # only those it had
    (0o604, 0o000, 0o666),
])  # fmt: skip
def test_share_modes_on_one_file(
    created: int, mask: int, want: int, tmp_path: Path, umask: Callable[[int], None]
) -> None:
    f = tmp_path / "f.bin"
    f.write_bytes(b"x")
    os.chmod(f, created)
    umask(mask)
    durable.share_modes(f)
    assert _mode(f) == want


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_every_write_gets_the_umask_modes(
    mask: int, tmp_path: Path, kills: list[tuple[int, int]], umask: Callable[[int], None]
) -> None:
    src = tmp_path / "src.pt"
    src.write_bytes(b"weights")
    os.chmod(src, 0o600)
    umask(mask)
    durable.write_text(tmp_path / "t.txt", "t", label="t.txt")
    durable.copy_file(src, tmp_path / "copy.pt", label="copy.pt")  # bytes, not the 0600
    with durable.file_output(tmp_path / "by_name.onnx") as tmp:
        tmp.write_bytes(b"onnx")
        os.chmod(tmp, 0o600)
    folder = durable.temp_path(tmp_path / "model", folder=True)
    (folder / "w").write_bytes(b"w")
    os.chmod(folder / "w", 0o600)
    durable.replace_dir(folder, tmp_path / "model", label="model")
    published = durable.temp_path(tmp_path / "run", folder=True)
    os.chmod(published, 0o700)
    assert durable.publish_dir(published, tmp_path / "run", label=".")
    file, folder_mode = 0o666 & ~mask, 0o777 & ~mask
    assert {p.name: _mode(p) for p in tmp_path.rglob("*")} == {
        "src.pt": 0o600,
        "t.txt": file,
        "copy.pt": file,
        "by_name.onnx": file,
        "model": folder_mode,
        "w": file,
        "run": folder_mode,
    }
    assert (tmp_path / "copy.pt").read_bytes() == b"weights"


# ---- file_output: a writer that takes a file name ---------------------------------------------


def test_file_output_moves_the_finished_file_over_the_target(
    tmp_path: Path,
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    trace: Path,
) -> None:
    target = tmp_path / "out" / "deep" / "model.onnx"  # the parent folders are created
    events: list[Any] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        events.append(("fsync dir",) if stat.S_ISDIR(st.st_mode) else ("fsync file", st.st_size))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(("replace", Path(src).parent == Path(dst).parent, Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(durable.os, "fsync", fsync)
    monkeypatch.setattr(durable.os, "replace", replace)
    monkeypatch.setattr(durable.os, "kill", lambda pid, sig: events.append("kill"))
    monkeypatch.setenv(durable.KILL_ENV, "1:inside")
    with durable.file_output(target, label="model.onnx") as tmp:
        assert tmp.parent == target.parent and tmp.is_file()
        assert re.fullmatch(r"\.model\.onnx\.[0-9a-f]{8}\.tmp", tmp.name), tmp.name
        tmp.write_bytes(b"12345")  # the exporter writes by name
        events.append("written")
    assert events == [
        "written",
        ("fsync file", 5),
        "kill",  # the inside point: complete, not yet renamed
        ("replace", True, "model.onnx"),
        ("fsync dir",),
    ]
    assert target.read_bytes() == b"12345" and _temps(target.parent) == []
    assert _trace(trace) == ["1\tmodel.onnx"] and durable._writes == 1
    monkeypatch.setenv(durable.KILL_ENV, "2")
    with durable.file_output(target) as tmp:  # no label: atomic, not counted nor killed
        tmp.write_bytes(b"6")
    assert target.read_bytes() == b"6" and durable._writes == 1 and events.count("kill") == 1
    assert _trace(trace) == ["1\tmodel.onnx"]


def test_file_output_failing_leaves_the_old_file_and_no_temporary(
    tmp_path: Path,
    kills: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    trace: Path,
) -> None:
    monkeypatch.setenv(durable.KILL_ENV, "1:inside")
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old")
    with (
        pytest.raises(RuntimeError, match="export failed"),
        durable.file_output(target, label="model.onnx") as tmp,
    ):
        tmp.write_bytes(b"half")
        raise RuntimeError("export failed")
    with pytest.raises(KeyboardInterrupt), durable.file_output(target, label="model.onnx"):
        raise KeyboardInterrupt  # not an Exception: cleaned up all the same
    with (  # the writer removed it: its error stands, not the clean-up's
        pytest.raises(ValueError, match="gone"),
        durable.file_output(target, label="model.onnx") as tmp,
    ):
        tmp.unlink()
        raise ValueError("gone")
    with (  # nothing where the writer was told to write
        pytest.raises(FileNotFoundError),
        durable.file_output(target, label="model.onnx") as tmp,
    ):
        tmp.unlink()
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    assert _trace(trace) == [] and durable._writes == 0 and kills == []


def test_a_fill_whose_temporary_vanished_raises_its_own_error(
    tmp_path: Path, kills: list[tuple[int, int]]
) -> None:
    """A temporary another process swept away meanwhile: the writer's error is the one seen,
    not the clean-up's."""
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def fill(f: Any) -> None:
        os.unlink(f.name)
        raise ValueError("disk went away")

    with pytest.raises(ValueError, match="disk went away"):
        durable.write_with(target, fill, label="f.bin")
    assert target.read_bytes() == b"old" and _temps(tmp_path) == []


# ---- _exchange: the real renameat2, and where there is none ----------------------------------


def test_exchange_works_on_relative_paths_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative names are resolved from the working folder (``AT_FDCWD``)."""
    _folder(tmp_path / "a", w="a")
    (tmp_path / "b").write_text("a file")
    monkeypatch.chdir(tmp_path)
    assert durable._exchange(Path("a"), Path("b")) is True
    assert (tmp_path / "a").read_text() == "a file" and (tmp_path / "b" / "w").read_text() == "a"


def test_exchange_names_both_paths_when_it_fails(tmp_path: Path) -> None:
    a, missing = _folder(tmp_path / "a", w="a"), tmp_path / "missing"
    with pytest.raises(FileNotFoundError) as exc:
        durable._exchange(a, missing)
    assert exc.value.errno == errno.ENOENT
    assert exc.value.strerror == os.strerror(errno.ENOENT)
    assert (exc.value.filename, exc.value.filename2) == (str(a), str(missing))
    assert _snapshot(tmp_path) == {"a/": "", "a/w": "a"}


def test_exchange_says_false_when_the_kernel_refuses_the_swap(tmp_path: Path) -> None:
    """EINVAL (here: a folder and one inside it) means 'cannot swap': nothing moved."""
    a = _folder(tmp_path / "a", w="a")
    inner = _folder(a / "inner", x="x")
    assert durable._exchange(a, inner) is False
    assert _snapshot(tmp_path) == {"a/": "", "a/inner/": "", "a/inner/x": "x", "a/w": "a"}


def test_exchange_says_false_without_renameat2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A C library older than glibc 2.28 has no renameat2; one that cannot be loaded is the
    same: the caller falls back to two renames."""
    a, b = _folder(tmp_path / "a", w="a"), _folder(tmp_path / "b", w="b")

    class OldLibc:
        def __init__(self, name: Any, use_errno: bool = False) -> None:
            pass

    monkeypatch.setattr(durable.ctypes, "CDLL", OldLibc)
    assert durable._exchange(a, b) is False

    def unloadable(name: Any, use_errno: bool = False) -> None:
        raise OSError("cannot load the C library")

    monkeypatch.setattr(durable.ctypes, "CDLL", unloadable)
    assert durable._exchange(a, b) is False
    assert _snapshot(tmp_path) == {"a/": "", "a/w": "a", "b/": "", "b/w": "b"}


def test_replace_dir_onto_nothing_deletes_only_the_stale_parked_folder(
    tmp_path: Path, kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_rmtree = durable.shutil.rmtree
    removed: list[str] = []

    def rmtree(path: Any, **kw: Any) -> None:
        removed.append(str(path))
        real_rmtree(path, **kw)

    monkeypatch.setattr(durable.shutil, "rmtree", rmtree)
    run = tmp_path / "run"
    durable.replace_dir(_folder(run / ".a.tmp", w="1"), run / "model", label="model")
    assert removed == [str(run / ".model.old.tmp")]
    assert _snapshot(run) == {"model/": "", "model/w": "1"}


def test_refuse_folder_names_the_flag_what_goes_there_and_a_file_to_use(tmp_path: Path) -> None:
    durable.refuse_folder(tmp_path / "new.onnx", flag="-o", writes="w", name="m.onnx")  # absent
    (tmp_path / "old.onnx").write_bytes(b"x")
    durable.refuse_folder(tmp_path / "old.onnx", flag="-o", writes="w", name="m.onnx")  # a file
    with pytest.raises(InputError) as info:
        durable.refuse_folder(
            tmp_path, flag="--report-out", writes="it writes a page", name="r.html"
        )
    assert str(info.value) == (
        f"--report-out {tmp_path} is a folder; it writes a page: name the file "
        f"(e.g. --report-out {tmp_path / 'r.html'})."
    )
