"""``zoo compare-jit``: :func:`~zoo.deploy.export.jit_compare.compare_jit_model` → its summary
(or ``--json``), TorchScript's deprecation note on stderr."""

from __future__ import annotations

import typer

from zoo.cli.common import JsonOpt, ModelArg, err, out, print_json


def compare_jit_cmd(
    model: ModelArg,
    as_json: JsonOpt = False,
) -> None:
    """Compare torch.jit.trace, torch.jit.script and torch.export against eager."""
    from zoo.deploy.export.jit_compare import compare_jit_model

    report = compare_jit_model(model)
    if as_json:
        print_json(report.to_dict())
        return
    for line in report.lines():
        out.print(line)
    err.print(report.note)


def register(app: typer.Typer) -> None:
    app.command("compare-jit")(compare_jit_cmd)
