"""The v2 gRPC service (KServe's ``GRPCInferenceService``) of ``zoo serve --grpc-port``: a
``grpc.aio`` server in uvicorn's event loop, on the same :class:`ModelServer` (model, batcher,
queue limits) as HTTP. Keys come in the ``authorization`` metadata (``Bearer <key>``); errors
map to status codes as HTTP's to statuses: bad input INVALID_ARGUMENT, unknown model
NOT_FOUND, not ready UNAVAILABLE, queue full or too large RESOURCE_EXHAUSTED, timeout
DEADLINE_EXCEEDED, no or wrong key UNAUTHENTICATED, a key without the scope
PERMISSION_DENIED; INTERNAL only for a bug of ours."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from zoo.artifact import zoo_version
from zoo.deploy.serve.auth import ApiKeys, Verdict, refusal_message
from zoo.deploy.serve.grpc_protocol import SERVICE, infer_response, messages, parse_infer
from zoo.deploy.serve.model import ModelServer
from zoo.errors import (
    InputError,
    ModelNotReadyError,
    ModelNotServedError,
    PayloadTooLargeError,
    ServerBusyError,
)

log = logging.getLogger("zoo.serve")

Handler = Callable[[bytes], Awaitable[Any]]


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


class GrpcService:
    """The service's methods over one :class:`ModelServer`.

    Args:
        model: the served model (shared with the HTTP app).
        keys: the API keys (None: every method open).
    """

    def __init__(self, model: ModelServer, keys: ApiKeys | None) -> None:
        self.model, self.keys, self.pb = model, keys, messages()

    def handler(self) -> grpc.GenericRpcHandler:
        """The method table: requests arrive as bytes and are parsed in the method, so a
        message that does not decode is INVALID_ARGUMENT (gRPC's own deserializer would
        answer INTERNAL)."""
        pb = self.pb
        methods: dict[str, tuple[str | None, Handler, Any]] = {
            "ServerLive": (None, self.server_live, pb.ServerLiveResponse),
            "ServerReady": (None, self.server_ready, pb.ServerReadyResponse),
            "ServerMetadata": ("metadata", self.server_metadata, pb.ServerMetadataResponse),
            "ModelReady": ("metadata", self.model_ready, pb.ModelReadyResponse),
            "ModelMetadata": ("metadata", self.model_metadata, pb.ModelMetadataResponse),
            "ModelInfer": ("infer", self.model_infer, pb.ModelInferResponse),
        }
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                name: grpc.unary_unary_rpc_method_handler(
                    self._guarded(name, scope, fn),
                    response_serializer=response.SerializeToString,
                )
                for name, (scope, fn, response) in methods.items()
            },
        )

    def _guarded(self, method: str, scope: str | None, fn: Handler) -> Any:
        async def call(data: bytes, context: grpc.aio.ServicerContext) -> Any:
            if self.keys is not None and scope is not None:
                metadata = dict(context.invocation_metadata() or ())
                verdict = self.keys.check(metadata.get("authorization"), scope)
                if verdict is not Verdict.OK:
                    self.model.metrics.auth_refusals.labels(scope, verdict.value).inc()
                    forbidden = verdict is Verdict.FORBIDDEN
                    code = (
                        grpc.StatusCode.PERMISSION_DENIED
                        if forbidden
                        else grpc.StatusCode.UNAUTHENTICATED
                    )
                    log.info(
                        "gRPC %s -> %s: %r", method, code.name, refusal_message(verdict, scope)
                    )
                    await context.abort(code, refusal_message(verdict, scope))
            try:
                answer = await fn(data)
                self.model.metrics.requests.labels(f"grpc_{method}", "ok").inc()
                return answer
            except Exception as exc:  # every failure becomes a status; the server goes on
                code, message = _status(exc)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("gRPC %s failed", method)
            elif code is not grpc.StatusCode.NOT_FOUND:  # one line, as HTTP's client errors
                log.info("gRPC %s -> %s: %r", method, code.name, message[:500])
            self.model.metrics.requests.labels(f"grpc_{method}", code.name.lower()).inc()
            await context.abort(code, message)

        return call

    def _parse(self, message: Any, data: bytes) -> Any:
        from google.protobuf.message import DecodeError

        try:
            return message.FromString(data)
        except DecodeError as exc:
            raise InputError(f"the request is not a {message.__name__}: {exc}") from exc

    # ---------------------------------------------------------------- methods
    async def server_live(self, data: bytes) -> Any:
        return self.pb.ServerLiveResponse(live=True)

    async def server_ready(self, data: bytes) -> Any:
        return self.pb.ServerReadyResponse(ready=self.model.ready)

    async def server_metadata(self, data: bytes) -> Any:
        return self.pb.ServerMetadataResponse(name="zoo", version=zoo_version(), extensions=[])

    async def model_ready(self, data: bytes) -> Any:
        req = self._parse(self.pb.ModelReadyRequest, data)
        try:
            self.model.check_model(req.name)
        except ModelNotReadyError:  # known, not ready yet: an answer, not an error
            return self.pb.ModelReadyResponse(ready=False)
        return self.pb.ModelReadyResponse(ready=True)

    async def model_metadata(self, data: bytes) -> Any:
        req = self._parse(self.pb.ModelMetadataRequest, data)
        meta = self.model.metadata(req.name)
        tensor = self.pb.ModelMetadataResponse.TensorMetadata
        return self.pb.ModelMetadataResponse(
            name=meta.name,
            versions=meta.versions,
            platform=meta.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.outputs],
        )

    async def model_infer(self, data: bytes) -> Any:
        name, req = parse_infer(data, max_elements=self.model.cfg.body_limit)
        outputs = await self.model.infer(name, req)
        return infer_response(self.model.name, req.id, outputs)


async def start_grpc(model: ModelServer, keys: ApiKeys | None) -> grpc.aio.Server:
    """The v2 gRPC service on ``model.cfg.grpc_port`` (TLS with the HTTP certificate),
    started in the running event loop.

    Raises:
        InputError: the v2 messages are not installed (:func:`messages`).
        RuntimeError: the port cannot be bound (gRPC's own error).
    """
    cfg = model.cfg
    assert cfg.grpc_port is not None
    service = GrpcService(model, keys)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", cfg.body_limit),
            ("grpc.so_reuseport", 0),  # a port in use is an error, not a shared listener
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
    return server
