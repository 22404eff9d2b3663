"""Prometheus metrics of one server (own registry, so several apps can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "zoo_requests",
            "Inference requests by endpoint and outcome",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.auth_refusals = Counter(
            "zoo_auth_refusals",
            "Requests refused for their API key, by scope and reason (missing, invalid, forbidden)",
            ["scope", "reason"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "zoo_queue_depth", "Requests waiting for a batch", registry=self.registry
        )
        self.batch_size = Histogram(
            "zoo_batch_size",
            "Samples per ONNX Runtime call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )
        self.queue_seconds = Histogram(
            "zoo_queue_seconds",
            "Time a request waited before its batch ran",
            buckets=_TIME_BUCKETS,
            registry=self.registry,
        )
        self.compute_seconds = Histogram(
            "zoo_compute_seconds",
            "Duration of one ONNX Runtime call",
            buckets=_TIME_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
