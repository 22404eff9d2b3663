"""Server settings (the ``zoo serve`` options): their one home, defaults and checks included."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from zoo.errors import UsageError

if TYPE_CHECKING:
    from zoo.deploy.runtimes.loader import Classifier


@dataclass(frozen=True)
class ServeConfig:
    """What ``zoo serve`` serves and how; made once (the CLI only maps its options here).

    Args:
        model_path: the ``.onnx`` file or OpenVINO ``.xml`` IR served; before start-up, any
            model reference (run or model folder, registry name): :func:`zoo.deploy.serve.run.serve`
            resolves it to the file (:meth:`resolved`).
        name: the model's name in the URL (``/v2/models/NAME``); None: the file's ``arch.tag``.
        host: the bind address (not loopback: refused without an API key unless
            ``allow_unauthenticated``).
        port: the HTTP port (0: any free one).
        max_batch: samples per runtime call (the dynamic batcher's largest batch).
        max_delay_ms: how long to wait for fuller batches (0: never wait).
        max_queue: waiting requests before 429 (gRPC: RESOURCE_EXHAUSTED).
        timeout_ms: 504 after waiting this long (gRPC: DEADLINE_EXCEEDED).
        threads: inference threads (ORT intra-op, or OpenVINO); None: the CPUs available.
        device: ``cpu`` or ``cuda``.
        runtime: ``auto`` (by the file: ``.xml`` is OpenVINO), ``onnxruntime`` or ``openvino``.
        max_body_mb: 413 above this request size (gRPC: the largest message received).
        max_image_pixels: 413 above this many decoded pixels.
        graceful_timeout_s: how long in-flight requests may finish on SIGTERM.
        api_key_file: keys, one a line, ``KEY [scope,...]`` (:mod:`zoo.deploy.serve.auth`);
            None: the ``ZOO_API_KEY`` environment variable at start-up, if set.
        allow_unauthenticated: serve a non-loopback ``host`` without a key, knowingly.
        ssl_certfile: TLS certificate (PEM) for HTTPS and gRPC; None: plain text.
        ssl_keyfile: its private key (PEM), unless the certificate file holds it.
        grpc_port: also serve the v2 gRPC protocol on this port (None: HTTP only).

    Raises:
        UsageError: a key file without a certificate, or gRPC and HTTP on the same port.
    """

    model_path: str
    name: str | None = None
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
    api_key_file: str | None = None
    allow_unauthenticated: bool = False
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    grpc_port: int | None = None

    def __post_init__(self) -> None:
        if self.ssl_keyfile and not self.ssl_certfile:
            raise UsageError(
                "--ssl-keyfile needs --ssl-certfile (the certificate it belongs to)",
                param_hint="--ssl-certfile",
            )
        if self.grpc_port is not None and self.grpc_port == self.port and self.port != 0:
            raise UsageError(
                f"--grpc-port {self.grpc_port} is the HTTP --port too: give gRPC its own port",
                param_hint="--grpc-port",
            )

    @property
    def body_limit(self) -> int:
        """The largest request body (HTTP) or message (gRPC) in bytes."""
        return int(self.max_body_mb * 2**20)

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None

    def resolved(self, model_path: str, name: str) -> ServeConfig:
        """These settings for the file actually served, under its name."""
        return replace(self, model_path=model_path, name=self.name or name)


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
