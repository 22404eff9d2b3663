"""What ``zoo export``, ``zoo quantize`` and ``zoo bench`` add to a tracked run's MLflow run
(:mod:`zoo.tracking`): each command's typed result as a :class:`~zoo.tracking_stages.Stage`, and
``zoo export --register NAME``. A helper of those commands (no ``register(app)``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from zoo.cli.common import err

if TYPE_CHECKING:
    from zoo.deploy.bench.report import BenchReport
    from zoo.deploy.export.result import ExportResult
    from zoo.deploy.quantize.report import QuantizeReport
    from zoo.tracking import TrackingRecord
    from zoo.tracking_stages import Stage


def export_stage(result: ExportResult) -> Stage:
    """The export's file, its size and the parity gate's numbers."""
    from zoo.tracking_stages import Stage

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
        version_tags={"zoo.format": result.format, "zoo.precision": result.precision},
        versioned=True,  # a registered version points at its own bytes, never replaced
    )


def quantize_stage(report: QuantizeReport) -> Stage:
    """The int8 table: size, latency, agreement and accuracy against fp32, and the file."""
    from zoo.tracking_stages import Stage

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
    from zoo.tracking_stages import Stage

    metrics: dict[str, float] = {}
    for r in report.rows:
        if not r.ran:
            continue
        key = f"{r.backend}/{r.device}/b{r.batch}"
        values = {"p50_ms": r.p50_ms, "img_per_s": r.img_per_s, "agreement": r.agreement}
        metrics |= {f"{key}/{k}": float(v) for k, v in values.items() if v is not None}
    return Stage("bench", metrics=metrics, document=report.to_dict(), document_name="bench.json")


def check_model_name(name: str, fmt: str | None = None) -> None:
    """Refuse a ``--register`` name MLflow would refuse (empty, ``/`` or ``:``, a ``..``
    part) or an export with no single model file to register (``--format kserve``: a manifest).

    Raises:
        UsageError: what is wrong with ``--register`` and what to give instead.
    """
    from zoo.errors import UsageError

    if not name.strip() or name != name.strip() or any(c in name for c in "/:\\"):
        raise UsageError(
            f"--register {name!r} is not a model name MLflow takes: give a non-empty name "
            "without '/', ':', '\\' or spaces at its ends, e.g. --register digits-cnn.",
            param_hint="--register",
        )
    if ".." in name or not name.isprintable():
        raise UsageError(
            f"--register {name!r}: a name may not hold '..' or control characters.",
            param_hint="--register",
        )
    if fmt == "kserve":
        raise UsageError(
            "--register with --format kserve would register the InferenceService manifest, "
            "not a model: export and register the ONNX file (zoo export RUN --register "
            f"{name}), then export --format kserve without --register.",
            param_hint="--register",
        )


def tracked(
    model: str | Path, *, register: str | None = None, fmt: str | None = None
) -> tuple[Path, TrackingRecord] | None:
    """The tracked run ``model`` belongs to (None: none), at the URI to use
    (:func:`zoo.tracking.effective`). With ``--register``, checked before any work: the name
    (:func:`check_model_name`), the run must be tracked and its server must answer.

    Raises:
        UsageError: a ``--register`` name or format that cannot be registered.
        TrackingError: ``--register`` of an untracked model, or its server does not answer.
    """
    from zoo.errors import TrackingError
    from zoo.tracking import connect, effective
    from zoo.tracking_stages import tracked_run

    if register is not None:
        check_model_name(register, fmt)
    found = tracked_run(model)
    if found is not None:
        record, note = effective(found[1])
        found = (found[0], record)
        if note:
            err.print(note, markup=False)
    if register is not None:
        if found is None:
            raise TrackingError(
                f"--register {register}: {model} is not a run trained with --track mlflow, so no "
                "MLflow run holds its lineage. Fine-tune with --track mlflow, or export without "
                "--register."
            )
        connect(found[1].uri, "export without --register (the run's MLflow run is unchanged)")
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
    from dataclasses import replace

    from zoo.errors import TrackingError
    from zoo.tracking_pending import queue
    from zoo.tracking_stages import lineage_tags, log_stage, register_model

    run, record = found
    logged = log_stage(record, stage)
    if logged.error is not None and register is None:  # an outage: `zoo runs sync` sends it
        queue(run, stage)
        logged = replace(logged, queued=run)
    err.print(logged.line(), markup=False)
    if register is None:
        return
    if logged.error is not None or not stage.files:
        raise TrackingError(
            f"--register {register}: the exported file did not reach the MLflow run "
            f"({logged.error or 'no single file to register'}); the export itself is written."
        )
    tags = lineage_tags(run, record) | dict(stage.version_tags)
    version = register_model(record, register, logged.artifacts[0], tags)
    err.print(version.line(), markup=False)
