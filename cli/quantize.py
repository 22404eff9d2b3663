"""``zoo quantize``: int8 ONNX with its size, latency and accuracy against fp32."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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

if TYPE_CHECKING:
    pass


def quantize_cmd(
    model: Annotated[Path, typer.Argument(help="an exported fp32 .onnx file")],
    mode: Annotated[
        QuantMode, choice(QuantMode, "--mode", help="weights only, or calibrated activations too")
    ] = "static",
    calib: Annotated[
        str | None, typer.Option(help="static: folder of real calibration images")
    ] = None,
    method: Annotated[
        CalibMethod, choice(CalibMethod, "--method", help="static, --engine ort: activation ranges")
    ] = "minmax",
    engine: Annotated[
        QuantEngine,
        choice(
            QuantEngine,
            "--engine",
            help="static: onnxruntime's quantizer, or NNCF's (pip install 'zoo[nncf]'; keeps more "
            "answers on depthwise nets)",
        ),
    ] = "ort",
    per_channel: Annotated[
        bool, typer.Option(help="per-channel weight scales (better for conv nets)")
    ] = True,
    data: Annotated[
        str | None, typer.Option("--data", help="real images (class folders give accuracy)")
    ] = None,
    max_accuracy_drop: Annotated[
        float | None, typer.Option(help="fail above this drop, e.g. 0.01")
    ] = None,
    target_agreement: Annotated[
        float | None,
        typer.Option(
            "--target-agreement",
            min=0.0,
            max=1.0,
            help="static, --engine ort: try every calibration, then keep the most sensitive "
            "nodes float until top-1 agreement with fp32 on --data (held out: no --calib "
            "image in it) reaches this, e.g. 0.98",
        ),
    ] = None,
    threads: int | None = None,
    output: Annotated[Path | None, typer.Option("-o", "--output")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Quantize an ONNX model to int8 and report size, latency and accuracy vs fp32."""
    from zoo.deploy.quantize import quantize

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
    dest = output or model.with_name(model.stem + f".int8-{mode}.onnx")
    report = quantize(
        model,
        dest,
        mode=mode,
        calib=calib,
        method=method,
        per_channel=per_channel,
        eval_data=data,
        max_accuracy_drop=max_accuracy_drop,
        threads=threads,
        engine=engine,
        target_agreement=target_agreement,
    )
    for line in report["advice_before"]:
        err.print(f"advice: {line}")
    if as_json:
        print_json(report)
    else:
        out.print(f"wrote {report['path']}")
        out.print(
            f"size {report['size_mb']['fp32']} → {report['size_mb']['int8']} MB (×{report['size_ratio']})"
        )
        lat = report["latency_ms"]
        out.print(
            f"latency p50 {lat['fp32_p50']:.2f} → {lat['int8_p50']:.2f} ms (×{report['latency_ratio']}, "
            f"batch {lat['batch']}, {lat['threads']} threads)"
        )
        low, high = report["agreement_ci95"]
        out.print(
            f"top-1 agreement with fp32: {report['top1_agreement']:.1%} on {report['n_images']} "
            f"images (95% interval {low:.1%}–{high:.1%})"
        )
        if "accuracy" in report:
            out.print(
                f"accuracy {report['accuracy']['fp32']:.4f} → {report['accuracy']['int8']:.4f}"
            )
        cov = report["coverage"]
        out.print(f"coverage: {cov['quantized']}/{cov['heavy_ops']} Conv/Gemm/MatMul nodes in int8")
        if "search" in report:
            s, cal = report["search"], report["search"]["calibration"]
            ops = ", ".join(f"{n} {op}" for op, n in s["float_ops"].items()) or "none"
            out.print(
                f"float: {s['k']} of {s['sensitivity']['candidates']} quantizable nodes kept "
                f"float ({ops}) for target agreement {s['target']:.1%}"
            )
            out.print(
                f"calibration: {cal['method']} ranges, per-channel weights "
                f"{'on' if cal['per_channel'] else 'off'}"
                f"{', symmetric activations' if cal['symmetric_activations'] else ''} (the best "
                f"of {len(cal['tried'])} settings tried on {cal['n_images']} calibration images)"
            )
            held = s["held_out"]
            low, high = held["ci95"]
            out.print(
                f"held-out agreement: {held['agreement']:.1%} on {held['n_images']} --data images "
                f"(95% interval {low:.1%}–{high:.1%}; the float count was chosen on them)"
            )
    if report.get("advice_after"):
        err.print(f"advice: {report['advice_after']}")


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize_cmd)
