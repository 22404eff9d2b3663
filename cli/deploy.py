"""``zoo export``, ``zoo predict``, ``zoo compare-jit``, ``zoo quantize``, ``zoo bench``."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from zoo.cli.common import (
    JsonOpt,
    ModelArg,
    ModelOrOnnxArg,
    WeightsOpt,
    choice,
    err,
    int_list,
    out,
    print_json,
)
from zoo.deploy.choices import (
    Backend,
    CalibMethod,
    Exporter,
    Format,
    JitMode,
    Precision,
    PredictEngine,
    QuantEngine,
    QuantMode,
    Tta,
)

if TYPE_CHECKING:
    from zoo.ref import ModelRef


def _default_output(ref: ModelRef, fmt: str) -> Path:
    ext = {"onnx": ".onnx", "torchscript": ".ts", "pt2": ".pt2", "triton": "", "openvino": ""}
    if fmt == "triton":
        return Path("model_repository")
    if ref.kind in ("run", "model-folder"):
        folder = ref.model_folder
        if fmt == "onnx":
            return folder / "model.onnx"  # part of the artifact contract
        if fmt == "openvino":
            return folder / "openvino"
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
        str | None, typer.Option("--data", help="real images for the prediction check")
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
    from zoo.deploy.export import DEFAULT_OPSET, export_onnx, export_torch
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
    path = output or _default_output(ref, fmt)
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
        from zoo.deploy.openvino_export import export_openvino

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
        from zoo.deploy.triton import export_triton

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


InputsArg = Annotated[
    list[str],
    typer.Argument(
        metavar="INPUTS...",
        help="image files, folders (recursive), globs ('photos/**/*.jpg', quoted) or text "
        "files listing image paths (one per line, relative to the list's folder)",
    ),
]


def predict_cmd(
    model: ModelOrOnnxArg,
    inputs: InputsArg,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1)] = 5,
    device: str = "cpu",
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
    ] = 32,
    chunk_size: Annotated[
        int,
        typer.Option(
            "--chunk-size", min=1, help="--out: inputs per committed chunk (what a kill can cost)"
        ),
    ] = 1024,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", min=1, help="--out: decoding threads; default: the CPUs available"
        ),
    ] = None,
    strict: Annotated[
        bool, typer.Option("--strict", help="--out: stop at the first file that cannot be read")
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="--out: replace the file and discard an interrupted job"),
    ] = False,
    embeddings: Annotated[
        bool,
        typer.Option(
            "--embeddings",
            help="--out: add `embedding`, the penultimate-layer features (.parquet/.jsonl)",
        ),
    ] = False,
    engine: Annotated[
        PredictEngine,
        choice(
            PredictEngine,
            "--engine",
            help="--out: score here, or on Ray Data (pip install 'zoo[ray]'; --workers: actors)",
        ),
    ] = "local",
    address: Annotated[
        str | None,
        typer.Option("--address", help="--engine ray: the cluster to join (default: a local Ray)"),
    ] = None,
    tta: Annotated[
        Tta,
        choice(
            Tta,
            "--tta",
            help="test-time augmentation: average the scores of the eval crop and its mirror "
            "(flip), of five crops, or of those and their mirrors",
        ),
    ] = "none",
    as_json: JsonOpt = False,
) -> None:
    """Top-k labels. From an ONNX file alone, preprocessing and class names come from its metadata.

    Without --out the labels are printed (a few images, all in memory); with --out any number
    of images are scored into a file, resumably.
    """
    if address and engine != "ray":
        raise typer.BadParameter("--address applies to --engine ray only.")
    if out_file is not None:
        _predict_to_file(
            model, inputs, out_file, top_k=top_k, device=device, batch_size=batch_size,
            chunk_size=chunk_size, workers=workers, strict=strict, overwrite=overwrite,
            embeddings=embeddings, engine=engine, address=address, tta=tta, as_json=as_json,
        )  # fmt: skip
        return
    if strict or overwrite or embeddings or engine != "local" or address:
        raise typer.BadParameter(
            "--strict, --overwrite, --embeddings, --engine and --address apply to --out only."
        )
    from zoo.deploy.predict import predict
    from zoo.deploy.predict_inputs import check_inputs, iter_inputs

    check_inputs(inputs)
    results = predict(model, list(iter_inputs(inputs)), k=top_k, device=device, tta=tta)
    if as_json:
        print_json(results)
        return
    for r in results:
        out.print(f"{r['image']}:")
        for p in r["top"]:
            out.print(f"  {p['score']:.4f}  {p['label']}")


def _predict_to_file(
    model: str, inputs: list[str], out_file: Path, *, as_json: bool, **options: Any
) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from zoo.deploy.batch_predict import predict_to_file
    from zoo.deploy.predict_inputs import count_inputs

    bar = Progress(
        "predict", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        "{task.fields[rate]}", console=err, transient=True,
    )  # fmt: skip
    task = None
    t0 = time.perf_counter()

    def advance(handled: int, skipped: int) -> None:
        nonlocal task, t0
        if task is None:  # after the resumed part is skipped: the rate counts this run only
            total = count_inputs(inputs)
            t0 = time.perf_counter()
            task = bar.add_task("predict", total=total, completed=skipped, rate="")
        rate = handled / max(time.perf_counter() - t0, 1e-9)
        bar.update(task, completed=skipped + handled, rate=f"{rate:,.1f} img/s")

    with bar if err.is_terminal else nullcontext():
        s = predict_to_file(
            model, inputs, out_file, on_progress=advance if err.is_terminal else None, **options
        )
    if as_json:
        print_json(s.to_dict())
        return
    errors = (
        f"{s.errors:,} unreadable (listed in {s.errors_file})"
        if s.errors_file
        else "none unreadable"
    )
    err.print(
        f"predicted {s.done:,} inputs → {s.out}: {s.rows:,} rows, {s.skipped:,} skipped as "
        f"already done, {errors}; {s.seconds:.1f} s, {s.images_per_s:,.1f} images/s"
    )


def compare_jit_cmd(
    model: ModelArg,
    as_json: JsonOpt = False,
) -> None:
    """Compare torch.jit.trace, torch.jit.script and torch.export against eager."""
    from zoo.deploy.jit_compare import compare_jit
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


def bench_cmd(
    model: ModelArg,
    backends: Annotated[
        str, choice(Backend, "--backends", help="comma-separated", many=True)
    ] = "eager,torchscript,ort_fp32,ort_fp16,ort_int8",
    devices: Annotated[str, typer.Option(help="comma-separated: cpu,cuda")] = "cpu",
    batch_sizes: Annotated[
        str, typer.Option(help="comma-separated, e.g. 1,8", parser=int_list, metavar="<int>[,...]")
    ] = "1",
    threads: int | None = None,
    calib: Annotated[
        str | None, typer.Option(help="calibration images for ort_int8 and ov_int8")
    ] = None,
    seconds: Annotated[float, typer.Option(help="minimum timed seconds per row")] = 1.0,
    data: Annotated[
        str | None,
        typer.Option("--data", help="real images for each backend's top-1 agreement with eager"),
    ] = None,
    min_agreement: Annotated[
        float | None,
        typer.Option(
            "--min-agreement",
            min=0.0,
            max=1.0,
            help="name the fastest backend whose agreement with eager reaches this, e.g. 0.99",
        ),
    ] = None,
    weights: WeightsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Latency table across backends and devices (warm-up, p50/p90/p99, cold start), with each
    backend's top-1 agreement with eager on real images."""
    from zoo.deploy.bench import floor_notes, run_bench

    report = run_bench(
        model,
        backends=backends.split(","),
        devices=devices.split(","),
        batch_sizes=[int(b) for b in batch_sizes.split(",")],
        threads=threads,
        calib=calib,
        min_seconds=seconds,
        weights=weights,
        data=data,
        min_agreement=min_agreement,
    )
    if as_json:
        print_json(report)
        return
    from rich.table import Table

    t = Table(
        "format",
        "device",
        "batch",
        "status",
        "size MB",
        "p50 ms",
        "p99 ms",
        "img/s",
        "vs eager",
        f"agree ({report['agreement_images']})",
        "cold ms",
    )
    reasons: list[str] = []
    for r in report["rows"]:
        status = r["status"]
        if "reason" in r:
            if r["reason"] not in reasons:
                reasons.append(r["reason"])
            status += f" [{reasons.index(r['reason']) + 1}]"
        t.add_row(
            r["backend"],
            r["device"],
            str(r["batch"]),
            status,
            str(r.get("size_mb", "")),
            str(r.get("p50_ms", "")),
            str(r.get("p99_ms", "")),
            str(r.get("img_per_s", "")),
            str(r.get("speedup_vs_eager", "")),
            f"{r['agreement']:.1%} ({r['agreement_ci95'][0]:.0%}–{r['agreement_ci95'][1]:.0%})"
            if "agreement" in r
            else "",
            str(r.get("cold_start_ms", "")),
        )
    out.print(t)
    for i, reason in enumerate(reasons, 1):
        out.print(f"[{i}] {reason}", markup=False)
    for f in report["fastest"] or []:
        out.print(
            f"fastest with agreement ≥ {f['min_agreement']:.1%} on {f['device']}, batch "
            f"{f['batch']}: {f['backend']} ({f['p50_ms']} ms p50, agreement {f['agreement']:.1%})"
        )
    for note in floor_notes(report["fastest"] or [], report["agreement_images"]):
        err.print(note, markup=False)
    if min_agreement is not None and data is None:
        err.print(
            f"note: agreement measured on the {report['agreement_images']} built-in images "
            "proves little: pass --data DIR with real images like yours"
        )
    if min_agreement is not None:
        met = {(f["device"], f["batch"]) for f in report["fastest"]}
        for dev, bs in sorted({(r["device"], r["batch"]) for r in report["rows"]} - met):
            err.print(f"no backend reaches agreement ≥ {min_agreement:.1%} on {dev}, batch {bs}")
    fp = report["fingerprint"]
    out.print(
        f"torch {fp['torch']}, onnxruntime {fp['onnxruntime']}, openvino {fp['openvino']}, "
        f"{fp['threads']} threads, "
        f"{fp['cpus_available']} CPUs, {fp['processor']}"
    )


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)
    app.command("predict")(predict_cmd)
    app.command("compare-jit")(compare_jit_cmd)
    app.command("quantize")(quantize_cmd)
    app.command("bench")(bench_cmd)
