"""Wires the command modules together and maps known errors to clean exits.

Adding a command group is a one-file change: a new module in this package with a
``register(app: typer.Typer)`` function is picked up automatically.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import sys

import typer

import zoo.cli as cli_pkg
from zoo.errors import ZooError

DEBUG_ENV = "ZOO_DEBUG"

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
_ORDER = ["models", "train", "export", "predict", "quantize", "bench", "serve", "hub"]


def _register_all() -> None:
    mods = pkgutil.iter_modules(cli_pkg.__path__)
    rank = {name: i for i, name in enumerate(_ORDER)}
    for mod in sorted(mods, key=lambda m: (rank.get(m.name, len(_ORDER)), m.name)):
        if mod.name in {"app", "common"}:
            continue
        module = importlib.import_module(f"zoo.cli.{mod.name}")
        if hasattr(module, "register"):
            module.register(app)


_register_all()


def main() -> None:
    """Console-script entry point: known errors → message on stderr, exit 1."""
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0")
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
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


if __name__ == "__main__":
    main()
