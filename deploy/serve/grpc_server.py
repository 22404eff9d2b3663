"""The v2 gRPC service (KServe's ``GRPCInferenceService``, with Triton's ``ModelConfig`` and
``RepositoryIndex``) of ``zoo serve --grpc-port``: a
``grpc.aio`` server in uvicorn's event loop, on the same models (:class:`ServedModels`: each
its own batcher and queue limits) as HTTP. Keys come in the ``authorization`` metadata
(``Bearer <key>``); errors map to status codes as HTTP's to statuses: bad input
INVALID_ARGUMENT, unknown model NOT_FOUND (naming the models served), not ready UNAVAILABLE,
queue full or too large RESOURCE_EXHAUSTED, timeout DEADLINE_EXCEEDED, no or wrong key
UNAUTHENTICATED, a key without the scope PERMISSION_DENIED; INTERNAL only for a bug of ours."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import msgspec

from zoo.artifact import zoo_version
from zoo.deploy.serve.auth import ApiKeys, Verdict, refusal_message
from zoo.deploy.serve.config import ServeConfig
from zoo.deploy.serve.grpc_protocol import (
    SERVICE,
    infer_response,
    messages,
    parse_infer,
    repository_messages,
)
from zoo.deploy.serve.metrics import ServerMetrics
from zoo.deploy.serve.model import ModelServer
from zoo.deploy.serve.protocol import TritonConfig
from zoo.deploy.serve.relay import GrpcCall, GrpcReply
from zoo.deploy.serve.served import ServedModels
from zoo.deploy.triton_schema import model_config_pb2
from zoo.errors import (
    InputError,
    ModelNotReadyError,
    ModelNotServedError,
    PayloadTooLargeError,
    ServerBusyError,
)

log = logging.getLogger("zoo.serve")


@dataclass
class _Call:
    """One RPC's bookkeeping: whose metrics it counts in (the model's, once it names one)."""

    metrics: ServerMetrics


Handler = Callable[[bytes, _Call], Awaitable[Any]]


def _status(exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code and message of a failed RPC (the order matters: subclasses first)."""
    if isinstance(exc, ModelNotServedError):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    if isinstance(exc, ModelNotReadyError):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, PayloadTooLargeError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, InputError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, ServerBusyError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc}; retry in {exc.retry_after_s} s"
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "the request waited longer than --timeout-ms"
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


class _Elsewhere(Exception):
    """The RPC names a model another worker owns (:mod:`zoo.deploy.serve.workers`)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@dataclass(frozen=True)
class _Outcome:
    """An RPC's answer: the response (a message, or one already serialized by the worker
    that owns the model), or the status code it ends with and why."""

    response: Any = None
    code: grpc.StatusCode | None = None
    message: str = ""


def _serialize(response: Any) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


class GrpcService:
    """The service's methods over a server's models.

    Args:
        models: the served models (shared with the HTTP app).
        keys: the API keys (None: every method open).
        body_limit: the largest message, in bytes (also the largest tensor's element count).
    """

    def __init__(self, models: ServedModels, keys: ApiKeys | None, body_limit: int) -> None:
        self.models, self.keys, self.pb = models, keys, messages()
        self.body_limit = body_limit
        # method -> (the API-key scope, None: open to probes; the method)
        self.methods: dict[str, tuple[str | None, Handler]] = {
            "ServerLive": (None, self.server_live),
            "ServerReady": (None, self.server_ready),
            "ServerMetadata": ("metadata", self.server_metadata),
            "ModelReady": ("metadata", self.model_ready),
            "ModelMetadata": ("metadata", self.model_metadata),
            "ModelInfer": ("infer", self.model_infer),
            "RepositoryIndex": ("metadata", self.repository_index),  # Triton's extension
        }
        if importlib.util.find_spec("tritonclient") is not None:  # Triton's schema is there
            self.methods["ModelConfig"] = ("metadata", self.model_config)

    def handler(self) -> grpc.GenericRpcHandler:
        """The method table: requests arrive as bytes and are parsed in the method, so a
        message that does not decode is INVALID_ARGUMENT (gRPC's own deserializer would
        answer INTERNAL)."""

        def method(name: str) -> Any:
            async def call(data: bytes, context: grpc.aio.ServicerContext) -> Any:
                metadata = dict(context.invocation_metadata() or ())
                outcome = await self.answer(name, data, metadata.get("authorization"))
                if outcome.code is not None:
                    await context.abort(outcome.code, outcome.message)
                return outcome.response

            return grpc.unary_unary_rpc_method_handler(call, response_serializer=_serialize)

        return grpc.method_handlers_generic_handler(SERVICE, {n: method(n) for n in self.methods})

    async def answer(self, method: str, data: bytes, authorization: str | None) -> _Outcome:
        """One RPC, keyed, answered here or by the worker that owns its model; every failure
        becomes a status code, and the server goes on."""
        scope, fn = self.methods[method]
        rpc = _Call(self.models.unrouted)
        if self.keys is not None and scope is not None:
            verdict = self.keys.check(authorization, scope)
            if verdict is not Verdict.OK:
                self.models.families.auth_refusals.labels(scope, verdict.value).inc()
                forbidden = verdict is Verdict.FORBIDDEN
                code = (
                    grpc.StatusCode.PERMISSION_DENIED
                    if forbidden
                    else grpc.StatusCode.UNAUTHENTICATED
                )
                log.info("gRPC %s -> %s: %r", method, code.name, refusal_message(verdict, scope))
                return _Outcome(code=code, message=refusal_message(verdict, scope))
        try:
            try:
                answer = await fn(data, rpc)
            except _Elsewhere as elsewhere:  # counted by the worker that answers it
                assert self.models.peers is not None
                self.models.families.relayed.labels(elsewhere.name).inc()
                reply = await self.models.peers.relay(
                    elsewhere.name, GrpcCall(method, data, authorization)
                )
                assert isinstance(reply, GrpcReply)
                if reply.code:
                    return _Outcome(code=grpc.StatusCode[reply.code], message=reply.message)
                return _Outcome(reply.data)
            rpc.metrics.requests.labels(f"grpc_{method}", "ok").inc()
            return _Outcome(answer)
        except Exception as exc:  # every failure becomes a status; the server goes on
            code, message = _status(exc)
        if code is grpc.StatusCode.INTERNAL:
            log.exception("gRPC %s failed", method)
        elif code is not grpc.StatusCode.NOT_FOUND:  # one line, as HTTP's client errors
            log.info("gRPC %s -> %s: %r", method, code.name, message[:500])
        rpc.metrics.requests.labels(f"grpc_{method}", code.name.lower()).inc()
        return _Outcome(code=code, message=message)

    async def relayed(self, call: GrpcCall) -> GrpcReply:
        """An RPC another worker relayed here (for one of this worker's models)."""
        if call.method not in self.methods:
            return GrpcReply(code="UNIMPLEMENTED", message=f"no method {call.method!r}")
        outcome = await self.answer(call.method, call.data, call.authorization)
        if outcome.code is not None:
            return GrpcReply(code=outcome.code.name, message=outcome.message)
        return GrpcReply(_serialize(outcome.response))

    def _parse(self, message: Any, data: bytes) -> Any:
        from google.protobuf.message import DecodeError

        try:
            return message.FromString(data)
        except (DecodeError, UnicodeDecodeError) as exc:  # the latter: pure-Python protobuf
            raise InputError(f"the request is not a {message.__name__}: {exc}") from exc

    def _model(self, name: str, rpc: _Call) -> ModelServer:
        """The model ``name`` (the RPC counts in its metrics from now on).

        Raises:
            ModelNotServedError: no model of that name.
            _Elsewhere: another worker's model (relayed there by :meth:`answer`).
        """
        if self.models.peers is not None and not self.models.peers.is_local(name):
            raise _Elsewhere(name)
        model = self.models.get(name)
        rpc.metrics = model.metrics
        return model

    # ---------------------------------------------------------------- methods
    async def server_live(self, data: bytes, rpc: _Call) -> Any:
        return self.pb.ServerLiveResponse(live=True)

    async def server_ready(self, data: bytes, rpc: _Call) -> Any:
        return self.pb.ServerReadyResponse(ready=await self.models.all_ready())

    async def server_metadata(self, data: bytes, rpc: _Call) -> Any:
        return self.pb.ServerMetadataResponse(name="zoo", version=zoo_version(), extensions=[])

    async def model_ready(self, data: bytes, rpc: _Call) -> Any:
        req = self._parse(self.pb.ModelReadyRequest, data)
        model = self._model(req.name, rpc)
        try:
            model.check_model(model.name)
        except ModelNotReadyError:  # known, not ready yet: an answer, not an error
            return self.pb.ModelReadyResponse(ready=False)
        return self.pb.ModelReadyResponse(ready=True)

    async def model_metadata(self, data: bytes, rpc: _Call) -> Any:
        req = self._parse(self.pb.ModelMetadataRequest, data)
        meta = self._model(req.name, rpc).metadata(req.name)
        tensor = self.pb.ModelMetadataResponse.TensorMetadata
        return self.pb.ModelMetadataResponse(
            name=meta.name,
            versions=meta.versions,
            platform=meta.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.outputs],
        )

    async def model_config(self, data: bytes, rpc: _Call) -> bytes:
        """Triton's ``ModelConfig`` (Triton's clients ask for it before they infer). Its
        request has ModelMetadataRequest's fields (name = 1, version = 2)."""
        req = self._parse(self.pb.ModelMetadataRequest, data)
        return config_response(self._model(req.name, rpc).triton_config(req.name))

    async def repository_index(self, data: bytes, rpc: _Call) -> Any:
        """Triton's ``RepositoryIndex``: every model (``ready``: the ready ones), as
        ``/v2/repository/index`` lists them (the other workers' asked, never relayed)."""
        pb = repository_messages()
        req = self._parse(pb.RepositoryIndexRequest, data)
        if req.repository_name:  # as Triton's own server refuses it
            raise InputError(
                f"repository_name {req.repository_name!r}: zoo serve has one repository; "
                "leave it empty"
            )
        entry = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(
            models=[
                entry(name=e.name, version=e.version, state=e.state, reason=e.reason)
                for e in await self.models.listed(req.ready)
            ]
        )

    async def model_infer(self, data: bytes, rpc: _Call) -> Any:
        name, req = parse_infer(data, max_elements=self.body_limit)
        model = self._model(name, rpc)
        outputs = await model.infer(name, req)
        return infer_response(model.name, req.id, outputs)


def config_response(config: TritonConfig) -> bytes:
    """Triton's ``ModelConfigResponse`` holding ``config``, serialized. The response is one
    field (``ModelConfig config = 1``) and its class lives in tritonclient's service module,
    which clashes with KServe's messages (:mod:`zoo.deploy.triton_schema`): that one
    length-delimited field is written here, around the ``ModelConfig`` Triton's schema
    encodes."""
    from google.protobuf import json_format

    pb = model_config_pb2("gRPC ModelConfig")
    payload = json_format.ParseDict(msgspec.to_builtins(config), pb.ModelConfig())
    body = payload.SerializeToString()
    size, length = len(body), bytearray()
    while True:  # the length as a base-128 varint
        byte, size = size & 0x7F, size >> 7
        length.append(byte | (0x80 if size else 0))
        if not size:
            break
    return b"\x0a" + bytes(length) + body  # field 1, wire type 2 (length-delimited)


@dataclass(frozen=True)
class GrpcServer:
    """The running gRPC server and its service."""

    server: grpc.aio.Server
    service: GrpcService


async def start_grpc(models: ServedModels, keys: ApiKeys | None, cfg: ServeConfig) -> GrpcServer:
    """The v2 gRPC service on ``cfg.grpc_port`` (TLS with the HTTP certificate), started in
    the running event loop. In a worker of a server with a process per model, every worker
    listens on the port (``SO_REUSEPORT``, the port checked free before the workers start).

    Raises:
        InputError: the v2 messages are not installed (:func:`messages`).
        RuntimeError: the port cannot be bound (gRPC's own error).
    """
    assert cfg.grpc_port is not None
    service = GrpcService(models, keys, cfg.body_limit)
    shared = models.peers is not None  # else a port in use is an error, not a shared listener
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", cfg.body_limit),
            ("grpc.so_reuseport", int(shared)),
        ]
    )
    server.add_generic_rpc_handlers((service.handler(),))
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    address = f"{host}:{cfg.grpc_port}"
    if cfg.ssl_certfile:
        with open(cfg.ssl_certfile, "rb") as f:
            chain = f.read()
        key = chain
        if cfg.ssl_keyfile:
            with open(cfg.ssl_keyfile, "rb") as f:
                key = f.read()
        port = server.add_secure_port(address, grpc.ssl_server_credentials([(key, chain)]))
    else:
        port = server.add_insecure_port(address)
    await server.start()
    log.info("zoo serve: gRPC on %s:%s%s", host, port, " (TLS)" if cfg.ssl_certfile else "")
    return GrpcServer(server, service)
