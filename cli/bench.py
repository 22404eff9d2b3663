"""``zoo bench``: options → :class:`~zoo.deploy.bench.options.BenchOptions` →
:func:`~zoo.deploy.bench.table.run_bench` → the report's table and notes (or ``--json``)."""

from __future__ import annotations

from typing import Annotated

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
from zoo.deploy.bench.options import BenchOptions, option_defaults
from zoo.deploy.choices import Backend

# Every default and check lives in BenchOptions; only the help text and spelling live here.
D = option_defaults()


def bench_cmd(
    model: ModelArg,
    backends: Annotated[
        str, choice(Backend, "--backends", help="comma-separated", many=True)
    ] = ",".join(D["backends"]),
    devices: Annotated[str, typer.Option(help="comma-separated: cpu,cuda")] = ",".join(
        D["devices"]
    ),
    batch_sizes: Annotated[
        str, typer.Option(help="comma-separated, e.g. 1,8", parser=int_list, metavar="<int>[,...]")
    ] = ",".join(map(str, D["batch_sizes"])),
    threads: int | None = D["threads"],
    calib: Annotated[
        str | None, typer.Option(help="calibration images for ort_int8 and ov_int8")
    ] = D["calib"],
    seconds: Annotated[float, typer.Option(help="minimum timed seconds per row")] = D[
        "min_seconds"
    ],
    data: Annotated[
        str | None,
        typer.Option("--data", help="real images for each backend's top-1 agreement with eager"),
    ] = D["data"],
    min_agreement: Annotated[
        float | None,
        typer.Option(
            "--min-agreement",
            min=0.0,
            max=1.0,
            help="name the fastest backend whose agreement with eager reaches this, e.g. 0.99",
        ),
    ] = D["min_agreement"],
    weights: WeightsOpt = D["weights"],
    variant: VariantOpt = D["variant"],
    as_json: JsonOpt = False,
) -> None:
    """Latency table across backends and devices (warm-up, p50/p90/p99, cold start), with each
    backend's top-1 agreement with eager on real images.

    --variant times a run's derived file as its backend (int8-static → ort_int8, fp16 →
    ort_fp16, openvino-int8 → ov_int8) instead of making that file afresh."""
    from zoo.deploy.bench.table import run_bench

    options = BenchOptions(
        model=model,
        backends=tuple(backends.split(",")),
        devices=tuple(devices.split(",")),
        batch_sizes=tuple(int(b) for b in batch_sizes.split(",")),
        threads=threads,
        calib=calib,
        min_seconds=seconds,
        weights=weights,
        data=data,
        min_agreement=min_agreement,
        variant=variant,
    )
    from zoo.cli import tracking

    report = run_bench(options)
    if as_json:
        print_json(report.to_dict())
    else:
        out.print(report.table())
        for line in report.lines():
            out.print(line, markup=False)
        for note in report.notes():
            err.print(note, markup=False)
        out.print(report.footer(), markup=False)
    found = tracking.tracked(model)
    if found is not None:  # the stage is built only for a tracked run
        tracking.log(found, tracking.bench_stage(report))


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_cmd)
