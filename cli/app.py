"""Wires the command modules together and maps known errors to clean exits.

Adding a command group is a one-file change: a new module in this package with a
``register(app: typer.Typer)`` function is picked up automatically.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import pkgutil
import sys
from typing import Any

import typer
from typer.core import TyperCommand

import zoo.cli as cli_pkg
from zoo.errors import UsageError, ZooError

DEBUG_ENV = "ZOO_DEBUG"

# At exit, the interpreter would walk every object importing torch made: 1.0-1.3 s of each
# command's wall clock on 2 cores (measured), for memory the OS takes back anyway. Frozen, they
# are left to it. The price: cyclic garbage left at exit is not finalised. Nothing of zoo's waits
# on that (no __del__; zoo.durable closes what it writes), and the exit handlers registered after
# this one (torch's, MLflow's, a command's) run before it. Any process importing this module
# gets it, in-process test runs and notebooks included; only its exit changes.
atexit.register(gc.freeze)

app = typer.Typer(
    name="zoo",
    help="PyTorch model zoo and deployment toolkit: pick a model, fine-tune it on a folder of "
    "images, export, check, serve.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,
)


# The order of `zoo --help`: the user's path first; any other module follows alphabetically.
_ORDER = [
    "models",
    "finetune",
    "tune",
    "eval",
    "calibrate",
    "enroll",
    "data",
    "export",
    "compare_jit",
    "predict",
    "quantize",
    "bench",
    "serve",
    "hub",
]


def _register_all() -> None:
    mods = pkgutil.iter_modules(cli_pkg.__path__)
    rank = {name: i for i, name in enumerate(_ORDER)}
    for mod in sorted(mods, key=lambda m: (rank.get(m.name, len(_ORDER)), m.name)):
        if mod.name in {"app", "common", "train_options"}:
            continue
        module = importlib.import_module(f"zoo.cli.{mod.name}")
        if hasattr(module, "register"):
            module.register(app)


class _Command(TyperCommand):
    """Every command: a library :class:`~zoo.errors.UsageError` exits 2 with the command's
    usage, like the usage errors typer finds itself (the one place this mapping is made)."""

    def invoke(self, ctx: Any) -> Any:  # typer's own click Context (typer._click is private)
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            raise typer.BadParameter(str(exc), ctx, param_hint=exc.param_hint) from None


def _usage_errors_exit_2(group: typer.Typer) -> None:
    for info in group.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = _Command
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _usage_errors_exit_2(sub.typer_instance)


_register_all()
_usage_errors_exit_2(app)


@app.callback()
def _configure_logging() -> None:
    """Before any command (not for ``zoo --help``, whose start-up is measured: importing
    :mod:`logging` is a tenth of it): WARNING and above on stderr, DEBUG with ZOO_DEBUG=1."""
    import logging

    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


def main() -> None:
    """Console-script entry point: known errors → message on stderr, exit 1 (usage errors
    exit 2 inside the command, :class:`_Command`)."""
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        app()
    except ZooError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        print(f"(set {DEBUG_ENV}=1 for the full traceback)", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as exc:
        said = _path_error(exc)
        if said is None or debug:
            raise
        print(f"error: {said}", file=sys.stderr)
        print(f"(set {DEBUG_ENV}=1 for the full traceback)", file=sys.stderr)
        sys.exit(1)


def _path_error(exc: OSError) -> str | None:
    """What a file-system refusal of a path the user gave means (None: not one of those, a
    traceback). The commands check their outputs first; this is the net under them.

    A write fails on its temporary file (an atomic write builds ``.NAME.<token>.tmp`` beside
    ``NAME``, a quantize or OpenVINO export works in such a scratch folder beside its output):
    the message names the path the user asked for (:func:`zoo.durable.destination_of`), never
    a hidden name that is gone by the time it is read."""
    import errno

    where = _user_path(exc.filename) if exc.filename is not None else "a path"
    meaning = {
        errno.ENOTDIR: "a folder on this path is a file: give a path whose folders are folders",
        errno.EEXIST: "already exists where a new file or folder was to be made: name another path",
        errno.EISDIR: "is a folder where a file was needed: name a file",
        errno.EACCES: "permission denied: choose a place you can write to (or read)",
        errno.EPERM: "operation not permitted: choose a place you can write to",
        errno.EROFS: "is on a read-only file system: choose another place",
        errno.ENOSPC: "no space left on the device: free some space and run again",
        errno.ENAMETOOLONG: "the name is too long for the file system",
    }.get(exc.errno or 0)
    return None if meaning is None else f"{where}: {meaning}."


def _user_path(filename: str | bytes | int) -> str:
    """``filename`` as the user knows it: a temporary name zoo made (a durable write's, a
    scratch folder's: :data:`zoo.durable.TEMP_NAME`) as the destination it was for
    (``out/m.onnx``); any other path as it is."""
    import os

    from zoo import durable

    if isinstance(filename, int):  # a file descriptor: nothing to map
        return str(filename)
    name = os.fsdecode(filename)
    destination = durable.destination_of(name)
    return name if destination is None else f"{destination} (writing it)"


if __name__ == "__main__":
    main()
