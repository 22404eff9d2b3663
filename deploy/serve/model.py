"""One served model, whatever the transport: its classifier, the batcher that feeds it,
readiness, metrics, and the inference and metadata answers the HTTP app
(:mod:`zoo.deploy.serve.app`) and the gRPC service (:mod:`zoo.deploy.serve.grpc_server`)
both give. Failures are the errors of :mod:`zoo.errors`; each transport maps them to its own
status codes."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from zoo.calibration import UNKNOWN_LABEL, Verdict
from zoo.deploy.runtimes.classifier import Assessed, Prediction
from zoo.deploy.runtimes.loader import Classifier
from zoo.deploy.serve.batcher import DynamicBatcher
from zoo.deploy.serve.config import ModelConfig, ServeConfig, load_served
from zoo.deploy.serve.inputs import TensorSpec, check_tensor
from zoo.deploy.serve.metrics import ServerMetrics
from zoo.deploy.serve.protocol import (
    ACCEPTED_OUTPUT,
    LABELS_OUTPUT,
    SCORE_OUTPUT,
    InferRequest,
    ModelMetadata,
    OutputSpec,
    TensorMetadata,
    TritonConfig,
    classification,
    triton_config,
)
from zoo.errors import (
    InputError,
    ModelNotReadyError,
    ModelNotServedError,
    ServerBusyError,
    first_line,
)
from zoo.images import open_image

log = logging.getLogger("zoo.serve")


def precision_of(meta: Mapping[str, Any]) -> str:
    """A served file's precision for the ready line: ``int8 (static)`` (with the
    quantization mode, :func:`zoo.variants.quant_mode`) or ``fp32``, ``fp16``…"""
    from zoo.variants import precision_of as file_precision
    from zoo.variants import quant_mode

    mode = quant_mode(meta)
    return f"{file_precision(meta)} ({mode})" if mode else file_precision(meta)


@dataclass(frozen=True)
class ImageAnswer:
    """What ``/predict`` answers for one image (:meth:`ModelServer.predict_image`).

    Attributes:
        top: the ``k`` best classes, best first (softmax scores, or each class's sigmoid for
            a multi-label model).
        verdict: the model's rejection rule's verdict (None: the model has no rule).
        labels: a multi-label model's decided classes, in class order: each class whose score
            reaches its threshold, whatever ``k`` (None: a single-label model).
    """

    top: list[Prediction]
    verdict: Verdict | None = None
    labels: list[str] | None = None

    @property
    def label(self) -> str:
        """The answer of a model with a rejection rule: the best class, or
        :data:`zoo.calibration.UNKNOWN_LABEL` when the rule rejects the image."""
        if self.verdict is not None and not self.verdict.accepted:
            return UNKNOWN_LABEL
        return self.top[0].label


class ModelServer:
    """One model behind the endpoints: its classifier, the batcher that feeds it, and what
    the endpoints answer from (readiness, metrics).

    Args:
        cfg: the model's settings (file, name in the URL, batching and limits, threads); a
            :class:`ServeConfig`: its one model (:meth:`ServeConfig.served`).
        clf: the model, already loaded (``zoo serve`` loads it before binding, to refuse
            a model it cannot run); None: loaded from ``cfg.model_path`` in :meth:`start`.
        metrics: where it counts (a view of the server's families); None: its own.

    Attributes:
        cfg: the model's settings.
        name: the model's name in the URL.
        metrics: the Prometheus counters and histograms of ``/metrics``.
        ready: the model is loaded and has answered a warm-up batch.
        load_error: why the model failed to load or warm up (then never ready).
        clf: the classifier once ready (None before).
        batcher: the dynamic batcher, from :meth:`start`.
        tensor: one sample's shape as requests may send it and as the graph was exported
            (and is warmed up) at; height and width free for a ``zoo export --dynamic-size``
            graph.
    """

    def __init__(
        self,
        cfg: ModelConfig | ServeConfig,
        clf: Classifier | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.cfg = cfg.served()[0] if isinstance(cfg, ServeConfig) else cfg
        self.name = self.cfg.name
        self.metrics = metrics or ServerMetrics()
        self.ready = False
        self.load_error: str | None = None
        self.clf: Classifier | None = None
        self.batcher: DynamicBatcher | None = None
        self.tensor = TensorSpec((), ())
        self._loaded = clf
        # its own decoding threads (as many as asyncio's default pool): another model's
        # flood of uploads never queues ahead of this model's
        self.decoder = ThreadPoolExecutor(
            min(32, (os.cpu_count() or 1) + 4), thread_name_prefix=f"decode-{self.name}"
        )

    # ---------------------------------------------------------------- lifecycle
    def _load(self) -> None:
        """Load the model (unless it was handed over) and warm it up at batch 1 and max
        batch (in a thread)."""
        try:
            clf = self._loaded or load_served(self.cfg)
            self.tensor = TensorSpec.of(clf)
            dtype = np.uint8 if clf.embedded else np.float32
            for b in sorted({1, self.cfg.max_batch}):
                clf.run(np.zeros((b, *self.tensor.export), dtype))
            self.clf = clf
            self.ready = True
            log.info(
                "zoo serve: model %r ready (%s) in %s on %s, %s threads, max batch %s%s, "
                "max delay %s ms, max queue %s, timeout %s ms",
                self.name,
                self.cfg.model_path,
                f"{clf.runtime} {precision_of(clf.meta)}",
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
            log.error("model %r failed to load: %s", self.name, self.load_error)

    def _cost(self, x: np.ndarray) -> float:
        """A request's work in samples of the export size (:meth:`TensorSpec.cost`)."""
        return self.tensor.cost(x)

    def _run(self, x: np.ndarray) -> np.ndarray:
        assert self.clf is not None
        return self.clf.outputs(x)  # the logits (and a kNN score column: Classifier.split)

    def start(self) -> None:
        """Start the batcher (in the running event loop) and load the model in a thread."""
        self.batcher = DynamicBatcher(
            self._run,
            max_batch=self.cfg.max_batch,
            max_delay_ms=self.cfg.max_delay_ms,
            max_queue=self.cfg.max_queue,
            metrics=self.metrics,
            cost=self._cost,
        )
        self.batcher.start()
        threading.Thread(target=self._load, name=f"load-{self.name}", daemon=True).start()

    async def stop(self) -> None:
        """Not ready any more; finish what is queued or running."""
        self.ready = False
        if self.batcher is not None:
            await self.batcher.stop()
        self.decoder.shutdown(wait=False)

    # ---------------------------------------------------------------- answers
    def check_model(self, name: str) -> Classifier:
        """The classifier, if ``name`` is this model and it is ready.

        Raises:
            ModelNotServedError: another name.
            ModelNotReadyError: still loading or warming up, or failed to (the message says why).
        """
        if name != self.name:
            raise ModelNotServedError(f"unknown model {name!r}; this server serves {self.name!r}")
        if not self.ready:
            raise ModelNotReadyError(
                "model is not ready yet" + (f": {self.load_error}" if self.load_error else "")
            )
        assert self.clf is not None  # ready means loaded
        return self.clf

    def metadata(self, name: str) -> ModelMetadata:
        """The v2 model metadata.

        Raises:
            ModelNotServedError / ModelNotReadyError: as :meth:`check_model`.
        """
        clf = self.check_model(name)
        rule, decisions = clf.rule, clf.decisions
        extra = (
            [
                TensorMetadata(ACCEPTED_OUTPUT, "BOOL", [-1]),
                TensorMetadata(SCORE_OUTPUT, "FP32", [-1]),
            ]
            if rule
            else []
        )
        if decisions is not None:
            extra.append(TensorMetadata(LABELS_OUTPUT, "BYTES", [-1]))
        return ModelMetadata(
            name=self.name,
            versions=["1"],
            platform="openvino" if clf.runtime == "openvino" else "onnxruntime_onnx",
            inputs=[
                TensorMetadata(
                    clf.input_name,
                    "UINT8" if clf.embedded else "FP32",
                    [-1, *(-1 if d is None else d for d in self.tensor.dims)],
                )
            ],
            outputs=[TensorMetadata(clf.output_name, "FP32", [-1, len(clf.classes) or -1]), *extra],
            parameters={
                "max_batch": self.cfg.max_batch,
                "static_batch": clf.static_batch,
                "multi_label": clf.multi_label,
                "classes": clf.classes,
                # a multi-label model: each class's threshold, as its labels output applies them
                **({"thresholds": list(decisions.thresholds)} if decisions is not None else {}),
                "preprocessing": clf.pre.to_dict(),
                **(
                    {"rejection": {**rule.to_dict(), "unknown_label": UNKNOWN_LABEL}}
                    if rule
                    else {}
                ),
            },
        )

    def triton_config(self, name: str) -> TritonConfig:
        """The model's configuration in Triton's form (:func:`triton_config`).

        Raises:
            ModelNotServedError / ModelNotReadyError: as :meth:`check_model`.
        """
        return triton_config(self.metadata(name), self.cfg.max_batch)

    async def run_batched(self, x: np.ndarray) -> np.ndarray:
        """``x`` through the dynamic batcher, within the timeout.

        Raises:
            ServerBusyError: the queue is full or the work ahead outlasts the timeout.
            TimeoutError: the request waited longer than ``timeout_ms``.
        """
        assert self.batcher is not None
        return await self.batcher.submit(x, self.cfg.timeout_ms / 1000)

    async def _run_any_size(self, clf: Classifier, x: np.ndarray) -> np.ndarray:
        """:meth:`run_batched`; a free-size graph that fails at a size other than its export
        size, and still answers at that size, has refused the client's size: a 400.

        Raises:
            InputError: the graph failed at another size and answers at the export size.
            ServerBusyError / TimeoutError: as :meth:`run_batched`.
        """
        try:
            return await self.run_batched(x)
        except (ServerBusyError, TimeoutError):
            raise
        except Exception as exc:
            export = self.tensor.export
            if clf.embedded or x.shape[1:] == export or not await self._answers(export):
                raise  # failing at the size it was proven and warmed up at: a fault of ours
            raise InputError(
                f"input {clf.input_name!r} of shape {list(x.shape)}: the graph does not take "
                f"it ({first_line(exc)}); send [batch, {', '.join(map(str, export))}], the "
                "size it was exported at"
            ) from exc

    async def _answers(self, sample: tuple[int, ...]) -> bool:
        """Whether the model answers one sample of zeros of this shape now."""
        try:
            await self.run_batched(np.zeros((1, *sample), np.float32))
        except Exception:
            return False
        return True

    async def infer(self, name: str, req: InferRequest) -> list[tuple[OutputSpec, np.ndarray]]:
        """A v2 inference request's outputs (the tensor, or its top-k classification); for a
        model with a rejection rule also :data:`ACCEPTED_OUTPUT` and :data:`SCORE_OUTPUT`, for
        a multi-label model :data:`LABELS_OUTPUT` (by default, or when asked for by name).

        Raises:
            ModelNotServedError / ModelNotReadyError: as :meth:`check_model`.
            InputError: the input is not what the model takes, or an unknown output is asked for.
            ServerBusyError / TimeoutError: as :meth:`run_batched`.
        """
        clf = self.check_model(name)
        x = check_tensor(
            req.inputs,
            clf,
            self.tensor,
            max_batch=self.cfg.max_batch,
            max_image_pixels=self.cfg.max_image_pixels,
        )
        rule, decisions = clf.rule, clf.decisions
        names = [
            clf.output_name,
            *((ACCEPTED_OUTPUT, SCORE_OUTPUT) if rule else ()),
            *((LABELS_OUTPUT,) if decisions is not None else ()),
        ]
        specs = req.outputs or [OutputSpec(n, binary=req.binary_default) for n in names]
        for spec in specs:  # before the model runs: a wrong name costs no inference
            if spec.name not in names:
                raise InputError(
                    f"unknown output {spec.name!r}; the model's outputs are "
                    + ", ".join(repr(n) for n in names)
                )
            if spec.classification and spec.name != clf.output_name:
                raise InputError(
                    f"output {spec.name!r} has no classes: ask for classification on "
                    f"{clf.output_name!r}"
                )
        y = await self._run_any_size(clf, x)
        # the rule's scores, or the sigmoids a multi-label model decides on (as zoo predict)
        judged = clf.judge(y) if rule or decisions is not None else None
        return [(spec, self._output(clf, spec, y, judged)) for spec in specs]

    def _output(
        self, clf: Classifier, spec: OutputSpec, y: np.ndarray, judged: Assessed | None
    ) -> np.ndarray:
        if judged is not None:
            scores, rule = judged.rule_scores, clf.rule
            if spec.name == ACCEPTED_OUTPUT and scores is not None and rule is not None:
                return scores >= rule.threshold
            if spec.name == SCORE_OUTPUT and scores is not None:
                return scores.astype(np.float32)
            if spec.name == LABELS_OUTPUT and clf.decisions is not None:
                return clf.decisions.joined(judged.probs)
        logits = clf.split(y)[0]
        if spec.classification:
            return classification(logits, spec.classification, clf.classes)
        return logits.astype(np.float32)

    async def predict_image(self, name: str, data: bytes, k: int) -> ImageAnswer:
        """The top ``k`` labels of an encoded image (decoded off the event loop, in this
        model's own threads, once the queue has room), the model's rejection rule's verdict
        on it, and a multi-label model's decided classes.

        Raises:
            ModelNotServedError / ModelNotReadyError: as :meth:`check_model`.
            InputError: an empty body or an image that does not decode; ``k`` below 1.
            ServerBusyError / TimeoutError: as :meth:`run_batched`.
        """
        clf = self.check_model(name)
        if k < 1:
            raise InputError(f"top_k={k}: ask for 1 or more classes (default 5)")
        if not data:
            raise InputError(
                "empty body: send a JPEG/PNG image (raw body or multipart field 'file')"
            )
        if self.batcher is not None:  # a full queue refuses before the decoding, not after
            self.batcher.admit(1, self.cfg.timeout_ms / 1000)
        loop = asyncio.get_running_loop()
        x = await loop.run_in_executor(self.decoder, self._image_tensor, clf, data)
        judged = clf.judge(await self.run_batched(x))  # calibrated, as zoo predict
        probs = judged.probs[0]
        top = np.argsort(-probs, kind="stable")[:k]  # every class when k is larger
        labels = clf.classes
        rule, decisions = clf.rule, clf.decisions
        verdict = (
            rule.verdict(judged.rule_scores[0])
            if rule is not None and judged.rule_scores is not None
            else None
        )
        return ImageAnswer(
            [
                Prediction(labels[i] if i < len(labels) else str(i), int(i), float(probs[i]))
                for i in top
            ],
            verdict,
            decisions.labels(judged.probs)[0] if decisions is not None else None,
        )

    def _image_tensor(self, clf: Classifier, data: bytes) -> np.ndarray:
        """(1, C, H, W): the upload decoded and preprocessed (in one worker-thread hop); for a
        graph that preprocesses itself, its (1, H, W, C) pixels."""
        image = open_image(data, max_pixels=self.cfg.max_image_pixels)
        return clf.prepare(image)[None]
