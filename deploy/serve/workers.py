"""``zoo serve A B …``: a worker process per model behind the same ports.

Each model's decoding, batching and inference run in its own process, so one model flooded
or stuck costs another no GIL time (issue #34: in one process, a flooded MobileNet took the
event loop from a small CNN). The parent (this module's :func:`serve_workers`) binds the HTTP
port once and hands the socket to every worker, which all accept on it (the kernel shares the
connections out, as under uvicorn's own ``--workers``); gRPC is bound by every worker with
``SO_REUSEPORT``. A request that lands on a worker for another worker's model is relayed to
it (:mod:`zoo.deploy.serve.relay`). Readiness and the repository index ask every worker;
``/metrics`` sums them (prometheus_client's multiprocess mode). The parent loads nothing: it
starts the workers, waits for each to load its model (one that cannot is refused, exit 1,
before any serves), starts a worker again if one dies, and on SIGTERM or SIGINT stops them
gracefully.

A connection is handed whole to the worker that owns the model its first request names
(:class:`_Handoff`: its descriptor passed over a Unix socket, the request still unread), so a
client that talks to one model, as most do, reaches that model's process directly; only a
later request on the same connection for another model, or any over TLS (whose first line
cannot be read before the handshake), is relayed.

A worker reads its :class:`WorkerSpec` on standard input as JSON (never a pickle), says
whether its model loaded on the status pipe, serves once the parent says ``go``, and shuts
down when the parent goes (its standard input closes)."""

from __future__ import annotations

import array
import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import msgspec

import zoo.errors
from zoo.deploy.serve.config import ServeConfig
from zoo.deploy.serve.metrics import MULTIPROC_ENV
from zoo.deploy.serve.relay import MODEL_PREFIX, Peers
from zoo.deploy.serve.startup import (
    address_family,
    check_grpc_port,
    graceful_server,
    log_model,
    setup_logging,
    uvicorn_config,
)
from zoo.errors import ZooError

log = logging.getLogger("zoo.serve")

RESTARTS = 3
"""Restarts of one worker within :data:`RESTART_WINDOW_S` before the server gives up (exit 1)."""
RESTART_WINDOW_S = 60.0


class WorkerSpec(msgspec.Struct):
    """What one worker serves: the server's settings (models resolved to files), which model
    is its own, where the workers' relay sockets are, and its inherited descriptors."""

    cfg: ServeConfig
    index: int
    relay_dir: str
    http_fd: int
    status_fd: int


class WorkerStatus(msgspec.Struct, omit_defaults=True):
    """A worker's word after loading: its inference threads and CPUs, or why its model did not load
    (the message and the :mod:`zoo.errors` class, so the parent exits as ``zoo serve`` would
    with the model loaded in it)."""

    threads: int | None = None
    cpus: list[int] = msgspec.field(default_factory=list)
    error: str = ""
    kind: str = ""


class _Worker:
    """One worker process, seen from the parent."""

    def __init__(self, spec: WorkerSpec, http: socket.socket, env: dict[str, str]) -> None:
        self.spec, self.http, self.env = spec, http, env
        self.name = spec.cfg.served()[spec.index].name
        self.where = f"{spec.cfg.host}:{spec.cfg.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.status_r = -1
        self.restarts: list[float] = []

    def start(self) -> None:
        read, write = os.pipe()
        spec = msgspec.structs.replace(self.spec, http_fd=self.http.fileno(), status_fd=write)
        self.proc = subprocess.Popen(
            # the model and address on its command line: what `ps` shows of it
            [sys.executable, "-m", "zoo.deploy.serve.workers", f"{self.name}@{self.where}"],
            stdin=subprocess.PIPE,
            pass_fds=(self.http.fileno(), write),
            env=self.env,
        )
        os.close(write)
        self.status_r = read
        assert self.proc.stdin is not None
        self.proc.stdin.write(msgspec.json.encode(spec) + b"\n")
        self.proc.stdin.flush()

    def loaded(self) -> WorkerStatus:
        """The worker's status once its model is loaded (or it failed, or died)."""
        with os.fdopen(self.status_r, "rb") as status:
            line = status.readline()
        if not line:
            assert self.proc is not None
            code = self.proc.wait()
            return WorkerStatus(
                error=f"the worker process of model {self.name!r} exited with code {code} "
                "before its model loaded (its log is above)"
            )
        return msgspec.json.decode(line, type=WorkerStatus)

    def go(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.error("the worker of model %r did not stop in %.0f s: killed", self.name, timeout_s)
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()


def _raise(status: WorkerStatus) -> None:
    """The worker's load error, as the class it was (else :class:`ZooError`)."""
    cls = getattr(zoo.errors, status.kind, None)
    if isinstance(cls, type) and issubclass(cls, ZooError):
        try:
            raise cls(status.error)
        except TypeError:  # a class whose constructor takes more than a message
            pass
    raise ZooError(status.error)


def _reserve_grpc(host: str, port: int) -> socket.socket:
    """A socket holding the gRPC port for the workers' ``SO_REUSEPORT`` listeners (it never
    listens itself). The port must be free: a listener of another program there, shared
    silently, would take some of the calls.

    Raises:
        InputError: the port is in use.
    """
    check_grpc_port(host, port)
    hold = socket.socket(address_family(host))
    hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    hold.bind((host, port))
    return hold


def serve_workers(cfg: ServeConfig, http: socket.socket) -> None:
    """Serve ``cfg``'s models (resolved to files, several), a worker process each, accepting
    on ``http`` (bound by :func:`~zoo.deploy.serve.startup.listen`), until SIGTERM or SIGINT;
    then stop every worker gracefully and return.

    Raises:
        InputError: a gRPC port that cannot be bound.
        ZooError (the class the worker raised): a model that does not load; every worker is
            stopped first.
    """
    models = cfg.served()
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    with tempfile.TemporaryDirectory(prefix="zoo-serve-") as tmp:  # private: mode 0700
        relay_dir, metrics_dir = Path(tmp) / "relay", Path(tmp) / "metrics"
        relay_dir.mkdir()
        metrics_dir.mkdir()
        hold = _reserve_grpc(cfg.host, cfg.grpc_port) if cfg.grpc_port is not None else None
        cfg = replace(
            cfg,
            port=http.getsockname()[1],
            grpc_port=hold.getsockname()[1] if hold is not None else None,
        )
        env = {**os.environ, MULTIPROC_ENV: str(metrics_dir)}
        workers = [
            _Worker(WorkerSpec(cfg, i, str(relay_dir), -1, -1), http, env)
            for i in range(len(models))
        ]
        try:
            for w in workers:  # they load at the same time
                w.start()
            statuses = [w.loaded() for w in workers]
            for status in statuses:
                if status.error and stop.is_set():  # Ctrl-C while loading: no error of ours
                    return
                if status.error:
                    _raise(status)
            for w, model, status in zip(workers, models, statuses, strict=True):
                assert w.proc is not None
                on = f" on CPU {', '.join(map(str, status.cpus))}" if status.cpus else ""
                log_model(cfg, model, status.threads, f"; worker process {w.proc.pid}{on}")
            log.info(
                "zoo serve: %s://%s:%s, %s worker processes (one per model) accepting on it%s",
                "https" if cfg.tls else "http",
                cfg.host,
                cfg.port,
                len(workers),
                f", gRPC on port {cfg.grpc_port}" if cfg.grpc_port is not None else "",
            )
            for w in workers:
                w.go()
            _supervise(workers, stop, metrics_dir)
        finally:
            for w in workers:
                w.signal(signal.SIGTERM)
            for w in workers:
                w.wait(cfg.graceful_timeout_s + 10)
            if hold is not None:
                hold.close()
            for s, handler in previous.items():
                signal.signal(s, handler)


def _supervise(workers: list[_Worker], stop: threading.Event, metrics_dir: Path) -> None:
    """Until ``stop``: a worker that exits is started again (its model loaded anew; the
    others serve meanwhile, and answer 503 for its model).

    Raises:
        ZooError: a worker exited more than :data:`RESTARTS` times within a minute, or its
            model no longer loads.
    """
    from prometheus_client import multiprocess

    while not stop.wait(0.2):
        for w in workers:
            assert w.proc is not None
            code = w.proc.poll()
            if code is None or stop.is_set():
                continue
            multiprocess.mark_process_dead(w.proc.pid, str(metrics_dir))  # its live gauges
            now = time.monotonic()
            w.restarts = [t for t in w.restarts if now - t < RESTART_WINDOW_S] + [now]
            if len(w.restarts) > RESTARTS:
                raise ZooError(
                    f"the worker of model {w.name!r} exited {len(w.restarts)} times within "
                    f"{RESTART_WINDOW_S:.0f} s (last exit code {code}); stopping the server"
                )
            log.error("the worker of model %r exited with code %s; starting it again", w.name, code)
            w.start()
            status = w.loaded()
            if status.error:
                _raise(status)
            w.go()
            log.info("zoo serve: model %r loaded again; worker process %s", w.name, w.proc.pid)


# ---------------------------------------------------------------- in the worker process
PEEK_BYTES = 2048
"""The most of a connection's first bytes read (not consumed) for its request line."""
PEEK_WAIT_S = 2.0
"""How long a new connection may take to send its request line before it is served here."""
HAND_WAIT_S = 0.5
"""How long a connection waits for room in its owner's queue before it is served here."""


class _Handoff:
    """This worker's side of the shared HTTP socket: it accepts connections and serves each
    in the worker that owns the model its first request names. The request line is read
    with ``MSG_PEEK`` (left in the socket); a connection for another worker's model is sent
    to that worker as a descriptor (``SCM_RIGHTS`` over a Unix datagram socket) and served
    there by uvicorn as if accepted there. Written here: uvicorn and asyncio accept, but do
    not route connections between processes.

    Args:
        peers: the workers (who owns which model, where their sockets are).
        listen: the shared listening socket.
        server: this worker's uvicorn server (its protocol serves the connections).
        tls: the connections are TLS (served where accepted; requests relayed).
    """

    def __init__(self, peers: Peers, listen: socket.socket, server: Any, tls: bool) -> None:
        self.peers, self.listen, self.server, self.tls = peers, listen, server, tls
        self.inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.outbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.tasks: set[asyncio.Task[None]] = set()
        self.accepting: asyncio.Task[None] | None = None

    def _protocol(self) -> asyncio.Protocol:
        config, server = self.server.config, self.server
        protocol: asyncio.Protocol = config.http_protocol_class(
            config=config, server_state=server.server_state, app_state=server.lifespan.state
        )
        return protocol

    async def _serve_here(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        ssl = self.server.config.ssl
        await loop.connect_accepted_socket(self._protocol, conn, ssl=ssl)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def start(self) -> None:
        """Accept on the shared socket and take connections handed here (in the loop)."""
        loop = asyncio.get_running_loop()
        path = self.peers.relay_dir / f"{self.peers.own}.fd"
        path.unlink(missing_ok=True)
        self.inbox.bind(str(path))
        self.inbox.setblocking(False)
        self.outbox.setblocking(False)
        self.listen.setblocking(False)
        loop.add_reader(self.inbox.fileno(), self._take)
        self.accepting = loop.create_task(self._accept())

    async def stop(self) -> None:
        """Accept no more; the connections being routed go where they were going."""
        if self.accepting is not None:
            self.accepting.cancel()
        asyncio.get_running_loop().remove_reader(self.inbox.fileno())
        self.inbox.close()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=PEEK_WAIT_S + 1)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self.listen)
            except OSError as exc:  # out of descriptors, a connection reset before accept
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.05)
                continue
            conn.setblocking(False)
            self._spawn(self._route(conn))

    async def _route(self, conn: socket.socket) -> None:
        name = None if self.tls else await self._model(conn)
        owner = self.peers.owners.get(name or "", self.peers.own)
        if owner != self.peers.own and await self._hand(conn, owner):
            conn.close()  # its copy lives on in the owner
            if self.peers.families is not None:
                self.peers.families.handed.labels(name).inc()
            return
        try:
            await self._serve_here(conn)
        except OSError:  # the client went away meanwhile
            conn.close()

    async def _hand(self, conn: socket.socket, owner: int) -> bool:
        """Send ``conn`` to worker ``owner``; False: it is not there (starting again), or
        its queue stayed full for :data:`HAND_WAIT_S` (the connection is served here, its
        requests relayed)."""
        path = str(self.peers.relay_dir / f"{owner}.fd")
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [conn.fileno()]))]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HAND_WAIT_S
        while True:
            try:
                self.outbox.sendmsg([b"c"], rights, 0, path)  # send_fds drops the address (3.11)
                return True
            except BlockingIOError:  # its queue is full (max_dgram_qlen, 10 by default)
                if loop.time() > deadline:
                    return False
                await asyncio.sleep(0.001)
            except OSError:
                return False

    async def _model(self, conn: socket.socket) -> str | None:
        """The model the first request names (None: not a model's path, or no request line
        within :data:`PEEK_WAIT_S`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PEEK_WAIT_S
        while True:
            ready: asyncio.Future[None] = loop.create_future()

            def readable(f: asyncio.Future[None] = ready) -> None:
                if not f.done():  # called again while the loop runs on: once is enough
                    f.set_result(None)

            loop.add_reader(conn.fileno(), readable)
            try:
                await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:  # the builtin TimeoutError only from Python 3.11
                return None
            finally:
                loop.remove_reader(conn.fileno())
            try:
                head = conn.recv(PEEK_BYTES, socket.MSG_PEEK)
            except OSError:
                return None
            end = head.find(b"\r\n")
            if end >= 0 or not head or len(head) >= PEEK_BYTES:
                break
            await asyncio.sleep(0.002)  # a request line in pieces: still readable, so wait
        parts = head[: max(end, 0)].split(b" ")
        if len(parts) != 3 or not parts[1].startswith(MODEL_PREFIX.encode()):
            return None
        name = parts[1][len(MODEL_PREFIX) :].split(b"/", 1)[0].split(b"?", 1)[0]
        return unquote(name.decode("latin-1"))

    def _take(self) -> None:
        """Connections handed here by the other workers: served as if accepted here."""
        while True:
            try:
                _, fds, _, _ = socket.recv_fds(self.inbox, 16, 8)
            except (BlockingIOError, InterruptedError):
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                conn.setblocking(False)
                self._spawn(self._serve_here(conn))


def _worker_server(config: Any, handoff: Any) -> Any:
    """uvicorn's server for this worker, its connections accepted by the handoff."""
    graceful = type(graceful_server(config))

    class WorkerServer(graceful):  # type: ignore[misc,valid-type]
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=[])  # no listener of uvicorn's own
            if not self.should_exit:
                handoff(self).start()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            await self.handoff.stop()
            await super().shutdown(sockets=sockets)

    return WorkerServer(config)


def _exit_with_parent() -> None:
    """The parent is gone (standard input closed): shut down as on SIGTERM."""
    while os.read(0, 4096):  # unbuffered: a daemon thread must hold no lock at exit
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def worker_cpus(index: int, shares: list[int], cpus: list[int]) -> list[int]:
    """The CPUs of worker ``index`` among ``cpus``: as many as its share of the inference
    threads, after those of the workers before it, wrapping round where the shares add up to
    more than there are."""
    start = sum(shares[:index])
    return sorted({cpus[(start + k) % len(cpus)] for k in range(shares[index])})


def pin(index: int, shares: list[int]) -> list[int]:
    """Keep this worker (and the inference threads it will start) to its share of the CPUs,
    so a flooded model cannot take another's cores: on 2 cores its p99 under a neighbour's
    flood fell by a quarter, and the combined RPS rose (docs/benchmarks.md, serve_multi).
    Returns the CPUs, or [] where the affinity cannot be set (the worker then runs anywhere)."""
    try:
        cpus = worker_cpus(index, shares, sorted(os.sched_getaffinity(0)))
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError) as exc:  # no affinity on this OS, or not allowed
        log.warning("zoo serve: could not keep this worker to its CPUs (%s); it runs on any", exc)
        return []
    return cpus


def main() -> None:
    """A worker: load the model, say so, wait for ``go``, serve until SIGTERM."""
    spec = msgspec.json.decode(sys.stdin.buffer.readline(), type=WorkerSpec)
    from zoo.deploy.serve.app import create_app
    from zoo.deploy.serve.auth import load_keys
    from zoo.deploy.serve.config import load_served

    served = spec.cfg.served()
    model = served[spec.index]
    setup_logging(f" [{model.name}]")
    cpus = pin(spec.index, [m.threads or 1 for m in served])
    with os.fdopen(spec.status_fd, "wb") as status:
        try:
            keys = load_keys(spec.cfg.api_key_file)
            clf = load_served(model)
        except Exception as exc:  # told to the parent, which exits with it
            status.write(msgspec.json.encode(WorkerStatus(error=str(exc), kind=type(exc).__name__)))
            raise SystemExit(1) from None
        status.write(msgspec.json.encode(WorkerStatus(threads=clf.threads, cpus=cpus)) + b"\n")
    if sys.stdin.buffer.readline().strip() != b"go":
        return  # the parent gave up (another model did not load)
    threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()
    peers = Peers(
        {m.name: i for i, m in enumerate(served)},
        spec.index,
        Path(spec.relay_dir),
        keys,
        spec.cfg.body_limit,
    )
    app = create_app(spec.cfg, keys=keys, loaded={model.name: clf}, peers=peers)
    listen = socket.socket(fileno=spec.http_fd)

    def handoff(server: Any) -> _Handoff:
        server.handoff = _Handoff(peers, listen, server, spec.cfg.tls)
        return server.handoff

    _worker_server(uvicorn_config(peers.router(app), spec.cfg), handoff).run()


if __name__ == "__main__":
    main()
