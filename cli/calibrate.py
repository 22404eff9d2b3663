"""``zoo calibrate``: fit the temperature (and with ``--reject`` the "unknown" threshold) of a
run or model folder on held-out images, as ``zoo finetune`` does at the end of a run
(:func:`zoo.train.calibrate.calibrate_model`)."""

from __future__ import annotations

from typing import Annotated

import typer

from zoo.calibration import DEFAULT_ACCEPTANCE
from zoo.cli.common import DeviceOpt, JsonOpt, choice, err, out, print_json
from zoo.cli.train_options import AcceptanceOpt, RejectOpt
from zoo.run_images import Split


def calibrate_cmd(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="run folder or model folder")],
    data: Annotated[
        str | None,
        typer.Option("--data", help="image folder (default: the run's own validation split)"),
    ] = None,
    split: Annotated[
        Split | None,
        choice(
            Split,
            "--split",
            help="held-out images only (default: val; a flat folder the model did not train "
            "on: all)",
        ),
    ] = None,
    reject: RejectOpt = "off",
    acceptance: AcceptanceOpt = DEFAULT_ACCEPTANCE,
    batch_size: int = 64,
    device: DeviceOpt = "auto",
    num_workers: int = 0,
    as_json: JsonOpt = False,
) -> None:
    """Fit a model's temperature on held-out images (and an 'unknown' threshold with
    --reject), written into its config.json; predict, serve, eval and exports use it."""
    from zoo.train.calibrate import calibrate_model

    result = calibrate_model(
        model, data=data, split=split, reject=reject, acceptance=acceptance,
        batch_size=batch_size, device=device, num_workers=num_workers,
    )  # fmt: skip
    if as_json:
        print_json(result.to_dict())
        why = result.calibration.why_not_kept()
        if why is not None:  # the JSON's fit.why; said where a person reads it too
            err.print(f"temperature kept at 1: {why}", markup=False)
    else:
        out.print(result.line(), markup=False)
    err.print(f"written to {result.config}", markup=False)
    from zoo.variants import exports

    for v in exports(result.config.parent):  # predict and serve apply a file's own
        if v.calibration_stale:
            err.print(f"warning: {v.warning()}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate_cmd)
