"""``zoo bench``: the latency table across backends and devices."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from zoo.cli.common import (
    JsonOpt,
    ModelArg,
    VariantOpt,
    WeightsOpt,
    choice,
    err,
    int_list,
    out,
    print_json,
)
from zoo.deploy.choices import (
    Backend,
)

if TYPE_CHECKING:
    pass


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
    variant: VariantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Latency table across backends and devices (warm-up, p50/p90/p99, cold start), with each
    backend's top-1 agreement with eager on real images.

    --variant times a run's derived file as its backend (int8-static → ort_int8, fp16 →
    ort_fp16, openvino-int8 → ov_int8) instead of making that file afresh."""
    from zoo.deploy.bench.table import floor_notes, run_bench

    prebuilt = {}
    if variant is not None:
        from zoo.ref import ModelRef
        from zoo.variants import find_variant

        v = find_variant(ModelRef.parse(model).model_folder, variant)
        prebuilt[v.backend] = v.path
        if v.backend not in backends.split(","):
            backends += f",{v.backend}"

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
        prebuilt=prebuilt,
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
    app.command("bench")(bench_cmd)
