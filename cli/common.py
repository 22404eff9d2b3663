"""Options shared by several commands, and output helpers (data to stdout, hints to stderr)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console

JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON object.")]
OutOpt = Annotated[str | None, typer.Option("-o", "--output", help="Where to write the result.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N or auto.")]
WeightsOpt = Annotated[
    str | None,
    typer.Option(
        "--weights", help="'none' for random init, or a safetensors file; default: the entry's own"
    ),
]

# Wide enough for tables when piped to a file or another program.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 200)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
