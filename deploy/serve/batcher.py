"""Dynamic batching: requests are gathered into one ONNX Runtime call of at most
``max_batch`` samples. By default no delay is added (the largest batch available *now*, like
Triton); ``max_delay_ms`` opts into waiting for more. Inference runs in a worker thread, so
the event loop (and the health probes) stay responsive under full load.

Admission: when work is queued or running, a request that could not be answered within its
timeout (the batches ahead of it times the measured seconds per batch) is refused at once with
429 and a Retry-After, rather than queued to time out later as a 504: overload is the client's
signal to back off, not our failure. Seconds per batch, not per sample: a burst after single
requests is not refused for a cost that batching spreads; an idle server never refuses."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from zoo.deploy.serve.metrics import ServerMetrics
from zoo.errors import ServerBusyError


def moving_average(old: float | None, new: float, weight: float = 0.2) -> float:
    """Exponential moving average: ``new`` moves the average ``weight`` of the way."""
    return new if old is None else (1 - weight) * old + weight * new


@dataclass
class _Job:
    x: np.ndarray
    future: asyncio.Future[np.ndarray]
    enqueued: float  # the event loop's clock (loop.time()), which also times the delay
    cost: float  # its work in samples, what max_batch counts (DynamicBatcher's ``cost``)
    cancelled: bool = False


class DynamicBatcher:
    def __init__(
        self,
        run: Callable[[np.ndarray], np.ndarray],
        *,
        max_batch: int,
        max_delay_ms: float,
        max_queue: int,
        metrics: ServerMetrics,
        cost: Callable[[np.ndarray], float] = len,
    ) -> None:
        """``cost``: a request's work in samples, what ``max_batch`` counts (by default its
        samples; a ``--dynamic-size`` graph's bigger inputs count more: ``TensorSpec.cost``)."""
        self.run, self.max_batch, self.max_delay = run, max_batch, max_delay_ms / 1000
        self.cost = cost
        self.max_queue, self.metrics = max_queue, metrics
        self.queue: deque[_Job] = deque()
        # one thread: one ORT call at a time, always from the same thread
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ort")
        self._wake = asyncio.Event()  # set by submit: a job was queued
        self._idle = asyncio.Event()  # set by the loop: nothing queued, nothing running
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.batch_s: float | None = None  # seconds per batch: a moving average of those run
        self._running = 0.0  # the work of the batch being computed, in samples

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Finish what is queued or running, then stop the loop and the worker thread."""
        await self._idle.wait()
        if self._task is not None:
            self._task.cancel()
        self.executor.shutdown(wait=True)

    def expected_wait_s(self, n: float) -> float | None:
        """Seconds until ``n`` more samples (of work: ``cost``) would be answered: the batches
        ahead of them (the running one, and the queued work plus ``n`` in batches of
        ``max_batch``) times the measured seconds per batch. None before the first batch has
        run, and 0 when nothing is queued or running: an idle server admits every request,
        however large or slow."""
        if self.batch_s is None:
            return None
        queued = sum(j.cost for j in self.queue if not j.cancelled)
        if not queued and not self._running:
            return 0.0
        batches = math.ceil((queued + n) / self.max_batch) + (1 if self._running else 0)
        return batches * self.batch_s

    def admit(self, n: float, timeout_s: float) -> None:
        """Whether ``n`` more samples (of work) would be queued now (checked again by :meth:`submit`;
        asked first by work that costs CPU before it is queued, such as decoding an image).

        Raises:
            ServerBusyError: the queue is full, or the work ahead outlasts ``timeout_s``.
        """
        if len(self.queue) >= self.max_queue:
            raise ServerBusyError(f"queue full ({self.max_queue} requests waiting)")
        wait = self.expected_wait_s(n)
        if wait is not None and wait > timeout_s:
            raise ServerBusyError(
                f"server busy: about {wait:.2g} s of work is ahead, over the {timeout_s:g} s "
                "timeout (--timeout-ms)",
                retry_after_s=max(1, math.ceil(wait - timeout_s)),
            )

    async def submit(self, x: np.ndarray, timeout_s: float) -> np.ndarray:
        cost = self.cost(x)
        self.admit(cost, timeout_s)
        loop = asyncio.get_running_loop()
        job = _Job(x, loop.create_future(), loop.time(), cost)
        self.queue.append(job)
        self.metrics.queue_depth.set(len(self.queue))
        self._idle.clear()
        self._wake.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout_s)
        except asyncio.TimeoutError as exc:  # the builtin TimeoutError only from Python 3.11
            job.cancelled = True  # skipped if still queued; its result is dropped otherwise
            raise TimeoutError(f"waited more than {timeout_s:g} s") from exc  # 3.10: builtin

    def _take_batch(self) -> list[_Job]:
        """FIFO jobs with the first job's sample shape, up to max_batch samples of work."""
        first = self.queue.popleft()
        jobs, n, shape = [first], first.cost, first.x.shape[1:]
        rest: deque[_Job] = deque()
        while self.queue and n < self.max_batch:
            job = self.queue.popleft()
            if job.cancelled:
                continue
            if job.x.shape[1:] == shape and n + job.cost <= self.max_batch:
                jobs.append(job)
                n += job.cost
            else:
                rest.append(job)
        self.queue.extendleft(reversed(rest))
        return jobs

    async def _gather(self) -> None:
        """Wait until max_batch samples (of work) are queued or the oldest job has waited
        max_delay."""
        loop = asyncio.get_running_loop()
        deadline = self.queue[0].enqueued + self.max_delay
        while sum(j.cost for j in self.queue) < self.max_batch:
            self._wake.clear()
            try:  # woken by the next submit, not by polling
                await asyncio.wait_for(self._wake.wait(), deadline - loop.time())
            except asyncio.TimeoutError:  # the delay is over: run what has come
                return

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self.queue:
                    self._idle.set()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if self.max_delay > 0:  # opt-in: wait for a fuller batch, bounded by the delay
                    await self._gather()
                while self.queue and self.queue[0].cancelled:
                    self.queue.popleft()
                if not self.queue:
                    continue
                jobs = self._take_batch()
                self.metrics.queue_depth.set(len(self.queue))
                now = loop.time()
                for j in jobs:
                    self.metrics.queue_seconds.observe(now - j.enqueued)
                await self._run_jobs(loop, jobs)
        finally:  # ended (cancelled by stop(), or a bug): nothing runs now, stop() must not wait
            self._idle.set()

    def _run_batch(self, xs: list[np.ndarray]) -> np.ndarray:
        return self.run(np.concatenate(xs) if len(xs) > 1 else xs[0])

    async def _run_jobs(self, loop: asyncio.AbstractEventLoop, jobs: list[_Job]) -> None:
        t0, n = loop.time(), sum(len(j.x) for j in jobs)
        self._running = sum(j.cost for j in jobs)
        try:  # the batch is assembled in the worker: a copy of megabytes stays off the loop
            y = await loop.run_in_executor(self.executor, self._run_batch, [j.x for j in jobs])
        except Exception as exc:  # one bad request must not poison the others: retry alone
            if len(jobs) > 1:
                for j in jobs:
                    await self._run_jobs(loop, [j])
                return
            if not jobs[0].future.done():
                jobs[0].future.set_exception(exc)
            return
        finally:
            self._running = 0.0
        seconds = loop.time() - t0
        self.batch_s = moving_average(self.batch_s, seconds)
        self.metrics.compute_seconds.observe(seconds)
        self.metrics.batch_size.observe(n)
        start = 0
        for j in jobs:
            if not j.future.done():
                j.future.set_result(y[start : start + len(j.x)])
            start += len(j.x)
