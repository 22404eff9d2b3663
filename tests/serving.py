"""Helpers of the serving tests: the real ``zoo serve`` under uvicorn on 127.0.0.1, and the
request bodies clients send (KServe v2 JSON and binary tensors)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import ZOO
from zoo.deploy.serve.app import create_app
from zoo.deploy.serve.auth import ApiKeys
from zoo.deploy.serve.config import ServeConfig
from zoo.deploy.serve.model import ModelServer

NAME = "mobilenet_v2.tv_in1k"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(
    model: Path | str,
    *args: str,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    verify: Any = True,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ready ``zoo serve`` process; its output goes to ``log`` (a file: a pipe nobody reads
    would fill up and block the server once it has logged ~64 KB of client errors).

    Args:
        env: variables added to the server's environment (``ZOO_API_KEY``).
        verify: with ``--ssl-certfile`` among ``args``: how the readiness probe checks the
            certificate (an ``ssl.SSLContext`` trusting it); the URL is then ``https://``.
    """
    port = free_port()
    if log is None:
        fd, name = tempfile.mkstemp(suffix=".zoo-serve.log")
        os.close(fd)
        log = Path(name)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [ZOO, "serve", str(model), "--port", str(port), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    scheme = "https" if "--ssl-certfile" in args else "http"
    url = f"{scheme}://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                ready = httpx.get(f"{url}/v2/health/ready", timeout=1, verify=verify)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text(errors="replace")
            time.sleep(0.2)
        else:
            pytest.fail("server never became ready:\n" + log.read_text(errors="replace"))
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def x_of(seed: int, n: int = 1, size: int = 224) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, size, size)).astype(np.float32)


def json_infer(x: np.ndarray, name: str = "input", dtype: str = "FP32", **extra: Any) -> dict:
    """A v2 JSON inference request of one tensor; ``extra``: more of the request's fields
    (``id``, ``outputs``)."""
    return {
        "inputs": [
            {"name": name, "shape": list(x.shape), "datatype": dtype, "data": x.ravel().tolist()}
        ],
        **extra,
    }


def binary_infer(x: np.ndarray) -> dict:
    """The binary-tensor extension: JSON header, then the raw little-endian tensor."""
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return {
        "content": head + x.tobytes(),
        "headers": {"Inference-Header-Content-Length": str(len(head))},
    }


def binary_logits(r: httpx.Response, n: int, classes: int = 1000) -> np.ndarray:
    """The FP32 output tensor of a binary-extension response."""
    assert r.status_code == 200, r.text[:300]
    head = int(r.headers["inference-header-content-length"])
    return np.frombuffer(r.content[head:], np.float32).reshape(n, classes)


def metric(text: str, name: str) -> float:
    """Sum of a Prometheus metric's samples (all label sets)."""
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    )


@contextmanager
def in_process_server(
    cfg: ServeConfig, keys: ApiKeys | None = None, *, ready: bool = False
) -> Iterator[tuple[str, ModelServer]]:
    """``create_app`` under a real uvicorn on loopback, in a thread of this process, so a test
    can instrument the model (the CLI server is a separate process). ``ready``: yield only
    once every model is loaded and warmed up (else as soon as uvicorn listens: the model may
    still answer 503)."""
    app = create_app(cfg, keys=keys)
    with in_process_asgi(app, cfg.port) as url:
        deadline = time.time() + 120
        while ready and not app.state.models.ready:
            assert time.time() < deadline, "the model was not ready within 120 s"
            time.sleep(0.02)
        yield url, app.state.server


@contextmanager
def in_process_asgi(app: Any, port: int) -> Iterator[str]:
    """An ASGI app under a real uvicorn on 127.0.0.1:``port``, in a thread; its URL."""
    import threading

    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.time() + 60
        while not srv.started:
            assert thread.is_alive() and time.time() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(60)


def kserve_infer(
    url: str,
    request: Any,
    model: str = NAME,
    *,
    headers: dict[str, str] | None = None,
    verify: Any = True,
) -> Any:
    """One ``InferenceRESTClient.infer`` (the SDK is async), its client closed afterwards.

    Args:
        headers: sent with the request (``Authorization``).
        verify: the SDK's TLS verification (an ``ssl.SSLContext`` trusting a test's cert).
    """
    import kserve  # the test extra's (a missing one fails, not skips); imported late: ~1 s

    async def go() -> Any:
        config = kserve.RESTConfig(protocol="v2", retries=0, verify=verify)
        client = kserve.InferenceRESTClient(config)
        try:
            return await client.infer(url, request, model_name=model, headers=headers)
        finally:
            await client.close()

    return asyncio.run(go())


def kserve_request(
    x: np.ndarray, *, binary: bool, datatype: str = "FP32", model: str = NAME
) -> Any:
    import kserve

    inp = kserve.InferInput("input", list(x.shape), datatype)
    inp.set_data_from_numpy(x, binary_data=binary)
    return kserve.InferRequest(model_name=model, infer_inputs=[inp], request_id="sdk-1")


def self_signed_cert(folder: Path) -> tuple[Path, Path, Any]:
    """A self-signed certificate for 127.0.0.1 and localhost (made with ``cryptography``),
    its private key, and an ``ssl.SSLContext`` that trusts it: ``(cert.pem, key.pem, ctx)``."""
    import datetime
    import ipaddress
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "zoo test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path, ssl.create_default_context(cafile=str(cert_path))
