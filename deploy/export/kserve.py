"""``zoo export --format kserve``: a KServe ``InferenceService`` over zoo's Triton repository.

The manifest is built from the ``kserve`` SDK's own model classes (``V1beta1InferenceService``
and the Kubernetes ``V1Container`` it holds), serialised by the SDK
(``ApiClient.sanitize_for_serialization``) and read back by :func:`load_manifest` before it
is written: a field the SDK does not know fails the export, not the cluster. The Triton
repository (:func:`zoo.deploy.export.triton.export_triton`, parity-gated) goes beside the
manifest, ``NAME.isvc.yaml`` → ``NAME_model_repository/``; ``storageUri`` names where it will
be (``--storage-uri``, default its ``file://`` URI on this machine). Two runtimes serve it:

- ``triton``: ``predictor.model`` with ``modelFormat: triton`` and ``protocolVersion: v2``;
  KServe's Triton runtime loads the repository from ``storageUri``.
- ``zoo``: a custom predictor container, the image the repository's ``Dockerfile`` builds,
  running ``zoo serve`` on port 8080 over the model KServe's storage initializer puts in
  ``/mnt/models`` (``STORAGE_URI``), with readiness and liveness probes on the v2 health
  endpoints and its API key (``ZOO_API_KEY``) from the Secret ``NAME-api-key``, which the
  user creates. The same URLs answer on both runtimes (``--name`` is Triton's model name).
"""

from __future__ import annotations

import json
import re
import shutil
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo import durable
from zoo.deploy.export.result import ExportResult
from zoo.errors import ExportError, InputError
from zoo.ref import ModelRef

PORT = 8080
"""The port KServe routes to a predictor container."""
READY_PATH = "/v2/health/ready"
LIVE_PATH = "/v2/health/live"
MODEL_MOUNT = "/mnt/models"
"""Where KServe's storage initializer puts what ``storageUri`` names."""
DEFAULT_IMAGE = "zoo-serve:latest"
"""The ``zoo`` runtime's image: ``docker build -t zoo-serve .`` at the repository's root."""
CPUS = 2
"""The ``zoo`` container's CPU request and limit, and so its ``zoo serve --threads``."""
MEMORY = "2Gi"
API_KEY_ENV = "ZOO_API_KEY"
"""``zoo serve``'s API key (every scope), from the Secret :attr:`ServiceSpec.secret`."""
SECRET_KEY = "api-key"
"""The key in that Secret that holds it."""
CONTAINER = "kserve-container"
"""The name KServe gives a predictor's serving container."""
RUN_AS = 1000
"""The ``Dockerfile``'s non-root user (numeric, so ``runAsNonRoot`` can check it)."""


def service_name(model_name: str) -> str:
    """The ``InferenceService``'s name for a model name: a DNS-1035 label (lowercase letters,
    digits and ``-``, starting with a letter), at most 45 characters (KServe's limit, which
    leaves room for the ``-predictor`` host names it derives)."""
    label = re.sub(r"[^a-z0-9]+", "-", model_name.lower()).strip("-")
    label = label if label[:1].isalpha() else f"zoo-{label}"
    return label[:45].rstrip("-")


def zoo_serve_args(model_name: str, *, max_batch: int) -> list[str]:
    """The ``zoo`` container's arguments after its ``zoo serve`` entry point: the model from
    the mounted Triton repository, named as Triton names it, on all addresses at :data:`PORT`."""
    return [
        f"{MODEL_MOUNT}/{model_name}/1/model.onnx",
        *("--name", model_name, "--host", "0.0.0.0", "--port", str(PORT)),
        *("--max-batch", str(max_batch), "--threads", str(CPUS)),
    ]


@dataclass(frozen=True)
class ServiceSpec:
    """What the manifest says: the facts :func:`build_inference_service` is built from.

    Attributes:
        model_name: the model's name in the v2 URLs (the Triton repository's folder).
        runtime: ``triton`` or ``zoo``.
        storage_uri: where the Triton repository is.
        max_batch: the largest batch a request is gathered into.
        image: the ``zoo`` runtime's container image.
    """

    model_name: str
    runtime: str
    storage_uri: str
    max_batch: int = 32
    image: str = DEFAULT_IMAGE

    @property
    def name(self) -> str:
        """The ``InferenceService``'s ``metadata.name`` (:func:`service_name`)."""
        return service_name(self.model_name)

    @property
    def secret(self) -> str:
        """The Secret the ``zoo`` container's API key comes from: ``NAME-api-key``."""
        return f"{self.name}-api-key"


def _sdk() -> tuple[Any, Any]:
    """``kserve`` and ``kubernetes.client``, or an error naming what to install."""
    try:
        import kserve
        from kubernetes import client as k8s
    except ImportError as exc:
        raise InputError(
            f"--format kserve builds its manifest with KServe's SDK ({exc.name} is missing): "
            "pip install 'zoo[kserve]'"
        ) from exc
    return kserve, k8s


def _zoo_container(spec: ServiceSpec, k8s: Any) -> Any:
    """The ``zoo serve`` predictor container: non-root, probed on the v2 health endpoints."""

    def probe(path: str, **timing: int) -> Any:
        return k8s.V1Probe(
            http_get=k8s.V1HTTPGetAction(path=path, port=PORT), timeout_seconds=2, **timing
        )

    quota = {"cpu": str(CPUS), "memory": MEMORY}
    return k8s.V1Container(
        name=CONTAINER,
        image=spec.image,
        args=zoo_serve_args(spec.model_name, max_batch=spec.max_batch),
        env=[
            k8s.V1EnvVar(name="STORAGE_URI", value=spec.storage_uri),
            # zoo serve refuses a non-loopback address without a key; health stays open
            k8s.V1EnvVar(
                name=API_KEY_ENV,
                value_from=k8s.V1EnvVarSource(
                    secret_key_ref=k8s.V1SecretKeySelector(name=spec.secret, key=SECRET_KEY)
                ),
            ),
        ],
        ports=[k8s.V1ContainerPort(container_port=PORT, name="http1", protocol="TCP")],
        # ready only after the warm-up at batch 1 and max batch; live at once
        readiness_probe=probe(READY_PATH, period_seconds=5, failure_threshold=3),
        liveness_probe=probe(LIVE_PATH, period_seconds=10, failure_threshold=3),
        resources=k8s.V1ResourceRequirements(requests=quota, limits=quota),
        security_context=k8s.V1SecurityContext(
            run_as_non_root=True,
            run_as_user=RUN_AS,
            allow_privilege_escalation=False,
            capabilities=k8s.V1Capabilities(drop=["ALL"]),
        ),
    )


def build_inference_service(spec: ServiceSpec) -> Any:
    """The ``InferenceService`` as the SDK's ``V1beta1InferenceService``.

    Raises:
        InputError: the ``kserve`` SDK is not installed.
        ValueError: a value the SDK's classes refuse.
    """
    kserve, k8s = _sdk()
    if spec.runtime == "triton":
        predictor = kserve.V1beta1PredictorSpec(
            model=kserve.V1beta1ModelSpec(
                name=CONTAINER,
                model_format=kserve.V1beta1ModelFormat(name="triton", version="2"),
                protocol_version="v2",
                storage_uri=spec.storage_uri,
            )
        )
    else:
        predictor = kserve.V1beta1PredictorSpec(containers=[_zoo_container(spec, k8s)])
    return kserve.V1beta1InferenceService(
        api_version=kserve.constants.KSERVE_V1BETA1,
        kind=kserve.constants.KSERVE_KIND_INFERENCESERVICE,
        metadata=k8s.V1ObjectMeta(
            name=spec.name,
            labels={"app.kubernetes.io/managed-by": "zoo"},
            annotations={"zoo.model-name": spec.model_name},
        ),
        spec=kserve.V1beta1InferenceServiceSpec(predictor=predictor),
    )


def manifest_text(isvc: Any) -> str:
    """The YAML of an SDK ``InferenceService`` (the SDK's own camelCase serialisation)."""
    import yaml

    kserve, _ = _sdk()
    doc = kserve.ApiClient().sanitize_for_serialization(isvc)
    return str(yaml.safe_dump(doc, sort_keys=False))


def _deserializer() -> Any:
    """KServe's ``ApiClient`` that also finds the Kubernetes classes an ``InferenceService``
    holds. By hand because the SDK looks only in ``kserve.models`` (kserve#2329: ``metadata``
    and ``containers`` fail) and the Kubernetes client spells maps ``Dict[str, str]``, which
    the SDK's parser does not read."""
    kserve, k8s = _sdk()

    class Deserializer(kserve.ApiClient):  # type: ignore[name-defined]
        def _ApiClient__deserialize(self, data: Any, klass: Any) -> Any:
            if isinstance(klass, str):
                if m := re.fullmatch(r"Dict\[(\w+), (.+)\]", klass):
                    klass = f"dict({m[1]}, {m[2]})"
                elif m := re.fullmatch(r"List\[(.+)\]", klass):
                    klass = f"list[{m[1]}]"
                elif not hasattr(kserve.models, klass) and hasattr(k8s, klass):
                    klass = getattr(k8s, klass)
            return super()._ApiClient__deserialize(data, klass)

    return Deserializer()


def load_manifest(text: str) -> Any:
    """An ``InferenceService`` manifest read into the SDK's ``V1beta1InferenceService``.

    Strict: the SDK's deserialiser drops what it does not know, so the object is serialised
    again and must give back the same document.

    Raises:
        ExportError: not an ``InferenceService``, a value the SDK's classes refuse, or a field
            they do not have (named by its path).
    """
    import yaml

    kserve, _ = _sdk()
    doc = yaml.safe_load(text)
    if (
        not isinstance(doc, dict)
        or doc.get("kind") != kserve.constants.KSERVE_KIND_INFERENCESERVICE
    ):
        raise ExportError("not a KServe InferenceService manifest (kind: InferenceService)")
    client = _deserializer()
    try:
        isvc = client.deserialize(
            types.SimpleNamespace(data=json.dumps(doc)), "V1beta1InferenceService"
        )
    except (ValueError, TypeError) as exc:
        raise ExportError(f"the InferenceService does not match KServe's schema: {exc}") from exc
    again = client.sanitize_for_serialization(isvc)
    if again != doc:
        raise ExportError(
            f"the InferenceService has fields KServe's schema lacks: {_first_difference(doc, again)}"
        )
    return isvc


def _first_difference(doc: Any, again: Any, path: str = "") -> str:
    """The path of the first field of ``doc`` that ``again`` lacks or reads otherwise."""
    if isinstance(doc, dict) and isinstance(again, dict):
        for key, value in doc.items():
            if key not in again:
                return f"{path}.{key}".lstrip(".")
            if value != again[key]:
                return _first_difference(value, again[key], f"{path}.{key}")
    if isinstance(doc, list) and isinstance(again, list) and len(doc) == len(again):
        for i, (a, b) in enumerate(zip(doc, again, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}[{i}]")
    return path.lstrip(".") or "(the document)"


def repository_for(manifest: Path) -> Path:
    """The Triton repository written beside a manifest: ``X.isvc.yaml`` or ``X.yaml`` →
    ``X_model_repository``."""
    stem = manifest.name.split(".")[0] or "isvc"
    return manifest.parent / f"{stem}_model_repository"


@dataclass
class KServeResult(ExportResult):
    """An ``InferenceService`` export: the manifest (``path``), the Triton repository it serves
    and the gate's evidence for the ONNX graph in it.

    Attributes:
        repository: the Triton repository folder written beside the manifest.
        service: the ``InferenceService``'s name.
        model_name: the model's name in the v2 URLs.
        runtime: ``triton`` or ``zoo``.
        storage_uri: the manifest's ``storageUri``.
        storage_given: ``--storage-uri`` was given (else the repository's ``file://`` URI).
    """

    repository: str = ""
    service: str = ""
    model_name: str = ""
    runtime: str = "triton"
    storage_uri: str = ""
    storage_given: bool = False

    def lines(self) -> list[str]:
        """The manifest, the repository, then the gate's lines (:meth:`ExportResult.lines`)."""
        return [
            f"wrote {self.path} (KServe InferenceService {self.service}, {self.runtime} runtime, "
            f"model {self.model_name}, storageUri {self.storage_uri})",
            f"wrote {self.repository}/{self.model_name} ({self.size_mb} MiB, Triton repository, "
            f"exporter {self.exporter})",
            *super().lines()[1:],
        ]

    def warnings(self) -> list[str]:
        """The gate's warnings, and where to put the repository when no URI was given."""
        upload = (
            []
            if self.storage_given
            else [
                f"note: storageUri is this machine's {self.repository}: copy that folder to "
                "storage your cluster reads and export again with --storage-uri URI"
            ]
        )
        return [*super().warnings(), *upload]


def export_kserve(
    model: str | ModelRef,
    manifest: Path,
    *,
    runtime: str = "triton",
    storage_uri: str | None = None,
    image: str | None = None,
    max_batch: int = 32,
    opset: int = 18,
    data: str | None = None,
    weights: str | None = None,
    embed_preprocessing: bool = False,
) -> KServeResult:
    """Write the Triton repository beside ``manifest`` (replacing an old one whole), then the
    ``InferenceService`` serving it.

    Args:
        model: what to export (a model reference or its text).
        manifest: the YAML file to write.
        runtime: ``triton`` or ``zoo`` (see the module's docstring).
        storage_uri: the ``storageUri``; default the repository's ``file://`` URI.
        image: the ``zoo`` runtime's image (default :data:`DEFAULT_IMAGE`).
        max_batch, opset, data, weights, embed_preprocessing: as for
            :func:`zoo.deploy.export.triton.export_triton`.

    Returns:
        The manifest, the repository and the gate's evidence.

    Raises:
        InputError: the ``kserve`` SDK is not installed, or ``manifest`` is a folder.
        ExportError: the manifest does not read back through the SDK (a bug).
        Everything :func:`zoo.deploy.export.triton.export_triton` raises.
    """
    from zoo.deploy.export.triton import export_triton

    _sdk()  # before the export: a missing SDK costs nothing
    durable.refuse_folder(  # before the repository is written beside it
        manifest,
        flag="-o",
        writes="--format kserve writes the InferenceService manifest (the Triton repository beside it)",
        name="model.yaml",  # as the -o check of zoo export suggests
    )
    repo = repository_for(manifest)
    if repo.exists() and not repo.is_dir():
        raise InputError(
            f"{repo} is a file; --format kserve writes the Triton repository there (beside "
            f"{manifest.name}): move the file, or name another -o."
        )
    # built whole beside it and swapped in: the manifest's storage holds its one model (a
    # second export to the same -o once left the first model there for Triton to load too)
    repo.parent.mkdir(parents=True, exist_ok=True)
    scratch = durable.temp_path(repo, folder=True)
    try:
        exported = export_triton(
            model,
            scratch,
            max_batch=max_batch,
            opset=opset,
            data=data,
            weights=weights,
            embed_preprocessing=embed_preprocessing,
        )
        durable.replace_dir(scratch, repo, label=repo.name)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    model_name = Path(exported.path).name
    exported.path = str(repo / model_name)
    uri = storage_uri or repo.resolve().as_uri()
    spec = ServiceSpec(model_name, runtime, uri, max_batch, image or DEFAULT_IMAGE)
    text = manifest_text(build_inference_service(spec))
    load_manifest(text)  # what is written reads back through the SDK, field for field
    manifest.parent.mkdir(parents=True, exist_ok=True)
    durable.write_text(manifest, text, label=manifest.name)
    result = KServeResult(
        **{**exported.__dict__, "path": str(manifest), "format": "kserve"},
        repository=str(repo),
        service=spec.name,
        model_name=model_name,
        runtime=runtime,
        storage_uri=uri,
        storage_given=storage_uri is not None,
    )
    return result


__all__ = [
    "DEFAULT_IMAGE",
    "LIVE_PATH",
    "PORT",
    "READY_PATH",
    "KServeResult",
    "ServiceSpec",
    "build_inference_service",
    "export_kserve",
    "load_manifest",
    "manifest_text",
    "repository_for",
    "service_name",
    "zoo_serve_args",
]
