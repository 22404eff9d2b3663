"""``zoo list``, ``zoo info``, ``zoo doctor``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from zoo.cli.common import JsonOpt, ModelArg, err, out, print_json

if TYPE_CHECKING:
    from zoo.metadata import ModelInfo


def _row(info: ModelInfo) -> dict[str, Any]:
    from zoo.weights import availability

    here = availability(info.weights)  # no network, no torch: the caches, hash-checked
    return {
        "name": info.name,
        "arch": info.arch,
        "tag": info.tag,
        "params": info.params,
        "gflops": info.gflops,
        "input_size": list(info.input_size),
        "num_classes": info.num_classes,
        "weights": info.weights.kind,
        "pinned": info.weights.pinned,
        "weights_available": here.available,  # loadable offline (cached and sound, or none)
        "weights_state": here.state,  # cached | missing | corrupt | not needed
        "license": info.license,
        "parent": info.parent,
    }


def _variants(info: ModelInfo) -> list[dict[str, Any]]:
    """A local model folder's ``model.onnx`` and derived variants (:mod:`zoo.variants`)."""
    from pathlib import Path

    from zoo.variants import exports

    if info.weights.path is None:
        return []
    return [v.to_dict() for v in exports(Path(info.weights.path).parent)]


_HERE = {"cached": "cached", "missing": "not cached", "corrupt": "fails its hash"}


def list_cmd(
    pattern: Annotated[str | None, typer.Argument(help="fnmatch pattern, e.g. 'resnet*'")] = None,
    base: Annotated[
        str | None, typer.Option(help="only models descended from this entry (lineage)")
    ] = None,
    runs: Annotated[str, typer.Option(help="where to look for local runs")] = "runs",
    local: Annotated[bool, typer.Option(help="include local runs and pulled Hub models")] = True,
    as_json: JsonOpt = False,
) -> None:
    """List registered models, local runs and pulled models (fine-tuned variants with their parent)."""
    import fnmatch

    from rich.table import Column, Table

    from zoo.catalog import list_models, model_info
    from zoo.local_models import discover, unreadable_runs

    rows = [_row(model_info(n)) for n in list_models(pattern)]
    problems: list[tuple[str, str]] = []  # runs listed with what is wrong, never dropped
    if local:
        for name, info in discover(runs):
            if (
                pattern is None
                or fnmatch.fnmatch(name, pattern)
                or fnmatch.fnmatch(info.arch, pattern)
            ):
                rows.append(
                    {
                        **_row(info),
                        "name": name,
                        "lineage": list(info.lineage),
                        "variants": _variants(info),
                    }
                )
        problems = [
            (n, why)
            for n, why in unreadable_runs(runs)
            if pattern is None or fnmatch.fnmatch(n, pattern)
        ]
    if base is not None:
        from zoo.catalog import canonical_name

        root = canonical_name(base)
        rows = [
            r
            for r in rows
            if r["name"] == root or root in r.get("lineage", []) or r["parent"] == root
        ]
    if as_json:
        print_json(rows + [{"name": n, "problem": why} for n, why in problems])
        return
    if not rows and not problems:
        err.print(f"No model matches {pattern!r}.")
        raise typer.Exit(1)
    table = Table("params", "GFLOPs", "input", "classes", "weights (here?)", "variants")
    table.columns.insert(0, Column("name", no_wrap=True))
    for r in rows:
        table.add_row(
            r["name"],
            f"{r['params']:,}",
            f"{r['gflops']:.3g}",
            "×".join(map(str, r["input_size"])),
            str(r["num_classes"]) if r["num_classes"] else "none (backbone)",
            r["weights"]
            + ("" if r["pinned"] or r["weights"] == "none" else " (unpinned)")
            + ("" if r["weights_state"] == "not needed" else f", {_HERE[r['weights_state']]}"),
            ", ".join(
                v["name"]
                + (" (stale)" if v["stale"] else "")
                + (" (older calibration)" if v["calibration_stale"] else "")
                for v in r.get("variants", [])
            ),
        )
    for i, (name, _) in enumerate(problems, 1):
        table.add_row(name, f"unreadable [{i}]", *[""] * (len(table.columns) - 2))
    out.print(table)
    for i, (name, why) in enumerate(problems, 1):
        out.print(f"[{i}] {name}: {why}", markup=False)


def info_cmd(
    name: ModelArg,
    as_json: JsonOpt = False,
) -> None:
    """Show everything known about one model."""
    from zoo.factory import resolve
    from zoo.weights import availability

    info = resolve(name)[0].info
    d = info.to_dict()
    d["lineage"] = [*info.lineage] if info.lineage else [info.name]
    here = availability(info.weights)
    d["weights_available"], d["weights_state"] = here.available, here.state
    d["weights_here"] = here.describe()
    if as_json:
        print_json(d)
        return
    labels = d.pop("label_names")
    for k, v in d.items():
        if k == "weights":
            v = v["description"]
        if k in ("weights_available", "weights_state"):  # weights_here says both in words
            continue
        if k == "lineage":
            v = " → ".join(v)
        if k == "num_classes" and info.headless:
            v = "0 (a backbone without a head: fine-tuning or distilling into it makes one)"
        if k == "unused_weights":
            if not v:
                continue
            v = f"{len(v)} blocks of the weights file left out: {', '.join(v)}"
        out.print(f"[bold]{k}[/bold]: {v}")
    if labels:
        out.print(f"[bold]labels[/bold]: {len(labels)} ({', '.join(labels[:5])}, …)")


def doctor_cmd(as_json: JsonOpt = False) -> None:
    """Report versions, CUDA/driver, GPUs, ORT providers and thread counts."""
    from zoo.system import environment_report

    report = environment_report()
    if as_json:
        print_json(report)
        return
    for k, v in report.items():
        if k != "warnings":
            out.print(f"{k}: {v}")
    for w in report["warnings"]:
        err.print(f"[yellow]warning:[/yellow] {w}")


def register(app: typer.Typer) -> None:
    app.command("list")(list_cmd)
    app.command("info")(info_cmd)
    app.command("doctor")(doctor_cmd)
