"""What ``zoo finetune`` and ``zoo distill`` do once their options are a config: check the
tracking server before any work, launch ``--nproc`` processes or train here, write the
report, and end with the tracker's line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from zoo.cli.common import err, interrupt_exits, out

if TYPE_CHECKING:
    from zoo.train.config import TrainConfig


def run_training(
    cfg: TrainConfig,
    explicit: frozenset[str],
    *,
    nproc: int,
    report: bool,
    after: Callable[[Path], None] | None = None,
) -> None:
    """Train ``cfg`` as the command line asked; prints the run folder.

    Args:
        cfg: the run's config.
        explicit: the options the user typed (``--resume`` compares exactly these).
        nproc: processes to launch (``torchrun``); 1 trains here.
        report: write ``report.html`` after the run.
        after: what the command adds once the run is complete (rank 0), before the report.

    Raises:
        typer.Exit: with the launcher's exit code under ``--nproc``.
        TrackingError: the tracking server does not answer (before any work).
    """
    from zoo.train.console import is_main_process
    from zoo.train.tracking_process import tracker_for

    # an unreachable tracking server is refused before any work; under torchrun only rank 0.
    # The tracker's process starts now, so MLflow loads while torch does.
    tracker = tracker_for(cfg, explicit) if is_main_process() else None
    if nproc > 1:
        from zoo.train.launch import launch

        if tracker is not None:
            tracker.ready()
            tracker.close()
        raise typer.Exit(launch(nproc))
    from zoo.train.trainer import fit

    if tracker is not None:
        tracker.ready()
    try:
        with interrupt_exits():
            run = fit(cfg, explicit=explicit, observers=[tracker] if tracker else ())
        if run is None or not is_main_process():  # --dry-run writes no run folder; other ranks
            return
        if after is not None:
            after(run)
        if report:
            with interrupt_exits(
                f"interrupted while writing report.html: {run} is complete; write the "
                f"report with: zoo eval {run} --report"
            ):
                _run_report(run, cfg.device, cfg.batch_size)
            if tracker is not None and (run / "report.html").is_file():
                tracker.log_file(run / "report.html")
        out.print(str(run))
    finally:
        if tracker is not None:  # the last line: whether everything reached the tracker
            err.print(tracker.close().line(), markup=False)


def _run_report(run: Path, device: str, batch_size: int) -> None:
    """The finished run's report.html; a model the report cannot cover only gets a note."""
    from zoo.errors import DataError, InputError
    from zoo.train.evaluate import evaluate_split
    from zoo.train.report import write_report

    try:
        ev = evaluate_split(
            str(run), data=None, split="val", batch_size=batch_size, device=device, num_workers=0
        )
        info = write_report(ev, run / "report.html", run)
    except (InputError, DataError) as exc:  # the run itself is complete: never fail it here
        err.print(f"report: none ({exc})")
        return
    err.print(f"report: {info['path']} ({info['images']} images embedded)")
