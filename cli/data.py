"""``zoo check`` (preflight an image folder) and ``zoo example`` (write a built-in one)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zoo.cli.common import JsonOpt, choice_argument, err, out, print_json
from zoo.samples import Example


def check_cmd(
    data: Annotated[str, typer.Argument(help="image folder")],
    val_fraction: float = 0.2,
    seed: int = 0,
    as_json: JsonOpt = False,
    strict: Annotated[
        bool, typer.Option(help="exit 1 when any image is unreadable or leaks across splits")
    ] = False,
    cache_for: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL",
            help="also fill the decode-once image cache for this model (as zoo finetune would)",
        ),
    ] = None,
    image_size: Annotated[
        int | None, typer.Option(help="with --cache-for: the size zoo finetune will train at")
    ] = None,
) -> None:
    """Preflight an image folder: corrupt files, tiny images, odd modes, leaks, imbalance."""
    from zoo.train.check import check_splits, format_report
    from zoo.train.data import scan

    cache = None
    if cache_for:
        from zoo.train.build import cache_spec
        from zoo.train.image_cache import ImageCache

        spec = cache_spec(cache_for, image_size)
        if spec is None:
            raise typer.BadParameter(f"{cache_for} does not take images", param_hint="--cache-for")
        cache = ImageCache(spec)
    splits = scan(data, val_fraction=val_fraction, seed=seed)
    report = check_splits(splits, image_cache=cache)
    if cache is not None:  # files checked before (results cached) may still need decoding
        bad = set(report.quarantined)
        paths = [splits.root / r for items in splits.files.values() for r, _ in items]
        built = cache.build([p for p in paths if str(p.relative_to(splits.root)) not in bad])
        err.print(
            f"image cache: {cache.spec.tag} at {cache.root} ({built} decoded after the check)"
        )
    if as_json:
        print_json(report.to_dict())
    else:
        for line in format_report(report):
            out.print(line)
    if strict and report.problems():
        err.print(f"{report.problems()} problem(s) found")
        raise typer.Exit(1)


def example_cmd(
    name: Annotated[Example, choice_argument(Example, "name", help="built-in data set")],
    dest: Annotated[Path, typer.Argument(help="folder to write the image folder into")],
    size: Annotated[int, typer.Option(help="digits: image side in pixels")] = 32,
    per_class: Annotated[
        int | None, typer.Option(min=1, help="images per class (default: all digits / 300 photos)")
    ] = None,
) -> None:
    """Write a built-in real data set as an image folder.

    digits: scikit-learn's 1,797 real handwritten digits (10 classes, 32×32 PNG).
    photos: 2,100 JPEGs (300–640 px) cut from scikit-image's 7 colour photographs, one class each.
    """
    from zoo.samples import write_digits_folder, write_photo_folder

    if name == "photos":
        out.print(str(write_photo_folder(dest, per_class=per_class or 300)))
    else:
        out.print(str(write_digits_folder(dest, size=size, per_class=per_class)))


def register(app: typer.Typer) -> None:
    app.command("check")(check_cmd)
    app.command("example")(example_cmd)
