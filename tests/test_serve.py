"""The real server: ``zoo serve`` under uvicorn on 127.0.0.1, real onnxruntime, and clients
nobody here wrote (httpx, tritonclient.http)."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.serving import NAME, binary_infer, binary_logits, json_infer, metric, server, x_of
from zoo.deploy.runtimes.loader import make_session
from zoo.samples import sample_image_paths

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def srv_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve") / "server.log"


@pytest.fixture(scope="module")
def srv(mobilenet_onnx: Path, srv_log: Path) -> Iterator[str]:
    with server(
        mobilenet_onnx,
        "--max-batch",
        "8",
        "--max-body-mb",
        "12",
        "--max-image-pixels",
        "2000000",
        log=srv_log,
    ) as (url, _):
        yield url


def test_health_metadata_and_readiness(srv: str) -> None:
    assert httpx.get(f"{srv}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{srv}/v2/health/ready").json() == {"ready": True}
    meta = httpx.get(f"{srv}/v2/models/{NAME}").json()
    assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]}
    assert meta["platform"] == "onnxruntime_onnx" and len(meta["parameters"]["classes"]) == 1000
    assert httpx.get(f"{srv}/v2/models/nope").status_code == 404


def test_tritonclient_and_httpx_match_direct_ort(srv: str, mobilenet_onnx: Path) -> None:
    import tritonclient.http as th

    sess = make_session(mobilenet_onnx)
    x = x_of(1, 3)
    direct = sess.run(None, {"input": x})[0]
    client = th.InferenceServerClient(srv.removeprefix("http://"))
    assert client.is_server_ready() and client.is_model_ready(NAME)
    for binary in (True, False):
        inp = th.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        res = client.infer(
            NAME, [inp], outputs=[th.InferRequestedOutput("logits", binary_data=binary)]
        )
        np.testing.assert_allclose(res.as_numpy("logits"), direct, rtol=1e-5, atol=1e-5)
    top = client.infer(
        NAME, [inp], outputs=[th.InferRequestedOutput("logits", binary_data=False, class_count=3)]
    )
    first = top.as_numpy("logits")[0][0]
    first = first.decode() if isinstance(first, bytes) else first
    assert int(first.split(":")[1]) == int(direct[0].argmax())
    r = httpx.post(f"{srv}/v2/models/{NAME}/infer", json=json_infer(x[:1]))
    assert r.status_code == 200
    out = r.json()["outputs"][0]
    assert out["shape"] == [1, 1000]
    np.testing.assert_allclose(
        np.array(out["data"]).reshape(1, 1000), direct[:1], rtol=1e-5, atol=1e-5
    )


def test_image_endpoint_raw_and_multipart(srv: str) -> None:
    chelsea, coffee = sample_image_paths()
    raw = httpx.post(
        f"{srv}/v2/models/{NAME}/predict?top_k=3",
        content=coffee.read_bytes(),
        headers={"content-type": "image/jpeg"},
    )
    assert raw.status_code == 200 and raw.json()["predictions"][0]["label"] == "espresso"
    form = httpx.post(
        f"{srv}/v2/models/{NAME}/predict",
        files={"file": ("c.jpg", chelsea.read_bytes(), "image/jpeg")},
    )
    assert form.status_code == 200
    assert form.json()["predictions"][0]["label"] in {"Egyptian cat", "tabby", "tiger cat"}
    two = [("file", (p.name, p.read_bytes(), "image/jpeg")) for p in (chelsea, coffee)]
    both = httpx.post(f"{srv}/v2/models/{NAME}/predict", files=two)
    assert both.status_code == 400 and "2 'file' file parts" in both.json()["error"], both.text


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (w, h)).save(buf, format="PNG")
    return buf.getvalue()


def test_bad_input_matrix_then_still_serving(srv: str) -> None:
    infer, predict = f"{srv}/v2/models/{NAME}/infer", f"{srv}/v2/models/{NAME}/predict"
    x = x_of(2)
    jpeg = sample_image_paths()[1].read_bytes()
    cases = [
        (infer, {"json": json_infer(x, dtype="INT64")}, 400, "INT64 data must be integers"),
        (infer, {"json": json_infer(np.round(x * 10), dtype="INT64")}, 400, "FP32"),
        (infer, {"json": json_infer(x[:, :, :100, :100])}, 400, "shape"),
        (infer, {"json": json_infer(x, name="pixels")}, 400, "unknown input"),
        (
            infer,
            {"content": json.dumps(json_infer(np.full((1, 3, 224, 224), np.nan, np.float32)))},
            400,
            "NaN",
        ),
        (infer, binary_infer(np.full((1, 3, 224, 224), np.inf, np.float32)), 400, "infinite"),
        (infer, {"content": b""}, 400, "empty"),
        (infer, {"content": b"{not json"}, 400, "JSON"),
        (infer, binary_infer(x_of(3, 9)), 400, "max-batch"),
        (
            predict,
            {"content": jpeg[: len(jpeg) // 3], "headers": {"content-type": "image/jpeg"}},
            400,
            "decode",
        ),
        (
            predict,
            {"content": os.urandom(5000), "headers": {"content-type": "image/jpeg"}},
            400,
            "decode",
        ),
        (predict, {"content": b""}, 400, "empty"),
        (predict + "?top_k=0", {"content": jpeg}, 400, "top_k=0: ask for 1 or more"),
        (predict, {"content": b"x" * (13 * 2**20)}, 413, "limit"),
        (
            predict,
            {"content": _png(3000, 3000), "headers": {"content-type": "image/png"}},
            413,
            "pixels",
        ),
    ]
    for url, kw, status, word in cases:
        r = httpx.post(url, timeout=30, **kw)
        assert r.status_code == status, (word, r.status_code, r.text[:200])
        assert word.lower() in r.json()["error"].lower(), r.json()
        ok = httpx.post(
            f"{srv}/v2/models/{NAME}/predict", content=jpeg, headers={"content-type": "image/jpeg"}
        )
        assert ok.status_code == 200, f"server broken after {word}"
    assert httpx.get(f"{srv}/v2/health/live").status_code == 200


def _v2(**over: object) -> bytes:
    tensor = {"name": "input", "shape": [1], "datatype": "FP32", "data": [0.0]}
    return json.dumps({"inputs": [tensor], **over}).encode()


def test_malformed_requests_are_4xx_in_one_log_line(srv: str, srv_log: Path) -> None:
    """Each cause of the 500s the first fuzzing found, over HTTP: a 4xx naming the field, one
    log line without a traceback, and the server still answers."""
    infer, predict = f"{srv}/v2/models/{NAME}/infer", f"{srv}/v2/models/{NAME}/predict"
    jpeg = sample_image_paths()[1].read_bytes()
    deep = b"[" * 100_000 + b"]" * 100_000
    cases = [
        (infer, {"content": _v2(outputs=[3])}, 400, "$.outputs[0]"),
        (infer, {"content": _v2(outputs={"name": "logits"})}, 400, "$.outputs"),
        (infer, {"content": _v2(parameters=[True])}, 400, "$.parameters"),
        (
            infer,
            {"content": _v2(outputs=[{"name": "logits", "parameters": "binary"}])},
            400,
            "$.outputs[0].parameters",
        ),
        (
            infer,
            {
                "content": json.dumps(
                    {
                        "inputs": [
                            {"name": "input", "shape": [1], "datatype": "FP32", "parameters": 1}
                        ]
                    }
                ).encode()
            },
            400,
            "$.inputs[0].parameters",
        ),
        (
            infer,
            {"content": _v2(outputs=[{"name": "logits", "parameters": {"classification": -3}}])},
            400,
            "classification",
        ),
        (
            infer,
            {"content": _v2(outputs=[{"name": "logits", "parameters": {"classification": "5"}}])},
            400,
            "classification",
        ),
        (
            infer,
            {"content": _v2()[:-1] + b', "parameters": {"x": ' + deep + b"}}"},
            400,
            "nested too deeply",
        ),
        (
            infer,
            {
                "content": json.dumps(
                    {
                        "inputs": [
                            {
                                "name": "input",
                                "shape": [2**32, 2**32],
                                "datatype": "FP32",
                                "data": [0.0],
                            }
                        ]
                    }
                ).encode()
            },
            413,
            "18,446,744,073,709,551,616 elements",
        ),
        (infer, {"content": _v2(), "headers": {"content-encoding": "gzip"}}, 415, "gzip"),
        (
            predict,
            {"content": jpeg, "headers": {"content-type": "multipart/form-data"}},
            400,
            "boundary",
        ),
        (
            predict,
            {"content": jpeg, "headers": {"content-type": "multipart/form-data; boundary=zz"}},
            400,
            "multipart",
        ),
    ]
    before = srv_log.read_text(errors="replace").count("\n")
    for url, kw, status, words in cases:
        r = httpx.post(url, timeout=30, **kw)
        assert r.status_code == status, (words, r.status_code, r.text[:300])
        assert words.lower() in r.json()["error"].lower(), r.json()
    ok = httpx.post(predict, content=jpeg, headers={"content-type": "image/jpeg"})
    assert ok.json()["predictions"][0]["label"] == "espresso"
    # each line is written (stderr, line-buffered) before its response is sent
    lines = srv_log.read_text(errors="replace").splitlines()[before:]
    answered = [line for line in lines if " -> 4" in line]
    assert len(answered) == len(cases), lines
    assert "Traceback" not in srv_log.read_text(errors="replace")
    errors = metric(
        httpx.get(f"{srv}/metrics").text, 'zoo_requests_total{endpoint="infer",outcome="error"}'
    )
    assert errors == 0


def test_concurrent_requests_are_batched_without_cross_talk(srv: str, mobilenet_onnx: Path) -> None:
    sess = make_session(mobilenet_onnx)
    before = httpx.get(f"{srv}/metrics").text
    xs = [x_of(100 + i) for i in range(24)]

    def call(x: np.ndarray) -> np.ndarray:
        r = httpx.post(f"{srv}/v2/models/{NAME}/infer", json=json_infer(x), timeout=60)
        assert r.status_code == 200, r.text
        return np.array(r.json()["outputs"][0]["data"], np.float32).reshape(1, 1000)

    with ThreadPoolExecutor(24) as pool:
        outs = list(pool.map(call, xs))
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(y, sess.run(None, {"input": x})[0], rtol=1e-4, atol=1e-4)
    after = httpx.get(f"{srv}/metrics").text
    calls = metric(after, "zoo_batch_size_count") - metric(before, "zoo_batch_size_count")
    samples = metric(after, "zoo_batch_size_sum") - metric(before, "zoo_batch_size_sum")
    assert samples == 24 and calls < 24, (calls, samples)  # some requests shared an ORT call
    assert "zoo_queue_seconds_bucket" in after and "zoo_compute_seconds_count" in after


def test_max_delay_combines_multi_sample_requests_and_slices_them_back(
    mobilenet_onnx: Path,
) -> None:
    """``--max-delay-ms`` gathers a fuller batch: requests of 1, 2, 3 and 2 samples sent one
    after another become ONE ORT call of 8, and each response is exactly its own inputs'
    direct ORT output (a batch sliced at the wrong offset fails here)."""
    sess = make_session(mobilenet_onnx)
    sizes = [1, 2, 3, 2]
    xs = [x_of(300 + i, n) for i, n in enumerate(sizes)]
    with server(mobilenet_onnx, "--max-batch", "8", "--max-delay-ms", "5000") as (url, _):
        before = httpx.get(f"{url}/metrics").text

        def call(x: np.ndarray) -> np.ndarray:
            r = httpx.post(f"{url}/v2/models/{NAME}/infer", timeout=60, **binary_infer(x))
            return binary_logits(r, len(x))

        with ThreadPoolExecutor(len(xs)) as pool:
            futures = []
            for x in xs:  # staggered: only the delay can put them in one call
                futures.append(pool.submit(call, x))
                time.sleep(0.05)
            outs = [f.result() for f in futures]
        after = httpx.get(f"{url}/metrics").text
    calls = metric(after, "zoo_batch_size_count") - metric(before, "zoo_batch_size_count")
    samples = metric(after, "zoo_batch_size_sum") - metric(before, "zoo_batch_size_sum")
    assert (calls, samples) == (1, 8)
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(y, sess.run(None, {"input": x})[0], rtol=1e-4, atol=1e-4)


def test_queue_full_gives_429_with_retry_after(mobilenet_onnx: Path) -> None:
    with server(mobilenet_onnx, "--max-batch", "1", "--max-queue", "1", "--threads", "1") as (
        url,
        _,
    ):
        x = json_infer(x_of(5, 1))

        def call(_: int) -> httpx.Response:
            return httpx.post(f"{url}/v2/models/{NAME}/infer", json=x, timeout=60)

        with ThreadPoolExecutor(12) as pool:
            responses = list(pool.map(call, range(12)))
        codes = [r.status_code for r in responses]
        assert 429 in codes and 200 in codes and set(codes) <= {200, 429}, codes
        busy = next(r for r in responses if r.status_code == 429)
        assert busy.headers["retry-after"] == "1" and "queue full" in busy.json()["error"]


def test_timeout_gives_504_overload_429_and_an_idle_server_admits_again(
    mobilenet_onnx: Path,
) -> None:
    """The first request (nothing timed yet) is admitted and outlasts a 1 ms timeout: 504.
    Once a batch has been timed, requests that find work ahead of them are refused at once
    (429); when the server is idle again it admits again (a 504 here, never a lock-out)."""
    with server(mobilenet_onnx, "--max-batch", "1", "--timeout-ms", "1", "--threads", "1") as (
        url,
        _,
    ):
        x = json_infer(x_of(6, 1))

        def call(_: int) -> httpx.Response:
            return httpx.post(f"{url}/v2/models/{NAME}/infer", json=x, timeout=60)

        assert call(0).status_code == 504
        time.sleep(0.5)  # the late batch finishes and is timed
        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(call, range(8)))
        codes = [r.status_code for r in responses]
        assert 429 in codes and set(codes) <= {429, 504}, codes
        busy = [r for r in responses if r.status_code == 429]
        assert all(int(r.headers["retry-after"]) >= 1 for r in busy)
        assert "over the 0.001 s timeout" in busy[0].json()["error"]
        time.sleep(0.5)
        assert call(0).status_code == 504  # idle again: admitted, not refused
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200


def _queued(url: str) -> float:
    return metric(httpx.get(f"{url}/metrics").text, "zoo_queue_depth")


def test_sigterm_under_load_finishes_in_flight(mobilenet_onnx: Path) -> None:
    n = 10
    with server(mobilenet_onnx, "--max-batch", "8", "--threads", "1") as (url, proc):
        body = binary_infer(x_of(7, 8))  # 8 samples a request: each takes a while on one thread
        # One client with a connection per request: every body goes out at once (a client per
        # request spends GIL-bound set-up time each, spreading the arrivals so thin that on a
        # fast machine each batch finished before the next request came: no queue ever formed).
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        with httpx.Client(timeout=60, limits=limits) as client:

            def call(_: int) -> tuple[int | str, float]:
                try:
                    r = client.post(f"{url}/v2/models/{NAME}/infer", **body)
                except httpx.ConnectError:  # arrived after the listener closed: never accepted
                    return "refused", time.monotonic()
                return r.status_code, time.monotonic()

            with ThreadPoolExecutor(n) as pool:
                futures = [pool.submit(call, i) for i in range(n)]
                deadline = time.monotonic() + 30  # wait for a queue, not for a guessed time
                while (
                    _queued(url) < 5
                    and time.monotonic() < deadline
                    and not all(f.done() for f in futures)
                ):
                    time.sleep(0.01)
                queued = _queued(url)
                done = [f.result() for f in futures if f.done()]
                assert queued >= 3, f"only {queued} requests queued; finished already: {done}"
                sent = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                results = [f.result() for f in futures]
        codes = [c for c, _ in results]
        assert set(codes) <= {200, "refused"} and codes.count(200) >= queued + 1, results
        late = [t for c, t in results if c == 200 and t > sent]
        assert len(late) >= queued, "the queued requests were answered after SIGTERM"
        assert proc.wait(30) == 0


def test_triton_repository_parses_with_triton_schema(tmp_path: Path, mobilenet_weights) -> None:
    from tests.conftest import run_zoo
    from zoo.deploy.export.triton import validate_config

    r = run_zoo(
        "export",
        "mobilenet_v2",
        "--format",
        "triton",
        "-o",
        str(tmp_path / "repo"),
        "--max-batch",
        "16",
    )
    assert r.returncode == 0, r.stderr
    model_dir = tmp_path / "repo" / "mobilenet_v2.tv_in1k"
    cfg = validate_config((model_dir / "config.pbtxt").read_text())
    assert cfg.platform == "onnxruntime_onnx" and cfg.max_batch_size == 16
    assert list(cfg.input[0].dims) == [3, 224, 224] and list(cfg.output[0].dims) == [1000]
    assert cfg.output[0].label_filename == "labels.txt" and cfg.HasField("dynamic_batching")
    assert (model_dir / "1" / "model.onnx").is_file()
    assert len((model_dir / "labels.txt").read_text().splitlines()) == 1000


def test_a_client_that_hangs_up_mid_body_is_no_fault_of_ours(srv: str, srv_log: Path) -> None:
    """A client that closes its connection before the body it announced has arrived (a
    dropped upload) is counted as ``client_closed``: no 500, no traceback, and the server
    answers the next request."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(srv)
    for path, ctype in (
        (f"/v2/models/{NAME}/infer", "application/json"),
        (f"/v2/models/{NAME}/predict", "multipart/form-data; boundary=xyz"),
    ):
        with socket.create_connection((url.hostname, url.port), timeout=10) as conn:
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
            conn.sendall(f"{head}Content-Length: 100000\r\n\r\n".encode() + b"{" * 1000)
            time.sleep(0.2)  # the server is reading the body when the client goes
    metrics = ""
    for _ in range(100):
        metrics = httpx.get(f"{srv}/metrics").text
        closed = [
            metric(metrics, f'zoo_requests_total{{endpoint="{e}",outcome="client_closed"}}')
            for e in ("infer", "predict")
        ]
        if all(closed):
            break
        time.sleep(0.1)
    assert closed == [1, 1], metrics
    for endpoint in ("infer", "predict"):
        assert metric(metrics, f'zoo_requests_total{{endpoint="{endpoint}",outcome="error"}}') == 0
    assert "Traceback" not in srv_log.read_text(errors="replace")
    assert httpx.get(f"{srv}/v2/health/ready").status_code == 200
