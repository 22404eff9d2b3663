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
from zoo.deploy.quantize.options import option_defaults

# Every default comes from QuantizeOptions; only the help text and spelling live here.
D = option_defaults()


def quantize_cmd(
    model: Annotated[Path, typer.Argument(help="an exported fp32 .onnx file")],
    mode: Annotated[
        QuantMode, choice(QuantMode, "--mode", help="weights only, or calibrated activations too")
    ] = D["mode"],
    calib: Annotated[
        str | None, typer.Option(help="static: folder of real calibration images")
    ] = D["calib"],
    method: Annotated[
        CalibMethod | None,
        choice(
            CalibMethod,
            "--method",
            help="static, --engine ort: activation ranges (default: minmax, the measured best)",
        ),
    ] = D["method"],
    engine: Annotated[
        QuantEngine,
        choice(
            QuantEngine,
            "--engine",
            help="static: auto = NNCF where installed (pip install 'zoo[nncf]'; it kept the "
            "most accuracy measured), else onnxruntime's quantizer; or either by name",
        ),
    ] = D["engine"],
    per_channel: Annotated[
        bool | None,
        typer.Option(
            "--per-channel/--no-per-channel",
            help="per-channel weight scales (default on; better for conv nets)",
        ),
    ] = D["per_channel"],
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="real images (class folders give accuracy); default: the run's validation images",
        ),
    ] = D["eval_data"],
    max_accuracy_drop: Annotated[
        float | None, typer.Option(help="fail above this drop, e.g. 0.01")
    ] = D["max_accuracy_drop"],
    allow_drop: Annotated[
        bool,
        typer.Option(
            "--allow-drop",
            help="write the int8 file and exit 0 even below the floor (1 point of accuracy, or "
            "agreement's interval under 98%)",
        ),
    ] = D["allow_drop"],
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
    ] = D["target_agreement"],
    weight_bits: Annotated[
        int | None,
        typer.Option(
            "--weight-bits",
            help="static: the int8 weights' bits, 8 or 7 (onnxruntime's reduce_range; NNCF's "
            "overflow fix on every dense layer, depthwise ones keep 8); "
            "default: the fewer of a QAT model's and this CPU's (7 without VNNI, where NNCF "
            "makes both and keeps the one agreeing more with fp32). 8 on a CPU without VNNI "
            "makes a file for a VNNI server",
        ),
    ] = D["weight_bits"],
    threads: int | None = D["threads"],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="default: a run's model/variants/int8-KIND.onnx, KIND the engine's (nncf) or "
            "the mode (static, dynamic) of onnxruntime's (from variants/NAME.onnx: "
            "variants/NAME-int8-KIND.onnx)",
        ),
    ] = D["output"],
    as_json: JsonOpt = False,
) -> None:
    """Quantize an ONNX model to int8 and report size, latency and accuracy vs fp32 on the
    model's own images."""
    from zoo.cli import tracking
    from zoo.deploy.quantize.int8 import quantize
    from zoo.deploy.quantize.options import QuantizeOptions

    options = QuantizeOptions(
        model=model,
        output=output,
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
        weight_bits=weight_bits,
    )
    report = quantize(options, on_plan=lambda line: err.print(line))
    for line in report.advice_before:
        err.print(f"advice: {line}")
    if as_json:
        print_json(report.to_dict())
    else:
        for line in report.lines():
            out.print(line)
    if report.advice_after:
        err.print(f"advice: {report.advice_after}")
    found = tracking.tracked(model)
    if found is not None:  # the stage is built only for a tracked run
        tracking.log(found, tracking.quantize_stage(report))
    if report.failed:
        err.print(
            f"error: int8 is below the floor on {report.images.description}: "
            f"{report.floor.reason}. Nothing was written; try "
            + ("--engine nncf or " if report.engine != "nncf" else "")
            + "--target-agreement 0.98 (keeps the most sensitive nodes float), or fp16 "
            "(zoo export --precision fp16); --allow-drop keeps it anyway. Next step when "
            f"post-training int8 falls short: quantization-aware fine-tuning, zoo distill "
            f"{_run_of(model)} --qat --data DIR (2 epochs of every layer through int8 "
            "rounding; then zoo export and zoo quantize of the new run)."
        )
        raise typer.Exit(1)


def _run_of(model: Path) -> str:
    """The run an export came from, else ``RUN``."""
    from zoo.run_images import find_run

    return str(find_run(model) or "RUN")


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize_cmd)
