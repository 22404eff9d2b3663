"""The ASGI app: KServe v2 endpoints, an image endpoint for people, health that only says
ready once the model answers, limits that never crash the process, and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zoo.deploy.preprocess import preprocess, scores
from zoo.deploy.runtime import OnnxClassifier
from zoo.deploy.serve.batcher import DynamicBatcher
from zoo.deploy.serve.config import ServeConfig
from zoo.deploy.serve.metrics import ServerMetrics
from zoo.deploy.serve.protocol import (
    HEADER,
    OutputSpec,
    classification,
    encode_response,
    parse_request,
)
from zoo.errors import InputError, PayloadTooLargeError, ServerBusyError
from zoo.images import open_image

log = logging.getLogger("zoo.serve")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class ModelServer:
    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.metrics = ServerMetrics()
        self.ready = False
        self.load_error: str | None = None
        self.clf: OnnxClassifier | None = None
        self.batcher: DynamicBatcher | None = None

    # ---------------------------------------------------------------- lifecycle
    def _load(self) -> None:
        """Create the session and warm it up at batch 1 and max batch (in a thread)."""
        try:
            clf = OnnxClassifier(
                self.cfg.model_path, device=self.cfg.device, threads=self.cfg.threads
            )
            shape = clf.input.shape
            self.static_batch = shape[0] if isinstance(shape[0], int) else None
            if self.static_batch is not None and self.cfg.max_batch != self.static_batch:
                log.warning(
                    "model has a static batch of %s: --max-batch set to it", self.static_batch
                )
                self.cfg.max_batch = self.static_batch
            sample = [
                d if isinstance(d, int) else clf.pre.input_size[i - 1] for i, d in enumerate(shape)
            ][1:]
            self.sample_shape = tuple(sample)
            for b in sorted({1, self.cfg.max_batch}):
                clf.run(self._pad(np.zeros((b, *self.sample_shape), np.float32))[0])
            self.clf = clf
            self.ready = True
            log.warning(
                "zoo serve: model %r ready (%s) on %s, ORT intra-op threads %s, max batch %s, max delay %s ms, "
                "max queue %s, timeout %s ms",
                self.cfg.name,
                self.cfg.model_path,
                self.cfg.device,
                clf.session.get_session_options().intra_op_num_threads,
                self.cfg.max_batch,
                self.cfg.max_delay_ms,
                self.cfg.max_queue,
                self.cfg.timeout_ms,
            )
        except Exception as exc:  # keep serving health (not ready) and say why
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("model failed to load: %s", self.load_error)

    def _pad(self, x: np.ndarray) -> tuple[np.ndarray, int]:
        n = len(x)
        if self.static_batch is not None and n < self.static_batch:
            x = np.concatenate([x, np.zeros((self.static_batch - n, *x.shape[1:]), x.dtype)])
        return x, n

    def _run(self, x: np.ndarray) -> np.ndarray:
        assert self.clf is not None
        padded, n = self._pad(x)
        return self.clf.run(padded)[:n]

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
    async def _body(self, request: Request) -> bytes:
        limit = int(self.cfg.max_body_mb * 2**20)
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLargeError(
                f"request body of {int(declared):,} bytes is over the {limit:,}-byte limit"
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"request body is over the {limit:,}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)

    def _check_model(self, name: str) -> JSONResponse | None:
        if name != self.cfg.name:
            return _error(404, f"unknown model {name!r}; this server serves {self.cfg.name!r}")
        if not self.ready:
            return _error(
                503, "model is not ready yet" + (f": {self.load_error}" if self.load_error else "")
            )
        return None

    def _validate(self, inputs: list[tuple[str, np.ndarray]]) -> np.ndarray:
        assert self.clf is not None
        if len(inputs) != 1:
            raise InputError(
                f"this model takes exactly one input ({self.clf.input.name!r}), got {len(inputs)}"
            )
        name, x = inputs[0]
        if name != self.clf.input.name:
            raise InputError(
                f"unknown input {name!r}; the model's input is {self.clf.input.name!r}"
            )
        if x.dtype != np.float32:
            raise InputError(f"input {name!r} must be FP32, got {x.dtype}")
        if x.ndim != 1 + len(self.sample_shape) or x.shape[1:] != self.sample_shape:
            raise InputError(
                f"input {name!r} has shape {list(x.shape)}; expected [batch, "
                f"{', '.join(map(str, self.sample_shape))}]"
            )
        if not 1 <= len(x) <= self.cfg.max_batch:
            raise InputError(f"batch of {len(x)} is outside 1..{self.cfg.max_batch} (--max-batch)")
        if not np.isfinite(x).all():
            raise InputError(f"input {name!r} contains NaN or infinite values")
        return x

    async def _infer_array(self, x: np.ndarray) -> np.ndarray:
        assert self.batcher is not None
        return await self.batcher.submit(x, self.cfg.timeout_ms / 1000)

    async def _guard(self, endpoint: str, fn: Any) -> Response:
        """Map every failure to a status; nothing reaches the process."""
        try:
            resp = await fn()
            self.metrics.requests.labels(endpoint, "ok").inc()
            return resp
        except PayloadTooLargeError as exc:
            outcome, resp = "too_large", _error(413, str(exc))
        except InputError as exc:
            outcome, resp = "bad_request", _error(400, str(exc))
        except ServerBusyError as exc:
            outcome, resp = "queue_full", _error(429, f"{exc}; retry later", {"Retry-After": "1"})
        except TimeoutError:
            outcome, resp = (
                "timeout",
                _error(504, f"request waited more than {self.cfg.timeout_ms:g} ms"),
            )
        except Exception as exc:  # an unexpected bug: answer 500, keep serving
            log.exception("inference failed")
            outcome, resp = "error", _error(500, f"internal error: {type(exc).__name__}: {exc}")
        self.metrics.requests.labels(endpoint, outcome).inc()
        return resp

    # ---------------------------------------------------------------- endpoints
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
        out = self.clf.session.get_outputs()[0]
        return JSONResponse(
            {
                "name": self.cfg.name,
                "versions": ["1"],
                "platform": "onnxruntime_onnx",
                "inputs": [
                    {
                        "name": self.clf.input.name,
                        "datatype": "FP32",
                        "shape": [-1, *self.sample_shape],
                    }
                ],
                "outputs": [
                    {
                        "name": out.name,
                        "datatype": "FP32",
                        "shape": [-1, len(self.clf.classes) or -1],
                    }
                ],
                "parameters": {
                    "max_batch": self.cfg.max_batch,
                    "classes": self.clf.classes,
                    "preprocessing": self.clf.pre.to_dict(),
                },
            }
        )

    async def infer(self, request: Request) -> Response:
        async def go() -> Response:
            err = self._check_model(request.path_params["name"])
            if err:
                return err
            assert self.clf is not None
            req = parse_request(await self._body(request), request.headers.get(HEADER))
            x = self._validate(req.inputs)
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

        return await self._guard("infer", go)

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
            ctype = request.headers.get("content-type", "")
            if ctype.startswith("multipart/form-data"):
                await self._body_limit_only(request)
                form = await request.form()
                upload = form.get("file")
                if upload is None or isinstance(upload, str):
                    raise InputError("multipart upload needs a 'file' field")
                data = await upload.read()
            else:
                data = await self._body(request)
            if not data:
                raise InputError(
                    "empty body: send a JPEG/PNG image (raw body or multipart field 'file')"
                )
            image = await asyncio.to_thread(open_image, data, max_pixels=self.cfg.max_image_pixels)
            x = (await asyncio.to_thread(preprocess, image, self.clf.pre))[None]
            probs = scores(await self._infer_array(x), self.clf.multi_label)[0]
            top = np.argsort(-probs)[: max(1, k)]
            labels = self.clf.classes
            return JSONResponse(
                {
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
            )

        return await self._guard("predict", go)

    async def _body_limit_only(self, request: Request) -> None:
        limit = int(self.cfg.max_body_mb * 2**20)
        declared = request.headers.get("content-length")
        if not declared or not declared.isdigit():
            raise InputError("multipart uploads need a Content-Length header")
        if int(declared) > limit:
            raise PayloadTooLargeError(
                f"request body of {int(declared):,} bytes is over the {limit:,}-byte limit"
            )

    async def metrics_ep(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")


def create_app(cfg: ServeConfig) -> Starlette:
    s = ModelServer(cfg)
    routes = [
        Route("/v2/health/live", s.live),
        Route("/v2/health/ready", s.ready_ep),
        Route("/v2/models/{name}", s.model_meta),
        Route("/v2/models/{name}/ready", s.model_ready),
        Route("/v2/models/{name}/versions/1", s.model_meta),
        Route("/v2/models/{name}/infer", s.infer, methods=["POST"]),
        Route("/v2/models/{name}/versions/1/infer", s.infer, methods=["POST"]),
        Route("/v2/models/{name}/predict", s.predict, methods=["POST"]),
        Route("/metrics", s.metrics_ep),
    ]
    app = Starlette(routes=routes, lifespan=s.lifespan)
    app.state.server = s
    return app
