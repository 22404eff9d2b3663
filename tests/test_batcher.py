"""DynamicBatcher on its own (no server, no model): a fake ``run`` records every batch it is
handed, so composition, slicing, limits, delays and isolation are checked exactly, in ms."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest

from zoo.deploy.serve.batcher import DynamicBatcher
from zoo.deploy.serve.metrics import ServerMetrics
from zoo.errors import ServerBusyError


class Recorder:
    """A per-sample model (each output row depends on its input row only), recording calls."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.batches: list[list[float]] = []  # the first value of every sample, per call
        self.threads: list[int] = []
        self.gate = gate
        self.called = threading.Event()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.threads.append(threading.get_ident())
        self.batches.append([float(v) for v in x.reshape(len(x), -1)[:, 0]])
        self.called.set()
        if self.gate is not None:
            assert self.gate.wait(10), "test never released the gate"
        if np.isnan(x).any():
            raise ValueError("poisoned sample")
        return x.reshape(len(x), -1).sum(axis=1, keepdims=True) * 10 + x.reshape(len(x), -1)[:, :1]


def _samples(first: float, n: int, width: int = 3) -> np.ndarray:
    return (np.arange(n, dtype=np.float32)[:, None] + first) * np.ones((1, width), np.float32)


def expected(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(len(x), -1)
    return flat.sum(axis=1, keepdims=True) * 10 + flat[:, :1]


def _run(
    body: Callable[[DynamicBatcher, Recorder], Coroutine[Any, Any, None]],
    *,
    max_batch: int = 8,
    max_delay_ms: float = 0.0,
    max_queue: int = 64,
    gate: threading.Event | None = None,
) -> Recorder:
    rec = Recorder(gate)

    async def main() -> None:
        b = DynamicBatcher(
            rec,
            max_batch=max_batch,
            max_delay_ms=max_delay_ms,
            max_queue=max_queue,
            metrics=ServerMetrics(),
        )
        await body(b, rec)  # starts the batcher when its jobs are queued
        if gate is not None:
            gate.set()
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 30))
    return rec


def _queued_then_started(xs: list[np.ndarray], **kw: Any) -> tuple[Recorder, list[Any]]:
    """Queue every job, then start the batcher: the batches it forms are deterministic."""
    results: list[Any] = []

    async def body(b: DynamicBatcher, rec: Recorder) -> None:
        tasks = [asyncio.ensure_future(b.submit(x, 5)) for x in xs]
        await asyncio.sleep(0)  # every job is in the queue before the loop runs
        b.start()
        results.extend(await asyncio.gather(*tasks, return_exceptions=True))

    return _run(body, **kw), results


def test_requests_of_several_samples_share_one_call_and_get_their_own_rows() -> None:
    xs = [_samples(100 * i, n) for i, n in enumerate([1, 3, 2, 1])]
    rec, out = _queued_then_started(xs)
    assert rec.batches == [[0, 100, 101, 102, 200, 201, 300]]  # one call, FIFO order
    for x, y in zip(xs, out, strict=True):
        np.testing.assert_array_equal(y, expected(x))  # a mis-slice gives another row's values


def test_max_batch_is_never_exceeded_and_a_too_big_job_waits_its_turn() -> None:
    xs = [_samples(10 * i, n) for i, n in enumerate([3, 3, 1, 2, 4])]
    rec, out = _queued_then_started(xs, max_batch=4)
    # first job 3 + the next that fits (1); the skipped ones keep their place in the queue
    assert rec.batches == [[0, 1, 2, 20], [10, 11, 12], [30, 31], [40, 41, 42, 43]]
    for x, y in zip(xs, out, strict=True):
        np.testing.assert_array_equal(y, expected(x))


def test_different_sample_shapes_are_never_concatenated() -> None:
    xs = [_samples(0, 1, width=3), _samples(50, 1, width=5), _samples(100, 2, width=3)]
    rec, out = _queued_then_started(xs)
    assert rec.batches == [[0, 100, 101], [50]]
    for x, y in zip(xs, out, strict=True):
        np.testing.assert_array_equal(y, expected(x))


def test_a_failing_sample_is_retried_alone_and_fails_alone() -> None:
    bad = _samples(7, 1)
    bad[0, 1] = np.nan
    xs = [_samples(0, 2), bad, _samples(20, 1)]
    rec, results = _queued_then_started(xs)
    assert rec.batches == [[0, 1, 7, 20], [0, 1], [7], [20]]
    np.testing.assert_array_equal(results[0], expected(xs[0]))
    assert isinstance(results[1], ValueError)
    np.testing.assert_array_equal(results[2], expected(xs[2]))


def test_inference_runs_off_the_event_loop() -> None:
    """While a batch is stuck in ``run``, the loop keeps serving: new jobs queue, timers fire."""
    gate = threading.Event()
    ticks: list[int] = []
    loop_thread: list[int] = []

    async def body(b: DynamicBatcher, rec: Recorder) -> None:
        loop_thread.append(threading.get_ident())
        b.start()
        first = asyncio.ensure_future(b.submit(_samples(0, 1), 10))
        while not rec.called.is_set():
            await asyncio.sleep(0.001)
        for i in range(5):  # the loop is free although ``run`` has not returned
            await asyncio.sleep(0.001)
            ticks.append(i)
        second = asyncio.ensure_future(b.submit(_samples(1, 1), 10))
        await asyncio.sleep(0.01)
        assert len(b.queue) == 1 and not first.done()
        gate.set()
        await asyncio.gather(first, second)

    rec = _run(body, gate=gate)
    assert ticks == [0, 1, 2, 3, 4]
    assert rec.batches == [[0], [1]]
    assert loop_thread[0] not in rec.threads


def test_max_delay_gathers_a_fuller_batch_and_zero_delay_does_not_wait() -> None:
    async def staggered(b: DynamicBatcher, rec: Recorder) -> None:
        b.start()
        tasks = []
        for i in range(4):  # one request every 20 ms
            tasks.append(asyncio.ensure_future(b.submit(_samples(i, 1), 10)))
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)

    waited = _run(staggered, max_delay_ms=2000, max_batch=4)
    assert waited.batches == [[0, 1, 2, 3]]  # gathered up to max_batch, then ran at once
    eager = _run(staggered, max_delay_ms=0, max_batch=4)
    assert eager.batches[0] == [0]  # the first request did not wait for company


def test_full_queue_is_refused_and_a_timed_out_job_is_skipped() -> None:
    gate = threading.Event()

    async def body(b: DynamicBatcher, rec: Recorder) -> None:
        b.start()
        running = asyncio.ensure_future(b.submit(_samples(0, 1), 10))
        while not rec.called.is_set():
            await asyncio.sleep(0.001)
        queued = asyncio.ensure_future(b.submit(_samples(1, 1), 10))
        late = asyncio.ensure_future(b.submit(_samples(2, 1), 0.01))
        await asyncio.sleep(0)
        with pytest.raises(ServerBusyError, match="queue full"):
            await b.submit(_samples(3, 1), 10)
        with pytest.raises(TimeoutError):
            await late
        gate.set()
        await asyncio.gather(running, queued)

    rec = _run(body, max_queue=2, gate=gate)
    assert rec.batches == [[0], [1]]  # the timed-out job never reached the model
