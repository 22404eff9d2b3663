"""``zoo export``: options → :class:`~zoo.deploy.export.options.ExportOptions` →
:func:`~zoo.deploy.export.run.run_export` → the result's summary (or ``--json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zoo.cli.common import (
    JsonOpt,
    ModelArg,
    WeightsOpt,
    choice,
    err,
    out,
    print_json,
)
from zoo.deploy.choices import (
    Exporter,
    Format,
    JitMode,
    KServeRuntime,
    Precision,
)
from zoo.deploy.export.options import ExportOptions, applies_to, option_defaults

# Every default and check lives in ExportOptions (which --format uses which option:
# OPTION_FORMATS, whose formats each help text names); only the help text and spelling live here.
D = option_defaults()
A = applies_to


def typed_options(ctx: typer.Context) -> frozenset[str]:
    """The options typed on the command line, even at their default value, as
    :class:`ExportOptions` names them (``--format``: ``format``; ``--register``: ``register``)."""
    names = {"fmt": "format", "register_name": "register"}
    sources = {name: ctx.get_parameter_source(name) for name in ctx.params}
    # by name: typer's click is its own copy, its ParameterSource not click.core's
    return frozenset(
        names.get(name, name)
        for name, source in sources.items()
        if source is not None and source.name != "DEFAULT"
    )


def export_cmd(
    ctx: typer.Context,
    model: ModelArg,
    fmt: Annotated[Format, choice(Format, "--format", "-f", help="output format")] = D["format"],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="output: onnx a .onnx file; torchscript .ts, .pt or .torchscript; pt2 .pt2; "
            "triton a repository folder; openvino an IR folder; kserve the .yaml manifest, its "
            "Triton repository beside it",
        ),
    ] = D["output"],
    static_batch: Annotated[
        int | None,
        typer.Option(
            "--static-batch",
            min=1,
            help=f"{A('static_batch')}: fix the batch at N (predict/serve pad and chunk to "
            "it); default: dynamic",
        ),
    ] = D["static_batch"],
    dynamic_batch: Annotated[
        bool,
        typer.Option(
            "--dynamic-batch",
            help=f"{A('dynamic_batch')}: the default (a batch axis proven at 1, 2, 5); kept "
            "for old scripts (openvino/triton/kserve: always dynamic)",
        ),
    ] = D["dynamic_batch"],
    dynamic_size: Annotated[
        bool,
        typer.Option(
            "--dynamic-size", help=f"{A('dynamic_size')}: dynamic H/W, proven at 2 resolutions"
        ),
    ] = D["dynamic_size"],
    opset: Annotated[
        int | None, typer.Option(help=f"{A('opset')}: ONNX opset (default: the tested one)")
    ] = D["opset"],
    exporter: Annotated[
        Exporter,
        choice(
            Exporter,
            "--exporter",
            help=f"{A('exporter')}: ONNX exporter (auto: dynamo, then legacy)",
        ),
    ] = D["exporter"],
    jit: Annotated[JitMode, choice(JitMode, "--jit", help=f"{A('jit')}: how to build")] = D["jit"],
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help=f"{A('data')}: real images for the prediction check (default: the bundled "
            "photos, and for a run a seeded 64 of its validation images)",
        ),
    ] = D["data"],
    allow_mismatch: Annotated[
        bool,
        typer.Option(help=f"{A('allow_mismatch')}: write the file even when parity fails"),
    ] = D["allow_mismatch"],
    max_batch: Annotated[
        int, typer.Option(help=f"{A('max_batch')}: the largest batch (Triton's max_batch_size)")
    ] = D["max_batch"],
    precision: Annotated[
        Precision,
        choice(
            Precision,
            "--precision",
            help="onnx fp32|fp16: weights and compute (inputs/outputs fp32); openvino "
            "fp32|bf16|int8: the inference precision, set explicitly; others: fp32 only",
        ),
    ] = D["precision"],
    calib: Annotated[
        str | None,
        typer.Option(
            "--calib", help="openvino int8: real calibration images, disjoint from --data"
        ),
    ] = D["calib"],
    min_agreement: Annotated[
        float | None,
        typer.Option(
            "--min-agreement",
            min=0.0,
            max=1.0,
            help="openvino bf16/int8: top-1 agreement with PyTorch on the gate's real images "
            "(default 0.98)",
        ),
    ] = D["min_agreement"],
    slim: Annotated[
        bool,
        typer.Option(
            "--slim",
            help=f"{A('slim')}: simplify the graph with onnxslim; the checks judge the result",
        ),
    ] = D["slim"],
    embed_preprocessing: Annotated[
        bool,
        typer.Option(
            "--embed-preprocessing",
            help=f"{A('embed_preprocessing')}: the graph takes uint8 NHWC pixels of any size "
            "and resizes, crops and normalises them itself; parity judged from pixels to logits",
        ),
    ] = D["embed_preprocessing"],
    fp16_io: Annotated[
        bool,
        typer.Option("--fp16-io", help="onnx, --precision fp16: float16 inputs and outputs too"),
    ] = D["fp16_io"],
    kserve_runtime: Annotated[
        KServeRuntime,
        choice(
            KServeRuntime,
            "--kserve-runtime",
            help="kserve: KServe's Triton runtime, or a zoo serve container (the Dockerfile)",
        ),
    ] = D["kserve_runtime"],
    storage_uri: Annotated[
        str | None,
        typer.Option(
            "--storage-uri",
            help="kserve: where the Triton repository will be (s3://…, gs://…, pvc://…); "
            "default: its file:// URI here",
        ),
    ] = D["storage_uri"],
    image: Annotated[
        str | None, typer.Option("--image", help="kserve, runtime zoo: the container image")
    ] = D["image"],
    weights: WeightsOpt = D["weights"],
    register_name: Annotated[
        str | None,
        typer.Option(
            "--register",
            metavar="NAME",
            help=f"{A('register')}, a run trained with --track mlflow: register the exported "
            "file as a version of MLflow model NAME, its lineage tagged (run, data fingerprint, "
            "parent weights)",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Export a model; checks the graph and proves parity with PyTorch (exit 1 on a breach)."""
    from zoo.cli import tracking
    from zoo.deploy.export.run import run_export

    options = ExportOptions(
        model=model,
        format=fmt,
        output=output,
        static_batch=static_batch,
        dynamic_batch=dynamic_batch,
        dynamic_size=dynamic_size,
        opset=opset,
        exporter=exporter,
        jit=jit,
        data=data,
        allow_mismatch=allow_mismatch,
        max_batch=max_batch,
        precision=precision,
        calib=calib,
        min_agreement=min_agreement,
        slim=slim,
        embed_preprocessing=embed_preprocessing,
        fp16_io=fp16_io,
        weights=weights,
        kserve_runtime=kserve_runtime,
        storage_uri=storage_uri,
        image=image,
        given=typed_options(ctx),
    )
    tracked = tracking.tracked(model, register=register_name, fmt=fmt)  # before any work
    result = run_export(options)
    if as_json:
        print_json(result.to_dict())
    else:
        for line in result.lines():
            out.print(line)
    for warning in result.warnings():
        err.print(warning)
    if tracked is not None:  # the stage is built only for a tracked run
        tracking.log(tracked, tracking.export_stage(result), register_name)


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)
