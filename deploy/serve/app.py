"""The ASGI app: KServe v2 endpoints, an image endpoint for people, health that only says
ready once the model answers, limits that never crash the process, /metrics and
/openapi.json. A bad request earns a 4xx and one log line; a 500 is always our bug."""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import threading
from collections.abc import AsyncIterator
from importlib.resources import files
from typing import Any

import msgspec
import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from zoo.artifact import zoo_version
from zoo.deploy.runtimes.loader import Classifier
from zoo.deploy.serve.batcher import DynamicBatcher
from zoo.deploy.serve.config import ServeConfig, load_served
from zoo.deploy.serve.inputs import check_tensor, read_body, read_upload
from zoo.deploy.serve.metrics import ServerMetrics
from zoo.deploy.serve.openapi import openapi_document
from zoo.deploy.serve.protocol import (
    HEADER,
    ModelMetadata,
    OutputSpec,
    TensorMetadata,
    classification,
    encode_response,
    parse_request,
)
from zoo.errors import (
    InputError,
    PayloadTooLargeError,
    ServerBusyError,
    UnsupportedMediaTypeError,
)
from zoo.images import open_image
from zoo.preprocess import scores

log = logging.getLogger("zoo.serve")


_OUTCOMES = {404: "unknown_model", 503: "not_ready"}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _routing_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no such path) and 405 (wrong method), as JSON like every other
    error, naming what exists instead, in one log line."""
    assert isinstance(exc, HTTPException) and exc.status_code in (404, 405)
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


class ModelServer:
    """One model behind the endpoints of :func:`create_app`: its classifier, the batcher
    that feeds it, and what the endpoints answer from (readiness, metrics).

    Args:
        cfg: the server settings (model file, name in the URL, batching and limits).
        clf: the model, already loaded (``zoo serve`` loads it before binding, to refuse
            a model it cannot run); None: loaded from ``cfg.model_path`` in the lifespan.

    Attributes:
        cfg: the settings.
        metrics: the Prometheus counters and histograms of ``/metrics``.
        ready: the model is loaded and has answered a warm-up batch.
        load_error: why the model failed to load or warm up (then never ready).
        clf: the classifier once ready (None before).
        batcher: the dynamic batcher, from the lifespan's start.
        sample_shape: one sample's shape as the graph takes it (without the batch).
    """

    def __init__(self, cfg: ServeConfig, clf: Classifier | None = None) -> None:
        self.cfg = cfg
        self.metrics = ServerMetrics()
        self.ready = False
        self.load_error: str | None = None
        self.clf: Classifier | None = None
        self.batcher: DynamicBatcher | None = None
        self.sample_shape: tuple[int, ...] = ()
        self._loaded = clf
        self._openapi: bytes | None = None
        self._page: str | None = None

    # ---------------------------------------------------------------- lifecycle
    def _load(self) -> None:
        """Load the model (unless it was handed over) and warm it up at batch 1 and max
        batch (in a thread)."""
        try:
            clf = self._loaded or load_served(self.cfg)
            shape = clf.input_shape
            if clf.embedded:  # pixels of any size: warmed up at the crop size
                crop = clf.pre.crop_size
                self.sample_shape = (crop, crop, clf.pre.channels)
            else:
                sample = [
                    d if isinstance(d, int) else clf.pre.input_size[i - 1]
                    for i, d in enumerate(shape)
                ][1:]
                self.sample_shape = tuple(sample)
            dtype = np.uint8 if clf.embedded else np.float32
            for b in sorted({1, self.cfg.max_batch}):
                clf.run(np.zeros((b, *self.sample_shape), dtype))
            self.clf = clf
            self.ready = True
            log.info(
                "zoo serve: model %r ready (%s) in %s on %s, %s threads, max batch %s%s, "
                "max delay %s ms, max queue %s, timeout %s ms",
                self.cfg.name,
                self.cfg.model_path,
                f"{clf.runtime} {clf.meta.get('precision', 'fp32')}",
                self.cfg.device,
                clf.threads,
                self.cfg.max_batch,
                f" (the graph's batch is fixed at {clf.static_batch}: padded and chunked)"
                if clf.static_batch
                else "",
                self.cfg.max_delay_ms,
                self.cfg.max_queue,
                self.cfg.timeout_ms,
            )
        except Exception as exc:  # keep serving health (not ready) and say why
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("model failed to load: %s", self.load_error)

    def _run(self, x: np.ndarray) -> np.ndarray:
        assert self.clf is not None
        return self.clf.run(x)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.batcher = DynamicBatcher(
            self._run,
            max_batch=self.cfg.max_batch,
            max_delay_ms=self.cfg.max_delay_ms,
            max_queue=self.cfg.max_queue,
            metrics=self.metrics,
        )
        self.batcher.start()
        threading.Thread(target=self._load, name="model-load", daemon=True).start()
        yield
        self.ready = False
        await self.batcher.stop()

    # ---------------------------------------------------------------- helpers
    @property
    def _limit(self) -> int:
        return int(self.cfg.max_body_mb * 2**20)

    def _check_model(self, name: str) -> JSONResponse | None:
        if name != self.cfg.name:
            return _error(404, f"unknown model {name!r}; this server serves {self.cfg.name!r}")
        if not self.ready:
            return _error(
                503, "model is not ready yet" + (f": {self.load_error}" if self.load_error else "")
            )
        return None

    async def _infer_array(self, x: np.ndarray) -> np.ndarray:
        assert self.batcher is not None
        return await self.batcher.submit(x, self.cfg.timeout_ms / 1000)

    async def _guard(self, request: Request, endpoint: str, fn: Any) -> Response:
        """Map every failure to a status; nothing reaches the process. A client error is
        logged in one line; a traceback is logged only for a fault of ours (500)."""
        headers = None
        try:
            resp = await fn()
            outcome = _OUTCOMES.get(resp.status_code, "ok")  # 404/503 come back as responses
            self.metrics.requests.labels(endpoint, outcome).inc()
            return resp
        except UnsupportedMediaTypeError as exc:
            status, outcome, message = 415, "bad_request", str(exc)
        except PayloadTooLargeError as exc:
            status, outcome, message = 413, "too_large", str(exc)
        except InputError as exc:
            status, outcome, message = 400, "bad_request", str(exc)
        except ServerBusyError as exc:
            status, outcome, message = 429, "queue_full", f"{exc}; retry later"
            headers = {"Retry-After": str(exc.retry_after_s)}
        except TimeoutError:
            status, outcome = 504, "timeout"
            message = f"request waited more than {self.cfg.timeout_ms:g} ms"
        except Exception as exc:  # an unexpected bug: answer 500, keep serving
            log.exception("%s %s failed", request.method, request.url.path)
            status, outcome = 500, "error"
            message = f"internal error: {type(exc).__name__}: {exc}"
        if status != 500:  # one line; %r keeps a client's newlines out of the log
            log.info("%s %s -> %s: %r", request.method, request.url.path, status, message[:500])
        self.metrics.requests.labels(endpoint, outcome).inc()
        return _error(status, message, headers)

    # ---------------------------------------------------------------- endpoints
    async def server_meta(self, request: Request) -> Response:
        """``GET /v2``: the v2 protocol's server metadata (no model needs to be loaded)."""
        return JSONResponse({"name": "zoo", "version": zoo_version(), "extensions": []})

    async def live(self, request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready_ep(self, request: Request) -> Response:
        return JSONResponse({"ready": self.ready}, status_code=200 if self.ready else 503)

    async def model_ready(self, request: Request) -> Response:
        err = self._check_model(request.path_params["name"])
        return err or JSONResponse({"name": self.cfg.name, "ready": True})

    async def model_meta(self, request: Request) -> Response:
        err = self._check_model(request.path_params["name"])
        if err:
            return err
        assert self.clf is not None
        meta = ModelMetadata(
            name=self.cfg.name,
            versions=["1"],
            platform="openvino" if self.clf.runtime == "openvino" else "onnxruntime_onnx",
            inputs=[
                TensorMetadata(self.clf.input_name, "UINT8", [-1, -1, -1, self.clf.pre.channels])
                if self.clf.embedded
                else TensorMetadata(self.clf.input_name, "FP32", [-1, *self.sample_shape])
            ],
            outputs=[
                TensorMetadata(self.clf.output_name, "FP32", [-1, len(self.clf.classes) or -1])
            ],
            parameters={
                "max_batch": self.cfg.max_batch,
                "static_batch": self.clf.static_batch,
                "multi_label": self.clf.multi_label,
                "classes": self.clf.classes,
                "preprocessing": self.clf.pre.to_dict(),
            },
        )
        return Response(msgspec.json.encode(meta), media_type="application/json")

    async def infer(self, request: Request) -> Response:
        async def go() -> Response:
            err = self._check_model(request.path_params["name"])
            if err:
                return err
            assert self.clf is not None
            req = parse_request(
                await read_body(request, self._limit),
                request.headers.get(HEADER),
                max_elements=self._limit,
            )
            x = check_tensor(
                req.inputs,
                self.clf,
                self.sample_shape,
                max_batch=self.cfg.max_batch,
                max_image_pixels=self.cfg.max_image_pixels,
            )
            y = await self._infer_array(x)
            specs = req.outputs or [OutputSpec(self.clf.output_name, binary=req.binary_default)]
            outs = []
            for spec in specs:
                if spec.name != self.clf.output_name:
                    raise InputError(
                        f"unknown output {spec.name!r}; the model's output is {self.clf.output_name!r}"
                    )
                outs.append(
                    (
                        spec,
                        classification(y, spec.classification, self.clf.classes)
                        if spec.classification
                        else y.astype(np.float32),
                    )
                )
            body, headers = encode_response(self.cfg.name, req.id, outs)
            return Response(body, headers=headers)

        return await self._guard(request, "infer", go)

    async def predict(self, request: Request) -> Response:
        async def go() -> Response:
            err = self._check_model(request.path_params["name"])
            if err:
                return err
            assert self.clf is not None
            try:
                k = int(request.query_params.get("top_k", "5"))
            except ValueError as exc:
                raise InputError("top_k must be an integer") from exc
            if k < 1:
                raise InputError(f"top_k={k}: ask for 1 or more classes (default 5)")
            ctype = request.headers.get("content-type", "").lower()
            if ctype.startswith("multipart/form-data"):
                data = await read_upload(request, self._limit)
            else:
                data = await read_body(request, self._limit)
            if not data:
                raise InputError(
                    "empty body: send a JPEG/PNG image (raw body or multipart field 'file')"
                )
            x = await asyncio.to_thread(self._image_tensor, data)
            probs = scores(await self._infer_array(x), self.clf.multi_label)[0]
            top = np.argsort(-probs)[:k]  # every class when k is larger
            labels = self.clf.classes
            body = {
                "model_name": self.cfg.name,
                "predictions": [
                    {
                        "label": labels[i] if i < len(labels) else str(i),
                        "index": int(i),
                        "score": float(probs[i]),
                    }
                    for i in top
                ],
            }
            return Response(msgspec.json.encode(body), media_type="application/json")

        return await self._guard(request, "predict", go)

    def _image_tensor(self, data: bytes) -> np.ndarray:
        """(1, C, H, W): the upload decoded and preprocessed (in one worker-thread hop); for a
        graph that preprocesses itself, its (1, H, W, C) pixels."""
        assert self.clf is not None
        image = open_image(data, max_pixels=self.cfg.max_image_pixels)
        return self.clf.prepare(image)[None]

    async def demo_page(self, request: Request) -> Response:
        """``GET /``: a page where a person drops an image and sees the top labels."""
        if self._page is None:
            template = (files("zoo.deploy.serve") / "demo.html").read_text(encoding="utf-8")
            self._page = template.replace("{{MODEL}}", html.escape(self.cfg.name, quote=True))
        return HTMLResponse(self._page)

    async def openapi_ep(self, request: Request) -> Response:
        if self._openapi is None:
            self._openapi = msgspec.json.encode(openapi_document(self.cfg.name))
        return Response(self._openapi, media_type="application/json")

    async def metrics_ep(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")


def create_app(cfg: ServeConfig, clf: Classifier | None = None) -> Starlette:
    """The ASGI app serving ``cfg.model_path`` (Open Inference Protocol v2 + ``/predict``).

    Args:
        cfg: the server settings; the ONNX session is created and warmed up in the app's
            lifespan (in a thread), so the app answers ``/v2/health/live`` at once and
            ``/v2/health/ready`` with 503 until the model is loaded.
        clf: the model of ``cfg.model_path``, already loaded (:func:`load_served`); it is
            then only warmed up in the lifespan.

    Returns:
        A Starlette app; ``app.state.server`` is its :class:`ModelServer`.

    Raises:
        Nothing: a model that fails to load is logged, ``/v2/health/ready`` stays 503 and
        the model endpoints answer 503 with the reason, and the server keeps answering.
    """
    s = ModelServer(cfg, clf)
    routes = [
        Route("/", s.demo_page),
        Route("/v2", s.server_meta),
        Route("/v2/health/live", s.live),
        Route("/v2/health/ready", s.ready_ep),
        Route("/v2/models/{name}", s.model_meta),
        Route("/v2/models/{name}/ready", s.model_ready),
        Route("/v2/models/{name}/versions/1", s.model_meta),
        Route("/v2/models/{name}/infer", s.infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/1/infer", s.infer, methods=["POST"]),
        Route("/v2/models/{name}/predict", s.predict, methods=["POST"]),
        Route("/metrics", s.metrics_ep),
        Route("/openapi.json", s.openapi_ep),
    ]
    app = Starlette(
        routes=routes,
        lifespan=s.lifespan,
        exception_handlers={404: _routing_error, 405: _routing_error, 500: _unguarded_error},
    )
    app.state.server = s
    return app
