"""API keys and TLS of ``zoo serve``: one real server (HTTPS with a self-signed certificate
made here, a key file of three keys with different scopes, gRPC over the same TLS), real
clients (httpx, KServe's SDK over REST and gRPC, tritonclient.http), and one test for each
API-key defect LitServe fixed (the key read at import, a compare that is not constant-time,
the key in logs, one key for every route)."""

from __future__ import annotations

import asyncio
import hmac
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import run_zoo
from tests.serving import (
    NAME,
    binary_infer,
    free_port,
    kserve_infer,
    kserve_request,
    self_signed_cert,
    server,
    x_of,
)
from zoo.deploy.runtimes.loader import make_session
from zoo.deploy.serve.auth import (
    ENV_VAR,
    ApiKeys,
    Verdict,
    check_exposure,
    is_loopback,
    parse_key_file,
)
from zoo.errors import InputError, UsageError

pytestmark = pytest.mark.serve

ALL = "all-scopes-0123456789abcdef-ALL"  # no scope listed: every scope
INFER = "infer-only-0123456789abcdef"
OPS = "ops-0123456789abcdef-metadata+metrics"
KEYS = (ALL, INFER, OPS)
WRONG_SAME_LENGTH = "x" * len(ALL)
WRONG_OTHER_LENGTH = "y" * (len(ALL) + 17)
KEYED = {  # path -> scope, a GET per path (the POST endpoints are in the scope matrix)
    "/": "metadata",
    "/v2": "metadata",
    f"/v2/models/{NAME}": "metadata",
    f"/v2/models/{NAME}/ready": "metadata",
    "/openapi.json": "metadata",
    "/metrics": "metrics",
}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def srv_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-auth") / "server.log"


@pytest.fixture(scope="module")
def srv(
    mobilenet_onnx: Path,
    tls: tuple[Path, Path, Any],
    srv_log: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, int]]:
    """The keyed HTTPS server (and gRPC over TLS); once it has shut down, its whole log is
    searched for every key."""
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(
        f"# zoo serve keys\n{ALL}\n{INFER}  infer   # the app\n{OPS} metadata,metrics\n"
    )
    key_file.chmod(0o600)
    cert, key, ctx = tls
    grpc_port = free_port()
    args = ["--api-key-file", str(key_file), "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    args += ["--grpc-port", str(grpc_port), "--max-batch", "4"]
    with server(mobilenet_onnx, *args, log=srv_log, verify=ctx) as (url, _):
        yield url, grpc_port
    text = srv_log.read_text(errors="replace")
    assert "API keys: 3" in text  # the run did log; none of it is a key
    assert not [k for k in KEYS if k in text], "an API key was written to the server's log"


@pytest.fixture(scope="module")
def direct(mobilenet_onnx: Path) -> Any:
    sess = make_session(mobilenet_onnx)
    return lambda x: sess.run(None, {"input": x})[0]


def test_health_is_open_everything_else_needs_a_key(
    srv: tuple[str, int], tls: tuple[Path, Path, Any]
) -> None:
    url, _ = srv
    ctx = tls[2]
    with httpx.Client(verify=ctx, timeout=60) as client:
        assert client.get(f"{url}/v2/health/live").json() == {"live": True}
        assert client.get(f"{url}/v2/health/ready").json() == {"ready": True}
        for path in KEYED:
            for headers, challenge in [
                ({}, 'Bearer realm="zoo"'),
                ({"Authorization": f"Basic {ALL}"}, 'Bearer realm="zoo"'),
                (bearer(WRONG_SAME_LENGTH), 'Bearer realm="zoo", error="invalid_token"'),
                (bearer(WRONG_OTHER_LENGTH), 'Bearer realm="zoo", error="invalid_token"'),
                (bearer(ALL[:-1]), 'Bearer realm="zoo", error="invalid_token"'),
            ]:
                r = client.get(f"{url}{path}", headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.headers["www-authenticate"] == challenge
                assert "key" in r.json()["error"] and ALL not in r.text
            assert client.get(f"{url}{path}", headers=bearer(ALL)).status_code == 200, path
        r = client.post(f"{url}/v2/models/{NAME}/infer", **binary_infer(x_of(1)))
        assert r.status_code == 401
        # a path that does not exist tells a client without a key nothing more than 401
        for headers in ({}, bearer(WRONG_OTHER_LENGTH)):
            r = client.get(f"{url}/no/such/path", headers=headers)
            assert r.status_code == 401 and "www-authenticate" in r.headers, r.text
        assert client.get(f"{url}/no/such/path", headers=bearer(INFER)).status_code == 404
    with pytest.raises(httpx.TransportError):  # TLS only: plain HTTP gets no answer
        httpx.get(url.replace("https://", "http://") + "/v2/health/live", timeout=10)


def test_each_key_opens_only_its_scopes(srv: tuple[str, int], tls: tuple[Path, Path, Any]) -> None:
    url, _ = srv
    x = x_of(2)
    jpeg = {"content": b"", "headers": {"content-type": "image/jpeg"}}
    calls = {  # scope -> a request of that route group
        "infer": lambda c, h: c.post(
            f"{url}/v2/models/{NAME}/infer",
            **{**binary_infer(x), "headers": {**binary_infer(x)["headers"], **h}},
        ),
        "predict": lambda c, h: c.post(
            f"{url}/v2/models/{NAME}/predict",
            content=jpeg["content"],
            headers={**jpeg["headers"], **h},
        ),
        "metadata": lambda c, h: c.get(f"{url}/v2/models/{NAME}", headers=h),
        "metrics": lambda c, h: c.get(f"{url}/metrics", headers=h),
    }
    granted = {
        ALL: {"infer", "predict", "metadata", "metrics"},
        INFER: {"infer", "predict"},
        OPS: {"metadata", "metrics"},
    }
    with httpx.Client(verify=tls[2], timeout=60) as client:
        for key, scopes in granted.items():
            for what, call in calls.items():
                r = call(client, bearer(key))
                if what in scopes:  # let in (the empty image is then the client's 400)
                    assert r.status_code in (200, 400), (key, what, r.text[:200])
                    assert r.status_code == (400 if what == "predict" else 200)
                else:
                    assert r.status_code == 403, (key, what, r.status_code)
                    scope = "infer" if what == "predict" else what
                    assert r.headers["www-authenticate"] == (
                        f'Bearer realm="zoo", error="insufficient_scope", scope="{scope}"'
                    )
                    assert f"{scope!r} scope" in r.json()["error"]
        metrics = client.get(f"{url}/metrics", headers=bearer(OPS)).text
    assert 'zoo_auth_refusals_total{reason="forbidden",scope="metrics"}' in metrics


def test_clients_send_the_key_kserve_sdk_tritonclient_and_grpc_over_tls(
    srv: tuple[str, int], tls: tuple[Path, Path, Any], direct: Any
) -> None:
    import kserve
    import tritonclient.http as th

    url, grpc_port = srv
    cert, _, ctx = tls
    x = x_of(3, 2)
    res = kserve_infer(url, kserve_request(x, binary=True), headers=bearer(INFER), verify=ctx)
    np.testing.assert_allclose(res.outputs[0].as_numpy(), direct(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(httpx.HTTPStatusError) as info:
        kserve_infer(url, kserve_request(x, binary=True), headers=bearer(OPS), verify=ctx)
    assert info.value.response.status_code == 403

    client = th.InferenceServerClient(
        url.removeprefix("https://"), ssl=True, ssl_options={"ca_certs": str(cert)}
    )
    try:
        assert client.is_server_ready()  # health: no key
        inp = th.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        got = client.infer(NAME, [inp], headers=bearer(ALL)).as_numpy("logits")
        np.testing.assert_allclose(got, direct(x), rtol=1e-5, atol=1e-5)
        with pytest.raises(th.InferenceServerException) as refused:
            client.infer(NAME, [inp], headers=bearer(WRONG_OTHER_LENGTH))
        assert "401" in str(refused.value.status())
    finally:
        client.close()

    async def grpc_calls() -> tuple[Any, str, bool]:
        import grpc

        channel = kserve.InferenceGRPCClient(
            f"localhost:{grpc_port}", use_ssl=True, root_certificates=str(cert), retries=0
        )
        try:
            live = await channel.is_server_live()
            request = kserve_request(x, binary=True)
            try:
                await channel.infer(request, headers=(("authorization", f"Bearer {OPS}"),))
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
            answer = await channel.infer(request, headers=(("authorization", f"Bearer {INFER}"),))
            return answer, code, live
        finally:
            await channel.close()

    answer, code, live = asyncio.run(grpc_calls())
    assert live and code == "PERMISSION_DENIED"
    np.testing.assert_allclose(answer.outputs[0].as_numpy(), direct(x), rtol=1e-5, atol=1e-5)


def test_the_key_is_never_logged_nor_in_metrics_or_error_bodies(
    srv: tuple[str, int], tls: tuple[Path, Path, Any], srv_log: Path
) -> None:
    """Every way a key reaches the server, right or wrong, in headers and bodies; then no
    log line, /metrics text or error body holds it (the fixture searches the whole log
    again after shutdown)."""
    url, _ = srv
    bodies = []
    with httpx.Client(verify=tls[2], timeout=60) as client:
        for key in (*KEYS, WRONG_SAME_LENGTH, WRONG_OTHER_LENGTH):
            for path in ("/v2", "/metrics", f"/v2/models/{NAME}", "/v2/models/nope"):
                bodies.append(client.get(f"{url}{path}", headers=bearer(key)).text)
            bad = client.post(  # a client error logged while a key is in the header
                f"{url}/v2/models/{NAME}/infer", content=b"{not json", headers=bearer(key)
            )
            assert bad.status_code in (400, 401, 403)
            bodies.append(bad.text)
            bodies.append(client.get(f"{url}/metrics", headers=bearer(ALL)).text)
    log = srv_log.read_text(errors="replace")
    assert " -> 401" in log and " -> 403" in log and " -> 400" in log  # refusals were logged
    for key in KEYS:
        assert key not in log
        assert not [b for b in bodies if key in b]


def test_keys_are_read_at_start_up_not_at_import() -> None:
    """LitServe read its key when the module was imported: a key set afterwards (by a
    launcher, a test, a notebook) left the server open. In a fresh process, everything a
    server imports is imported first, then the variable is set: the start-up reads it (one
    key, every scope); and a variable gone by start-up leaves no key behind."""
    code = f"""
import os
os.environ.pop("{ENV_VAR}", None)
import zoo.cli.app, zoo.cli.serve, zoo.deploy.serve.run
from zoo.deploy.serve import auth
from zoo.deploy.serve.app import create_app
from zoo.deploy.serve.config import ServeConfig
from starlette.testclient import TestClient
os.environ["{ENV_VAR}"] = "{INFER}"
keys = auth.load_keys(None)
client = TestClient(create_app(ServeConfig("unused.onnx", "{NAME}"), keys=keys))
assert client.get("/v2").status_code == 401
assert client.get("/v2", headers={{"Authorization": "Bearer {INFER}"}}).status_code == 200
assert client.get("/v2/health/live").status_code == 200  # no lifespan: routes and keys only
del os.environ["{ENV_VAR}"]
assert auth.load_keys(None) is None
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_wrong_keys_of_any_length_take_the_same_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key of another length is hashed first, like a wrong key of the right length: both
    run the same lines and compare 32-byte digests against every stored key, in
    ``hmac.compare_digest`` (LitServe compared the strings with ``==``)."""
    keys = parse_key_file("\n".join(KEYS), "keys.txt")
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)

    def trace(header: str) -> tuple[Verdict, list[int]]:
        lines: list[int] = []
        code = ApiKeys.scopes_of.__code__, ApiKeys.check.__code__

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            if frame.f_code in code:
                if event == "line":
                    lines.append(frame.f_lineno)
                return tracer
            return None

        sys.settrace(tracer)
        try:
            verdict = keys.check(header, "infer")
        finally:
            sys.settrace(None)
        return verdict, lines

    paths = {}
    for key in (WRONG_SAME_LENGTH, WRONG_OTHER_LENGTH, "z", "w" * 4096):
        compared.clear()
        verdict, paths[key] = trace(f"Bearer {key}")
        assert verdict is Verdict.INVALID
        assert compared == [(32, 32)] * len(KEYS)  # every key, digests only
    assert len({tuple(p) for p in paths.values()}) == 1, paths
    compared.clear()
    assert trace(f"Bearer {INFER}")[0] is Verdict.OK and compared == [(32, 32)] * len(KEYS)


def test_exposure_key_files_and_tls_options_are_checked(
    mobilenet_onnx: Path, tmp_path: Path
) -> None:
    """A non-loopback bind without a key exits 2 before anything loads; a bad key file
    exits 1 naming the line, never the key."""
    r = run_zoo("serve", str(mobilenet_onnx), "--host", "0.0.0.0", env={ENV_VAR: ""})
    assert r.returncode == 2, r.stderr
    assert "--api-key-file" in r.stderr and "--allow-unauthenticated" in r.stderr
    bad = tmp_path / "keys.txt"
    secret = "short-secret"
    bad.write_text(f"{ALL}\n{secret} infer\n")
    r = run_zoo("serve", str(mobilenet_onnx), "--api-key-file", str(bad))
    assert r.returncode == 1 and "line 2" in r.stderr and "16" in r.stderr, r.stderr
    assert secret not in r.stderr + r.stdout
    r = run_zoo("serve", str(mobilenet_onnx), "--ssl-keyfile", str(bad))
    assert r.returncode == 2 and "--ssl-certfile" in r.stderr, r.stderr
    for text, words in [
        (f"{ALL} infer,admin", "unknown scope 'admin'"),
        (f"{ALL}\n{ALL} metrics", "already given"),
        ("# nothing\n", "no API key"),
    ]:
        with pytest.raises(InputError, match=words) as info:
            parse_key_file(text, "keys.txt")
        assert ALL not in str(info.value)
    for host, loopback in [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.org", False),
    ]:
        assert is_loopback(host) is loopback, host
    with pytest.raises(UsageError):
        check_exposure("::", None, allow_unauthenticated=False)
    check_exposure("::", None, allow_unauthenticated=True)  # said explicitly: allowed
    check_exposure("0.0.0.0", parse_key_file(ALL, "k"), allow_unauthenticated=False)


def test_tls_files_that_do_not_load_together_are_refused_before_anything_loads(
    tls: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    """A certificate that is not PEM, a key made for another certificate and an encrypted
    key exit 1 naming the files, before a model loads (uvicorn would fail only at start, with
    a traceback, or prompt for a password on a server's terminal)."""
    from cryptography.hazmat.primitives import serialization

    from tests.conftest import zoo_here
    from zoo.deploy.serve.config import ServeConfig
    from zoo.deploy.serve.run import check_tls

    cert, key, _ = tls
    (tmp_path / "other").mkdir()
    _, other_key, _ = self_signed_cert(tmp_path / "other")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    locked = tmp_path / "locked.pem"
    loaded = serialization.load_pem_private_key(key.read_bytes(), None)
    locked.write_bytes(
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    check_tls(ServeConfig(model_path="m", ssl_certfile=str(cert), ssl_keyfile=str(key)))  # a pair
    for cert_file, key_file, words in [
        (junk, key, f"--ssl-certfile {junk} with --ssl-keyfile {key} do not load"),
        (cert, other_key, f"--ssl-certfile {cert} with --ssl-keyfile {other_key} do not load"),
        (cert, locked, f"--ssl-keyfile {locked}: the private key is encrypted"),
    ]:
        args = ["--ssl-certfile", str(cert_file), "--ssl-keyfile", str(key_file)]
        r = zoo_here("serve", "no-such-model-is-loaded", *args)
        assert r.returncode == 1, r.stderr
        assert words in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize("option", ["--port", "--grpc-port"])
def test_a_port_another_process_holds_is_refused_before_anything_loads(
    option: str, mobilenet_onnx: Path, tmp_path: Path
) -> None:
    """Bound after the model loaded, a taken HTTP port aborted the server (exit 134, "terminate
    called without an active exception") and a taken gRPC port raised a traceback; now both
    exit 1 naming the port, and the one- and two-model servers check it alike."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        for models in ([str(mobilenet_onnx)], [f"a={mobilenet_onnx}", f"b={mobilenet_onnx}"]):
            extra = [option, port] if option == "--port" else ["--port", "0", option, port]
            r = run_zoo("serve", *models, *extra, timeout=120)
            assert r.returncode == 1, (models, r.returncode, r.stderr[-2000:])
            assert f"{option} {port}: cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
            assert "Traceback" not in r.stderr and "terminate called" not in r.stderr
