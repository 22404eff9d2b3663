"""``zoo quantize``: int8 ONNX with its size, latency and accuracy against fp32."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zoo.cli.common import (
    JsonOpt,
    choice,
    err,
    out,
    print_json,
)
from zoo.deploy.choices import (
    CalibMethod,
    QuantEngine,
    QuantMode,
)


def quantize_cmd(
    model: Annotated[Path, typer.Argument(help="an exported fp32 .onnx file")],
    mode: Annotated[
        QuantMode, choice(QuantMode, "--mode", help="weights only, or calibrated activations too")
    ] = "static",
    calib: Annotated[
        str | None, typer.Option(help="static: folder of real calibration images")
    ] = None,
    method: Annotated[
        CalibMethod | None,
        choice(
            CalibMethod,
            "--method",
            help="static, --engine ort: activation ranges (default: minmax, the measured best)",
        ),
    ] = None,
    engine: Annotated[
        QuantEngine,
        choice(
            QuantEngine,
            "--engine",
            help="static: auto = NNCF where installed (pip install 'zoo[nncf]'; it kept the "
            "most accuracy measured), else onnxruntime's quantizer; or either by name",
        ),
    ] = "auto",
    per_channel: Annotated[
        bool | None,
        typer.Option(
            "--per-channel/--no-per-channel",
            help="per-channel weight scales (default on; better for conv nets)",
        ),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="real images (class folders give accuracy); default: the run's validation images",
        ),
    ] = None,
    max_accuracy_drop: Annotated[
        float | None, typer.Option(help="fail above this drop, e.g. 0.01")
    ] = None,
    allow_drop: Annotated[
        bool,
        typer.Option(
            "--allow-drop",
            help="write the int8 file and exit 0 even below the floor (1 point of accuracy, or "
            "agreement's interval under 98%)",
        ),
    ] = False,
    target_agreement: Annotated[
        float | None,
        typer.Option(
            "--target-agreement",
            min=0.0,
            max=1.0,
            help="static, --engine ort: try every calibration, then keep the most sensitive "
            "nodes float until top-1 agreement with fp32 on the evaluation images (held out: "
            "no calibration image in them) reaches this, e.g. 0.98",
        ),
    ] = None,
    threads: int | None = None,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="default: a run's model/variants/int8-MODE.onnx"),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Quantize an ONNX model to int8 and report size, latency and accuracy vs fp32 on the
    model's own images."""
    from zoo.deploy.quantize.int8 import quantize

    if mode == "dynamic" and calib is not None:
        raise typer.BadParameter(
            "--calib applies to --mode static (dynamic quantization calibrates nothing)",
            param_hint="--calib",
        )
    if target_agreement is not None and not target_agreement > 0.0:  # 0 or nan
        raise typer.BadParameter(
            f"{target_agreement} is not in (0, 1]: give the share of top-1 answers to keep, "
            "e.g. 0.98",
            param_hint="--target-agreement",
        )
    report = quantize(
        model,
        output,
        mode=mode,
        calib=calib,
        method=method,
        per_channel=per_channel,
        eval_data=data,
        max_accuracy_drop=max_accuracy_drop,
        threads=threads,
        engine=engine,
        target_agreement=target_agreement,
        allow_drop=allow_drop,
        on_plan=lambda line: err.print(line),
    )
    for line in report.advice_before:
        err.print(f"advice: {line}")
    if as_json:
        print_json(report.to_dict())
    else:
        for line in report.lines():
            out.print(line)
    if report.advice_after:
        err.print(f"advice: {report.advice_after}")
    if report.failed:
        err.print(
            f"error: int8 is below the floor on {report.images.description}: "
            f"{report.floor.reason}. Nothing was written; try "
            + ("--engine nncf or " if report.engine != "nncf" else "")
            + "--target-agreement 0.98 (keeps the most sensitive nodes float), or fp16 "
            "(zoo export --precision fp16); --allow-drop keeps it anyway."
        )
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize_cmd)
