"""``zoo serve``."""

from __future__ import annotations

from typing import Annotated

import typer

from zoo.cli.common import ModelOrOnnxArg, VariantOpt, choice, with_variant
from zoo.deploy.choices import Runtime


def serve_cmd(
    model: ModelOrOnnxArg,
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535)] = 8000,
    name: Annotated[
        str | None, typer.Option(help="model name in the URL (default: arch.tag)")
    ] = None,
    max_batch: Annotated[int, typer.Option(min=1, help="samples per ONNX Runtime call")] = 16,
    max_delay_ms: Annotated[
        float, typer.Option(min=0, help="wait this long for fuller batches (0: never wait)")
    ] = 0.0,
    max_queue: Annotated[int, typer.Option(min=1, help="waiting requests before 429")] = 256,
    timeout_ms: Annotated[
        float, typer.Option(min=1, help="504 after waiting this long")
    ] = 10_000.0,
    threads: Annotated[
        int | None,
        typer.Option(min=1, help="inference threads: ORT intra-op, or OpenVINO (default: CPUs)"),
    ] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    runtime: Annotated[
        Runtime,
        choice(
            Runtime,
            "--runtime",
            help="auto: OpenVINO for an .xml IR, ONNX Runtime for .onnx; openvino compiles an "
            "fp32 .onnx in OpenVINO (pip install 'zoo[openvino]')",
        ),
    ] = "auto",
    max_body_mb: Annotated[
        float, typer.Option(min=0.001, help="413 above this request size")
    ] = 32.0,
    max_image_pixels: Annotated[
        int, typer.Option(min=1, help="413 above this many decoded pixels")
    ] = 40_000_000,
    variant: VariantOpt = None,
) -> None:
    """Serve an ONNX model over the Open Inference Protocol (KServe v2) with dynamic batching.

    A model that is not an .onnx file (nor a folder holding model.onnx) is exported first."""
    from zoo.deploy.serve.run import serve

    serve(
        with_variant(model, variant),
        {
            "host": host,
            "port": port,
            "name": name,
            "max_batch": max_batch,
            "max_delay_ms": max_delay_ms,
            "max_queue": max_queue,
            "timeout_ms": timeout_ms,
            "threads": threads,
            "device": device,
            "runtime": runtime,
            "max_body_mb": max_body_mb,
            "max_image_pixels": max_image_pixels,
        },
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)
