"""Server settings (the ``zoo serve`` options): their one home, defaults and checks included;
and the settings of each served model (:class:`ModelConfig`), made from them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.errors import UsageError

if TYPE_CHECKING:
    from zoo.deploy.runtimes.loader import Classifier


NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A model's name in the URL (``/v2/models/NAME``): what ``NAME=MODEL`` may give."""


@dataclass(frozen=True)
class ModelConfig:
    """One served model: its file, its name in the URL, and what its own batcher, queue and
    runtime session run with (made by :meth:`ServeConfig.served`, never by hand).

    Args:
        model_path: the ``.onnx`` file or OpenVINO ``.xml`` IR.
        name: its name in the URL.
        threads: its inference threads (its share of the CPU budget); None: the CPUs available.
        max_batch / max_delay_ms / max_queue / timeout_ms: its batcher's limits
            (:class:`ServeConfig`'s, for each model's own batcher and queue).
        device / runtime / max_body_mb / max_image_pixels: as :class:`ServeConfig`'s.
    """

    model_path: str
    name: str
    threads: int | None
    max_batch: int
    max_delay_ms: float
    max_queue: int
    timeout_ms: float
    device: str
    runtime: str
    max_body_mb: float
    max_image_pixels: int

    @property
    def body_limit(self) -> int:
        """The largest request body (HTTP) or message (gRPC) in bytes."""
        return int(self.max_body_mb * 2**20)


@dataclass(frozen=True)
class ServeConfig:
    """What ``zoo serve`` serves and how; made once (the CLI only maps its options here).

    Args:
        model_path: the ``.onnx`` file or OpenVINO ``.xml`` IR served; before start-up, any
            model reference (run or model folder, registry name), or ``NAME=REFERENCE``:
            :func:`zoo.deploy.serve.run.serve` resolves it to the file (:meth:`resolved`).
        name: the model's name in the URL (``/v2/models/NAME``); None: the file's ``arch.tag``.
            One model only (several are named ``NAME=REFERENCE``).
        more_models: the other models served (``zoo serve A B …``), references as
            ``model_path``; each gets its own batcher and queue (these limits), and ``threads``
            (or the CPUs available) is split among all of them.
        models: the served models as resolved at start-up (:meth:`resolved`); empty:
            ``model_path`` under ``name`` as it is (:meth:`served`).
        host: the bind address (not loopback: refused without an API key unless
            ``allow_unauthenticated``).
        port: the HTTP port (0: any free one).
        max_batch: samples per runtime call (the dynamic batcher's largest batch).
        max_delay_ms: how long to wait for fuller batches (0: never wait).
        max_queue: waiting requests before 429 (gRPC: RESOURCE_EXHAUSTED).
        timeout_ms: 504 after waiting this long (gRPC: DEADLINE_EXCEEDED).
        threads: inference threads (ORT intra-op, or OpenVINO); None: the CPUs available.
            With several models: the budget split among them (:meth:`served`).
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
        one_process: several models in this one process and event loop (less memory; one
            model's decoding and Python work then slows the others'); default: a worker
            process per model behind the same ports (:mod:`zoo.deploy.serve.workers`).

    Raises:
        UsageError: a key file without a certificate, gRPC and HTTP on the same port, or
            ``name`` with several models.
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
    one_process: bool = False
    more_models: tuple[str, ...] = ()
    models: tuple[ModelConfig, ...] = ()

    def __post_init__(self) -> None:
        if self.name is not None and self.more_models:
            raise UsageError(
                f"--name names one model, and {1 + len(self.more_models)} are served: name "
                "each as NAME=MODEL (e.g. `zoo serve cats=runs/cats dogs=runs/dogs`)",
                param_hint="--name",
            )
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

    def references(self) -> tuple[tuple[str | None, str], ...]:
        """Each served model's ``(name given, reference)``, in the order given: ``NAME=REF``
        split (unless the whole argument is an existing path), ``--name`` for one model."""
        split = [split_name(ref) for ref in (self.model_path, *self.more_models)]
        return tuple((self.name or given, ref) for given, ref in split)

    def resolved(self, files: Sequence[tuple[str, str]]) -> ServeConfig:
        """These settings for the files actually served: ``files`` holds each reference's
        ``(file, default name)`` in the order of :meth:`references`.

        Raises:
            UsageError: two models under one name.
        """
        names: dict[str, str] = {}
        paths = []
        for (given, ref), (path, default) in zip(self.references(), files, strict=True):
            name = given or default
            if name in names:
                raise UsageError(
                    f"two models are named {name!r} ({names[name]} and {ref}): rename one as "
                    f"NAME=MODEL, e.g. `{name}-2={ref}`",
                    param_hint="MODEL",
                )
            names[name] = ref
            paths.append((name, path))
        shares = thread_shares(self.threads, len(paths))
        models = tuple(self._model(p, n, t) for (n, p), t in zip(paths, shares, strict=True))
        only = models[0].name if len(models) == 1 else None  # several: NAME= each
        return replace(self, model_path=models[0].model_path, name=only, models=models)

    def served(self) -> tuple[ModelConfig, ...]:
        """The served models' settings: :attr:`models`, or else the references as files
        (each named ``NAME=``, ``name``, or its file's stem), sharing the threads.

        Raises:
            UsageError: two models under one name.
        """
        if self.models:
            return self.models
        return self.resolved([(ref, Path(ref).stem) for _, ref in self.references()]).models

    def _model(self, path: str, name: str, threads: int | None) -> ModelConfig:
        return ModelConfig(
            model_path=path,
            name=name,
            threads=threads,
            max_batch=self.max_batch,
            max_delay_ms=self.max_delay_ms,
            max_queue=self.max_queue,
            timeout_ms=self.timeout_ms,
            device=self.device,
            runtime=self.runtime,
            max_body_mb=self.max_body_mb,
            max_image_pixels=self.max_image_pixels,
        )


def split_name(arg: str) -> tuple[str | None, str]:
    """``NAME=REFERENCE`` as ``(NAME, REFERENCE)``; anything else (an existing path with a
    ``=`` in it included) as ``(None, arg)``.

    Raises:
        UsageError: ``NAME`` is not a name a URL can carry.
    """
    name, sep, ref = arg.partition("=")
    if not sep or Path(arg).exists():
        return None, arg
    if not NAME_PATTERN.fullmatch(name) or not ref:
        raise UsageError(
            f"{arg!r}: NAME=MODEL needs a name of letters, digits, '_', '.' or '-' (starting "
            "with a letter or digit) and a model after the '='",
            param_hint="MODEL",
        )
    return name, ref


def thread_shares(budget: int | None, n: int) -> list[int | None]:
    """Each of ``n`` models' inference threads: one model keeps ``budget`` (None: the CPUs
    available, as the runtime decides); several split ``budget`` (None: the CPUs available)
    as evenly as it goes, the first ones taking the remainder, one thread at least each."""
    if n == 1:
        return [budget]
    from zoo.system import available_cpus

    total = budget or available_cpus()
    return [max(1, total // n + (1 if i < total % n else 0)) for i in range(n)]


def option_defaults() -> dict[str, Any]:
    """Each setting's default: ``zoo serve``'s options read theirs from here."""
    return {f.name: f.default for f in fields(ServeConfig) if f.default is not MISSING}


def load_served(cfg: ModelConfig) -> Classifier:
    """The classifier of one served model, as the server runs it: no spinning threads (the
    same cores decode and answer HTTP). A model whose decisions could not be given (a
    multi-label model's thresholds, :func:`zoo.deploy.runtimes.decisions.decision_rule`) is
    refused here, before the server serves.

    Raises:
        Everything :func:`zoo.deploy.runtimes.loader.load_classifier` raises.
    """
    from zoo.deploy.runtimes.loader import load_classifier

    return load_classifier(
        cfg.model_path, runtime=cfg.runtime, device=cfg.device, threads=cfg.threads, spin=False
    )
