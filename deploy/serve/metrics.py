"""Prometheus metrics of one server (own registry, so several apps can live in one process).

One model: the metrics carry no model label (as they always have). Several: every metric of
a model carries ``model="NAME"`` (``""``: a request that names no served model), one family
per metric shared by all models, so ``/metrics`` lists them side by side. In the worker
processes of a server with a process per model (:mod:`zoo.deploy.serve.workers`), each
worker counts into prometheus_client's multiprocess files (``PROMETHEUS_MULTIPROC_DIR``, set
by the parent) and ``/metrics``, wherever it lands, sums them over the workers."""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's own variable: where each worker process's metric files live."""

_TIME_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class MetricFamilies:
    """The server's metric families in their own registry.

    Args:
        per_model: give every model's metric a leading ``model`` label (several models).
    """

    def __init__(self, per_model: bool = False) -> None:
        self.registry = CollectorRegistry()
        model = ["model"] if per_model else []
        self.per_model = per_model
        self.requests = Counter(
            "zoo_requests",
            "Inference requests by endpoint and outcome",
            [*model, "endpoint", "outcome"],
            registry=self.registry,
        )
        self.auth_refusals = Counter(  # the server's, not a model's: refused before routing
            "zoo_auth_refusals",
            "Requests refused for their API key, by scope and reason (missing, invalid, forbidden)",
            ["scope", "reason"],
            registry=self.registry,
        )
        # a server with a worker process per model: what crossed between workers
        self.handed = Counter(
            "zoo_handed_connections",
            "Connections handed to the worker process of the model their first request named",
            ["model"],
            registry=self.registry,
        )
        self.relayed = Counter(
            "zoo_relayed_requests",
            "Requests relayed to the worker process of their model (a later request on a "
            "connection for another model, or any over TLS)",
            ["model"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "zoo_queue_depth",
            "Requests waiting for a batch",
            model,
            registry=self.registry,
            multiprocess_mode="livesum",  # over the live workers (one process: the value)
        )
        self.batch_size = Histogram(
            "zoo_batch_size",
            "Samples per ONNX Runtime call",
            model,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )
        self.queue_seconds = Histogram(
            "zoo_queue_seconds",
            "Time a request waited before its batch ran",
            model,
            buckets=_TIME_BUCKETS,
            registry=self.registry,
        )
        self.compute_seconds = Histogram(
            "zoo_compute_seconds",
            "Duration of one ONNX Runtime call",
            model,
            buckets=_TIME_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> bytes:
        """The exposition text: this registry's, or every worker's summed."""
        shared = os.environ.get(MULTIPROC_ENV)
        if not shared:
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=shared)
        return generate_latest(merged)


class _Bound:
    """A labelled metric with its leading label values given: ``labels(*rest)``."""

    def __init__(self, metric: Any, prefix: tuple[str, ...]) -> None:
        self.metric, self.prefix = metric, prefix

    def labels(self, *values: str) -> Any:
        return self.metric.labels(*self.prefix, *values)


class ServerMetrics:
    """One model's metrics (what its batcher and endpoints count).

    Args:
        families: the server's families (None: its own, unlabelled: a one-model server).
        model: this model's ``model`` label, where ``families`` has one.
    """

    def __init__(self, families: MetricFamilies | None = None, model: str = "") -> None:
        fam = families or MetricFamilies()
        self.families = fam
        self.registry = fam.registry
        self._prefix = (model,) if fam.per_model else ()
        self.requests = _Bound(fam.requests, self._prefix)
        self.auth_refusals = fam.auth_refusals

    def _own(self, metric: Any) -> Any:
        # made when first used: the view of requests naming no model never runs a batch
        return metric.labels(*self._prefix) if self._prefix else metric

    @property
    def queue_depth(self) -> Any:
        return self._own(self.families.queue_depth)

    @property
    def batch_size(self) -> Any:
        return self._own(self.families.batch_size)

    @property
    def queue_seconds(self) -> Any:
        return self._own(self.families.queue_seconds)

    @property
    def compute_seconds(self) -> Any:
        return self._own(self.families.compute_seconds)

    def render(self) -> bytes:
        return self.families.render()
