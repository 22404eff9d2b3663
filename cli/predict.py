"""``zoo predict``: images in, labels out (to the terminal or a streamed file)."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer

from zoo.cli.common import (
    JsonOpt,
    ModelOrOnnxArg,
    VariantOpt,
    choice,
    err,
    interrupt_exits,
    out,
    print_json,
    with_variant,
)
from zoo.deploy.choices import PredictEngine
from zoo.deploy.predict.options import PredictFileOptions, option_defaults
from zoo.tta import Tta

InputsArg = Annotated[
    list[str],
    typer.Argument(
        metavar="INPUTS...",
        help="image files, folders (recursive), globs ('photos/**/*.jpg', quoted) or text "
        "files listing image paths (one per line, relative to the list's folder)",
    ),
]

# Every default comes from PredictFileOptions; only the help text and spelling live here.
D = option_defaults()


def predict_cmd(
    model: ModelOrOnnxArg,
    inputs: InputsArg,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1)] = D["top_k"],
    device: str = D["device"],
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="write one row per image to a .csv, .jsonl or .parquet file, streamed in "
            "chunks; after a kill the same command resumes; unreadable files are listed in "
            "FILE.errors.jsonl",
        ),
    ] = None,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            min=1,
            help="--out: images per model call (about three batches of decoded images are "
            "held in memory: the one scored, and the next decoding)",
        ),
    ] = D["batch_size"],
    chunk_size: Annotated[
        int,
        typer.Option(
            "--chunk-size", min=1, help="--out: inputs per committed chunk (what a kill can cost)"
        ),
    ] = D["chunk_size"],
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", min=1, help="--out: decoding threads; default: the CPUs available"
        ),
    ] = D["workers"],
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="stop at the first file that cannot be read (default: score the others, "
            "report each unreadable one and exit 1; --out: list them in FILE.errors.jsonl)",
        ),
    ] = D["strict"],
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="--out: replace the file and discard an interrupted job"),
    ] = D["overwrite"],
    embeddings: Annotated[
        bool,
        typer.Option(
            "--embeddings",
            help="--out: add `embedding`, the penultimate-layer features (.parquet/.jsonl)",
        ),
    ] = D["embeddings"],
    engine: Annotated[
        PredictEngine,
        choice(
            PredictEngine,
            "--engine",
            help="--out: score here, or on Ray Data (pip install 'zoo[ray]'; --workers: actors)",
        ),
    ] = D["engine"],
    address: Annotated[
        str | None,
        typer.Option("--address", help="--engine ray: the cluster to join (default: a local Ray)"),
    ] = D["address"],
    tta: Annotated[
        Tta,
        choice(
            Tta,
            "--tta",
            help="test-time augmentation: average the scores of the eval crop and its mirror "
            "(flip), of five crops, or of those and their mirrors",
        ),
    ] = D["tta"],
    no_reject: Annotated[
        bool,
        typer.Option(
            "--no-reject",
            help="show the top-k of every image, even one the model's rejection rule "
            "(zoo finetune/calibrate --reject) answers `unknown` for",
        ),
    ] = not D["reject"],
    variant: VariantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Top-k labels. From an ONNX file alone, preprocessing and class names come from its metadata.

    Without --out the labels are printed (a few images, all in memory): an unreadable image is
    reported on stderr and the others are still scored, then the command exits 1; with --out
    any number of images are scored into a file, resumably. A model with a rejection rule answers
    `unknown` for an image scoring below its threshold (JSON and --out rows add `label`,
    `accepted` and `score`).
    """
    if address and engine != "ray":
        raise typer.BadParameter("--address applies to --engine ray only.")
    model = with_variant(model, variant)
    if out_file is not None:
        options = PredictFileOptions(
            model, inputs, out_file, top_k=top_k, device=device, batch_size=batch_size,
            chunk_size=chunk_size, workers=workers, strict=strict, overwrite=overwrite,
            embeddings=embeddings, engine=engine, address=address, tta=tta, reject=not no_reject,
        )  # fmt: skip
        _predict_to_file(options, as_json=as_json)
        return
    if overwrite or embeddings or engine != D["engine"] or address:
        raise typer.BadParameter(
            "--overwrite, --embeddings, --engine and --address apply to --out only."
        )
    from zoo.deploy.predict.inputs import check_inputs, iter_inputs
    from zoo.deploy.predict.scoring import Unreadable, predict_each

    check_inputs(inputs)
    results = predict_each(
        model, list(iter_inputs(inputs)), k=top_k, device=device, tta=tta,
        reject=not no_reject, strict=strict,
    )  # fmt: skip
    failed = [r for r in results if isinstance(r, Unreadable)]
    if as_json:  # one array, in input order: an unreadable input's entry is {"image", "error"}
        print_json([r.to_dict() for r in results])
    else:
        for r in results:
            if not isinstance(r, Unreadable):
                for line in r.lines():
                    out.print(line)
    for u in failed:  # after the answers: stdout stays the answers alone
        where = "" if str(u.image) in u.reason else f"{u.image}: "  # the reason names it
        err.print(f"not scored: {where}{u.reason}", markup=False)
    if failed:
        n, total = len(failed), len(results)
        err.print(
            f"error: {n:,} of {total:,} inputs could not be scored (each listed above; "
            f"{total - n:,} answered): fix or remove them, or use --out FILE to list them in "
            "FILE.errors.jsonl and exit 0.",
            markup=False,
        )
        raise typer.Exit(1)


def _predict_to_file(options: PredictFileOptions, *, as_json: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from zoo.deploy.predict.batch import predict_to_file
    from zoo.deploy.predict.inputs import count_inputs

    bar = Progress(
        "predict", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        "{task.fields[rate]}", console=err, transient=True,
    )  # fmt: skip
    task = None
    t0 = time.perf_counter()

    def advance(handled: int, skipped: int) -> None:
        nonlocal task, t0
        if task is None:  # after the resumed part is skipped: the rate counts this run only
            total = count_inputs(options.inputs)
            t0 = time.perf_counter()
            task = bar.add_task("predict", total=total, completed=skipped, rate="")
        rate = handled / max(time.perf_counter() - t0, 1e-9)
        bar.update(task, completed=skipped + handled, rate=f"{rate:,.1f} img/s")

    stopped = (  # Ctrl-C: the committed chunks stay, and the same command resumes
        f"interrupted: {options.out} keeps every chunk written so far; run the same command again "
        "to finish (what is written is skipped)"
    )
    with interrupt_exits(stopped), bar if err.is_terminal else nullcontext():
        s = predict_to_file(options, on_progress=advance if err.is_terminal else None)
    if as_json:
        print_json(s.to_dict())
        return
    err.print(s.line())


def register(app: typer.Typer) -> None:
    app.command("predict")(predict_cmd)
