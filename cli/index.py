"""``zoo index`` (a folder's images as searchable embeddings) and ``zoo similar`` (the nearest
indexed images of a few images)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zoo.cli.common import DeviceOpt, JsonOpt, ModelOrOnnxArg, choice, err, out, print_json
from zoo.deploy.choices import SearchBackend


def index_cmd(
    model: ModelOrOnnxArg,
    folder: Annotated[Path, typer.Argument(metavar="DIR", help="the images to index (recursive)")],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="the index folder to write (INDEX)")
    ],
    batch_size: Annotated[int, typer.Option("--batch-size", min=1)] = 32,
    workers: Annotated[
        int | None,
        typer.Option("--workers", min=1, help="decoding threads; default: the CPUs available"),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace an existing index folder")
    ] = False,
    device: DeviceOpt = "cpu",
    as_json: JsonOpt = False,
) -> None:
    """Index a folder's images: their L2-normalised penultimate-layer embeddings and paths.

    The index remembers the model's weights digest: `zoo similar` and `zoo eval --index` refuse
    a query with another model. Written in shards, in constant memory, swapped in whole.
    """
    from zoo.deploy.index.build import build_index

    summary = build_index(
        model, folder, output, batch_size=batch_size, workers=workers, device=device,
        overwrite=overwrite,
    )  # fmt: skip
    if as_json:
        print_json(summary.to_dict())
        return
    err.print(summary.line(), markup=False)


def similar_cmd(
    index: Annotated[Path, typer.Argument(metavar="INDEX", help="an index from `zoo index`")],
    images: Annotated[list[str], typer.Argument(metavar="IMAGE...", help="image files")],
    k: Annotated[int, typer.Option("-k", "--top-k", min=1, help="neighbours per image")] = 5,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="embed the images with this model (default: the one that built the index; "
            "its weights must be the same)",
        ),
    ] = None,
    backend: Annotated[
        SearchBackend,
        choice(
            SearchBackend,
            "--backend",
            help="exact search in numpy or FAISS (pip install 'zoo[faiss]'); auto: numpy, "
            "FAISS for a big index searched by many images when installed",
        ),
    ] = "auto",
    device: DeviceOpt = "cpu",
    as_json: JsonOpt = False,
) -> None:
    """The indexed images nearest to each image, by cosine similarity of their embeddings."""
    from zoo.deploy.index.query import similar

    found = similar(index, images, k=k, model=model, backend=backend, device=device)
    if as_json:
        print_json([s.to_dict() for s in found])
        return
    for s in found:
        for line in s.lines():
            out.print(line, markup=False)


def register(app: typer.Typer) -> None:
    app.command("index")(index_cmd)
    app.command("similar")(similar_cmd)
