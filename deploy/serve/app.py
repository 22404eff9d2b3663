"""The ASGI app: KServe v2 endpoints for one model or several (each with its own batcher and
queue, listed by the repository index), an image endpoint for people, health that only says
ready once every model answers, API keys per route group, limits that never crash the
process, /metrics and /openapi.json. A bad request earns a 4xx and one log line; a 500 is
always our bug. With ``grpc_port`` set, the v2 gRPC service runs in the same event loop, on
the same models and batchers (:mod:`zoo.deploy.serve.grpc_server`)."""

from __future__ import annotations

import contextlib
import html
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from importlib.resources import files
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from zoo.artifact import zoo_version
from zoo.deploy.runtimes.loader import Classifier
from zoo.deploy.serve.auth import ApiKeys, Verdict, refusal_message
from zoo.deploy.serve.config import ServeConfig
from zoo.deploy.serve.inputs import read_body, read_upload
from zoo.deploy.serve.model import ModelServer
from zoo.deploy.serve.openapi import openapi_document
from zoo.deploy.serve.protocol import HEADER, encode_response, parse_request
from zoo.deploy.serve.relay import Peers, answer_http
from zoo.deploy.serve.served import ServedModels
from zoo.errors import (
    InputError,
    ModelNotReadyError,
    ModelNotServedError,
    PayloadTooLargeError,
    ServerBusyError,
    UnsupportedMediaTypeError,
)

log = logging.getLogger("zoo.serve")

Endpoint = Callable[[Request], Awaitable[Response]]


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _routing_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no such path) and 405 (wrong method), as JSON like every other
    error, naming what exists instead, in one log line. With API keys, a client without a
    valid key gets the 401 of any keyed route instead: which paths exist is not told to it."""
    assert isinstance(exc, HTTPException) and exc.status_code in (404, 405)
    api: HttpApi | None = getattr(request.app.state, "api", None)
    if api is not None and api.keys is not None:  # no probing for paths without a key
        verdict = api.keys.check(request.headers.get("authorization"), "metadata")
        if verdict in (Verdict.MISSING, Verdict.INVALID):
            message = refusal_message(verdict, "metadata")
            log.info("%s %s -> 401: %r", request.method, request.url.path, message)
            api.models.families.auth_refusals.labels("metadata", verdict.value).inc()
            return _error(401, message, {"WWW-Authenticate": _challenge(verdict, "metadata")})
    if exc.status_code == 405:
        allowed = exc.headers.get("Allow", "") if exc.headers else ""
        message = f"{request.method} is not allowed on {request.url.path}; use {allowed}"
    else:
        message = f"no such path {request.url.path!r}; the endpoints are listed at /openapi.json"
    log.info("%s %s -> %s: %r", request.method, request.url.path, exc.status_code, message)
    return _error(exc.status_code, message, dict(exc.headers) if exc.headers else None)


async def _unguarded_error(request: Request, exc: Exception) -> Response:
    """A bug outside the guarded endpoints: still a JSON body (Starlette logs the traceback)."""
    return _error(500, f"internal error: {type(exc).__name__}: {exc}")


def _challenge(verdict: Verdict, scope: str) -> str:
    """The ``WWW-Authenticate`` value of a refusal (RFC 6750)."""
    if verdict is Verdict.MISSING:
        return 'Bearer realm="zoo"'
    if verdict is Verdict.INVALID:
        return 'Bearer realm="zoo", error="invalid_token"'
    return f'Bearer realm="zoo", error="insufficient_scope", scope="{scope}"'


class HttpApi:
    """The HTTP endpoints of a server's models, each keyed by its scope.

    Args:
        models: the served models (one :class:`ModelServer`: that model alone).
        keys: the API keys (None: every endpoint open).
    """

    def __init__(self, models: ServedModels | ModelServer, keys: ApiKeys | None) -> None:
        self.models = models if isinstance(models, ServedModels) else ServedModels([models])
        self.keys = keys
        self.keyed_paths: dict[str, str] = {}  # path -> scope, for the OpenAPI document
        self._openapi: bytes | None = None
        self._page: str | None = None

    def keyed(self, path: str, scope: str | None, endpoint: Endpoint) -> Endpoint:
        """``endpoint``, answered only for a key granting ``scope`` (None: always open)."""
        keys = self.keys
        if keys is None or scope is None:
            return endpoint
        self.keyed_paths[path] = scope
        refusals = self.models.families.auth_refusals

        async def guarded(request: Request) -> Response:
            verdict = keys.check(request.headers.get("authorization"), scope)
            if verdict is Verdict.OK:
                return await endpoint(request)
            status = 403 if verdict is Verdict.FORBIDDEN else 401
            message = refusal_message(verdict, scope)
            log.info("%s %s -> %s: %r", request.method, request.url.path, status, message)
            refusals.labels(scope, verdict.value).inc()
            return _error(status, message, {"WWW-Authenticate": _challenge(verdict, scope)})

        return guarded

    async def _guard(self, request: Request, endpoint: str, fn: Any) -> Response:
        """Map every failure to a status; nothing reaches the process. A client error is
        logged in one line; a traceback is logged only for a fault of ours (500)."""
        headers = None
        name = request.path_params.get("name")
        counts = self.models.metrics_of(name).requests
        try:
            resp = await fn()
            counts.labels(endpoint, "ok").inc()
            return resp
        except ModelNotServedError as exc:
            status, outcome, message = 404, "unknown_model", str(exc)
        except ModelNotReadyError as exc:
            status, outcome, message = 503, "not_ready", str(exc)
        except UnsupportedMediaTypeError as exc:
            status, outcome, message = 415, "bad_request", str(exc)
        except PayloadTooLargeError as exc:
            status, outcome, message = 413, "too_large", str(exc)
        except InputError as exc:
            status, outcome, message = 400, "bad_request", str(exc)
        except ServerBusyError as exc:
            status, outcome, message = 429, "queue_full", f"{exc}; retry later"
            headers = {"Retry-After": str(exc.retry_after_s)}
        except ClientDisconnect:  # the client hung up mid-body: no one to answer, not a fault
            status, outcome = 499, "client_closed"  # nginx's code for it, seen only in logs
            message = "the client closed the connection before its request body arrived"
        except TimeoutError:
            status, outcome = 504, "timeout"
            timeout_ms = self.models.get(name).cfg.timeout_ms if name else 0.0
            message = f"request waited more than {timeout_ms:g} ms"
        except Exception as exc:  # an unexpected bug: answer 500, keep serving
            log.exception("%s %s failed", request.method, request.url.path)
            status, outcome = 500, "error"
            message = f"internal error: {type(exc).__name__}: {exc}"
        if status not in (404, 500, 503):  # one line; %r keeps a client's newlines out
            log.info("%s %s -> %s: %r", request.method, request.url.path, status, message[:500])
        counts.labels(endpoint, outcome).inc()
        return _error(status, message, headers)

    # ---------------------------------------------------------------- endpoints
    async def server_meta(self, request: Request) -> Response:
        """``GET /v2``: the v2 protocol's server metadata (no model needs to be loaded)."""
        return JSONResponse({"name": "zoo", "version": zoo_version(), "extensions": []})

    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready_ep(self, request: Request) -> Response:
        ready = await self.models.all_ready()
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    async def repository_index(self, request: Request) -> Response:
        """``GET|POST /v2/repository/index``: every model, its version and state (Triton's
        model repository extension; POST may send ``{"ready": true}``)."""

        async def go() -> Response:
            body = await read_body(request, 4096) if request.method == "POST" else b""
            entries = await self.models.index(body)
            return Response(msgspec.json.encode(entries), media_type="application/json")

        return await self._guard(request, "repository_index", go)

    async def model_ready(self, request: Request) -> Response:
        async def go() -> Response:
            model = self.models.get(request.path_params["name"])
            model.check_model(model.name)
            return JSONResponse({"name": model.name, "ready": True})

        return await self._guard(request, "model_ready", go)

    async def model_meta(self, request: Request) -> Response:
        async def go() -> Response:
            model = self.models.get(request.path_params["name"])
            meta = model.metadata(model.name)
            return Response(msgspec.json.encode(meta), media_type="application/json")

        return await self._guard(request, "metadata", go)

    async def model_config(self, request: Request) -> Response:
        """``GET /v2/models/NAME/config``: the model's configuration as Triton answers it."""

        async def go() -> Response:
            model = self.models.get(request.path_params["name"])
            config = model.triton_config(model.name)
            return Response(msgspec.json.encode(config), media_type="application/json")

        return await self._guard(request, "config", go)

    async def infer(self, request: Request) -> Response:
        async def go() -> Response:
            model = self.models.get(request.path_params["name"])
            limit = model.cfg.body_limit
            model.check_model(model.name)  # before reading the body
            req = parse_request(
                await read_body(request, limit), request.headers.get(HEADER), max_elements=limit
            )
            outs = await model.infer(model.name, req)
            body, headers = encode_response(model.name, req.id, outs)
            return Response(body, headers=headers)

        return await self._guard(request, "infer", go)

    async def predict(self, request: Request) -> Response:
        async def go() -> Response:
            model = self.models.get(request.path_params["name"])
            limit = model.cfg.body_limit
            model.check_model(model.name)
            try:
                k = int(request.query_params.get("top_k", "5"))
            except ValueError as exc:
                raise InputError("top_k must be an integer") from exc
            ctype = request.headers.get("content-type", "").lower()
            if ctype.startswith("multipart/form-data"):
                data = await read_upload(request, limit)
            else:
                data = await read_body(request, limit)
            answer = await model.predict_image(model.name, data, k)
            body: dict[str, Any] = {"model_name": model.name, "predictions": answer.top}
            if answer.labels is not None:  # multi-label: every class over its threshold
                body["labels"] = answer.labels
            if answer.verdict is not None:  # the answer: the best class, or unknown, and why
                body.update(label=answer.label, **answer.verdict.to_dict())
            return Response(msgspec.json.encode(body), media_type="application/json")

        return await self._guard(request, "predict", go)

    async def demo_page(self, request: Request) -> Response:
        """``GET /``: a page where a person drops an image and sees the first model's top
        labels."""
        if self._page is None:
            template = (files("zoo.deploy.serve") / "demo.html").read_text(encoding="utf-8")
            name = html.escape(self.models.names[0], quote=True)
            self._page = template.replace("{{MODEL}}", name)
        return HTMLResponse(self._page)

    async def openapi_ep(self, request: Request) -> Response:
        if self._openapi is None:
            doc = openapi_document(list(self.models.names), self.keyed_paths)
            self._openapi = msgspec.json.encode(doc)
        return Response(self._openapi, media_type="application/json")

    async def metrics_ep(self, request: Request) -> Response:
        return Response(self.models.families.render(), media_type="text/plain; version=0.0.4")


def create_app(
    cfg: ServeConfig,
    clf: Classifier | None = None,
    keys: ApiKeys | None = None,
    *,
    loaded: Mapping[str, Classifier] | None = None,
    peers: Peers | None = None,
) -> Starlette:
    """The ASGI app serving ``cfg``'s models (Open Inference Protocol v2 + ``/predict``),
    and the v2 gRPC service on ``cfg.grpc_port`` if set.

    Args:
        cfg: the server settings; its models (:meth:`ServeConfig.served`) are loaded and
            warmed up in the app's lifespan (in threads), so the app answers
            ``/v2/health/live`` at once and ``/v2/health/ready`` with 503 until every model
            is loaded.
        clf: the first model, already loaded (:func:`load_served`); it is then only warmed
            up in the lifespan.
        keys: the API keys (:func:`zoo.deploy.serve.auth.load_keys`, read at start-up);
            None: no authentication. Health stays open either way.
        loaded: models already loaded, by name (``zoo serve`` loads every one before binding).
        peers: the other workers of a server with a process per model
            (:mod:`zoo.deploy.serve.workers`): only this worker's models are served here, the
            others' answers are relayed (run the app behind :meth:`Peers.router`).

    Returns:
        A Starlette app; ``app.state.models`` is its :class:`ServedModels`,
        ``app.state.server`` the first model's :class:`ModelServer`.

    Raises:
        Nothing: a model that fails to load is logged, ``/v2/health/ready`` stays 503 and
        that model's endpoints answer 503 with the reason, and the server keeps answering.
    """
    given = dict(loaded or {})
    if clf is not None:
        given[cfg.served()[0].name] = clf
    models = ServedModels.build(cfg, given, peers)
    api = HttpApi(models, keys)
    # path, endpoint, methods, the API-key scope (None: open to probes)
    table: list[tuple[str, Endpoint, list[str] | None, str | None]] = [
        ("/", api.demo_page, None, "metadata"),
        ("/v2", api.server_meta, None, "metadata"),
        ("/v2/health/live", api.live, None, None),
        ("/v2/health/ready", api.ready_ep, None, None),
        ("/v2/repository/index", api.repository_index, ["GET", "POST"], "metadata"),
        ("/v2/models/{name}", api.model_meta, None, "metadata"),
        ("/v2/models/{name}/ready", api.model_ready, None, "metadata"),
        ("/v2/models/{name}/versions/1", api.model_meta, None, "metadata"),
        ("/v2/models/{name}/config", api.model_config, None, "metadata"),
        ("/v2/models/{name}/versions/1/config", api.model_config, None, "metadata"),
        ("/v2/models/{name}/infer", api.infer, ["POST"], "infer"),
        ("/v2/models/{name}/versions/1/infer", api.infer, ["POST"], "infer"),
        ("/v2/models/{name}/predict", api.predict, ["POST"], "infer"),
        ("/metrics", api.metrics_ep, None, "metrics"),
        ("/openapi.json", api.openapi_ep, None, "metadata"),
    ]
    routes = [Route(p, api.keyed(p, scope, ep), methods=m) for p, ep, m, scope in table]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        models.start()
        grpc = None
        if cfg.grpc_port is not None:
            from zoo.deploy.serve.grpc_server import start_grpc

            grpc = await start_grpc(models, keys, cfg)
        if peers is not None:
            await peers.open(
                lambda call: answer_http(app, call),
                grpc.service.relayed if grpc is not None else None,
                models.local_entries,
            )
        try:
            yield
        finally:
            if peers is not None:  # what other workers relayed here finishes first
                await peers.close(cfg.graceful_timeout_s)
            if grpc is not None:  # in-flight RPCs finish on the running batchers
                await grpc.server.stop(cfg.graceful_timeout_s)
            await models.stop()

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: _routing_error, 405: _routing_error, 500: _unguarded_error},
    )
    app.state.models = models
    app.state.server = models.first
    app.state.api = api
    return app
