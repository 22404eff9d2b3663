"""What ``zoo bench`` measured: one :class:`BenchRow` per backend, device and batch size, the
fastest backend within an agreement floor (:class:`FastestPick`), and the
:class:`BenchReport` that renders the table, its notes and the ``--json``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

RAN, FAILED = "✅", "❌"


def _cell(value: object) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True)
class BenchRow:
    """One backend on one device at one batch size.

    Attributes:
        backend, device, batch: what was timed.
        status: ``✅`` (timed) or ``❌`` (could not run: ``reason`` says why).
        reason: why it could not run (the exception's type and first line).
        cold_start_ms: build plus the first batch (also on a row that failed after it).
        size_mb: the model's size in this backend (file or parameters).
        timing: :func:`zoo.deploy.bench.harness.time_session`'s statistics (``p50_ms`` ...).
        img_per_s: images per second at the median latency.
        agreement: top-1 agreement with eager on the agreement images.
        agreement_ci95: its 95 % Wilson interval.
        speedup_vs_eager: eager's median latency over this one (same device and batch).
    """

    backend: str
    device: str
    batch: int
    status: str = RAN
    reason: str | None = None
    cold_start_ms: float | None = None
    size_mb: float | None = None
    timing: dict[str, Any] = field(default_factory=dict)
    img_per_s: float | None = None
    agreement: float | None = None
    agreement_ci95: list[float] | None = None
    speedup_vs_eager: float | None = None

    @property
    def ran(self) -> bool:
        return self.status == RAN

    @property
    def p50_ms(self) -> float | None:
        return self.timing.get("p50_ms")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: a row that could not run has only its reason (and cold start, if any)."""
        d: dict[str, Any] = {"backend": self.backend, "device": self.device, "batch": self.batch}
        if self.cold_start_ms is not None:
            d["cold_start_ms"] = self.cold_start_ms
        d["status"] = self.status
        if self.reason is not None:
            d["reason"] = self.reason
        if self.ran:
            d.update(
                size_mb=self.size_mb,
                **self.timing,
                img_per_s=self.img_per_s,
                agreement=self.agreement,
                agreement_ci95=self.agreement_ci95,
            )
            if self.speedup_vs_eager is not None:
                d["speedup_vs_eager"] = self.speedup_vs_eager
        return d


@dataclass(frozen=True)
class FastestPick:
    """The fastest row of one device and batch size whose agreement reaches ``min_agreement``
    (:func:`fastest_within`); ``proven``: the 95 % interval's lower bound reaches it too."""

    device: str
    batch: int
    backend: str
    p50_ms: float
    agreement: float
    agreement_ci95: list[float] | None
    proven: bool
    min_agreement: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fastest_within(rows: Sequence[BenchRow], floor: float) -> list[FastestPick]:
    """Per device and batch size, the fastest row (lowest p50) whose top-1 agreement with
    eager is at least ``floor``; rows that did not run or were not compared are never picked.
    The pick is on the measured agreement (what the user asked for); ``proven`` says whether
    the sample also proves it: the 95 % interval's lower bound is at or above the floor (eager
    is the reference itself, so always proven)."""
    best: dict[tuple[str, int], BenchRow] = {}
    for r in rows:
        if not r.ran or r.agreement is None or r.agreement < floor or r.p50_ms is None:
            continue
        key = (r.device, r.batch)
        if key not in best or r.p50_ms < (best[key].p50_ms or 0.0):
            best[key] = r
    return [
        FastestPick(
            device=d,
            batch=b,
            backend=r.backend,
            p50_ms=r.p50_ms or 0.0,
            agreement=r.agreement or 0.0,
            agreement_ci95=r.agreement_ci95,
            proven=r.backend == "eager"
            or (bool(r.agreement_ci95) and (r.agreement_ci95 or [0.0])[0] >= floor),
            min_agreement=floor,
        )
        for (d, b), r in sorted(best.items())
    ]


def floor_notes(fastest: Sequence[FastestPick], n_images: int) -> list[str]:
    """What the agreement sample does not prove about :func:`fastest_within`'s picks: one
    line per backend and device (agreement is measured once for all batch sizes)."""
    notes: dict[tuple[str, str], str] = {}
    for f in fastest:
        key = (f.backend, f.device)
        if f.proven or key in notes:
            continue
        floor, ci = f.min_agreement, f.agreement_ci95
        if floor >= 1.0:
            why = "no finite sample proves an agreement of 100%: choose a floor below 1"
        elif not ci:
            why = "its agreement has no interval here"
        else:
            why = (
                f"the 95% interval starts at {ci[0]:.1%}: pass --data with more images like "
                "yours to prove the floor"
            )
        notes[key] = (
            f"note: {n_images} images do not show {f.backend} on {f.device} keeps "
            f"≥ {floor:.1%} agreement: {why}"
        )
    return list(notes.values())


@dataclass(frozen=True)
class BenchReport:
    """One ``zoo bench`` run.

    Attributes:
        model: the model reference as shown to people.
        fingerprint: the machine and library versions (:func:`zoo.deploy.bench.table.fingerprint`).
        rows: every backend, device and batch size, in the order timed.
        torch_threads, ort_threads: the intra-op threads of each runtime.
        agreement_images: how many real images the agreement column is measured on.
        fastest: the picks within ``min_agreement`` (None: no floor was asked for).
        min_agreement: the floor asked for (not in ``--json``: the options').
        data: the agreement images' folder (None: the bundled ones; not in ``--json``).
    """

    model: str
    fingerprint: dict[str, Any]
    rows: tuple[BenchRow, ...]
    torch_threads: int
    ort_threads: int
    agreement_images: int
    fastest: tuple[FastestPick, ...] | None
    min_agreement: float | None = None
    data: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``--json``)."""
        return {
            "model": self.model,
            "fingerprint": self.fingerprint,
            "rows": [r.to_dict() for r in self.rows],
            "torch_threads": self.torch_threads,
            "ort_threads": self.ort_threads,
            "agreement_images": self.agreement_images,
            "fastest": None if self.fastest is None else [f.to_dict() for f in self.fastest],
        }

    @property
    def reasons(self) -> list[str]:
        """Each distinct reason a row could not run, numbered in the table from 1."""
        return list(dict.fromkeys(r.reason for r in self.rows if r.reason is not None))

    def table(self) -> Table:
        """The latency table (a :class:`rich.table.Table`)."""
        from rich.table import Table

        t = Table(
            "format",
            "device",
            "batch",
            "status",
            "size MiB",
            "p50 ms",
            "p99 ms",
            "img/s",
            "vs eager",
            f"agree ({self.agreement_images})",
            "cold ms",
        )
        reasons = self.reasons
        for r in self.rows:
            status = r.status
            if r.reason is not None:
                status += f" [{reasons.index(r.reason) + 1}]"
            ci = r.agreement_ci95 or [0.0, 0.0]
            t.add_row(
                r.backend,
                r.device,
                str(r.batch),
                status,
                _cell(r.size_mb),
                _cell(r.timing.get("p50_ms")),
                _cell(r.timing.get("p99_ms")),
                _cell(r.img_per_s),
                _cell(r.speedup_vs_eager),
                f"{r.agreement:.1%} ({ci[0]:.0%}–{ci[1]:.0%})" if r.agreement is not None else "",
                _cell(r.cold_start_ms),
            )
        return t

    def lines(self) -> list[str]:
        """What follows the table on stdout: each numbered reason, then the fastest picks."""
        lines = [f"[{i}] {reason}" for i, reason in enumerate(self.reasons, 1)]
        return lines + [
            f"fastest with agreement ≥ {f.min_agreement:.1%} on {f.device}, batch "
            f"{f.batch}: {f.backend} ({f.p50_ms} ms p50, agreement {f.agreement:.1%})"
            for f in self.fastest or ()
        ]

    def notes(self) -> list[str]:
        """What stderr says: what the agreement sample does not prove, and each device and
        batch size no backend reached the floor on."""
        notes = floor_notes(self.fastest or (), self.agreement_images)
        floor = self.min_agreement
        if floor is None:
            return notes
        if self.data is None:
            notes.append(
                f"note: agreement measured on the {self.agreement_images} built-in images "
                "proves little: pass --data DIR with real images like yours"
            )
        met = {(f.device, f.batch) for f in self.fastest or ()}
        for dev, bs in sorted({(r.device, r.batch) for r in self.rows} - met):
            notes.append(f"no backend reaches agreement ≥ {floor:.1%} on {dev}, batch {bs}")
        return notes

    def footer(self) -> str:
        """The last line: the versions and the machine the figures hold for."""
        fp = self.fingerprint
        return (
            f"torch {fp['torch']}, onnxruntime {fp['onnxruntime']}, openvino {fp['openvino']}, "
            f"{fp['threads']} threads, "
            f"{fp['cpus_available']} CPUs, {fp['processor']}"
        )


__all__ = ["BenchReport", "BenchRow", "FastestPick", "fastest_within", "floor_notes"]
