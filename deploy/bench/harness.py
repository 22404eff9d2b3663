"""One timing protocol for every backend: warm up until stable, then percentiles.

Warm-up runs until the median of the last 5 runs moves less than 5% (at least 5, at most
100 runs); then ``min_runs`` timed runs or ``min_seconds``, whichever is longer (at most
``max_runs``). CUDA work is timed with events after synchronising.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def time_session(
    fn: Callable[[], Any],
    *,
    label: str = "",
    min_runs: int = 30,
    min_seconds: float = 1.0,
    max_runs: int = 2000,
    cuda: bool = False,
) -> dict[str, Any]:
    """Time ``fn`` the one way zoo measures latency: warm up until the median of the last 5
    calls moves less than 5 %, then call it at least ``min_runs`` times and for at least
    ``min_seconds`` (at most ``max_runs`` times).

    Args:
        fn: one call of what is measured (e.g. a session run on a fixed batch).
        label: copied into the result, to name the measurement.
        min_runs: the fewest timed calls.
        min_seconds: the shortest timed span.
        max_runs: the most timed calls, whatever ``min_seconds``.
        cuda: time with CUDA events around a synchronised call (the GPU's time), not the
            host clock.

    Returns:
        ``{"label", "n", "warmup_runs", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms"}``
        (milliseconds, 4 decimals): the shape bench/ scripts write to ``docs/bench/``.
    """

    def once() -> float:
        if cuda:
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return float(start.elapsed_time(end))
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1000

    warm: list[float] = []
    prev = None
    while len(warm) < 100:
        warm.append(once())
        if len(warm) >= 5:
            med = statistics.median(warm[-5:])
            if prev is not None and abs(med - prev) / max(prev, 1e-9) < 0.05:
                break
            prev = med
    times: list[float] = []
    t_end = time.perf_counter() + min_seconds
    while (len(times) < min_runs or time.perf_counter() < t_end) and len(times) < max_runs:
        times.append(once())
    mean = statistics.fmean(times)
    return {
        "label": label,
        "n": len(times),
        "warmup_runs": len(warm),
        "p50_ms": round(_percentile(times, 0.5), 4),
        "p90_ms": round(_percentile(times, 0.9), 4),
        "p99_ms": round(_percentile(times, 0.99), 4),
        "mean_ms": round(mean, 4),
        "std_ms": round(statistics.pstdev(times), 4),
    }
