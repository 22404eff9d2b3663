"""``zoo serve MODEL [MODEL …]``: resolve what to serve (each an .onnx file, a run/model folder,
or a registry entry exported on the fly, optionally ``NAME=``) and run it under uvicorn with
graceful shutdown."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import replace
from pathlib import Path

from zoo.artifact import ONNX_FILE
from zoo.deploy.serve.config import ServeConfig, load_served
from zoo.deploy.serve.startup import (
    check_grpc_port,
    graceful_server,
    listen,
    log_model,
    log_server,
    setup_logging,
    uvicorn_config,
)
from zoo.errors import ArtifactError, InputError, first_line
from zoo.ref import RUNTIME_KINDS, ModelRef


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
        ArtifactError: a Triton model repository (``zoo export --format triton``), or one
            model's folder in one: refused before any export, naming its ONNX files.
        Everything :func:`zoo.deploy.export.onnx_export.export_onnx` raises, for an on-the-fly export.
    """
    ref = ModelRef.parse(model)
    if ref.kind in RUNTIME_KINDS:  # an .onnx file or an OpenVINO IR, served as it is
        return ref.path
    if ref.kind in ("run", "model-folder"):
        candidate = ref.model_folder / ONNX_FILE
        if candidate.is_file():
            return candidate
        refusal = _triton_refusal(ref.path)
        if refusal is not None:  # refused before the export's warning, which would not come true
            raise refusal
    from zoo.deploy.export.onnx_export import export_onnx
    from zoo.deploy.export.options import default_output

    out = workdir / ONNX_FILE
    once = (  # what spares the next start this export
        f"`zoo export {ref.shown}` once writes the file it serves"
        if ref.kind in ("run", "model-folder")
        else f"`zoo export {ref.shown}` once writes {default_output(ref, 'onnx', None)}: serve that"
    )
    logging.getLogger("zoo.serve").warning(
        "exporting %s to ONNX (dynamic batch, through the parity gate) in a temporary folder "
        "before serving, as on every start (%s)",
        ref.shown,
        once,
    )
    export_onnx(ref, out)
    return out


def _triton_refusal(folder: Path) -> ArtifactError | None:
    """Why ``folder`` is not served when it is a Triton model repository (``zoo export
    --format triton``: ``NAME/config.pbtxt`` and ``NAME/1/model.onnx``) or one model's folder
    in one, naming the ONNX files to serve instead; None: it is neither."""
    if (folder / "config.pbtxt").is_file():
        what, graphs = (
            "a Triton model's folder (config.pbtxt)",
            sorted(folder.glob("*/" + ONNX_FILE)),
        )
    elif any(folder.glob("*/config.pbtxt")):
        what, graphs = "a Triton model repository", sorted(folder.glob("*/*/" + ONNX_FILE))
    else:
        return None
    instead = " ".join(f"{g.parent.parent.name}={g}" for g in graphs)
    return ArtifactError(
        f"{folder} is {what}, as zoo export --format triton writes it, not a zoo model folder: "
        "zoo serve does not read Triton's config.pbtxt; serve the ONNX file inside it instead"
        + (f": zoo serve {instead}" if instead else " (it holds no NAME/1/model.onnx)")
        + ", or the run or model folder it was exported from"
    )


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


def check_tls(cfg: ServeConfig) -> None:
    """The certificate and key load together (PEM, matching, the key unencrypted), checked
    before any model loads: uvicorn would find out only when it starts, with a traceback.

    Raises:
        InputError: a file is missing or unreadable, not PEM, the key does not match the
            certificate, or the key wants a password (the server starts without a prompt).
    """
    import ssl

    for option, tls_file in (
        ("--ssl-certfile", cfg.ssl_certfile),
        ("--ssl-keyfile", cfg.ssl_keyfile),
    ):
        if tls_file is not None and not Path(tls_file).is_file():
            raise InputError(f"{option} {tls_file}: no such file")
    if cfg.ssl_certfile is None:
        return

    def no_prompt() -> bytes:
        raise InputError(
            f"--ssl-keyfile {cfg.ssl_keyfile or cfg.ssl_certfile}: the private key is "
            "encrypted; zoo serve starts without a password prompt: decrypt it (openssl pkey "
            "-in KEY -out KEY.plain) and keep that file readable by the server only"
        )

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            cfg.ssl_certfile, cfg.ssl_keyfile, password=no_prompt
        )
    except (ssl.SSLError, OSError) as exc:
        raise InputError(
            f"--ssl-certfile {cfg.ssl_certfile}"
            + (f" with --ssl-keyfile {cfg.ssl_keyfile}" if cfg.ssl_keyfile else "")
            + f" do not load as a certificate and its private key ({first_line(exc)}): give "
            "PEM files, the key the one the certificate was made for"
        ) from exc


def serve(cfg: ServeConfig) -> None:
    """Serve one model or several under uvicorn until SIGTERM/SIGINT, then shut down
    gracefully. Several models get a worker process each behind the same ports
    (:func:`zoo.deploy.serve.workers.serve_workers`) unless ``cfg.one_process``.

    Args:
        cfg: the settings; ``cfg.model_path`` (and ``cfg.more_models``) are model references
            (see :func:`resolve_onnx` for what is served), each optionally ``NAME=REF``;
            a model without a name is named by its file's ``arch.tag``. The API keys are read
            now (``--api-key-file`` or ``ZOO_API_KEY``).

    Raises:
        UsageError: a non-loopback ``host`` without an API key or ``allow_unauthenticated``;
            two models under one name; a ``NAME=`` that is no name.
        InputError: an unreadable or malformed key file, a TLS file that is not there,
            ``grpc_port`` without KServe's v2 messages installed, a port another process
            holds (the HTTP port is bound before anything is exported or loaded, and held:
            :func:`~zoo.deploy.serve.startup.listen`).
        ModelRefError / UnknownModelError: the reference does not parse.
        Everything :func:`zoo.deploy.export.onnx_export.export_onnx` raises, for an on-the-fly export.
        Everything :func:`zoo.deploy.runtimes.loader.load_classifier` raises: the model is loaded
            once, before the server serves, so a model it cannot run is refused, not served 503
            (with workers: the error's class and message, from the worker that loaded it).
    """
    from zoo.deploy.serve.app import create_app
    from zoo.deploy.serve.auth import check_exposure, load_keys

    setup_logging()
    keys = load_keys(cfg.api_key_file)  # at start-up, from the environment as it is now
    check_exposure(cfg.host, keys, allow_unauthenticated=cfg.allow_unauthenticated)
    check_tls(cfg)
    if cfg.grpc_port is not None:  # the v2 messages are there, before anything loads
        from zoo.deploy.serve.grpc_protocol import messages

        messages()
    refs = cfg.references()  # NAME= checked before anything is exported
    if cfg.grpc_port is not None:
        check_grpc_port(cfg.host, cfg.grpc_port)
    http = listen(cfg.host, cfg.port)
    try:
        cfg = replace(cfg, port=http.getsockname()[1])  # the port bound, for --port 0 too
        with tempfile.TemporaryDirectory() as tmp:
            files = []
            for i, (_, ref) in enumerate(refs):
                workdir = Path(tmp) / str(i)  # an export on the fly per model
                workdir.mkdir()
                path = resolve_onnx(ref, workdir)
                files.append((str(path), default_name(path)))
            cfg = cfg.resolved(files)
            if len(cfg.models) > 1 and not cfg.one_process:
                from zoo.deploy.serve.workers import serve_workers

                serve_workers(cfg, http)  # each model loaded in its worker, refused there alike
                return
            # loaded once, here: a model it cannot run is refused (exit 1) before the server
            # serves, rather than a server that answers 503 for ever; the app only warms it up
            loaded = {}
            for model in cfg.served():
                loaded[model.name] = load_served(model)
                log_model(cfg, model, loaded[model.name].threads)
            app = create_app(cfg, keys=keys, loaded=loaded)
            config = uvicorn_config(app, cfg)
            log_server(cfg, config, keys, "")
            graceful_server(config).run(sockets=[http])
    finally:
        http.close()
