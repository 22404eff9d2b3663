"""What ``zoo predict`` reads: image files, folders (recursive), globs and text files listing
paths, expanded lazily in a fixed order, so a million inputs never sit in memory and a resumed
job meets them in the same order.

Folders and globs are walked one directory at a time (each directory's entries in natural
order, hidden entries skipped, symlinked folders followed once); only image files
(:data:`zoo.images.IMAGE_EXTENSIONS`) are taken from them. A list file gives one path per
line (blank lines and ``#`` comments skipped), relative paths being relative to the list's own
folder; its paths are taken as they are, so a missing one becomes an error row (each one a
:class:`Listed` path, which knows the line and list it came from, for the messages). Written by
hand: ``glob``/``rglob`` return directory order (not sorted), and sorting their whole output
would hold every path in memory.
"""

from __future__ import annotations

import fnmatch
import os
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path

from zoo.errors import InputError
from zoo.images import IMAGE_EXTENSIONS, is_image_file, natural_key

_MAGIC = frozenset("*?[")
_SNIFF = 8192  # bytes read to tell a list of paths from a binary file
# what a list of paths may hold besides printable text (never NUL, ESC or other controls)
_TEXT_CONTROLS = frozenset("\t\n\r\f\v")
ACCEPTED = (
    f"image files ({', '.join(sorted(IMAGE_EXTENSIONS))}), folders, globs ('photos/**/*.jpg', "
    "quoted) or UTF-8 text files listing image paths, one per line"
)


class Listed(str):
    """A path read from a list of paths: the path itself (a ``str``, as every other input),
    and where it came from, so that a message about it names the line the user wrote.

    Attributes:
        list_file: the list of paths, as given.
        line: its line number (1-based).
    """

    list_file: str
    line: int

    def __new__(cls, path: str, list_file: str, line: int) -> Listed:
        self = super().__new__(cls, path)
        self.list_file, self.line = list_file, line
        return self

    def __reduce__(self) -> tuple[type[Listed], tuple[str, str, int]]:  # to a worker and back
        return Listed, (str(self), self.list_file, self.line)

    @property
    def origin(self) -> str:
        """Where the path came from: ``line 3 of the list photos/todo.txt``."""
        return f"line {self.line} of the list {self.list_file}"


def described(path: str) -> str:
    """``path`` as a message names it: a :class:`Listed` one with its origin
    (``a/hello (line 1 of the list a/notes.txt)``)."""
    return f"{path} ({path.origin})" if isinstance(path, Listed) else str(path)


def unreadable_reason(path: str, exc: Exception) -> str:
    """Why the input ``path`` could not be scored, from what opening it raised: a path read
    from a list is named with the line and list it came from."""
    if not isinstance(path, Listed):
        return str(exc)
    if not os.path.lexists(path):
        return f"Image file {described(path)} does not exist."
    return f"{exc} ({path} is {path.origin}.)"


def _is_glob(text: str) -> bool:
    return any(c in text for c in _MAGIC)


def _entries(folder: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return sorted((e for e in it), key=lambda e: natural_key(e.name))
    except OSError as exc:
        raise InputError(f"Cannot list the folder {folder!r} ({exc.strerror}).") from exc


def _walk(folder: str, seen: set[str]) -> Iterator[str]:
    seen.add(os.path.realpath(folder))
    for e in _entries(folder):
        if e.name.startswith("."):
            continue
        if e.is_dir():
            if os.path.realpath(e.path) not in seen:
                yield from _walk(e.path, seen)
        elif is_image_file(Path(e.name)):
            yield e.path


def _join(base: str, name: str) -> str:
    return name if base == "." else os.path.join(base, name)


def _glob(base: str, parts: list[str], above: frozenset[str] = frozenset()) -> Iterator[str]:
    """Matches of ``parts`` under ``base``; ``above``: the folders ``**`` came through."""
    head, rest = parts[0], parts[1:]
    if head == "**":
        rest = rest or ["*"]  # a trailing ** means every file below
        yield from _glob(base, rest)  # zero folders
        here = above | {os.path.realpath(base)}
        for e in _entries(base):
            if e.is_dir() and not e.name.startswith(".") and os.path.realpath(e.path) not in here:
                yield from _glob(_join(base, e.name), ["**", *rest], here)  # one more
        return
    if not _is_glob(head):
        names = [head] if os.path.lexists(os.path.join(base, head)) else []
    else:
        hidden = head.startswith(".")
        names = [
            e.name
            for e in _entries(base)
            if fnmatch.fnmatch(e.name, head) and (hidden or not e.name.startswith("."))
        ]
    for name in names:
        path = _join(base, name)
        if rest:
            if os.path.isdir(path):
                yield from _glob(path, rest)
        elif os.path.isfile(path) and is_image_file(Path(name)):
            yield path


def expand_glob(pattern: str) -> Iterator[str]:
    """Image files matching ``pattern`` (``*``, ``?``, ``[...]`` within a name; ``**`` for any
    number of folders), lazily, in a fixed order."""
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    while "**/**" in "/".join(parts):  # ** twice in a row is ** once (and no duplicates)
        i = next(i for i in range(len(parts) - 1) if parts[i] == parts[i + 1] == "**")
        del parts[i]
    base = "/" if pattern.startswith("/") else "."
    while len(parts) > 1 and not _is_glob(parts[0]):
        base = _join(base, parts.pop(0))
    yield from _glob(base, parts)


def _controls(text: str) -> list[str]:
    """Control characters (Unicode ``Cc``: NUL, ESC, DEL...) other than whitespace."""
    return [c for c in text if unicodedata.category(c) == "Cc" and c not in _TEXT_CONTROLS]


def _image_format(path: str) -> str | None:
    """The image format PIL recognises in the file's header (``PNG``), or None."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return im.format
    except (OSError, UnidentifiedImageError, ValueError):
        return None


def _not_a_list(path: str, why: str) -> InputError:
    fmt = _image_format(path)
    if fmt is not None:  # an image under another name: say how to have it read as one
        return InputError(
            f"Input {path!r} is a {fmt} image without an image extension, so it was taken for "
            f"a list of paths: rename it to {os.path.splitext(path)[0] + '.' + fmt.lower()!r}. "
            f"zoo predict takes {ACCEPTED}."
        )
    return InputError(
        f"Input {path!r} is neither an image nor a list of image paths ({why}). "
        f"zoo predict takes {ACCEPTED}."
    )


def check_list_file(path: str) -> None:
    """Refuse a file that is not a text list of paths, from its first bytes.

    Raises:
        InputError: the file holds binary data (NUL or other control bytes, or bytes that are
            not UTF-8): the message names the file and the inputs ``zoo predict`` takes, and
            quotes no raw bytes.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF)
    except OSError as exc:
        raise InputError(f"Cannot read the input {path!r} ({exc.strerror}).") from exc
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not a character cut by the read's end
            raise _not_a_list(path, f"byte {exc.start} is not UTF-8 text") from exc
        text = head[: exc.start].decode("utf-8")
    bad = _controls(text)
    if bad:
        raise _not_a_list(path, f"it holds control bytes such as {bad[0]!r}, so it is binary")


def _list_file(path: str) -> Iterator[Listed]:
    check_list_file(path)
    root = os.path.dirname(path)
    try:
        with open(path, encoding="utf-8-sig") as f:  # a byte-order mark is no path
            for number, line in enumerate(f, 1):
                line = line.strip()
                if _controls(line):  # quoted escaped (repr), never printed raw
                    raise InputError(
                        f"Line {number} of the list of paths {path!r} holds control bytes: "
                        f"{line[:200]!r}. Give one image path per line."
                    )
                if line and not line.startswith("#"):
                    name = line if os.path.isabs(line) else os.path.join(root, line)
                    yield Listed(name, path, number)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(
            f"Cannot read the list of paths {path!r} ({exc}): give a UTF-8 text file with "
            "one image path per line."
        ) from exc


def iter_inputs(specs: Sequence[str]) -> Iterator[str]:
    """Every image path the ``INPUTS`` of ``zoo predict`` name, lazily, in order.

    Args:
        specs: image files, folders, globs and text files listing paths (one per line).

    Yields:
        Paths, spelled from the given ones (a folder ``photos`` yields ``photos/a.jpg``); a
        path read from a list is a :class:`Listed` one (a ``str`` that knows its line).

    Raises:
        InputError: an input that is none of these (a missing path that is not a glob), or a
            folder or list that cannot be read.
    """
    for spec in specs:
        if os.path.isdir(spec):
            yield from _walk(spec, set())
        elif os.path.isfile(spec):
            yield from [spec] if is_image_file(Path(spec)) else _list_file(spec)
        elif _is_glob(spec):
            yield from expand_glob(spec)
        else:
            raise _missing(spec)


def _missing(spec: str) -> InputError:
    return InputError(f"Input {spec!r} does not exist: give {ACCEPTED}.")


def check_inputs(specs: Sequence[str]) -> None:
    """Refuse, before any work, inputs that do not exist or name no image at all.

    Raises:
        InputError: a path that does not exist and is not a glob, a file that is neither an
            image nor a text list of paths, a list none of whose paths exists, or nothing to
            score.
    """
    for spec in specs:
        if not (os.path.exists(spec) or _is_glob(spec)):
            raise _missing(spec)
        if os.path.isfile(spec) and not is_image_file(Path(spec)):
            check_list_file(spec)  # every list, not only the first one the job reaches
            _check_some_exist(spec)
    if next(iter_inputs(specs), None) is None:
        raise InputError(
            f"The inputs {', '.join(map(repr, specs))} name no image (no file with an image "
            "extension in the folders, nothing the globs match, an empty list)."
        )


def _check_some_exist(path: str) -> None:
    """Refuse a list of paths none of which exists (read up to its first existing path): a
    file the user did not mean as a list (notes), or paths relative to another folder.

    Raises:
        InputError: the list names paths and none exists; the message says the file was read
            as a list of image paths, one per line, and quotes its first path and line.
    """
    first, count = None, 0
    for listed in _list_file(path):
        if os.path.exists(listed):
            return
        first, count = first or listed, count + 1
    if first is None:  # an empty list: "name no image" if nothing else does
        return
    others = {1: "", 2: ", nor does the other path it names"}.get(
        count, f", nor do the other {count - 1:,} paths it names"
    )
    raise InputError(
        f"Input {path!r} is not an image, so it was read as a list of image paths, one per "
        f"line (relative to the list's folder), but none of its paths exists: "
        f"{described(first)} does not exist{others}. Give {ACCEPTED}."
    )


def count_inputs(specs: Sequence[str]) -> int:
    """How many paths :func:`iter_inputs` yields (one more pass over the folders)."""
    return sum(1 for _ in iter_inputs(specs))


def describe_inputs(specs: Sequence[str]) -> list[str]:
    """The inputs as a resumed job compares them: absolute spellings."""
    return [os.path.abspath(s) for s in specs]


__all__ = [
    "ACCEPTED",
    "Listed",
    "check_inputs",
    "check_list_file",
    "count_inputs",
    "describe_inputs",
    "described",
    "expand_glob",
    "iter_inputs",
    "unreadable_reason",
]
