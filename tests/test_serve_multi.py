"""Several models in one ``zoo serve`` (issue #34): a digits CNN fine-tuned and exported here
(``cnn=RUN``) next to the real MobileNetV2 ImageNet export, each under its name with its own
batcher, queue and share of the threads. Checked with real clients on loopback: the v2
repository index (httpx, ``tritonclient.http``), per-model ready, metadata and infer over HTTP
and gRPC (KServe's stub), each answer equal to onnxruntime's on that model's file; an unknown
name is 404 / NOT_FOUND naming the models served; API keys guard every model's routes;
``/metrics`` labels each model. One model flooded past its queue answers 429 while the other
keeps answering the same numbers; one model held inside its runtime does not hold the other;
names that collide are a usage error (exit 2). ``zoo serve A B`` runs a worker process per
model behind the same ports: a request that lands on another model's worker is relayed and
answered as its owner answers it (tested with two workers in this process, where which one a
request reaches is chosen); a killed worker is started again while the other model answers;
a model that does not load stops the start (exit 1); SIGTERM stops every worker (exit 0),
and so does the parent's death."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from tests.conftest import ZOO, run_zoo
from tests.serving import (
    NAME,
    binary_infer,
    free_port,
    in_process_asgi,
    in_process_server,
    metric,
    self_signed_cert,
    server,
    x_of,
)
from zoo.deploy.runtimes.loader import OnnxClassifier, make_session
from zoo.deploy.serve.app import create_app
from zoo.deploy.serve.auth import ENV_VAR, load_keys
from zoo.deploy.serve.config import ServeConfig, split_name, thread_shares
from zoo.deploy.serve.relay import Peers
from zoo.errors import UsageError
from zoo.images import open_image

pytestmark = pytest.mark.serve

KEY = "multi-model-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
CNN = "cnn"  # the digits model's name, given as NAME=RUN


@pytest.fixture(scope="module")
def cnn_run(four_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``zoo finetune simple_cnn`` on four real digit classes, then ``zoo export RUN``."""
    runs = tmp_path_factory.mktemp("multi")
    r = run_zoo(
        "finetune", "simple_cnn", "--data", str(four_digits), "--epochs", "1", "--runs",
        str(runs), "--name", "cnn", "--num-workers", "0", "--no-progress",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = run_zoo("export", str(runs / "cnn"))
    assert r.returncode == 0, r.stderr
    assert (runs / "cnn" / "model" / "model.onnx").is_file()
    return runs / "cnn"


@pytest.fixture(scope="module")
def digits_x(cnn_run: Path, four_digits: Path) -> np.ndarray:
    """Six real digit images as the CNN takes them (its own preprocessing), (6, C, H, W)."""
    clf = OnnxClassifier(cnn_run / "model" / "model.onnx")
    paths = sorted(four_digits.glob("*/*.png"))[::20][:6]  # the class folders are links
    return np.stack([clf.prepare(open_image(p.read_bytes())) for p in paths])


@pytest.fixture(scope="module")
def srv_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-multi") / "server.log"


@pytest.fixture(scope="module")
def srv(cnn_run: Path, mobilenet_onnx: Path, srv_log: Path) -> Iterator[tuple[str, int]]:
    """Both models in one server: 2 threads split between them; per model, batches of 8
    samples at most and two requests waiting at most."""
    grpc_port = free_port()
    args = [str(mobilenet_onnx), "--grpc-port", str(grpc_port), "--threads", "2"]
    args += ["--max-batch", "8", "--max-queue", "2"]
    with server(f"{CNN}={cnn_run}", *args, log=srv_log, env={ENV_VAR: KEY}) as (url, proc):
        yield url, grpc_port
    log = srv_log.read_text(errors="replace")
    assert KEY not in log
    assert proc.returncode == 0, log[-2000:]  # SIGTERM: every worker stopped gracefully
    assert not [pid for pid in worker_pids(log) if alive(pid)]
    for name in (CNN, NAME):  # each worker said it was stopping
        said = rf"\[{re.escape(name)}\]: zoo serve: SIGTERM: no new connections"
        assert re.search(said, log), log[-2000:]


def worker_pids(log: str) -> list[int]:
    """The worker processes named in a server's start-up lines."""
    return [int(m) for m in re.findall(r"; worker process (\d+)", log)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def infer(url: str, model: str, x: np.ndarray, classes: int) -> np.ndarray:
    r = httpx.post(f"{url}/v2/models/{model}/infer", timeout=60, **_with_key(binary_infer(x)))
    assert r.status_code == 200, r.text[:300]
    head = int(r.headers["inference-header-content-length"])
    return np.frombuffer(r.content[head:], np.float32).reshape(len(x), classes)


def _with_key(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "headers": {**body["headers"], **AUTH}}


def test_two_models_are_listed_and_each_answers_as_its_own_file(
    srv: tuple[str, int], srv_log: Path, cnn_run: Path, mobilenet_onnx: Path, digits_x: np.ndarray
) -> None:
    import tritonclient.http as th

    url, _ = srv
    log = srv_log.read_text(errors="replace")
    for name in (CNN, NAME):  # one start-up line per model: its share of the CPU budget
        assert f"model {name!r} from" in log
    assert log.count("1 inference threads (its share of 2 CPUs among 2 models)") == 2
    assert "2 worker processes (one per model)" in log and len(set(worker_pids(log))) == 2
    # each worker kept to its share of the CPUs (one each here), as its start-up line says
    pinned = {int(pid): {int(c) for c in cpus.split(", ")}
              for pid, cpus in re.findall(r"; worker process (\d+) on CPU ([\d, ]+)", log)}  # fmt: skip
    assert len(pinned) == 2 and all(len(c) == 1 for c in pinned.values())
    assert set.union(*pinned.values()) <= os.sched_getaffinity(0)
    assert len(set.union(*pinned.values())) == 2  # disjoint
    for pid, cpus in pinned.items():
        assert os.sched_getaffinity(pid) == cpus

    index = httpx.get(f"{url}/v2/repository/index", headers=AUTH)
    expected = [
        {"name": CNN, "version": "1", "state": "READY"},
        {"name": NAME, "version": "1", "state": "READY"},
    ]
    assert index.status_code == 200 and index.json() == expected
    client = th.InferenceServerClient(url.removeprefix("http://"))
    assert client.get_model_repository_index(headers=AUTH) == expected  # Triton's POST form
    ready_only = httpx.post(f"{url}/v2/repository/index", json={"ready": True}, headers=AUTH)
    assert ready_only.json() == expected
    bad = httpx.post(f"{url}/v2/repository/index", json={"ready": "yes"}, headers=AUTH)
    assert bad.status_code == 400 and "ready" in bad.json()["error"]
    assert client.is_model_ready(CNN, headers=AUTH) and client.is_model_ready(NAME, headers=AUTH)

    cnn_meta = httpx.get(f"{url}/v2/models/{CNN}", headers=AUTH).json()
    assert cnn_meta["name"] == CNN and cnn_meta["parameters"]["classes"] == [
        "digit_1", "digit_3", "digit_7", "digit_8",
    ]  # fmt: skip
    assert (
        len(httpx.get(f"{url}/v2/models/{NAME}", headers=AUTH).json()["parameters"]["classes"])
        == 1000
    )

    # Triton's model configuration, from whichever worker a connection lands on
    assert client.get_model_config(CNN, headers=AUTH)["input"] == [
        {"name": "input", "data_type": "TYPE_FP32", "dims": [3, 32, 32], "format": "FORMAT_NCHW"}
    ]
    configs = [httpx.get(f"{url}/v2/models/{n}/config", headers=AUTH) for n in [CNN, NAME] * 3]
    assert all(r.status_code == 200 for r in configs), [r.text for r in configs]
    assert [r.json()["output"][0]["dims"] for r in configs] == [[4], [1000]] * 3

    cnn_direct = make_session(cnn_run / "model" / "model.onnx").run(None, {"input": digits_x})[0]
    np.testing.assert_allclose(infer(url, CNN, digits_x, 4), cnn_direct, rtol=1e-5, atol=1e-5)
    x = x_of(3, 2)
    mobile_direct = make_session(mobilenet_onnx).run(None, {"input": x})[0]
    np.testing.assert_allclose(infer(url, NAME, x, 1000), mobile_direct, rtol=1e-4, atol=1e-4)

    for path in ("/v2/models/nope", "/v2/models/nope/ready"):
        missing = httpx.get(url + path, headers=AUTH)
        assert missing.status_code == 404
        assert f"'{CNN}'" in missing.json()["error"] and f"'{NAME}'" in missing.json()["error"]
    assert (
        httpx.post(f"{url}/v2/models/nope/infer", **_with_key(binary_infer(x))).status_code == 404
    )

    for path in (f"/v2/models/{CNN}", f"/v2/models/{NAME}/ready", "/v2/repository/index"):
        assert httpx.get(url + path).status_code == 401  # every model's routes are keyed
    assert httpx.post(f"{url}/v2/models/{CNN}/infer", **binary_infer(digits_x)).status_code == 401

    # one keep-alive connection for both models: handed to the first one's worker, so every
    # request for the other is relayed to its worker, and each still answers as its own file
    with httpx.Client(headers=AUTH, timeout=60) as client:
        for _ in range(2):
            for name in (CNN, NAME):
                assert client.get(f"{url}/v2/models/{name}").json()["name"] == name
    text = httpx.get(f"{url}/metrics", headers=AUTH).text
    assert metric(text, "zoo_relayed_requests_total") >= 2
    # a connection per request above: those landing on the other model's worker were handed
    assert metric(text, "zoo_handed_connections_total") >= 1
    for name in (CNN, NAME):
        assert (
            metric(text, f'zoo_requests_total{{endpoint="infer",model="{name}",outcome="ok"}}') >= 1
        )
        assert metric(text, f'zoo_batch_size_count{{model="{name}"}}') >= 1
    assert (
        metric(text, 'zoo_requests_total{endpoint="infer",model="",outcome="unknown_model"}') == 1
    )


def test_grpc_serves_each_model_by_name(
    srv: tuple[str, int], cnn_run: Path, digits_x: np.ndarray
) -> None:
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as v2_grpc

    metadata = (("authorization", f"Bearer {KEY}"),)
    with grpc.insecure_channel(f"127.0.0.1:{srv[1]}") as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        for name in (CNN, NAME):
            assert stub.ModelReady(pb.ModelReadyRequest(name=name), metadata=metadata).ready
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=CNN), metadata=metadata)
        assert meta.name == CNN and list(meta.outputs[0].shape) == [-1, 4]

        def request(model: str) -> Any:
            req = pb.ModelInferRequest(model_name=model, id="g-1")
            req.inputs.add(name="input", datatype="FP32", shape=list(digits_x.shape))
            req.raw_input_contents.append(digits_x.tobytes())
            return req

        res = stub.ModelInfer(request(CNN), metadata=metadata)
        assert res.model_name == CNN
        got = np.frombuffer(res.raw_output_contents[0], np.float32).reshape(len(digits_x), 4)
        direct = make_session(cnn_run / "model" / "model.onnx").run(None, {"input": digits_x})
        np.testing.assert_allclose(got, direct[0], rtol=1e-5, atol=1e-5)
        with pytest.raises(grpc.RpcError) as missing:
            stub.ModelInfer(request("nope"), metadata=metadata)
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND
        assert f"'{CNN}'" in missing.value.details() and f"'{NAME}'" in missing.value.details()
        with pytest.raises(grpc.RpcError) as unkeyed:
            stub.ModelMetadata(pb.ModelMetadataRequest(name=NAME))
        assert unkeyed.value.code() is grpc.StatusCode.UNAUTHENTICATED

    # Triton's client lists both models over gRPC, as /v2/repository/index does (its own
    # process: tritonclient's messages clash with KServe's loaded here)
    index = subprocess.run(
        [sys.executable, "-c", TRITON_INDEX, str(srv[1]), KEY],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert index.returncode == 0, index.stderr[-2000:]
    assert json.loads(index.stdout) == [
        {"name": name, "version": "1", "state": "READY"} for name in (CNN, NAME)
    ]


TRITON_INDEX = """
import json, sys, tritonclient.grpc as tg
port, key = sys.argv[1:3]
client = tg.InferenceServerClient(f"127.0.0.1:{port}")
auth = {"authorization": f"Bearer {key}"}
print(json.dumps(client.get_model_repository_index(headers=auth, as_json=True)["models"]))
"""


def test_flooding_one_model_leaves_the_other_answering_the_same_numbers(
    srv: tuple[str, int], digits_x: np.ndarray
) -> None:
    """MobileNet flooded by 16 closed-loop clients past its queue (a batch running, two waiting):
    it refuses with 429 as a one-model server does, while every request to the CNN is
    answered 200 with the numbers it gave before the flood. Each connection (16 opened at
    once) reaches its model's worker whole: not one request is relayed."""
    url, _ = srv

    def relayed() -> float:
        return metric(httpx.get(f"{url}/metrics", headers=AUTH).text, "zoo_relayed_requests_total")

    relayed_before = relayed()
    before = [infer(url, CNN, digits_x[i : i + 1], 4) for i in range(len(digits_x))]
    flood_body = _with_key(binary_infer(x_of(7, 1)))
    codes: Counter[int] = Counter()
    refused, stop = threading.Event(), threading.Event()

    def flood(_: int) -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                r = client.post(f"{url}/v2/models/{NAME}/infer", **flood_body)
                codes[r.status_code] += 1
                if r.status_code == 429:
                    refused.set()

    with ThreadPoolExecutor(16) as pool:
        floods = [pool.submit(flood, i) for i in range(16)]
        try:
            assert refused.wait(120), f"the flood never filled the queue: {codes}"
            during = [
                infer(url, CNN, digits_x[i : i + 1], 4)
                for _ in range(2)
                for i in range(len(digits_x))
            ]
        finally:
            stop.set()
        for f in floods:
            f.result()
    assert set(codes) <= {200, 429} and codes[429] and codes[200], codes
    for i, got in enumerate(during):
        np.testing.assert_array_equal(got, before[i % len(digits_x)])
    assert relayed() == relayed_before


def test_a_model_held_in_its_runtime_does_not_hold_the_other(
    cnn_run: Path, mobilenet_onnx: Path, digits_x: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MobileNet's runtime call is held (as a hung model would be); the CNN, health and the
    repository index answer meanwhile, from the same process and event loop."""
    hold, entered, release = threading.Event(), threading.Event(), threading.Event()
    real = OnnxClassifier.outputs

    def run(clf: OnnxClassifier, x: np.ndarray) -> np.ndarray:
        if hold.is_set() and clf.path == mobilenet_onnx:
            entered.set()
            assert release.wait(60), "the test never released the model"
        return real(clf, x)

    monkeypatch.setattr(OnnxClassifier, "outputs", run)
    cnn_onnx = cnn_run / "model" / "model.onnx"
    cfg = ServeConfig(
        f"a={mobilenet_onnx}", port=free_port(), more_models=(f"b={cnn_onnx}",), threads=2
    )
    direct = make_session(cnn_onnx).run(None, {"input": digits_x})[0]
    try:
        with in_process_server(cfg) as (url, first):
            for _ in range(600):
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
                threading.Event().wait(0.1)
            assert first.name == "a" and first.cfg.threads == 1  # 2 threads, split in two
            hold.set()
            with ThreadPoolExecutor(1) as pool:
                held = pool.submit(
                    httpx.post, f"{url}/v2/models/a/infer", timeout=120, **binary_infer(x_of(2))
                )
                assert entered.wait(60), "the request never reached MobileNet's runtime"
                for _ in range(3):
                    r = httpx.post(f"{url}/v2/models/b/infer", timeout=30, **binary_infer(digits_x))
                    assert r.status_code == 200, r.text
                    head = int(r.headers["inference-header-content-length"])
                    got = np.frombuffer(r.content[head:], np.float32).reshape(-1, 4)
                    np.testing.assert_allclose(got, direct, rtol=1e-5, atol=1e-5)
                assert httpx.get(f"{url}/v2/health/live", timeout=30).status_code == 200
                states = httpx.get(f"{url}/v2/repository/index", timeout=30).json()
                assert [e["state"] for e in states] == ["READY", "READY"]
                assert not held.done()
                release.set()
                assert held.result().status_code == 200
    finally:
        release.set()


def test_names_threads_and_collisions(cnn_run: Path, mobilenet_onnx: Path) -> None:
    assert split_name("cats=runs/cats") == ("cats", "runs/cats")
    assert split_name("runs/cats") == (None, "runs/cats")
    with pytest.raises(UsageError, match="NAME=MODEL needs a name"):
        split_name("bad/name=runs/cats")
    assert thread_shares(None, 1) == [None] and thread_shares(4, 1) == [4]
    assert thread_shares(5, 2) == [3, 2] and thread_shares(2, 3) == [1, 1, 1]
    with pytest.raises(UsageError, match="--name names one model"):
        ServeConfig(str(mobilenet_onnx), name="x", more_models=(str(cnn_run),))
    cfg = ServeConfig(str(mobilenet_onnx), more_models=(f"m={mobilenet_onnx}",), threads=4)
    assert [(m.name, m.threads) for m in cfg.served()] == [("mobilenet_v2", 2), ("m", 2)]
    # the real command: the same run twice is named twice alike, refused before loading
    r = run_zoo("serve", str(cnn_run), str(cnn_run), "--port", str(free_port()), timeout=120)
    assert r.returncode == 2, r.stderr
    assert "two models are named 'simple_cnn.ft-cnn'" in r.stderr and "NAME=MODEL" in r.stderr


def test_a_worker_relays_the_other_workers_model_as_its_owner_answers(
    cnn_run: Path, mobilenet_onnx: Path, digits_x: np.ndarray, four_digits: Path, tmp_path: Path
) -> None:
    """The two workers of ``zoo serve m=MOBILENET cnn=RUN`` (each its own model, as
    :mod:`zoo.deploy.serve.workers` runs them), here in this process so each request goes to
    the worker chosen: everything sent to the MobileNet worker for the CNN is answered as
    the CNN's worker answers it directly (HTTP and gRPC, answers and errors); a missing key is
    refused before anything is relayed; the index and readiness ask both. The CNN's worker
    stopped, its model is 503 / UNAVAILABLE saying why, while MobileNet answers."""
    cnn_onnx = cnn_run / "model" / "model.onnx"
    keys = load_keys(None, {ENV_VAR: KEY})
    cfg = ServeConfig(f"m={mobilenet_onnx}", more_models=(f"{CNN}={cnn_onnx}",), max_body_mb=1)
    owners, relay = {"m": 0, CNN: 1}, tmp_path / "relay"
    relay.mkdir()
    urls, grpc_ports, stacks = [], [free_port(), free_port()], []
    for i in (0, 1):
        peers = Peers(owners, i, relay, keys, cfg.body_limit)
        worker = dataclasses.replace(cfg, grpc_port=grpc_ports[i])
        app = create_app(worker, keys=keys, peers=peers)
        stacks.append(contextlib.ExitStack())
        urls.append(stacks[i].enter_context(in_process_asgi(peers.router(app), free_port())))
    here, owner = urls
    try:
        deadline = time.time() + 120
        while httpx.get(f"{here}/v2/health/ready").status_code != 200:
            assert time.time() < deadline, "the two workers were never ready"
            time.sleep(0.1)
        index = httpx.get(f"{here}/v2/repository/index", headers=AUTH).json()
        assert [(e["name"], e["state"]) for e in index] == [("m", "READY"), (CNN, "READY")]

        def both(method: str, path: str, **kw: Any) -> httpx.Response:
            """The relayed answer, checked equal to the owner's own."""
            relayed = httpx.request(method, here + path, timeout=60, **kw)
            direct = httpx.request(method, owner + path, timeout=60, **kw)
            assert relayed.status_code == direct.status_code, (relayed.text, direct.text)
            assert relayed.content == direct.content
            assert relayed.headers.get("retry-after") == direct.headers.get("retry-after")
            return relayed

        assert both("GET", f"/v2/models/{CNN}", headers=AUTH).json()["name"] == CNN
        r = both("POST", f"/v2/models/{CNN}/infer", **_with_key(binary_infer(digits_x)))
        head = int(r.headers["inference-header-content-length"])
        got = np.frombuffer(r.content[head:], np.float32).reshape(len(digits_x), 4)
        direct = make_session(cnn_onnx).run(None, {"input": digits_x})[0]
        np.testing.assert_allclose(got, direct, rtol=1e-5, atol=1e-5)
        png = sorted(four_digits.glob("*/*.png"))[0].read_bytes()
        files = {"file": ("d.png", png, "image/png")}
        r = both("POST", f"/v2/models/{CNN}/predict?top_k=2", files=files, headers=AUTH)
        assert r.status_code == 200 and len(r.json()["predictions"]) == 2
        big = b"0" * (cfg.body_limit + 10)  # over the limit: by its declared length, then read
        assert both("POST", f"/v2/models/{CNN}/infer", content=big, headers=AUTH).status_code == 413
        for url in urls:  # no declared length (chunked): refused once the limit is read
            chunks = iter([big[:700_000], big[700_000:]])
            r = httpx.post(f"{url}/v2/models/{CNN}/infer", content=chunks, headers=AUTH)
            assert r.status_code == 413 and "1,048,576-byte limit" in r.json()["error"]
        assert (
            both("POST", f"/v2/models/{CNN}/infer", json={"inputs": 1}, headers=AUTH).status_code
            == 400
        )
        assert both("GET", f"/v2/models/{CNN}/infer", headers=AUTH).status_code == 405
        assert both("GET", f"/v2/models/{CNN}/nothing", headers=AUTH).status_code == 404
        refused = httpx.post(f"{here}/v2/models/{CNN}/infer", **binary_infer(digits_x))
        assert refused.status_code == 401 and "WWW-Authenticate" in refused.headers
        relayed = metric(
            httpx.get(f"{here}/metrics", headers=AUTH).text, "zoo_relayed_requests_total"
        )
        assert relayed == 8  # each request above for the CNN sent here, but the unkeyed one
        refusals = 'zoo_auth_refusals_total{reason="missing",scope="infer"}'
        for url, count in ((here, 1), (owner, 0)):  # refused here: its body never went on
            text = httpx.get(f"{url}/metrics", headers=AUTH).text
            assert metric(text, refusals) == count, text

        from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
        from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as v2_grpc

        metadata = (("authorization", f"Bearer {KEY}"),)
        request = pb.ModelInferRequest(model_name=CNN, id="relayed")
        request.inputs.add(name="input", datatype="FP32", shape=list(digits_x.shape))
        request.raw_input_contents.append(digits_x.tobytes())
        with grpc.insecure_channel(f"127.0.0.1:{grpc_ports[0]}") as channel:
            stub = v2_grpc.GRPCInferenceServiceStub(channel)
            res = stub.ModelInfer(request, metadata=metadata)
            assert res.model_name == CNN and res.id == "relayed"
            got = np.frombuffer(res.raw_output_contents[0], np.float32).reshape(-1, 4)
            np.testing.assert_allclose(got, direct, rtol=1e-5, atol=1e-5)
            assert stub.ModelReady(pb.ModelReadyRequest(name=CNN), metadata=metadata).ready
            assert stub.ServerReady(pb.ServerReadyRequest()).ready
            small = digits_x[:, :, :8, :8].copy()  # not the CNN's input size: the owner says
            for name, x, code in (
                (CNN, small, grpc.StatusCode.INVALID_ARGUMENT),
                ("nope", digits_x, grpc.StatusCode.NOT_FOUND),
            ):
                bad = pb.ModelInferRequest(model_name=name)
                bad.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
                bad.raw_input_contents.append(x.tobytes())
                with pytest.raises(grpc.RpcError) as failed:
                    stub.ModelInfer(bad, metadata=metadata)
                assert failed.value.code() is code, failed.value.details()
            with pytest.raises(grpc.RpcError) as unkeyed:
                stub.ModelInfer(request)
            assert unkeyed.value.code() is grpc.StatusCode.UNAUTHENTICATED

            stacks[1].close()  # the CNN's worker stops
            gone = httpx.get(f"{here}/v2/models/{CNN}/ready", headers=AUTH)
            assert gone.status_code == 503 and "not answering" in gone.json()["error"]
            states = httpx.get(f"{here}/v2/repository/index", headers=AUTH).json()
            assert [e["state"] for e in states] == ["READY", "UNAVAILABLE"]
            assert "not answering" in states[1]["reason"]
            assert httpx.get(f"{here}/v2/health/ready").status_code == 503
            mine = httpx.post(
                f"{here}/v2/models/m/infer", timeout=60, **_with_key(binary_infer(x_of(1)))
            )
            assert mine.status_code == 200
            with pytest.raises(grpc.RpcError) as unavailable:
                stub.ModelInfer(request, metadata=metadata)
            assert unavailable.value.code() is grpc.StatusCode.UNAVAILABLE
            assert not stub.ServerReady(pb.ServerReadyRequest()).ready
    finally:
        for stack in reversed(stacks):
            stack.close()


def test_a_killed_worker_is_started_again_and_the_parent_takes_its_workers_along(
    cnn_run: Path, mobilenet_onnx: Path, digits_x: np.ndarray, tmp_path: Path
) -> None:
    """``zoo serve m=MOBILENET cnn=RUN``: the CNN's worker killed (as a crash would), the
    CNN answers 503 saying why until its worker is back and warm, then the same numbers; MobileNet
    answers all along. The parent killed (no chance to stop anything), the workers stop
    too, and the port is free again."""
    log = tmp_path / "server.log"
    with server(f"m={mobilenet_onnx}", f"{CNN}={cnn_run}", "--threads", "2", log=log) as (
        url,
        proc,
    ):
        pids = worker_pids(log.read_text())
        before = infer_open(url, CNN, digits_x)
        os.kill(pids[1], signal.SIGKILL)
        codes: Counter[int] = Counter()
        deadline = time.time() + 120
        while True:
            assert time.time() < deadline, f"the CNN never came back: {codes}"
            m = httpx.post(f"{url}/v2/models/m/infer", timeout=60, **binary_infer(x_of(4)))
            assert m.status_code == 200, m.text
            r = httpx.post(f"{url}/v2/models/{CNN}/infer", timeout=60, **binary_infer(digits_x))
            codes[r.status_code] += 1
            if r.status_code == 200:
                break
            # two phases, each a 503 saying why: the worker is gone (the parent answers), then
            # the new worker is up but still loading and warming its model (it answers)
            why = r.json()["error"]
            assert r.status_code == 503, r.text
            assert "not answering" in why or why.startswith("model is not ready yet"), why
        np.testing.assert_array_equal(infer_open(url, CNN, digits_x), before)
        text = log.read_text()
        assert f"the worker of model {CNN!r} exited with code -9; starting it again" in text
        restarted = worker_pids(text)[-1]
        assert restarted not in pids and alive(restarted)
        port = int(url.rsplit(":", 1)[1])
        proc.kill()
        proc.wait()
        for pid in (pids[0], restarted):
            for _ in range(100):
                if not alive(pid):
                    break
                time.sleep(0.1)
            assert not alive(pid), f"worker {pid} outlived its parent"
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the port is free: nothing of the server is left


def infer_open(url: str, model: str, x: np.ndarray) -> np.ndarray:
    r = httpx.post(f"{url}/v2/models/{model}/infer", timeout=60, **binary_infer(x))
    assert r.status_code == 200, r.text[:300]
    head = int(r.headers["inference-header-content-length"])
    return np.frombuffer(r.content[head:], np.float32).reshape(len(x), -1)


def test_a_model_that_does_not_load_stops_the_start(mobilenet_onnx: Path, tmp_path: Path) -> None:
    """One of two models is a graph onnxruntime cannot load (an operator it does not know):
    ``zoo serve`` exits 1 naming the file and why, before anything serves, and leaves no
    worker behind."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 3, 8, 8])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 2])
    node = helper.make_node("NoSuchOp", ["input"], ["logits"], domain="zoo.test")
    graph = helper.make_graph([node], "unrunnable", [x], [y])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("zoo.test", 1)]
    broken = tmp_path / "broken.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), broken)
    port = free_port()
    r = subprocess.run(
        [ZOO, "serve", f"m={mobilenet_onnx}", f"x={broken}", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 1, r.stderr
    assert "onnxruntime cannot load" in r.stderr and "broken.onnx" in r.stderr, r.stderr
    assert "NoSuchOp" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert worker_pids(r.stderr) == []  # no model line: refused before serving
    workers = f"zoo.deploy.serve.workers [mx]@127.0.0.1:{port}"  # each worker's command line
    left = subprocess.run(["pgrep", "-f", workers], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout


def test_over_tls_both_models_answer_through_the_one_port(
    cnn_run: Path, mobilenet_onnx: Path, tmp_path: Path
) -> None:
    """``--ssl-certfile``: a worker cannot read a TLS connection's first line before the
    handshake, so it serves every connection it accepts and relays the other model's
    requests; both models answer over HTTPS and gRPC over TLS."""
    cert, key, ctx = self_signed_cert(tmp_path)
    grpc_port = free_port()
    tls = ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key), "--grpc-port", str(grpc_port)]
    with server(f"m={mobilenet_onnx}", f"{CNN}={cnn_run}", *tls, verify=ctx) as (url, _):
        assert url.startswith("https://")
        # a connection each: whichever worker accepts it relays the other's requests. The
        # kernel spreads connections between the two at random: 3 rounds left no relay at all
        # once in CI (a 1-in-64 draw); 12 rounds, 1 in 2**24
        for _ in range(12):
            for name in ("m", CNN):
                r = httpx.get(f"{url}/v2/models/{name}/ready", verify=ctx)
                assert r.status_code == 200 and r.json() == {"name": name, "ready": True}
        text = httpx.get(f"{url}/metrics", verify=ctx).text
        assert metric(text, "zoo_relayed_requests_total") >= 1
        assert metric(text, "zoo_handed_connections_total") == 0

        from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
        from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as v2_grpc

        creds = grpc.ssl_channel_credentials(cert.read_bytes())
        with grpc.secure_channel(f"localhost:{grpc_port}", creds) as channel:
            stub = v2_grpc.GRPCInferenceServiceStub(channel)
            for name in ("m", CNN):
                assert stub.ModelReady(pb.ModelReadyRequest(name=name)).ready


def test_worker_cpus_split_the_cpus_by_share_and_wrap_round() -> None:
    from zoo.deploy.serve.workers import worker_cpus

    cpus = [2, 3, 5, 7]
    assert [worker_cpus(i, [1, 1], cpus) for i in range(2)] == [[2], [3]]
    assert [worker_cpus(i, [2, 1, 1], cpus) for i in range(3)] == [[2, 3], [5], [7]]
    # more threads than CPUs: the shares wrap round and overlap, none is left without a CPU
    assert [worker_cpus(i, [3, 3], cpus) for i in range(2)] == [[2, 3, 5], [2, 3, 7]]
    assert [worker_cpus(i, [1, 1, 1], [0, 1]) for i in range(3)] == [[0], [1], [0]]
