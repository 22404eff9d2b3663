"""Options shared by several commands, and output helpers (data to stdout, hints to stderr)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, get_args

import typer
from rich.console import Console

from zoo.errors import MODEL_FORMS, ChoiceError, Interrupted

JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON object.")]
OutOpt = Annotated[str | None, typer.Option("-o", "--output", help="Where to write the result.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:N or auto.")]
ModelArg = Annotated[str, typer.Argument(metavar="MODEL", help=MODEL_FORMS)]
"""A command's model reference (parsed by :meth:`zoo.ref.ModelRef.parse`), not an ONNX file."""
ModelOrOnnxArg = Annotated[
    str,
    typer.Argument(
        metavar="MODEL", help=MODEL_FORMS + ", an exported .onnx file or an OpenVINO .xml IR"
    ),
]
"""Like :data:`ModelArg`, for the commands that also take an exported ``.onnx`` file."""
VariantOpt = Annotated[
    str | None,
    typer.Option(
        "--variant",
        help="use a derived file of the run or model folder (its variants/, listed by "
        "`zoo list`), by name or unique prefix: int8 → model/variants/int8-nncf.onnx (or "
        "int8-static.onnx, onnxruntime's)",
    ),
]


def with_variant(model: str, variant: str | None) -> str:
    """``model`` itself, or the file of its variant ``variant`` (:meth:`ModelRef.variant`)."""
    if variant is None:
        return model
    from zoo.ref import ModelRef

    return str(ModelRef.parse(model).variant(variant))


WeightsOpt = Annotated[
    str | None,
    typer.Option(
        "--weights", help="'none' for random init, or a safetensors file; default: the entry's own"
    ),
]


def _choice_parser(name: str, choices: tuple[str, ...], many: bool) -> Callable[[str], str]:
    def parse(value: str) -> str:
        for item in value.split(",") if many else [value]:
            if item not in choices:
                raise typer.BadParameter(str(ChoiceError(name, item, choices)))
        return value

    return parse


def choice(literal: Any, *decls: str, help: str = "", many: bool = False) -> Any:
    """A ``typer.Option`` taking one value of a ``Literal`` type (the one definition of the
    choices): the help lists them; anything else exits 2 with a did-you-mean.

    Args:
        literal: e.g. ``Literal["onnx", "torchscript"]``.
        *decls: the option's names, e.g. ``"--format", "-f"``.
        help: the option's help text.
        many: a comma-separated list of choices (``eager,ort_fp32``), returned unchanged.
    """
    choices: tuple[str, ...] = get_args(literal)
    name = (decls[0] if decls else "value").lstrip("-")
    return typer.Option(
        *decls,
        help=help,
        parser=_choice_parser(name, choices, many),
        metavar=("<{}>[,...]" if many else "<{}>").format("|".join(choices)),
    )


def choice_argument(literal: Any, name: str, *, help: str = "") -> Any:
    """Like :func:`choice`, for a positional argument called ``name``."""
    choices: tuple[str, ...] = get_args(literal)
    return typer.Argument(
        help=help,
        parser=_choice_parser(name, choices, False),
        metavar=name,
    )


def int_list(value: str) -> str:
    """Parser of a comma-separated list of positive integers (exit 2 otherwise)."""
    try:
        ok = all(int(v) > 0 for v in value.split(","))
    except ValueError:
        ok = False
    if not ok:
        raise typer.BadParameter(f"{value!r} is not a comma-separated list of positive integers.")
    return value


# Wide enough for tables when piped to a file or another program.
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 200)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


@contextmanager
def interrupt_exits(hint: str = "interrupted") -> Iterator[None]:
    """Ctrl-C in a long command: its message (an :class:`~zoo.errors.Interrupted` says what
    was kept and how to go on; else ``hint``) on stderr, and exit code 130 (128 + SIGINT)."""
    try:
        yield
    except Interrupted as exc:
        err.print(exc.message, markup=False)
        raise typer.Exit(130) from None
    except KeyboardInterrupt:
        err.print(hint, markup=False)
        raise typer.Exit(130) from None
