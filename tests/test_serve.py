"""The real server: ``zoo serve`` under uvicorn on 127.0.0.1, real onnxruntime, and clients
nobody here wrote (httpx, tritonclient.http)."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.conftest import ZOO
from zoo.deploy.runtime import make_session
from zoo.samples import sample_image_paths

pytestmark = pytest.mark.serve
NAME = "mobilenet_v2.tv_in1k"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(model: Path | str, *args: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = _free_port()
    proc = subprocess.Popen(
        [ZOO, "serve", str(model), "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            time.sleep(0.2)
        else:
            pytest.fail("server never became ready")
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def srv(mobilenet_onnx: Path) -> Iterator[str]:
    with server(
        mobilenet_onnx, "--max-batch", "8", "--max-body-mb", "12", "--max-image-pixels", "2000000"
    ) as (url, _):
        yield url


def _x(seed: int, n: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 224, 224)).astype(np.float32)


def _json_infer(x: np.ndarray, name: str = "input", dtype: str = "FP32") -> dict:
    return {
        "inputs": [
            {"name": name, "shape": list(x.shape), "datatype": dtype, "data": x.ravel().tolist()}
        ]
    }


def _binary_infer(x: np.ndarray) -> dict:
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
            ]
        }
    ).encode()
    return {
        "content": head + x.tobytes(),
        "headers": {"Inference-Header-Content-Length": str(len(head))},
    }


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
    x = _x(1, 3)
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
    r = httpx.post(f"{srv}/v2/models/{NAME}/infer", json=_json_infer(x[:1]))
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


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (w, h)).save(buf, format="PNG")
    return buf.getvalue()


def test_bad_input_matrix_then_still_serving(srv: str) -> None:
    infer, predict = f"{srv}/v2/models/{NAME}/infer", f"{srv}/v2/models/{NAME}/predict"
    x = _x(2)
    jpeg = sample_image_paths()[1].read_bytes()
    cases = [
        (infer, {"json": _json_infer(x, dtype="INT64")}, 400, "FP32"),
        (infer, {"json": _json_infer(x[:, :, :100, :100])}, 400, "shape"),
        (infer, {"json": _json_infer(x, name="pixels")}, 400, "unknown input"),
        (
            infer,
            {"content": json.dumps(_json_infer(np.full((1, 3, 224, 224), np.nan, np.float32)))},
            400,
            "NaN",
        ),
        (infer, {"content": b""}, 400, "empty"),
        (infer, {"content": b"{not json"}, 400, "JSON"),
        (infer, _binary_infer(_x(3, 9)), 400, "max-batch"),
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


def _metric(text: str, name: str) -> float:
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    )


def test_concurrent_requests_are_batched_without_cross_talk(srv: str, mobilenet_onnx: Path) -> None:
    sess = make_session(mobilenet_onnx)
    before = httpx.get(f"{srv}/metrics").text
    xs = [_x(100 + i) for i in range(24)]

    def call(x: np.ndarray) -> np.ndarray:
        r = httpx.post(f"{srv}/v2/models/{NAME}/infer", json=_json_infer(x), timeout=60)
        assert r.status_code == 200, r.text
        return np.array(r.json()["outputs"][0]["data"], np.float32).reshape(1, 1000)

    with ThreadPoolExecutor(24) as pool:
        outs = list(pool.map(call, xs))
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(y, sess.run(None, {"input": x})[0], rtol=1e-4, atol=1e-4)
    after = httpx.get(f"{srv}/metrics").text
    calls = _metric(after, "zoo_batch_size_count") - _metric(before, "zoo_batch_size_count")
    samples = _metric(after, "zoo_batch_size_sum") - _metric(before, "zoo_batch_size_sum")
    assert samples == 24 and calls < 24, (calls, samples)  # some requests shared an ORT call
    assert "zoo_queue_seconds_bucket" in after and "zoo_compute_seconds_count" in after


def test_queue_full_gives_429_with_retry_after(mobilenet_onnx: Path) -> None:
    with server(mobilenet_onnx, "--max-batch", "1", "--max-queue", "1", "--threads", "1") as (
        url,
        _,
    ):
        x = _json_infer(_x(5, 1))

        def call(_: int) -> httpx.Response:
            return httpx.post(f"{url}/v2/models/{NAME}/infer", json=x, timeout=60)

        with ThreadPoolExecutor(12) as pool:
            responses = list(pool.map(call, range(12)))
        codes = [r.status_code for r in responses]
        assert 429 in codes and 200 in codes and set(codes) <= {200, 429}, codes
        busy = next(r for r in responses if r.status_code == 429)
        assert busy.headers["retry-after"] == "1" and "queue full" in busy.json()["error"]


def test_timeout_gives_504(mobilenet_onnx: Path) -> None:
    with server(mobilenet_onnx, "--max-batch", "1", "--timeout-ms", "1", "--threads", "1") as (
        url,
        _,
    ):
        x = _json_infer(_x(6, 1))
        with ThreadPoolExecutor(8) as pool:
            codes = [
                r.status_code
                for r in pool.map(
                    lambda _: httpx.post(f"{url}/v2/models/{NAME}/infer", json=x, timeout=60),
                    range(8),
                )
            ]
        assert 504 in codes and set(codes) <= {200, 504}, codes
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200


def test_sigterm_under_load_finishes_in_flight(mobilenet_onnx: Path) -> None:
    with server(mobilenet_onnx, "--max-batch", "8", "--threads", "1") as (url, proc):
        body = _binary_infer(_x(7, 8))  # 8 samples a request: each takes a while on one thread

        def call(_: int) -> tuple[int, float]:
            r = httpx.post(f"{url}/v2/models/{NAME}/infer", timeout=60, **body)
            return r.status_code, time.monotonic()

        with ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(call, i) for i in range(6)]
            time.sleep(0.25)  # all six are connected and queued or computing
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            results = [f.result() for f in futures]
        assert [c for c, _ in results] == [200] * 6, results
        assert max(t for _, t in results) > sent, "some requests were still in flight at SIGTERM"
        assert proc.wait(30) == 0


def test_triton_repository_parses_with_triton_schema(tmp_path: Path, mobilenet_weights) -> None:
    from tests.conftest import run_zoo
    from zoo.deploy.triton import validate_config

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
