"""DynamicBatcher edges that mutation testing found unchecked (scripts/mutation.sh batcher):
the delay's unit, the one named worker thread, stop() draining what is queued and in flight,
and the metrics each batch records. Plain arrays, no server, well under a second each."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from tests.test_batcher import Recorder, _samples, expected
from zoo.deploy.serve.batcher import DynamicBatcher, moving_average
from zoo.deploy.serve.metrics import ServerMetrics
from zoo.errors import ServerBusyError

Setup = Callable[[DynamicBatcher], Awaitable[list[asyncio.Future[np.ndarray]]]]


def _batcher(rec: Recorder, metrics: ServerMetrics | None = None, **kw: float) -> DynamicBatcher:
    args = {"max_batch": 4, "max_delay_ms": 0.0, "max_queue": 16, **kw}
    return DynamicBatcher(
        rec,
        max_batch=int(args["max_batch"]),
        max_delay_ms=args["max_delay_ms"],
        max_queue=int(args["max_queue"]),
        metrics=metrics or ServerMetrics(),
    )


def test_max_delay_is_milliseconds_and_a_lone_request_still_runs() -> None:
    rec = Recorder()
    out: list[np.ndarray] = []

    async def main() -> None:
        b = _batcher(rec, max_delay_ms=50)
        assert b.max_delay == 0.05  # seconds
        b.start()
        out.append(await b.submit(_samples(3, 1), 5))  # nobody joins: it runs after the delay
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert rec.batches == [[3.0]]
    np.testing.assert_array_equal(out[0], expected(_samples(3, 1)))


def test_inference_runs_in_one_thread_named_ort() -> None:
    names: list[str] = []

    class Named(Recorder):
        def __call__(self, x: np.ndarray) -> np.ndarray:
            names.append(threading.current_thread().name)
            return super().__call__(x)

    rec = Named()

    async def main() -> None:
        b = _batcher(rec, max_batch=1)
        b.start()
        await asyncio.gather(*(b.submit(_samples(i, 1), 5) for i in range(3)))
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert len(names) == 3 and len(set(rec.threads)) == 1
    assert all(n.startswith("ort_") for n in names), names


def test_stop_finishes_queued_and_running_jobs_first() -> None:
    gate = threading.Event()
    rec = Recorder(gate)

    async def queued_only(b: DynamicBatcher) -> list[asyncio.Future[np.ndarray]]:
        jobs = [asyncio.ensure_future(b.submit(_samples(10 * i, 1), 10)) for i in range(5)]
        await asyncio.sleep(0)  # all queued; the loop has not run yet
        b.start()
        assert len(b.queue) == 5 and not rec.called.is_set()
        gate.set()
        return jobs

    async def running_only(b: DynamicBatcher) -> list[asyncio.Future[np.ndarray]]:
        gate.clear()
        rec.called.clear()
        b.start()
        jobs = [asyncio.ensure_future(b.submit(_samples(7, 1), 10))]
        while not rec.called.is_set():
            await asyncio.sleep(0.001)
        assert not b.queue  # nothing waits, one batch still runs
        threading.Timer(0.05, gate.set).start()
        return jobs

    async def main(setup: Setup) -> list[asyncio.Future[np.ndarray]]:
        b = _batcher(rec, max_batch=2)
        jobs = await setup(b)
        await b.stop()  # returns only once everything queued or running has finished
        # their results are set; the awaiting tasks need a loop turn (never come if dropped)
        await asyncio.wait(jobs, timeout=2)
        assert all(j.done() for j in jobs)
        assert b._task is not None
        await asyncio.gather(b._task, return_exceptions=True)
        assert b._task.cancelled()  # the loop was stopped, not left waiting
        return jobs

    jobs = asyncio.run(asyncio.wait_for(main(queued_only), 10))
    for i, j in enumerate(jobs):
        np.testing.assert_array_equal(j.result(), expected(_samples(10 * i, 1)))
    assert rec.batches == [[0.0, 10.0], [20.0, 30.0], [40.0]]
    jobs = asyncio.run(asyncio.wait_for(main(running_only), 10))
    np.testing.assert_array_equal(jobs[0].result(), expected(_samples(7, 1)))


def _sample(metrics: ServerMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


def test_each_batch_records_its_size_wait_and_compute_time() -> None:
    metrics = ServerMetrics()
    rec = Recorder()
    depths: list[float] = []

    async def main() -> None:
        b = _batcher(rec, metrics, max_batch=8)
        tasks = [asyncio.ensure_future(b.submit(_samples(i, n), 5)) for i, n in [(0, 2), (5, 3)]]
        await asyncio.sleep(0)
        depths.append(_sample(metrics, "zoo_queue_depth"))  # both queued, not started
        b.start()
        await asyncio.gather(*tasks)
        depths.append(_sample(metrics, "zoo_queue_depth"))
        await b.submit(_samples(9, 1), 5)
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert depths == [2.0, 0.0]
    assert rec.batches == [[0.0, 1.0, 5.0, 6.0, 7.0], [9.0]]
    # one observation per ORT call (its sample count), one wait per request
    assert _sample(metrics, "zoo_batch_size_count") == 2
    assert _sample(metrics, "zoo_batch_size_sum") == 6
    assert metrics.registry.get_sample_value("zoo_batch_size_bucket", {"le": "1.0"}) == 1
    assert metrics.registry.get_sample_value("zoo_batch_size_bucket", {"le": "4.0"}) == 1
    assert metrics.registry.get_sample_value("zoo_batch_size_bucket", {"le": "8.0"}) == 2
    assert _sample(metrics, "zoo_queue_seconds_count") == 3
    assert _sample(metrics, "zoo_compute_seconds_count") == 2
    # durations, not clock readings: the whole test is bounded by its 10 s wait_for
    assert 0 <= _sample(metrics, "zoo_queue_seconds_sum") < 3 * 10
    assert 0 <= _sample(metrics, "zoo_compute_seconds_sum") < 2 * 10


def test_a_timed_out_job_in_the_middle_is_skipped_not_a_stop() -> None:
    rec = Recorder()
    results: list[object] = []

    async def main() -> None:
        b = _batcher(rec, max_batch=8)
        jobs = [
            asyncio.ensure_future(b.submit(_samples(v, 1), t))
            for v, t in [(0, 5), (1, 0.01), (2, 5)]
        ]
        await asyncio.wait([jobs[1]], timeout=5)  # the middle one times out while queued
        b.start()
        results.extend(await asyncio.gather(*jobs, return_exceptions=True))
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert rec.batches == [[0.0, 2.0]]  # the jobs after it still join the batch
    assert isinstance(results[1], TimeoutError)


def test_the_loop_survives_a_queue_that_held_only_a_timed_out_job() -> None:
    gate = threading.Event()
    rec = Recorder(gate)
    out: list[np.ndarray] = []

    async def main() -> None:
        b = _batcher(rec)
        b.start()
        first = asyncio.ensure_future(b.submit(_samples(0, 1), 5))
        while not rec.called.is_set():
            await asyncio.sleep(0.001)
        late = asyncio.ensure_future(b.submit(_samples(1, 1), 0.01))
        await asyncio.wait([late], timeout=5)  # timed out while the first batch runs
        gate.set()
        await first
        out.append(await b.submit(_samples(2, 1), 5))  # the loop must still be serving
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert rec.batches == [[0.0], [2.0]]
    np.testing.assert_array_equal(out[0], expected(_samples(2, 1)))


def test_a_sub_second_delay_still_gathers() -> None:
    rec = Recorder()

    async def main() -> None:
        b = _batcher(rec, max_batch=3, max_delay_ms=900)
        b.start()
        tasks = []
        for i in range(3):  # one request every 20 ms, well inside the delay
            tasks.append(asyncio.ensure_future(b.submit(_samples(i, 1), 5)))
            await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert rec.batches == [[0.0, 1.0, 2.0]]


def test_a_full_batch_does_not_wait_out_the_delay() -> None:
    rec = Recorder()

    async def main() -> None:
        b = _batcher(rec, max_batch=2, max_delay_ms=60_000)  # a minute: the submits time out first
        b.start()
        await asyncio.gather(b.submit(_samples(0, 1), 5), b.submit(_samples(1, 1), 5))
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert rec.batches == [[0.0, 1.0]]


def test_a_failing_batch_of_two_is_retried_one_by_one() -> None:
    bad = _samples(7, 1)
    bad[0, 0] = np.nan
    rec = Recorder()
    results: list[object] = []

    async def main() -> None:
        b = _batcher(rec)
        jobs = [asyncio.ensure_future(b.submit(x, 5)) for x in (_samples(1, 1), bad)]
        await asyncio.sleep(0)
        b.start()
        results.extend(await asyncio.gather(*jobs, return_exceptions=True))
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert len(rec.batches) == 3 and rec.batches[0][0] == 1.0  # together, then each alone
    np.testing.assert_array_equal(results[0], expected(_samples(1, 1)))
    assert isinstance(results[1], ValueError)


def _spy_submits(b: DynamicBatcher, then: Callable[[int], None] = lambda n: None) -> list[Future]:
    """Record every future the batcher's pool hands out; ``then(count)`` runs after each."""
    submitted: list[Future] = []
    real_submit = b.executor.submit

    def submit(fn: Callable[..., Any], /, *args: Any) -> Future:
        submitted.append(real_submit(fn, *args))
        then(len(submitted))
        return submitted[-1]

    b.executor.submit = submit  # type: ignore[method-assign]
    return submitted


def test_stop_waits_for_the_worker_thread_to_end() -> None:
    """stop() returns only once the worker thread has ended. The thread is held after its last
    call (in that call's future callbacks, after the event loop has its result) until the
    event loop's thread is joining it; a stop() that does not join returns while it is held."""
    gate, released = threading.Event(), threading.Event()
    rec = Recorder(gate)
    worker: list[threading.Thread] = []
    loop_thread = threading.get_ident()  # asyncio.run runs the loop in this thread

    def joining() -> bool:
        frame = sys._current_frames().get(loop_thread)
        while frame is not None and frame.f_code is not threading.Thread.join.__code__:
            frame = frame.f_back
        return frame is not None

    def hold(_: object) -> None:
        worker.append(threading.current_thread())
        for _ in range(10_000):  # at most 10 s
            if released.wait(0.001) or joining():
                return

    async def main() -> bool:
        b = _batcher(rec)
        submitted = _spy_submits(b)
        b.start()
        job = asyncio.ensure_future(b.submit(_samples(0, 1), 5))
        while not rec.called.is_set():
            await asyncio.sleep(0.001)
        submitted[0].add_done_callback(hold)  # after the callback that wakes the event loop
        gate.set()
        await job
        await b.stop()
        return worker[0].is_alive()

    try:
        alive_after_stop = asyncio.run(asyncio.wait_for(main(), 20))
    finally:
        released.set()
    assert not alive_after_stop  # joined, not left running


class _CountingQueue(deque[Any]):
    """The batcher's queue, counting how often a job is taken off its front."""

    taken = 0

    def popleft(self) -> Any:
        self.taken += 1
        return super().popleft()


def test_forming_a_batch_takes_each_job_off_the_queue_once() -> None:
    """Once a batch is full the jobs behind it stay where they are: the queue is not rescanned
    for every batch (with a deep queue, O(queue) per batch instead of O(batch))."""
    rec = Recorder()

    async def main() -> int:
        b = _batcher(rec, max_batch=4)
        b.queue = queue = _CountingQueue()
        tasks = [asyncio.ensure_future(b.submit(_samples(i, 1), 5)) for i in range(12)]
        await asyncio.sleep(0)  # all queued before the loop runs
        b.start()
        await asyncio.gather(*tasks)
        await b.stop()
        return queue.taken

    taken = asyncio.run(asyncio.wait_for(main(), 10))
    assert rec.batches == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]]
    assert taken == 12


def test_stop_before_start_shuts_the_worker_down() -> None:
    """A server whose startup fails before the loop starts still stops cleanly."""
    b = _batcher(Recorder())
    asyncio.run(asyncio.wait_for(b.stop(), 10))
    with pytest.raises(RuntimeError, match="shutdown"):
        b.executor.submit(int)


def test_a_lone_request_reaches_the_model_uncopied() -> None:
    seen: list[np.ndarray] = []

    class Keeping(Recorder):
        def __call__(self, x: np.ndarray) -> np.ndarray:
            seen.append(x)
            return super().__call__(x)

    xs = [_samples(0, 3), _samples(5, 1), _samples(8, 2)]

    async def main() -> None:
        b = _batcher(Keeping(), max_batch=3)
        tasks = [asyncio.ensure_future(b.submit(x, 5)) for x in xs]
        await asyncio.sleep(0)
        b.start()
        await asyncio.gather(*tasks)
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert len(seen) == 2
    assert seen[0] is xs[0]  # alone in its batch: its own array, not a copy of it
    np.testing.assert_array_equal(seen[1], np.concatenate(xs[1:]))


def test_zero_delay_takes_what_is_queued_now_without_yielding() -> None:
    """With no ``max_delay_ms`` the batch is what is queued when the loop wakes: it does not
    hand the event loop a turn first, so a request submitted in that turn runs next, apart."""
    rec = Recorder()

    async def main() -> None:
        b = _batcher(rec, max_batch=4)
        b.start()
        await asyncio.sleep(0)  # the loop now waits for work
        first = asyncio.ensure_future(b.submit(_samples(0, 1), 5))
        await asyncio.sleep(0)  # ``first`` is queued and has woken the loop
        second = asyncio.ensure_future(b.submit(_samples(1, 1), 5))  # runs after the loop's turn
        await asyncio.gather(first, second)
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert rec.batches == [[0.0], [1.0]]


def test_the_next_batch_waits_for_the_one_worker_thread() -> None:
    """The next batch can be handed over while the worker thread is still finishing the last
    one (here: held in its future's callbacks, after the event loop was told the result). It
    waits for that thread; a pool of more than one would start a second thread for it."""
    gate = threading.Event()
    rec = Recorder(gate)
    handed_over = threading.Event()
    workers_at_handover: list[int] = []
    before = {t.ident for t in threading.enumerate()}

    def workers() -> int:
        return sum(
            t.name.startswith("ort_") and t.ident not in before for t in threading.enumerate()
        )

    def at_submit(count: int) -> None:
        if count == 2:
            workers_at_handover.append(workers())
            handed_over.set()

    async def main() -> None:
        b = _batcher(rec, max_batch=1)
        submitted = _spy_submits(b, at_submit)
        b.start()
        first = asyncio.ensure_future(b.submit(_samples(0, 1), 10))
        while not rec.called.is_set():
            await asyncio.sleep(0.001)
        # runs in the worker thread after the callback that wakes the event loop
        submitted[0].add_done_callback(lambda _: handed_over.wait(10))
        second = asyncio.ensure_future(b.submit(_samples(1, 1), 10))
        await asyncio.sleep(0)  # queued behind the running batch
        gate.set()
        await asyncio.gather(first, second)
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 20))
    assert rec.batches == [[0.0], [1.0]]
    assert workers_at_handover == [1]
    assert len(set(rec.threads)) == 1


def test_stop_does_not_wait_for_a_loop_that_died() -> None:
    """A model output the batcher cannot slice (0-d here) ends its loop; the request times out
    on its own deadline and a later stop() still returns instead of waiting forever."""
    outcome: list[object] = []

    async def main() -> None:
        b = _batcher(lambda x: np.float32(x.sum()))  # type: ignore[arg-type]
        b.start()
        outcome.append(await asyncio.gather(b.submit(_samples(0, 1), 0.2), return_exceptions=True))
        assert b._task is not None
        await asyncio.wait([b._task], timeout=5)
        outcome.append(b._task.exception())
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert isinstance(outcome[0][0], TimeoutError)  # type: ignore[index]
    assert isinstance(outcome[1], IndexError)


def test_a_costlier_sample_takes_more_of_the_batch_and_of_the_wait() -> None:
    """With ``cost`` (a ``--dynamic-size`` graph's bigger inputs), ``max_batch`` and the
    admission's wait count work, not samples: samples of cost 1.5 make batches of two within
    4, a job that does not fit waits its turn, and what is queued is costed so."""
    xs = [_samples(10 * i, n) for i, n in enumerate([1, 1, 1, 2, 1])]
    rec = Recorder()

    async def main() -> list[np.ndarray]:
        b = DynamicBatcher(
            rec,
            max_batch=4,
            max_delay_ms=0.0,
            max_queue=16,
            metrics=ServerMetrics(),
            cost=lambda x: 1.5 * len(x),
        )
        tasks = [asyncio.ensure_future(b.submit(x, 5)) for x in xs]
        await asyncio.sleep(0)  # queued; the loop is not started
        b.batch_s = 0.5
        assert b.expected_wait_s(1.5) == pytest.approx(3 * 0.5)  # 9 + 1.5 of work: 3 batches
        b.start()
        out = await asyncio.gather(*tasks)
        await b.stop()
        return out

    out = asyncio.run(main())
    assert rec.batches == [[0, 10], [20, 40], [30, 31]]
    for x, y in zip(xs, out, strict=True):
        np.testing.assert_array_equal(y, expected(x))


def test_moving_average_moves_a_fifth_of_the_way() -> None:
    assert moving_average(None, 3.0) == 3.0
    assert moving_average(1.0, 2.0) == pytest.approx(1.2)
    assert moving_average(2.0, 1.0, weight=0.5) == pytest.approx(1.5)


def test_expected_wait_counts_batches_ahead_and_skips_timed_out_jobs() -> None:
    async def main() -> None:
        b = _batcher(Recorder(), max_batch=4)
        assert b.expected_wait_s(1) is None  # nothing measured yet: admit
        b.batch_s = 0.5
        assert b.expected_wait_s(100) == 0.0  # idle: admit, however large
        sizes = ((0, 2), (5, 3), (10, 1))
        tasks = [asyncio.ensure_future(b.submit(_samples(i, n), 5)) for i, n in sizes]
        await asyncio.sleep(0)  # queued; the loop is not started
        assert b.expected_wait_s(2) == pytest.approx(2 * 0.5)  # 6 + 2 samples: two batches
        assert b.expected_wait_s(3) == pytest.approx(3 * 0.5)  # 6 + 3: three
        b._running = 4
        assert b.expected_wait_s(2) == pytest.approx(3 * 0.5)  # and the one running
        assert b.expected_wait_s(1) == pytest.approx(3 * 0.5)  # 7 queued: two, + running
        b.queue[1].cancelled = True  # timed out: it will be skipped, so it is not ahead
        assert b.expected_wait_s(1) == pytest.approx(2 * 0.5)  # 4 queued: one, + running
        b._running = 0
        b.start()
        await asyncio.gather(*tasks[:1], tasks[2])
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 10))


class Slow(Recorder):
    def __call__(self, x: np.ndarray) -> np.ndarray:
        time.sleep(0.05)  # at least 50 ms per batch: a lower bound on any machine
        return super().__call__(x)


def test_work_beyond_the_timeout_is_refused_at_once_with_retry_after() -> None:
    """Once a batch has been timed, a request whose batches ahead would outlast its timeout
    gets ServerBusyError (429) immediately instead of waiting to time out (504)."""
    gate = threading.Event()
    outcome: dict[str, Any] = {}
    rec = Slow()

    async def main() -> None:
        b = _batcher(rec, max_batch=4)
        b.start()
        await b.submit(_samples(0, 1), 5)  # timed: >= 50 ms per batch
        outcome["batch_s"] = b.batch_s
        rec.gate = gate
        running = asyncio.ensure_future(b.submit(_samples(1, 4), 5))
        while b._running != 4:
            await asyncio.sleep(0.001)
        try:
            await b.submit(_samples(9, 1), 0.07)  # (1 running + 1 queued) x 50 ms > 70 ms
        except ServerBusyError as exc:
            outcome["error"] = exc
        outcome["admitted"] = asyncio.ensure_future(b.submit(_samples(7, 1), 60))
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(running, outcome["admitted"])
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 20))
    assert outcome["batch_s"] >= 0.05
    err = outcome["error"]
    assert "timeout" in str(err) and err.retry_after_s >= 1
    assert [9.0] not in rec.batches and rec.batches[-1] == [7.0]
    np.testing.assert_array_equal(outcome["admitted"].result(), expected(_samples(7, 1)))


def test_a_slow_batch_never_locks_out_an_idle_server() -> None:
    """A batch far slower than the timeout (a stall) must not make an idle server refuse: the
    next request is admitted (and, being slow, may time out), never refused forever."""
    rec = Slow()
    outcome: list[Any] = []

    async def main() -> None:
        b = _batcher(rec, max_batch=1)
        b.start()
        outcome.append(await asyncio.gather(b.submit(_samples(0, 1), 0.01), return_exceptions=True))
        await b._idle.wait()  # the stalled batch has finished and been timed
        assert b.batch_s is not None and b.batch_s > 0.01
        big = _samples(1, 3)  # larger than max_batch, alone: admitted
        outcome.append(await asyncio.gather(b.submit(big, 5), return_exceptions=True))
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 20))
    assert isinstance(outcome[0][0], TimeoutError)
    np.testing.assert_array_equal(outcome[1][0], expected(_samples(1, 3)))


@pytest.mark.parametrize(
    ("batches_ahead", "timeout_s", "retry_after"), [(3, 1.0, 1), (5, 0.6, 2), (3, 1.5, None)]
)
def test_refusal_boundary_and_retry_after(
    batches_ahead: int, timeout_s: float, retry_after: int | None
) -> None:
    """Refused only when the wait is over the timeout (equal is admitted); Retry-After is the
    wait beyond the timeout, rounded up."""
    outcome: list[Any] = []

    async def main() -> None:
        b = _batcher(Recorder(), max_batch=1)
        b.batch_s, b._running = 0.5, 1  # one batch running, then the queued ones, then ours
        n = batches_ahead - 2
        filler = [asyncio.ensure_future(b.submit(_samples(i, 1), 60)) for i in range(n)]
        await asyncio.sleep(0)  # queued; the loop is not started
        assert b.expected_wait_s(1) == pytest.approx(batches_ahead * 0.5)
        try:
            outcome.append(await asyncio.wait_for(b.submit(_samples(9, 1), timeout_s), 0.01))
        except ServerBusyError as exc:
            outcome.append(exc)
        except TimeoutError:  # admitted: queued behind the others (the loop is not started)
            outcome.append("admitted")
        b._running = 0
        for f in filler:
            f.cancel()

    asyncio.run(asyncio.wait_for(main(), 10))
    if retry_after is None:
        assert outcome == ["admitted"]
    else:
        err = outcome[0]
        assert isinstance(err, ServerBusyError) and err.retry_after_s == retry_after
        assert f"over the {timeout_s:g} s timeout (--timeout-ms)" in str(err)


def test_seconds_per_batch_is_a_moving_average_and_running_resets() -> None:
    pauses = iter([0.05, 0.5])

    class Paced(Recorder):
        def __call__(self, x: np.ndarray) -> np.ndarray:
            time.sleep(next(pauses))
            return super().__call__(x)

    seen: list[Any] = []

    async def main() -> None:
        b = _batcher(Paced(), max_batch=1)
        b.start()
        await b.submit(_samples(0, 1), 60)
        await b.submit(_samples(1, 1), 60)
        await b._idle.wait()
        seen.extend([b.batch_s, b._running, b.expected_wait_s(1)])
        await b.stop()

    asyncio.run(asyncio.wait_for(main(), 20))
    batch_s, running, wait = seen
    assert 0.05 * 0.8 + 0.5 * 0.2 <= batch_s < 0.3  # not the last batch's 0.5 s alone
    assert running == 0 and wait == 0.0
