"""How the worker processes of one ``zoo serve A B …`` answer for each other
(:mod:`zoo.deploy.serve.workers`): every worker accepts connections on the server's ports,
and a request for a model another worker owns is relayed to that worker over a local Unix
socket, as it came (path, headers, body; or a gRPC method's raw message), to be answered by
the owner's own app as if it had arrived there. So each model's decoding, batching and
inference run in its own process, under its own GIL: one model flooded costs another only
the relaying of the requests that happened to land on it.

Written here, not taken from a library: an HTTP reverse proxy (aiohttp, httpx) would parse
and re-encode every relayed request a second time; this passes the ASGI request itself
(one msgpack frame each way, many in flight on one connection)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from zoo.deploy.serve.auth import ApiKeys, Verdict
from zoo.deploy.serve.metrics import MetricFamilies
from zoo.deploy.serve.protocol import IndexEntry
from zoo.errors import ModelNotReadyError

log = logging.getLogger("zoo.serve")

MODEL_PREFIX = "/v2/models/"
"""The paths that belong to one model: ``/v2/models/NAME[/...]``, relayed to its owner."""
PEER_START_S = 10.0
"""How long a worker waits for another worker's relay socket, not reached yet, to be opened:
the workers open theirs at about the same time, once every model is loaded, so a request
in the first moments may ask a peer whose socket is not there yet."""


class HttpCall(msgspec.Struct, tag=True):
    """An HTTP request for a model of the worker it is sent to, as its ASGI scope had it."""

    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


class HttpReply(msgspec.Struct, tag=True):
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class GrpcCall(msgspec.Struct, tag=True):
    """A v2 gRPC method's request message for a model of the worker it is sent to."""

    method: str
    data: bytes
    authorization: str | None


class GrpcReply(msgspec.Struct, tag=True):
    """The answer: the response message (``code`` empty), or a status code's name and why."""

    data: bytes = b""
    code: str = ""
    message: str = ""


class StateCall(msgspec.Struct, tag=True):
    """The worker's models, their versions and states (for readiness and the index)."""


class StateReply(msgspec.Struct, tag=True):
    entries: list[IndexEntry]


Call = HttpCall | GrpcCall | StateCall
Reply = HttpReply | GrpcReply | StateReply
_HEAD = struct.Struct("!IQ")  # payload length, call id

HttpHandler = Callable[[HttpCall], Awaitable[HttpReply]]
GrpcHandler = Callable[[GrpcCall], Awaitable[GrpcReply]]
StateHandler = Callable[[], list[IndexEntry]]


class _Connection:
    """One connection to a peer, many calls in flight on it (replies matched by id)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.pending: dict[int, asyncio.Future[Reply]] = {}
        self.next_id = 0
        self.decoder = msgspec.msgpack.Decoder(Reply)
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                size, cid = _HEAD.unpack(await self.reader.readexactly(_HEAD.size))
                reply = self.decoder.decode(await self.reader.readexactly(size))
                future = self.pending.pop(cid, None)
                if future is not None and not future.done():
                    future.set_result(reply)
        except (OSError, asyncio.IncompleteReadError, msgspec.DecodeError) as exc:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ConnectionError(f"the relay connection closed: {exc}"))
        self.pending.clear()
        self.writer.close()

    async def call(self, payload: bytes) -> Reply:
        cid, self.next_id = self.next_id, self.next_id + 1
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.pending[cid] = future
        self.writer.write(_HEAD.pack(len(payload), cid) + payload)
        await self.writer.drain()
        return await future

    @property
    def closed(self) -> bool:
        return self.task.done()


class Peers:
    """The workers of one server, seen from one of them.

    Args:
        owners: every model's name, in the order given, and the worker that owns it.
        own: this worker's number.
        relay_dir: the private folder of the workers' Unix sockets (``N.sock``).
        keys: the server's API keys (a request without a valid one is refused here, not
            relayed).
        body_limit: the largest body relayed (a larger one is answered 413 by the owner
            from its declared length, or from the first ``body_limit + 1`` bytes).
    """

    def __init__(
        self,
        owners: dict[str, int],
        own: int,
        relay_dir: Path,
        keys: ApiKeys | None = None,
        body_limit: int = 2**25,
    ) -> None:
        self.owners, self.own, self.relay_dir = owners, own, relay_dir
        self.keys, self.body_limit = keys, body_limit
        self.names = tuple(owners)
        self._connections: dict[int, _Connection] = {}
        self._encoder = msgspec.msgpack.Encoder()
        self._server: asyncio.AbstractServer | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self.families: MetricFamilies | None = None  # where crossings count (the app's)
        self._reached: set[int] = set()  # the peers connected to once: started
        self._starting_until = time.monotonic() + PEER_START_S

    def socket_of(self, worker: int) -> Path:
        return self.relay_dir / f"{worker}.sock"

    def is_local(self, name: str) -> bool:
        """``name`` is this worker's (or no model's: answered here, as unknown)."""
        return self.owners.get(name, self.own) == self.own

    # ---------------------------------------------------------------- calling a peer
    async def _call(self, worker: int, call: Call) -> Reply:
        """Raises: ConnectionError: the worker does not answer (not started, or gone)."""
        conn = self._connections.get(worker)
        if conn is None or conn.closed:
            reader, writer = await self._connect(worker)
            opened = self._connections.get(worker)  # by another call meanwhile: one is enough
            if opened is not None and not opened.closed:
                writer.close()
                conn = opened
            else:
                conn = self._connections[worker] = _Connection(reader, writer)
        return await conn.call(self._encoder.encode(call))

    async def _connect(self, worker: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``worker``'s relay socket; one not reached yet is waited for while
        the server starts (:data:`PEER_START_S`).

        Raises: ConnectionError: the socket is not there or not answering, saying so.
        """
        path = self.socket_of(worker)
        while True:
            try:
                opened = await asyncio.open_unix_connection(path)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if worker not in self._reached and time.monotonic() < self._starting_until:
                    await asyncio.sleep(0.02)  # not opened yet: that worker is starting
                    continue
                what = (
                    "is not there" if isinstance(exc, FileNotFoundError) else "refuses connections"
                )
                raise ConnectionError(
                    f"its relay socket {path} {what}: worker {worker} is not serving "
                    "(not started yet, restarting, or exited: the server's log says why)"
                ) from exc
            except OSError as exc:
                raise ConnectionError(f"its relay socket {path}: {exc}") from exc
            self._reached.add(worker)
            return opened

    async def relay(self, name: str, call: HttpCall | GrpcCall) -> Reply:
        """``call`` answered by the worker that owns model ``name``.

        Raises:
            ModelNotReadyError: that worker is not running (starting, or started again).
        """
        try:
            return await self._call(self.owners[name], call)
        except ConnectionError as exc:
            raise ModelNotReadyError(
                f"model {name!r} is not answering: its worker process is not running "
                f"(starting or restarting): {exc}"
            ) from exc

    async def entries(self, local: Sequence[IndexEntry]) -> list[IndexEntry]:
        """Every model's index entry, in the order given: ``local`` (this worker's) and each
        other worker's, asked now (UNAVAILABLE, saying why, where one does not answer)."""
        by_name = {e.name: e for e in local}
        others = sorted({w for w in self.owners.values() if w != self.own})

        async def ask(worker: int) -> list[IndexEntry]:
            try:
                reply = await self._call(worker, StateCall())
            except ConnectionError as exc:
                gone = "its worker process is not answering (starting or restarting)"
                names = [n for n, w in self.owners.items() if w == worker]
                log.warning("worker %s (%s): %s", worker, ", ".join(names), exc)
                return [IndexEntry(n, "1", "UNAVAILABLE", gone) for n in names]
            assert isinstance(reply, StateReply)
            return reply.entries

        for got in await asyncio.gather(*(ask(w) for w in others)):
            by_name.update((e.name, e) for e in got)
        return [by_name[n] for n in self.names if n in by_name]

    # ---------------------------------------------------------------- answering peers
    async def open(self, http: HttpHandler, grpc: GrpcHandler | None, state: StateHandler) -> None:
        """Answer the other workers on this worker's socket (in the running loop)."""
        decoder = msgspec.msgpack.Decoder(Call)

        async def answer(call: Call) -> Reply:
            if isinstance(call, HttpCall):
                return await http(call)
            if isinstance(call, GrpcCall):
                if grpc is None:
                    return GrpcReply(code="UNIMPLEMENTED", message="gRPC is not served")
                return await grpc(call)
            return StateReply(state())

        async def one(cid: int, payload: bytes, writer: asyncio.StreamWriter) -> None:
            reply = await answer(decoder.decode(payload))
            frame = self._encoder.encode(reply)
            with contextlib.suppress(OSError):  # the caller went away: nobody to tell
                writer.write(_HEAD.pack(len(frame), cid) + frame)
                await writer.drain()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    size, cid = _HEAD.unpack(await reader.readexactly(_HEAD.size))
                    task = asyncio.get_running_loop().create_task(
                        one(cid, await reader.readexactly(size), writer)
                    )
                    self._in_flight.add(task)
                    task.add_done_callback(self._in_flight.discard)
            except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
                writer.close()  # the peer went, or this worker stops: nothing more to read

        path = self.socket_of(self.own)
        path.unlink(missing_ok=True)  # a restarted worker's socket, left by the one before
        self._server = await asyncio.start_unix_server(serve, path)

    async def close(self, timeout_s: float) -> None:
        """Finish the calls relayed here (within ``timeout_s``), then stop answering."""
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=timeout_s)
        if self._server is not None:
            self._server.close()
        for conn in self._connections.values():
            conn.fail(ConnectionError("this worker is shutting down"))

    # ---------------------------------------------------------------- the ASGI front
    def router(self, app: Any) -> Any:
        """``app`` behind a front that relays another worker's model paths to it."""
        return _Router(app, self)


class _Router:
    """ASGI: ``/v2/models/NAME…`` of a model another worker owns goes there (once the key is
    good: a refusal is ``app``'s own, counted here); everything else to ``app``."""

    def __init__(self, app: Any, peers: Peers) -> None:
        self.app, self.peers = app, peers

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(MODEL_PREFIX):
            name = scope["path"][len(MODEL_PREFIX) :].split("/", 1)[0]
            if not self.peers.is_local(name) and self._key_ok(scope):
                await self._relay(name, scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _key_ok(self, scope: dict[str, Any]) -> bool:
        keys = self.peers.keys
        if keys is None:
            return True
        auth = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        path = scope["path"]
        scope_name = "infer" if path.endswith(("/infer", "/predict")) else "metadata"
        return keys.check(auth.decode("latin-1") if auth else None, scope_name) is Verdict.OK

    async def _relay(self, name: str, scope: dict[str, Any], receive: Any, send: Any) -> None:
        limit = self.peers.body_limit
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
        chunks: list[bytes] = []
        # over the limit by its declared length: the owner refuses it from the header alone
        if not (declared.isdigit() and int(declared) > limit):
            size, more = 0, True
            while more and size <= limit:  # limit + 1 bytes at most: enough for a 413
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                chunks.append(chunk)
                size += len(chunk)
                more = message.get("more_body", False)
        call = HttpCall(
            scope["method"],
            scope["path"],
            scope["query_string"],
            scope["headers"],
            b"".join(chunks),
        )
        if self.peers.families is not None:
            self.peers.families.relayed.labels(name).inc()
        try:
            reply = await self.peers.relay(name, call)
            assert isinstance(reply, HttpReply)
        except ModelNotReadyError as exc:
            log.warning("%s %s -> 503: %s", scope["method"], scope["path"], exc)
            body = msgspec.json.encode({"error": str(exc)})
            reply = HttpReply(503, [(b"content-type", b"application/json")], body)
        await send(
            {"type": "http.response.start", "status": reply.status, "headers": reply.headers}
        )
        await send({"type": "http.response.body", "body": reply.body})


async def answer_http(app: Any, call: HttpCall) -> HttpReply:
    """``call`` answered by the ASGI ``app`` as if it had come to this worker."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": call.method,
        "scheme": "http",
        "path": call.path,
        "raw_path": call.path.encode(),
        "query_string": call.query_string,
        "root_path": "",
        "headers": call.headers,
        "client": None,
        "server": None,
        "state": {},
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # the response is being written: no disconnect
        sent = True
        return {"type": "http.request", "body": call.body, "more_body": False}

    status, headers, body = 500, [], []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    try:
        await app(scope, receive, send)
    except Exception:  # the app answered 500 first (Starlette re-raises after it)
        log.exception("%s %s failed (relayed)", call.method, call.path)
        if not body:
            return HttpReply(500, [(b"content-type", b"application/json")], b'{"error":"internal"}')
    return HttpReply(status, headers, b"".join(body))
