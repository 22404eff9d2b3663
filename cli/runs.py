"""``zoo runs ls|compare|sync``: runs side by side from their folders (no server needed;
:mod:`zoo.train.runs`), and a tracked run's missing MLflow records sent after an outage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zoo.cli.common import JsonOpt, err, out, print_json

runs_app = typer.Typer(help="Runs side by side: list, compare, sync to MLflow.")


@runs_app.command("ls")
def ls_cmd(
    root: Annotated[
        Path, typer.Argument(help="the folder the runs are in (zoo finetune --runs)")
    ] = Path("runs"),
    as_json: JsonOpt = False,
) -> None:
    """One line per run: arch, data, best metric, epochs, time, state
    (done/interrupted/failed); a zoo tune search's trials as SEARCH/trial-000."""
    from zoo.train.runs import list_runs

    runs = list_runs(root)
    if as_json:
        print_json([r.to_dict() for r in runs])
        return
    for r in runs:
        out.print(r.line(), markup=False, highlight=False)
    if not runs:
        err.print(f"no runs in {root} (zoo finetune ARCH --data DIR writes one under runs/)")


@runs_app.command("compare")
def compare_cmd(
    runs: Annotated[list[Path], typer.Argument(help="two run folders or more")],
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="also draw the runs' validation curves into this PNG"),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The config keys that differ, and the best metrics side by side."""
    from zoo.train.runs import check_plot_path, compare_runs, plot_comparison

    if plot is not None:
        check_plot_path(plot)
    comparison = compare_runs(runs)
    if plot is not None:
        plot_comparison(comparison, plot)
    if as_json:
        print_json(comparison.to_dict() | ({"plot": str(plot)} if plot else {}))
    else:
        for line in comparison.lines():
            out.print(line, markup=False, highlight=False)
    if plot is not None:
        err.print(f"curves: {plot}")


@runs_app.command("sync")
def sync_cmd(
    run: Annotated[Path, typer.Argument(help="a run trained with --track mlflow")],
) -> None:
    """Send what a tracked run's MLflow run lacks (epochs, files) after a tracking outage."""
    from zoo.train.runs import read_run
    from zoo.train.tracking_sync import sync

    read_run(run)  # a run folder, or an error that says what one is
    summary = sync(run)
    err.print(summary.line(), markup=False)
    if not summary.complete:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(runs_app, name="runs")
