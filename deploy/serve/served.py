"""The models one server serves, by name: what the HTTP app (:mod:`zoo.deploy.serve.app`) and
the gRPC service (:mod:`zoo.deploy.serve.grpc_server`) look a request's model up in, the
server's readiness, and the v2 model repository's index. Each model keeps its own batcher,
queue and runtime session (:class:`ModelServer`): one model's overload or failure is answered
by that model alone. In a worker process of ``zoo serve A B …``
(:mod:`zoo.deploy.serve.workers`) it holds that worker's own model and asks the others
(:class:`Peers`) for readiness and the index."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import msgspec

from zoo.deploy.runtimes.loader import Classifier
from zoo.deploy.serve.config import ServeConfig
from zoo.deploy.serve.metrics import MetricFamilies, ServerMetrics
from zoo.deploy.serve.model import ModelServer
from zoo.deploy.serve.protocol import IndexEntry
from zoo.deploy.serve.relay import Peers
from zoo.errors import InputError, ModelNotServedError


class IndexRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The optional body of ``POST /v2/repository/index``: ``ready`` lists only ready models."""

    ready: bool = False


class ServedModels:
    """Every model of a server, by its name in the URL.

    Args:
        models: the served models (the first one: the demo page's), named apart.
        families: their metric families (None: the first model's own, for one model).
        peers: the other workers of a server with a process per model (None: every model
            is here).

    Attributes:
        models: name -> :class:`ModelServer` (this process's), in the order given.
        names: every model's name, in the order given (the other workers' included).
        families: the metric families ``/metrics`` renders (a ``model`` label with several).
        unrouted: the metrics of a request that names no served model (the one model's own,
            with one).
    """

    def __init__(
        self,
        models: Sequence[ModelServer],
        families: MetricFamilies | None = None,
        peers: Peers | None = None,
    ) -> None:
        self.models = {m.name: m for m in models}
        self.peers = peers
        if peers is not None:
            peers.families = families or models[0].metrics.families
        self.names = peers.names if peers is not None else tuple(self.models)
        self.families = families or models[0].metrics.families
        one = len(self.names) == 1
        self.unrouted = models[0].metrics if one else ServerMetrics(self.families, "")

    @classmethod
    def build(
        cls,
        cfg: ServeConfig,
        loaded: Mapping[str, Classifier] | None = None,
        peers: Peers | None = None,
    ) -> ServedModels:
        """The models of ``cfg`` (:meth:`ServeConfig.served`), each with its own batcher.

        Args:
            cfg: the server settings.
            loaded: classifiers already loaded, by model name (``zoo serve`` loads each
                before binding); the others load in :meth:`start`.
            peers: the other workers (only this worker's models are built here).
        """
        served = cfg.served()
        families = MetricFamilies(per_model=len(served) > 1)
        return cls(
            [
                ModelServer(m, (loaded or {}).get(m.name), ServerMetrics(families, m.name))
                for m in served
                if peers is None or peers.is_local(m.name)
            ],
            families,
            peers,
        )

    @property
    def first(self) -> ModelServer:
        """The first model of this process."""
        return next(iter(self.models.values()))

    @property
    def ready(self) -> bool:
        """Every model of this process is loaded and warmed up."""
        return all(m.ready for m in self.models.values())

    async def all_ready(self) -> bool:
        """Every model is loaded and warmed up (Triton's strict readiness), the other
        workers' included."""
        if self.peers is None:
            return self.ready
        return all(e.state == "READY" for e in await self.entries())

    def get(self, name: str) -> ModelServer:
        """The model served as ``name``.

        Raises:
            ModelNotServedError: no model of that name (the message lists those served).
        """
        model = self.models.get(name)
        if model is None:
            served = ", ".join(repr(n) for n in self.names)
            raise ModelNotServedError(f"unknown model {name!r}; this server serves {served}")
        return model

    def metrics_of(self, name: str | None) -> ServerMetrics:
        """Where a request for model ``name`` counts."""
        model = self.models.get(name or "")
        return model.metrics if model is not None else self.unrouted

    def local_entries(self) -> list[IndexEntry]:
        """This process's models, their versions and states."""
        entries = []
        for name, m in self.models.items():
            state = "READY" if m.ready else "UNAVAILABLE" if m.load_error else "LOADING"
            entries.append(IndexEntry(name, "1", state, m.load_error or ""))
        return entries

    async def entries(self) -> list[IndexEntry]:
        """Every model's index entry, in the order given (the other workers' asked now)."""
        local = self.local_entries()
        return local if self.peers is None else await self.peers.entries(local)

    async def index(self, body: bytes = b"") -> list[IndexEntry]:
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
        return await self.listed(only_ready)

    async def listed(self, only_ready: bool) -> list[IndexEntry]:
        """The repository index's entries: every model's, or the ready ones' (both transports)."""
        entries = await self.entries()
        return [e for e in entries if e.state == "READY"] if only_ready else entries

    def start(self) -> None:
        """Start every model's batcher and load (in the running event loop)."""
        for m in self.models.values():
            m.start()

    async def stop(self) -> None:
        """Every model finishes what is queued or running."""
        await asyncio.gather(*(m.stop() for m in self.models.values()))
