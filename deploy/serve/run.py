"""``zoo serve MODEL [MODEL …]``: resolve what to serve (each an .onnx file, a run/model folder,
or a registry entry exported on the fly, optionally ``NAME=``) and run it under uvicorn with
graceful shutdown."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

from zoo.artifact import ONNX_FILE
from zoo.deploy.serve.config import ServeConfig, load_served
from zoo.errors import InputError
from zoo.ref import RUNTIME_KINDS, ModelRef
from zoo.system import available_cpus


def resolve_onnx(model: str | ModelRef, workdir: Path) -> Path:
    """The ONNX file to serve for a model reference.

    Args:
        model: a model reference: an ``.onnx`` file or OpenVINO ``.xml`` IR is served as is; a
            run or model folder
            holding ``model.onnx`` serves that file; anything else (a registry, timm or Hub
            name, a folder without ONNX) is exported to ``workdir`` first.
        workdir: where an on-the-fly export is written.

    Returns:
        The path of the ONNX file.

    Raises:
        ModelRefError / UnknownModelError: the reference does not parse.
        Everything :func:`zoo.deploy.export.onnx_export.export_onnx` raises, for an on-the-fly export.
    """
    ref = ModelRef.parse(model)
    if ref.kind in RUNTIME_KINDS:  # an .onnx file or an OpenVINO IR, served as it is
        return ref.path
    if ref.kind in ("run", "model-folder"):
        candidate = ref.model_folder / ONNX_FILE
        if candidate.is_file():
            return candidate
    from zoo.deploy.export.onnx_export import export_onnx

    out = workdir / ONNX_FILE
    logging.getLogger("zoo.serve").warning(
        "exporting %s to ONNX (dynamic batch) before serving", ref.shown
    )
    export_onnx(ref, out)
    return out


def default_name(onnx_path: Path) -> str:
    from zoo.onnx_meta import read_metadata

    if onnx_path.suffix == ".xml":
        from zoo.deploy.runtimes.openvino import read_ir_file_metadata

        meta = read_ir_file_metadata(onnx_path)
    else:
        meta = read_metadata(onnx_path)
    if meta.get("arch") and meta.get("tag"):
        return f"{meta['arch']}.{meta['tag']}".replace(":", "_").replace("/", "_")
    return onnx_path.stem


def _graceful_server_class() -> type:
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """SIGTERM/SIGINT: stop accepting, finish in-flight requests (bounded by
        timeout_graceful_shutdown), then return normally, so the process exits 0. (uvicorn's own
        handler re-raises the signal after shutting down, which ends the process with -15.)"""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {
                s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)
            }
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    return GracefulServer


def serve(cfg: ServeConfig) -> None:
    """Serve one model or several under uvicorn until SIGTERM/SIGINT, then shut down
    gracefully.

    Args:
        cfg: the settings; ``cfg.model_path`` (and ``cfg.more_models``) are model references
            (see :func:`resolve_onnx` for what is served), each optionally ``NAME=REF``;
            a model without a name is named by its file's ``arch.tag``. The API keys are read
            now (``--api-key-file`` or ``ZOO_API_KEY``).

    Raises:
        UsageError: a non-loopback ``host`` without an API key or ``allow_unauthenticated``;
            two models under one name; a ``NAME=`` that is no name.
        InputError: an unreadable or malformed key file, a TLS file that is not there,
            ``grpc_port`` without KServe's v2 messages installed.
        ModelRefError / UnknownModelError: the reference does not parse.
        Everything :func:`zoo.deploy.export.onnx_export.export_onnx` raises, for an on-the-fly export.
        Everything :func:`zoo.deploy.runtimes.loader.load_classifier` raises: the model is loaded
            once, before the server binds, so a model it cannot run is refused, not served 503.
    """
    import uvicorn

    from zoo.deploy.serve.app import create_app
    from zoo.deploy.serve.auth import check_exposure, load_keys

    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("zoo.serve").setLevel(logging.INFO)  # start-up line, one per client error
    logging.getLogger("python_multipart").setLevel(logging.ERROR)  # its bad-body warnings: ours
    keys = load_keys(cfg.api_key_file)  # at start-up, from the environment as it is now
    check_exposure(cfg.host, keys, allow_unauthenticated=cfg.allow_unauthenticated)
    for option, tls_file in (
        ("--ssl-certfile", cfg.ssl_certfile),
        ("--ssl-keyfile", cfg.ssl_keyfile),
    ):
        if tls_file is not None and not Path(tls_file).is_file():
            raise InputError(f"{option} {tls_file}: no such file")
    if cfg.grpc_port is not None:  # the v2 messages are there, before anything loads
        from zoo.deploy.serve.grpc_protocol import messages

        messages()
    refs = cfg.references()  # NAME= checked before anything is exported
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, (_, ref) in enumerate(refs):
            workdir = Path(tmp) / str(i)  # an export on the fly per model
            workdir.mkdir()
            path = resolve_onnx(ref, workdir)
            files.append((str(path), default_name(path)))
        cfg = cfg.resolved(files)
        # loaded once, here: a model it cannot run is refused (exit 1) before the server
        # binds, rather than a server that answers 503 for ever; the app only warms it up
        loaded = {}
        for model in cfg.served():
            loaded[model.name] = load_served(model)
            logging.getLogger("zoo.serve").info(
                "zoo serve: model %r from %s: %s inference threads%s; its own batcher "
                "(max batch %s) and queue (max %s)",
                model.name,
                model.model_path,
                loaded[model.name].threads,
                f" (its share of {cfg.threads or available_cpus()} CPUs among {len(refs)} models)"
                if len(refs) > 1
                else "",
                model.max_batch,
                model.max_queue,
            )
        app = create_app(cfg, keys=keys, loaded=loaded)
        # uvicorn's fast loop and parser are dependencies; "auto" still runs without them
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
        http = "httptools" if importlib.util.find_spec("httptools") else "h11"
        config = uvicorn.Config(
            app,
            host=cfg.host,
            port=cfg.port,
            loop=loop,
            http=http,
            log_level="warning",
            timeout_graceful_shutdown=int(cfg.graceful_timeout_s),
            access_log=False,
            ssl_certfile=cfg.ssl_certfile,
            ssl_keyfile=cfg.ssl_keyfile,
        )
        scheme = "https" if cfg.tls else "http"
        logging.getLogger("zoo.serve").info(
            "zoo serve: %s://%s:%s (uvicorn, %s loop, %s parser)%s; API keys: %s",
            scheme,
            cfg.host,
            cfg.port,
            loop,
            http,
            f", gRPC on port {cfg.grpc_port}" if cfg.grpc_port is not None else "",
            f"{len(keys.entries)} (health open)" if keys else "none (every endpoint open)",
        )
        _graceful_server_class()(config).run()
