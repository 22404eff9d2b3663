"""Server settings (the ``zoo serve`` options): their one home, defaults included."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zoo.deploy.runtimes.loader import Classifier


@dataclass
class ServeConfig:
    """What ``zoo serve`` serves and how.

    Args:
        model_path: the ``.onnx`` file or OpenVINO ``.xml`` IR served.
        name: the model's name in the URL (``/v2/models/NAME``).
        host: the bind address.
        port: the port (0: any free one).
        max_batch: samples per runtime call (the dynamic batcher's largest batch).
        max_delay_ms: how long to wait for fuller batches (0: never wait).
        max_queue: waiting requests before 429.
        timeout_ms: 504 after waiting this long.
        threads: inference threads (ORT intra-op, or OpenVINO); None: the CPUs available.
        device: ``cpu`` or ``cuda``.
        runtime: ``auto`` (by the file: ``.xml`` is OpenVINO), ``onnxruntime`` or ``openvino``.
        max_body_mb: 413 above this request size.
        max_image_pixels: 413 above this many decoded pixels.
        graceful_timeout_s: how long in-flight requests may finish on SIGTERM.
    """

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


def option_defaults() -> dict[str, Any]:
    """Each setting's default: ``zoo serve``'s options read theirs from here."""
    return {f.name: f.default for f in fields(ServeConfig) if f.default is not MISSING}


def load_served(cfg: ServeConfig) -> Classifier:
    """The classifier ``cfg`` serves, as the server runs it: no spinning threads (the same
    cores decode and answer HTTP).

    Raises:
        Everything :func:`zoo.deploy.runtimes.loader.load_classifier` raises.
    """
    from zoo.deploy.runtimes.loader import load_classifier

    return load_classifier(
        cfg.model_path, runtime=cfg.runtime, device=cfg.device, threads=cfg.threads, spin=False
    )
