"""Server settings (the ``zoo serve`` options)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServeConfig:
    model_path: str
    name: str
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 16
    max_delay_ms: float = 0.0  # 0: form the largest batch available now (no added latency)
    max_queue: int = 256
    timeout_ms: float = 10_000.0
    threads: int | None = None  # ORT intra-op threads; default: the CPUs actually available
    device: str = "cpu"
    runtime: str = "auto"  # by the file (.xml: OpenVINO), or onnxruntime / openvino
    max_body_mb: float = 32.0
    max_image_pixels: int = 40_000_000  # below zoo.images.MAX_PIXELS: a server is exposed
    graceful_timeout_s: float = 30.0
