"""How a serving process starts and stops: its ports, its log lines (start-up lines included),
uvicorn's settings, and a graceful shutdown on SIGTERM and SIGINT; for ``zoo serve`` in one process
(:mod:`zoo.deploy.serve.run`) and for each worker of a server with a process per model
(:mod:`zoo.deploy.serve.workers`)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import signal
import socket
from collections.abc import Iterator
from typing import Any

from zoo.deploy.serve.auth import ApiKeys
from zoo.deploy.serve.config import ModelConfig, ServeConfig
from zoo.errors import InputError
from zoo.system import available_cpus


def address_family(host: str) -> socket.AddressFamily:
    """IPv6 for a host written with colons (::1, ::), else IPv4."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _taken(option: str, host: str, port: int, exc: OSError) -> InputError:
    return InputError(
        f"{option} {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); another "
        f"server may hold it: pick another {option} (0: any free one), or stop that server."
    )


def listen(host: str, port: int) -> socket.socket:
    """The HTTP socket, bound once, before any model is exported or loaded, and handed to
    uvicorn (or inherited by the worker processes): a port another process holds is refused
    at once (bound after loading, uvicorn exited from under a model's native threads, an abort),
    and nothing can take it while the models load.

    Raises:
        InputError: the address cannot be bound (the port in use, an address not here).
    """
    try:
        sock = socket.create_server((host, port), family=address_family(host), backlog=2048)
    except OSError as exc:
        raise _taken("--port", host, port, exc) from None
    sock.set_inheritable(True)
    return sock


def check_grpc_port(host: str, port: int) -> None:
    """Refuse a ``--grpc-port`` another process holds before anything loads (gRPC binds its
    own listeners later; a port taken in between is still refused then, by gRPC).

    Raises:
        InputError: the port is in use.
    """
    if not port:  # 0: any free port
        return
    with socket.socket(address_family(host)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise _taken("--grpc-port", host, port, exc) from None


def graceful_server(config: Any) -> Any:
    """A uvicorn server for ``config`` that shuts down gracefully on SIGTERM and SIGINT."""
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """SIGTERM/SIGINT: stop accepting, finish in-flight requests (bounded by
        timeout_graceful_shutdown), then return normally, so the process exits 0. (uvicorn's own
        handler re-raises the signal after shutting down, which ends the process with -15.)"""

        def handle_exit(self, sig: int, frame: Any) -> None:
            first = not self.should_exit  # said once (a second Ctrl-C forces the exit)
            try:
                if first:
                    logging.getLogger("zoo.serve").info(
                        "zoo serve: %s: no new connections; the requests in flight finish "
                        "(at most %s s), then it stops",
                        signal.Signals(sig).name,
                        self.config.timeout_graceful_shutdown,
                    )
            finally:  # a log write the signal interrupted must not lose the signal
                super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {
                s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)
            }
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    return GracefulServer(config)


def setup_logging(where: str = "") -> None:
    """The server's log lines: warnings, zoo's start-up and client-error lines (``where``:
    which worker process says it)."""
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s %(levelname)s %(name)s{where}: %(message)s"
    )
    logging.getLogger("zoo.serve").setLevel(logging.INFO)  # start-up line, one per client error
    logging.getLogger("python_multipart").setLevel(logging.ERROR)  # its bad-body warnings: ours


def log_model(cfg: ServeConfig, model: ModelConfig, threads: int | None, where: str = "") -> None:
    """The start-up line of one served model: its file, threads, batcher and queue."""
    several = len(cfg.served()) > 1
    logging.getLogger("zoo.serve").info(
        "zoo serve: model %r from %s: %s inference threads%s; its own batcher "
        "(max batch %s) and queue (max %s)%s",
        model.name,
        model.model_path,
        threads,
        f" (its share of {cfg.threads or available_cpus()} CPUs among {len(cfg.served())} models)"
        if several
        else "",
        model.max_batch,
        model.max_queue,
        where,
    )


def uvicorn_config(app: Any, cfg: ServeConfig) -> Any:
    """uvicorn's settings for ``app`` under ``cfg``."""
    import uvicorn

    # uvicorn's fast loop and parser are dependencies; "auto" still runs without them
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        loop=loop,
        http=http,
        log_level="warning",
        timeout_graceful_shutdown=int(cfg.graceful_timeout_s),
        access_log=False,
        ssl_certfile=cfg.ssl_certfile,
        ssl_keyfile=cfg.ssl_keyfile,
    )


def log_server(cfg: ServeConfig, config: Any, keys: ApiKeys | None, how: str) -> None:
    """The start-up line of the server: its address, loop and parser, gRPC, keys."""
    logging.getLogger("zoo.serve").info(
        "zoo serve: %s://%s:%s (uvicorn, %s loop, %s parser%s)%s; API keys: %s",
        "https" if cfg.tls else "http",
        cfg.host,
        cfg.port,
        config.loop,
        config.http,
        how,
        f", gRPC on port {cfg.grpc_port}" if cfg.grpc_port is not None else "",
        f"{len(keys.entries)} (health open)" if keys else "none (every endpoint open)",
    )
