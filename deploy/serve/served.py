"""The models one server serves, by name: what the HTTP app (:mod:`zoo.deploy.serve.app`) and
the gRPC service (:mod:`zoo.deploy.serve.grpc_server`) look a request's model up in, the
server's readiness, and the v2 model repository's index. Each model keeps its own batcher,
queue and runtime session (:class:`ModelServer`): one model's overload or failure is answered
by that model alone."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import msgspec

from zoo.deploy.runtimes.loader import Classifier
from zoo.deploy.serve.config import ServeConfig
from zoo.deploy.serve.metrics import MetricFamilies, ServerMetrics
from zoo.deploy.serve.model import ModelServer
from zoo.errors import InputError, ModelNotServedError


class IndexEntry(msgspec.Struct, omit_defaults=True):
    """One model in the repository index (Triton's model repository extension):
    ``state`` is READY, LOADING (warming up) or UNAVAILABLE (``reason`` says why)."""

    name: str
    version: str
    state: str
    reason: str = ""


class IndexRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The optional body of ``POST /v2/repository/index``: ``ready`` lists only ready models."""

    ready: bool = False


class ServedModels:
    """Every model of a server, by its name in the URL.

    Args:
        models: the served models (the first one: the demo page's), named apart.
        families: their metric families (None: the first model's own, for one model).

    Attributes:
        models: name -> :class:`ModelServer`, in the order given.
        families: the metric families ``/metrics`` renders (a ``model`` label with several).
        unrouted: the metrics of a request that names no served model (the one model's own,
            with one).
    """

    def __init__(
        self, models: Sequence[ModelServer], families: MetricFamilies | None = None
    ) -> None:
        self.models = {m.name: m for m in models}
        self.families = families or models[0].metrics.families
        self.unrouted = models[0].metrics if len(models) == 1 else ServerMetrics(self.families, "")

    @classmethod
    def build(
        cls, cfg: ServeConfig, loaded: Mapping[str, Classifier] | None = None
    ) -> ServedModels:
        """The models of ``cfg`` (:meth:`ServeConfig.served`), each with its own batcher.

        Args:
            cfg: the server settings.
            loaded: classifiers already loaded, by model name (``zoo serve`` loads each
                before binding); the others load in :meth:`start`.
        """
        served = cfg.served()
        families = MetricFamilies(per_model=len(served) > 1)
        return cls(
            [
                ModelServer(m, (loaded or {}).get(m.name), ServerMetrics(families, m.name))
                for m in served
            ],
            families,
        )

    @property
    def first(self) -> ModelServer:
        """The first model given (the demo page's)."""
        return next(iter(self.models.values()))

    @property
    def ready(self) -> bool:
        """Every model is loaded and warmed up (Triton's strict readiness)."""
        return all(m.ready for m in self.models.values())

    def get(self, name: str) -> ModelServer:
        """The model served as ``name``.

        Raises:
            ModelNotServedError: no model of that name (the message lists those served).
        """
        model = self.models.get(name)
        if model is None:
            served = ", ".join(repr(n) for n in self.models)
            raise ModelNotServedError(f"unknown model {name!r}; this server serves {served}")
        return model

    def metrics_of(self, name: str | None) -> ServerMetrics:
        """Where a request for model ``name`` counts."""
        model = self.models.get(name or "")
        return model.metrics if model is not None else self.unrouted

    def index(self, body: bytes = b"") -> list[IndexEntry]:
        """The repository index: every model, its version and state.

        Args:
            body: ``POST``'s optional JSON ``{"ready": true}`` (only the ready models).

        Raises:
            InputError: a body that is not that object.
        """
        try:
            only_ready = msgspec.json.decode(body, type=IndexRequest).ready if body else False
        except msgspec.DecodeError as exc:  # ValidationError included
            raise InputError(f'the repository index takes {{"ready": true|false}}: {exc}') from exc
        entries = []
        for name, m in self.models.items():
            if only_ready and not m.ready:
                continue
            state = "READY" if m.ready else "UNAVAILABLE" if m.load_error else "LOADING"
            entries.append(IndexEntry(name, "1", state, m.load_error or ""))
        return entries

    def start(self) -> None:
        """Start every model's batcher and load (in the running event loop)."""
        for m in self.models.values():
            m.start()

    async def stop(self) -> None:
        """Every model finishes what is queued or running."""
        await asyncio.gather(*(m.stop() for m in self.models.values()))
