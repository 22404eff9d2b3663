"""``zoo enroll``: add a class to a trained model from a few images, without retraining it
(:func:`zoo.train.enroll.enroll`); the result is a model folder with one class more."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zoo.cli.common import DeviceOpt, JsonOpt, err, out, print_json


def enroll_cmd(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="run folder or model folder")],
    images: Annotated[
        list[Path],
        typer.Argument(
            metavar="IMAGES...",
            help="at least 5 images of the new class (files, or folders: the images in them)",
        ),
    ],
    class_name: Annotated[
        str, typer.Option("--class", help="the new class's name (not one the model has)")
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o", "--output", help="model folder to write (default: <MODEL>+<class> beside it)"
        ),
    ] = None,
    in_place: Annotated[
        bool, typer.Option("--in-place", help="replace MODEL's own model folder instead")
    ] = False,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="images of the existing classes, one subfolder per class, to fit against "
            "(default: the run's training split)",
        ),
    ] = None,
    device: DeviceOpt = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Add a class from a few images (at least 5) without retraining: the classifier gains
    one row; export, predict, serve and eval use the result unchanged."""
    from zoo.images import image_files
    from zoo.train.enroll import EnrollOptions, enroll

    opts = EnrollOptions(
        model=model, class_name=class_name, images=image_files(images), out=output,
        in_place=in_place, data=data, device=device,
    )  # fmt: skip
    result = enroll(opts)
    if as_json:
        print_json(result.to_dict())
    else:
        for line in result.lines():
            out.print(line, markup=False)
    err.print(
        f"export it to serve the new class: zoo export {result.out}"
        + (" (the folder's model.onnx from before is now stale)" if in_place else ""),
        markup=False,
    )


def register(app: typer.Typer) -> None:
    app.command("enroll")(enroll_cmd)
