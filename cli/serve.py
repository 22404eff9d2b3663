"""``zoo serve``."""

from __future__ import annotations

from typing import Annotated

import typer

from zoo.cli.common import VariantOpt, choice, with_variant
from zoo.deploy.choices import Runtime
from zoo.deploy.serve.config import option_defaults
from zoo.errors import MODEL_FORMS

# Every default comes from ServeConfig; only the help text and spelling live here.
D = option_defaults()


def serve_cmd(
    models: Annotated[
        list[str],
        typer.Argument(
            metavar="MODEL",
            help=MODEL_FORMS + ", an exported .onnx file or an OpenVINO .xml IR; several: one "
            "server, each model with its own batcher and queue and a share of --threads; "
            "NAME=MODEL names one in the URL (default: its arch.tag)",
        ),
    ],
    host: Annotated[str, typer.Option(help="bind address")] = D["host"],
    port: Annotated[int, typer.Option(min=0, max=65535)] = D["port"],
    name: Annotated[
        str | None, typer.Option(help="model name in the URL (default: arch.tag); one model only")
    ] = D["name"],
    max_batch: Annotated[int, typer.Option(min=1, help="samples per ONNX Runtime call")] = D[
        "max_batch"
    ],
    max_delay_ms: Annotated[
        float, typer.Option(min=0, help="wait this long for fuller batches (0: never wait)")
    ] = D["max_delay_ms"],
    max_queue: Annotated[int, typer.Option(min=1, help="waiting requests before 429")] = D[
        "max_queue"
    ],
    timeout_ms: Annotated[float, typer.Option(min=1, help="504 after waiting this long")] = D[
        "timeout_ms"
    ],
    threads: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="inference threads: ORT intra-op, or OpenVINO (default: CPUs); several "
            "models split them",
        ),
    ] = D["threads"],
    device: Annotated[str, typer.Option(help="cpu | cuda")] = D["device"],
    runtime: Annotated[
        Runtime,
        choice(
            Runtime,
            "--runtime",
            help="auto: OpenVINO for an .xml IR, ONNX Runtime for .onnx; openvino compiles an "
            "fp32 .onnx in OpenVINO (pip install 'zoo[openvino]')",
        ),
    ] = D["runtime"],
    max_body_mb: Annotated[float, typer.Option(min=0.001, help="413 above this request size")] = D[
        "max_body_mb"
    ],
    max_image_pixels: Annotated[
        int, typer.Option(min=1, help="413 above this many decoded pixels")
    ] = D["max_image_pixels"],
    api_key_file: Annotated[
        str | None,
        typer.Option(
            help="API keys, one a line: KEY [infer,metadata,metrics] (default: env ZOO_API_KEY; "
            "health stays open)"
        ),
    ] = D["api_key_file"],
    allow_unauthenticated: Annotated[
        bool, typer.Option(help="serve a non-loopback --host without an API key")
    ] = D["allow_unauthenticated"],
    ssl_certfile: Annotated[
        str | None, typer.Option(help="TLS certificate (PEM): HTTPS and gRPC over TLS")
    ] = D["ssl_certfile"],
    ssl_keyfile: Annotated[str | None, typer.Option(help="the certificate's private key")] = D[
        "ssl_keyfile"
    ],
    grpc_port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="also serve the v2 gRPC protocol on this port"),
    ] = D["grpc_port"],
    one_process: Annotated[
        bool,
        typer.Option(
            help="several models: serve them all in this one process (less memory, no "
            "isolation); default: a worker process per model behind the same ports"
        ),
    ] = D["one_process"],
    variant: VariantOpt = None,
) -> None:
    """Serve ONNX models over the Open Inference Protocol (KServe v2) with dynamic batching.

    A model that is not an .onnx file (nor a folder holding model.onnx) is exported first.
    Several models share one server: /v2/repository/index lists them."""
    from zoo.deploy.serve.config import ServeConfig
    from zoo.deploy.serve.run import serve

    serve(
        ServeConfig(
            model_path=served(models[0], variant),
            more_models=tuple(served(m, variant) for m in models[1:]),
            name=name,
            host=host,
            port=port,
            max_batch=max_batch,
            max_delay_ms=max_delay_ms,
            max_queue=max_queue,
            timeout_ms=timeout_ms,
            threads=threads,
            device=device,
            runtime=runtime,
            max_body_mb=max_body_mb,
            max_image_pixels=max_image_pixels,
            api_key_file=api_key_file,
            allow_unauthenticated=allow_unauthenticated,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            grpc_port=grpc_port,
            one_process=one_process,
        )
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_cmd)


def served(arg: str, variant: str | None) -> str:
    """One MODEL argument with ``--variant`` applied: ``NAME=MODEL`` keeps its NAME."""
    from zoo.deploy.serve.config import split_name

    given, ref = split_name(arg)
    chosen = with_variant(ref, variant)
    return f"{given}={chosen}" if given else chosen
