"""``zoo pull``, ``zoo push``, ``zoo bundle``, ``zoo convert``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zoo.cli.common import JsonOpt, ModelArg, err, out, print_json


def pull_cmd(
    name: Annotated[str, typer.Argument(help="hf:ORG/REPO[@REVISION]")],
    as_json: JsonOpt = False,
) -> None:
    """Fetch a zoo model folder from the Hub into the HF cache, verify it and load it."""
    from zoo.factory import create_model, info_of
    from zoo.hub import pull
    from zoo.ref import ModelRef

    ref = ModelRef.parse(name)
    if ref.kind != "hf":
        raise typer.BadParameter(f"{name!r} is a {ref.kind} reference; give hf:ORG/REPO[@REVISION]")
    folder = pull(ref)
    model = create_model(ModelRef("model-folder", str(folder)))
    info = info_of(model)
    result = {
        "name": name,
        "path": str(folder),
        "base": info.parent,
        "num_classes": info.num_classes,
        "lineage": list(info.lineage),
        "weights_sha256": info.weights.sha256,
    }
    if as_json:
        print_json(result)
    else:
        out.print(f"{name} → {folder}")
        out.print(f"verified sha256 {info.weights.sha256}; lineage {' → '.join(info.lineage)}")


def push_cmd(
    model: Annotated[str, typer.Argument(help="model folder or run folder")],
    repo_id: Annotated[str, typer.Argument(help="ORG/REPO")],
    private: bool = False,
    revision: Annotated[str | None, typer.Option(help="branch to push to")] = None,
    create_pr: bool = False,
    as_json: JsonOpt = False,
) -> None:
    """Upload a model folder (safetensors + config + card) in one commit. Token: the usual HF sources."""
    from zoo.hub import push

    result = push(model, repo_id, private=private, revision=revision, create_pr=create_pr)
    if as_json:
        print_json(result)
    else:
        out.print(
            f"pushed {', '.join(result['files'])} to {repo_id}: {result['commit_url'] or result['pr_url']}"
        )


def bundle_cmd(
    model: ModelArg,
    dest: Annotated[Path, typer.Argument(help="output folder")],
) -> None:
    """Write a model folder: model.safetensors + config.json + README.md (+ model.onnx)."""
    from zoo.bundle import bundle

    out.print(str(bundle(model, dest)))


def convert_cmd(
    checkpoint: Annotated[Path, typer.Argument(help="legacy .pth/.pt checkpoint")],
    arch: Annotated[str, typer.Option("--arch", help="registry architecture it belongs to")],
    output: Annotated[Path, typer.Option("-o", "--output", help="model folder to write")],
    trust: Annotated[
        bool, typer.Option(help="allow unpickling arbitrary objects (only for files you trust)")
    ] = False,
    num_classes: int | None = None,
) -> None:
    """Convert a pickle checkpoint to a safetensors model folder (weights_only unless --trust)."""
    from zoo.bundle import convert

    if trust:
        err.print("warning: --trust unpickles the file: only do this for checkpoints you created")
    out.print(str(convert(checkpoint, arch, output, trust=trust, num_classes=num_classes)))


def register(app: typer.Typer) -> None:
    app.command("pull")(pull_cmd)
    app.command("push")(push_cmd)
    app.command("bundle")(bundle_cmd)
    app.command("convert")(convert_cmd)
