"""What ``zoo export``, ``zoo quantize`` and ``zoo bench`` add to a tracked run's MLflow run
(:mod:`zoo.tracking`): each command's typed result as a :class:`~zoo.tracking.Stage`, and
``zoo export --register NAME``. A helper of those commands (no ``register(app)``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from zoo.cli.common import err

if TYPE_CHECKING:
    from zoo.deploy.bench.report import BenchReport
    from zoo.deploy.export.result import ExportResult
    from zoo.deploy.quantize.report import QuantizeReport
    from zoo.tracking import Stage, TrackingRecord


def export_stage(result: ExportResult) -> Stage:
    """The export's file, its size and the parity gate's numbers."""
    from zoo.tracking import Stage

    path = Path(result.path)
    key = path.name
    metrics = {f"{key}/size_mb": result.size_mb}
    p = result.parity
    if p is not None:
        metrics[f"{key}/parity_passed"] = float(p.passed)
        if p.tensors is not None:
            metrics |= {
                f"{key}/parity_max_abs": p.tensors.max_abs,
                f"{key}/parity_max_rel": p.tensors.max_rel,
                f"{key}/parity_cosine": p.tensors.cosine,
            }
        if p.predictions is not None:
            metrics[f"{key}/parity_agreement"] = p.predictions.agreement
    tags = {
        f"{key}.format": result.format,
        f"{key}.precision": result.precision,
        f"{key}.exporter": str(result.exporter),
        f"{key}.path": str(path.resolve()),
    }
    return Stage(
        "export",
        metrics=metrics,
        tags=tags,
        files=(path,) if path.is_file() else (),
        document=result.to_dict(),
        document_name=f"{key}.json",
    )


def quantize_stage(report: QuantizeReport) -> Stage:
    """The int8 table: size, latency, agreement and accuracy against fp32, and the file."""
    from zoo.tracking import Stage

    key = report.path.stem
    metrics = {
        f"{key}/size_mb_fp32": report.size_mb[0],
        f"{key}/size_mb_int8": report.size_mb[1],
        f"{key}/latency_p50_ms_fp32": report.latency.fp32_p50,
        f"{key}/latency_p50_ms_int8": report.latency.int8_p50,
        f"{key}/top1_agreement": report.top1_agreement,
        f"{key}/floor_passed": float(report.floor.passed),
    }
    if report.accuracy is not None:
        metrics |= {
            f"{key}/accuracy_fp32": report.accuracy[0],
            f"{key}/accuracy_int8": report.accuracy[1],
        }
    return Stage(
        "quantize",
        metrics=metrics,
        tags={f"{key}.engine": report.engine, f"{key}.mode": report.mode},
        files=(report.path,) if report.written and report.path.is_file() else (),
        document=report.to_dict(),
        document_name=f"{key}.json",
    )


def bench_stage(report: BenchReport) -> Stage:
    """The latency rows: p50, throughput and agreement of each backend, device and batch."""
    from zoo.tracking import Stage

    metrics: dict[str, float] = {}
    for r in report.rows:
        if not r.ran:
            continue
        key = f"{r.backend}/{r.device}/b{r.batch}"
        values = {"p50_ms": r.p50_ms, "img_per_s": r.img_per_s, "agreement": r.agreement}
        metrics |= {f"{key}/{k}": float(v) for k, v in values.items() if v is not None}
    return Stage("bench", metrics=metrics, document=report.to_dict(), document_name="bench.json")


def tracked(
    model: str | Path, *, register: str | None = None
) -> tuple[Path, TrackingRecord] | None:
    """The tracked run ``model`` belongs to (None: none). With ``--register``, checked before
    any work: the run must be tracked and its server must answer.

    Raises:
        TrackingError: ``--register`` of an untracked model, or its server does not answer.
    """
    from zoo.errors import TrackingError
    from zoo.tracking import connect, tracked_run

    found = tracked_run(model)
    if register is not None:
        if found is None:
            raise TrackingError(
                f"--register {register}: {model} is not a run trained with --track mlflow, so no "
                "MLflow run holds its lineage. Fine-tune with --track mlflow, or export without "
                "--register."
            )
        connect(found[1].uri)
    return found


def log(
    found: tuple[Path, TrackingRecord] | None, stage: Stage, register: str | None = None
) -> None:
    """Log ``stage`` into the tracked run (a warning when the server does not take it), then
    register the export's file as a version of model ``register``.

    Raises:
        TrackingError: ``--register`` could not be done (the export itself is written).
    """
    if found is None:
        return
    from zoo.errors import TrackingError
    from zoo.tracking import lineage_tags, log_stage, register_model

    run, record = found
    logged = log_stage(record, stage)
    err.print(logged.line(), markup=False)
    if register is None:
        return
    if logged.error is not None or not stage.files:
        raise TrackingError(
            f"--register {register}: the exported file did not reach the MLflow run "
            f"({logged.error or 'no single file to register'}); the export itself is written."
        )
    version = register_model(
        record, register, f"{stage.stage}/{stage.files[0].name}", lineage_tags(run, record)
    )
    err.print(version.line(), markup=False)
