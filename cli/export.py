"""``zoo export`` and ``zoo compare-jit``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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
    Precision,
)

if TYPE_CHECKING:
    from zoo.ref import ModelRef


def export_variant_name(
    fmt: str, precision: str, *, embed: bool, static_batch: int | None, fp16_io: bool
) -> str | None:
    """The variant a run's export goes to (``FOLDER/variants/NAME``), or None for the folder's
    own ``model.onnx`` (a plain fp32 ONNX graph, the artifact contract's one export)."""
    if fmt == "openvino":
        return f"openvino-{precision}"
    if fmt != "onnx":
        return None
    parts = [precision] if precision != "fp32" else []
    parts += ["io16"] if fp16_io else []
    parts += ["pixels"] if embed else []
    parts += [f"batch{static_batch}"] if static_batch is not None else []
    return "-".join(parts) or None


def _default_output(ref: ModelRef, fmt: str, variant: str | None) -> Path:
    ext = {"onnx": ".onnx", "torchscript": ".ts", "pt2": ".pt2", "triton": "", "openvino": ""}
    if fmt == "triton":
        return Path("model_repository")
    if ref.kind in ("run", "model-folder"):
        folder = ref.model_folder
        if variant is not None:  # derived files never land beside the contract's files
            from zoo.variants import variants_dir

            return variants_dir(folder) / (variant + ext[fmt])
        if fmt == "onnx":
            return folder / "model.onnx"  # part of the artifact contract
        stem = (folder.parent if folder.name == "model" else folder).resolve().name
    else:
        stem = ref.shown.replace(":", "_").replace("/", "_").replace("@", "_")
    if fmt == "openvino":  # an IR folder: model.xml + model.bin
        return Path(f"{stem}_openvino")
    return Path(f"{stem}{ext[fmt]}")


def export_cmd(
    model: ModelArg,
    fmt: Annotated[Format, choice(Format, "--format", "-f", help="output format")] = "onnx",
    output: Annotated[
        Path | None,
        typer.Option(
            "-o", "--output", help="output file (triton: repository folder; openvino: IR folder)"
        ),
    ] = None,
    static_batch: Annotated[
        int | None,
        typer.Option(
            "--static-batch",
            min=1,
            help="onnx: fix the batch at N (predict/serve pad and chunk to it); default: dynamic",
        ),
    ] = None,
    dynamic_batch: Annotated[
        bool,
        typer.Option(
            "--dynamic-batch",
            help="onnx: the default (a batch axis proven at 1, 2, 5); kept for old scripts",
        ),
    ] = False,
    dynamic_size: Annotated[
        bool, typer.Option("--dynamic-size", help="dynamic H/W, proven at 2 resolutions")
    ] = False,
    opset: Annotated[int | None, typer.Option(help="ONNX opset (default: the tested one)")] = None,
    exporter: Annotated[
        Exporter, choice(Exporter, "--exporter", help="ONNX exporter (auto: dynamo, then legacy)")
    ] = "auto",
    jit: Annotated[JitMode, choice(JitMode, "--jit", help="torchscript: how to build")] = "trace",
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            help="real images for the prediction check (default: the bundled photos, and for "
            "a run a seeded 64 of its validation images)",
        ),
    ] = None,
    allow_mismatch: Annotated[
        bool, typer.Option(help="write the file even when parity fails")
    ] = False,
    max_batch: Annotated[int, typer.Option(help="triton: max_batch_size")] = 32,
    precision: Annotated[
        Precision,
        choice(
            Precision,
            "--precision",
            help="onnx fp32|fp16: weights and compute (inputs/outputs fp32); openvino "
            "fp32|bf16|int8: the inference precision, set explicitly",
        ),
    ] = "fp32",
    calib: Annotated[
        str | None,
        typer.Option(
            "--calib", help="openvino int8: real calibration images, disjoint from --data"
        ),
    ] = None,
    min_agreement: Annotated[
        float | None,
        typer.Option(
            "--min-agreement",
            min=0.0,
            max=1.0,
            help="openvino bf16/int8: top-1 agreement with PyTorch on the gate's real images "
            "(default 0.98)",
        ),
    ] = None,
    slim: Annotated[
        bool,
        typer.Option(
            "--slim", help="onnx: simplify the graph with onnxslim; the checks judge the result"
        ),
    ] = False,
    embed_preprocessing: Annotated[
        bool,
        typer.Option(
            "--embed-preprocessing",
            help="onnx/triton: the graph takes uint8 NHWC pixels of any size and resizes, "
            "crops and normalises them itself; parity judged from pixels to logits",
        ),
    ] = False,
    fp16_io: Annotated[
        bool,
        typer.Option("--fp16-io", help="onnx, --precision fp16: float16 inputs and outputs too"),
    ] = False,
    weights: WeightsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Export a model; checks the graph and proves parity with PyTorch (exit 1 on a breach)."""
    from zoo.deploy.export.onnx_export import DEFAULT_OPSET, export_onnx, export_torch
    from zoo.ref import ModelRef

    if dynamic_batch and static_batch is not None:
        raise typer.BadParameter(
            "--dynamic-batch and --static-batch contradict each other: the batch is dynamic "
            "by default, pass only --static-batch N to fix it",
            param_hint="--static-batch",
        )
    onnx_only = ((static_batch is not None, "--static-batch"), (slim, "--slim"))
    for given, flag in onnx_only:
        if given and fmt != "onnx":
            raise typer.BadParameter(
                f"{flag} applies to --format onnx, not {fmt!r}", param_hint=flag
            )
    _check_precision(fmt, precision, calib, min_agreement)
    if fp16_io and (fmt != "onnx" or precision != "fp16" or embed_preprocessing):
        raise typer.BadParameter(
            "--fp16-io needs --format onnx and --precision fp16, without --embed-preprocessing",
            param_hint="--fp16-io",
        )
    if embed_preprocessing:
        if fmt not in ("onnx", "triton"):
            raise typer.BadParameter(
                f"--embed-preprocessing applies to --format onnx or triton, not {fmt!r}",
                param_hint="--embed-preprocessing",
            )
        fixed = ((static_batch is not None, "--static-batch"), (dynamic_size, "--dynamic-size"))
        for given, flag in fixed:
            if given:
                raise typer.BadParameter(
                    f"--embed-preprocessing takes images of any size in a dynamic batch: "
                    f"drop {flag}",
                    param_hint=flag,
                )
    ref = ModelRef.parse(model)
    variant = export_variant_name(
        fmt,
        precision,
        embed=embed_preprocessing,
        static_batch=static_batch,
        fp16_io=fp16_io,
    )
    path = output or _default_output(ref, fmt, variant)
    if fmt == "onnx":
        result = export_onnx(
            ref,
            path,
            static_batch=static_batch,
            dynamic_size=dynamic_size,
            opset=opset or DEFAULT_OPSET,
            exporter=exporter,
            data=data,
            allow_mismatch=allow_mismatch,
            weights=weights,
            slim=slim,
            precision=precision,
            embed_preprocessing=embed_preprocessing,
            fp16_io=fp16_io,
        )
    elif fmt == "openvino":
        from zoo.deploy.export.openvino import export_openvino

        result = export_openvino(
            ref,
            path,
            precision=precision,
            data=data,
            calib=calib,
            min_agreement=min_agreement,
            allow_mismatch=allow_mismatch,
            weights=weights,
        )
    elif fmt == "triton":
        from zoo.deploy.export.triton import export_triton

        result = export_triton(
            ref,
            path,
            max_batch=max_batch,
            opset=opset or DEFAULT_OPSET,
            data=data,
            weights=weights,
            embed_preprocessing=embed_preprocessing,
        )
    else:
        result = export_torch(ref, path, fmt=fmt, jit=jit, weights=weights)
    d = result.to_dict()
    if as_json:
        print_json(d)
    else:
        batch = (
            f", batch {d['static_batch'] or 'dynamic'}, {d['precision']}"
            if d["format"] in ("onnx", "openvino")
            else ""
        )
        out.print(
            f"wrote {d['path']} ({d['size_mb']} MB, {d['format']}, exporter {d['exporter']}{batch})"
        )
        if d.get("slim"):
            sl = d["slim"]
            out.print(
                f"slim (onnxslim {sl['onnxslim']}): {sl['nodes_before']} → {sl['nodes_after']} "
                f"nodes, {sl['bytes_before'] / 2**20:.2f} → {sl['bytes_after'] / 2**20:.2f} MB"
            )
        p = d["parity"]
        if "tensors" in p:
            t = p["tensors"]
            out.print(
                f"parity tensors: max abs {t['max_abs']:.2e}, max rel {t['max_rel']:.2e}, cosine "
                f"{t['cosine']:.7f} → {'pass' if t['passed'] else 'FAIL'}"
            )
        if p.get("predictions"):
            q = p["predictions"]
            out.print(
                f"parity predictions: top-1 agreement {q['agreement']:.1%} on {q['n_images']} "
                f"real images (needs {p['tolerances']['min_agreement']:.1%})"
            )
        if p.get("images"):  # which real images judged it: the bundled photos, --data, the run's
            out.print("parity images: " + "; ".join(i["description"] for i in p["images"]))
        for dyn in p.get("dynamic", []):
            out.print(
                f"parity dynamic: batch {dyn['batch']}, {dyn['size']}px → max abs {dyn['max_abs']:.2e} "
                f"{'pass' if dyn['passed'] else 'FAIL'}"
            )
    if d["parity"] and not d["parity"].get("passed", True):
        err.print("warning: parity FAILED (written because of --allow-mismatch)")


def _check_precision(fmt: str, precision: str, calib: str | None, agree: float | None) -> None:
    """Usage errors of --precision, --calib and --min-agreement for the chosen --format."""
    from zoo.deploy.choices import ONNX_PRECISIONS, OPENVINO_PRECISIONS

    allowed = {"onnx": ONNX_PRECISIONS, "openvino": OPENVINO_PRECISIONS}.get(fmt, ("fp32",))
    if precision not in allowed:
        raise typer.BadParameter(
            f"--precision {precision} is not one of --format {fmt}'s: {', '.join(allowed)}"
            + (" (int8 ONNX: zoo quantize)" if fmt == "onnx" and precision == "int8" else ""),
            param_hint="--precision",
        )
    if calib is None and (fmt, precision) == ("openvino", "int8"):
        raise typer.BadParameter(
            "--format openvino --precision int8 needs --calib DIR: real images like the ones "
            "the model will see, not the --data images the gate judges it on",
            param_hint="--calib",
        )
    if calib is not None and (fmt, precision) != ("openvino", "int8"):
        raise typer.BadParameter(
            "--calib applies to --format openvino --precision int8 (ONNX int8: zoo quantize)",
            param_hint="--calib",
        )
    if agree is not None and not agree > 0:
        raise typer.BadParameter("give a share in (0, 1], e.g. 0.98", param_hint="--min-agreement")
    if agree is not None and (fmt != "openvino" or precision == "fp32"):
        raise typer.BadParameter(
            "--min-agreement applies to --format openvino --precision bf16 or int8 (fp32 must "
            "agree on every image)",
            param_hint="--min-agreement",
        )


def compare_jit_cmd(
    model: ModelArg,
    as_json: JsonOpt = False,
) -> None:
    """Compare torch.jit.trace, torch.jit.script and torch.export against eager."""
    from zoo.deploy.export.jit_compare import compare_jit
    from zoo.factory import create_model, info_of

    net = create_model(model)
    size = info_of(net).input_size
    shapes: list[tuple[int, ...]] = [(b, *size) for b in (2, 1, 3)]
    if len(size) == 3 and size[1] >= 64:  # and another resolution
        shapes.append((2, size[0], size[1] + 32, size[2] + 32))
    report = compare_jit(net, shapes)
    if as_json:
        print_json(report)
        return
    for p in report["paths"]:
        status = "pass" if p["passed"] else ("not built" if not p["built"] else "FAIL")
        out.print(f"{p['path']:<7} {status}" + (f" ({p['error']})" if p["error"] else ""))
        for c_ in p["checks"]:
            out.print(
                f"   shape {c_['shape']}: max abs {c_['max_abs']:.2e} {'pass' if c_['passed'] else 'FAIL'}"
            )
        for w_ in p["warnings"]:
            out.print(f"   warning: {w_}")
    err.print(report["note"])


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)
    app.command("compare-jit")(compare_jit_cmd)
