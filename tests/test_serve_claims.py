"""What the README promises about serving, each proved: ready only after the warm-up, inference
off the event loop (health answers while a batch is computing), multi-label serving. The first
two run the real app under a real uvicorn on loopback inside this process, with the real ONNX
Runtime call wrapped so the test can hold it; the last serves a fine-tuned multi-label run."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from starlette.requests import Request

from tests.conftest import run_zoo
from tests.serving import NAME, binary_infer, binary_logits, free_port, in_process_server, server
from zoo.deploy.runtimes.loader import OnnxClassifier, make_session
from zoo.deploy.serve.app import HttpApi
from zoo.deploy.serve.config import ServeConfig
from zoo.deploy.serve.model import ModelServer
from zoo.deploy.serve.run import default_name
from zoo.errors import ServerBusyError

pytestmark = pytest.mark.serve


class Gate:
    """Wraps ``OnnxClassifier.outputs`` (what the server runs: warm-up and batches): records each call and can hold it until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, bool]] = []  # (batch, was the server ready then)
        self.hold = threading.Event()  # set: the next calls wait for ``release``
        self.entered = threading.Event()
        self.release = threading.Event()
        self.server_ready = lambda: False
        real = OnnxClassifier.outputs

        def run(clf: OnnxClassifier, x: np.ndarray) -> np.ndarray:
            self.calls.append((len(x), self.server_ready()))
            if self.hold.is_set():
                self.entered.set()
                assert self.release.wait(60), "the test never released the model"
            return real(clf, x)

        monkeypatch.setattr(OnnxClassifier, "outputs", run)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate(monkeypatch)
    yield g
    g.release.set()  # never leave a worker thread stuck


def test_ready_only_after_warm_up_at_batch_1_and_max_batch(
    mobilenet_onnx: Path, gate: Gate
) -> None:
    gate.hold.set()  # hold the first warm-up call
    cfg = ServeConfig(str(mobilenet_onnx), NAME, port=free_port(), max_batch=6)
    with in_process_server(cfg) as (url, srv):
        gate.server_ready = lambda: srv.ready
        assert gate.entered.wait(120), "the model never started its warm-up"
        assert httpx.get(f"{url}/v2/health/live").status_code == 200
        assert httpx.get(f"{url}/v2/health/ready").json() == {"ready": False}
        assert httpx.get(f"{url}/v2/models/{NAME}/ready").status_code == 503
        x = np.zeros((1, 3, 224, 224), np.float32)
        held = httpx.post(f"{url}/v2/models/{NAME}/infer", **binary_infer(x))
        assert held.status_code == 503 and "not ready" in held.json()["error"]
        gate.hold.clear()
        gate.release.set()
        for _ in range(600):
            if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                break
            threading.Event().wait(0.1)
        assert gate.calls == [(1, False), (6, False)]  # both warm-ups before ready
        assert srv.clf is not None  # ORT's idle threads sleep: the cores also decode and talk
        options = srv.clf.session.get_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        binary_logits(httpx.post(f"{url}/v2/models/{NAME}/infer", **binary_infer(x)), 1)
        assert gate.calls[-1] == (1, True)


def test_health_and_metrics_answer_while_a_batch_is_computing(
    mobilenet_onnx: Path, gate: Gate
) -> None:
    cfg = ServeConfig(str(mobilenet_onnx), NAME, port=free_port(), max_batch=4, threads=1)
    with in_process_server(cfg) as (url, srv):
        for _ in range(600):
            if srv.ready:
                break
            threading.Event().wait(0.1)
        gate.hold.set()
        x = np.random.default_rng(0).standard_normal((4, 3, 224, 224)).astype(np.float32)
        with ThreadPoolExecutor(2) as pool:
            computing = pool.submit(
                httpx.post, f"{url}/v2/models/{NAME}/infer", timeout=120, **binary_infer(x)
            )
            assert gate.entered.wait(60), "the batch never reached the model"
            queued = pool.submit(
                httpx.post, f"{url}/v2/models/{NAME}/infer", timeout=120, **binary_infer(x[:1])
            )
            # the batch is inside ONNX Runtime and stays there until released: anything that
            # answers now was answered by a free event loop
            assert httpx.get(f"{url}/v2/health/ready", timeout=30).json() == {"ready": True}
            assert httpx.get(f"{url}/v2/health/live", timeout=30).status_code == 200
            for _ in range(300):  # the second request waits its turn (once it has arrived)
                text = httpx.get(f"{url}/metrics", timeout=30).text
                if "zoo_queue_depth 1.0" in text:
                    break
                threading.Event().wait(0.1)
            assert "zoo_queue_depth 1.0" in text
            assert not computing.done() and not queued.done()
            gate.release.set()
            got = binary_logits(computing.result(), 4)
            binary_logits(queued.result(), 1)
    direct = make_session(mobilenet_onnx).run(None, {"input": x})[0]
    np.testing.assert_allclose(got, direct, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def multilabel_onnx(multilabel_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real multi-label run (simple_cnn, 2 epochs on the three-label digits), exported."""
    runs = tmp_path_factory.mktemp("ml-serve")
    args = ["--runs", str(runs), "--name", "ml", "--num-workers", "0", "--no-progress"]
    ft = run_zoo(
        "finetune",
        "simple_cnn",
        "--multi-label",
        "--data",
        str(multilabel_digits),
        "--epochs",
        "2",
        *args,
    )
    assert ft.returncode == 0, ft.stderr
    ex = run_zoo("export", str(runs / "ml"), "--data", str(multilabel_digits / "images"))
    assert ex.returncode == 0, ex.stderr
    return runs / "ml" / "model" / "model.onnx"


@pytest.mark.slow
def test_multi_label_model_serves_independent_sigmoid_scores(
    multilabel_onnx: Path, small_digits: Path
) -> None:
    clf = OnnxClassifier(multilabel_onnx)
    assert clf.multi_label and len(clf.classes) == 14
    image = next((small_digits / "digit_4").iterdir())
    logits = clf.run_each(clf.preprocess_images([image]))[0]
    with server(multilabel_onnx) as (url, _):
        name = default_name(multilabel_onnx)
        meta = httpx.get(f"{url}/v2/models/{name}").json()
        assert meta["parameters"]["multi_label"] is True
        r = httpx.post(
            f"{url}/v2/models/{name}/predict?top_k=14",
            content=image.read_bytes(),
            headers={"content-type": "image/png"},
        )
    assert r.status_code == 200, r.text
    got = {p["index"]: p["score"] for p in r.json()["predictions"]}
    sigmoid = 1 / (1 + np.exp(-logits.astype(np.float64)))
    assert len(got) == 14
    np.testing.assert_allclose([got[i] for i in range(14)], sigmoid, rtol=1e-5, atol=1e-6)
    assert abs(sum(got.values()) - 1.0) > 0.05  # independent per-class scores, not a softmax


def test_a_refusal_tells_the_client_when_to_come_back(tmp_path: Path) -> None:
    """The Retry-After of a 429 is the batcher's estimate, not a constant."""

    async def busy() -> None:
        raise ServerBusyError("queue full: about 9.0 s of work is waiting", retry_after_s=7)

    api = HttpApi(ModelServer(ServeConfig(str(tmp_path / "m.onnx"), NAME)), keys=None)
    request = Request({"type": "http", "method": "POST", "path": "/x", "headers": []})
    resp = asyncio.run(api._guard(request, "infer", busy))
    assert resp.status_code == 429 and resp.headers["retry-after"] == "7"
    assert b"retry later" in resp.body


def test_a_free_size_graph_is_batched_by_the_work_of_each_size(tmp_path: Path) -> None:
    """The server hands its batcher the cost of each request: two 5x6 samples (1.875 samples
    of the 4x4 export size each) never share a batch of ``--max-batch 2``; two 4x4 ones do."""
    from tests.test_gates_serve import free_size_model

    path = free_size_model(tmp_path / "free.onnx")
    shapes: list[tuple[int, ...]] = []

    async def main() -> None:
        ms = ModelServer(ServeConfig(str(path), NAME, threads=1, max_batch=2))
        ms.start()
        while not ms.ready:
            assert ms.load_error is None, ms.load_error
            await asyncio.sleep(0.01)
        assert ms.clf is not None
        real = ms.clf.outputs
        ms.clf.outputs = lambda batch: (shapes.append(batch.shape), real(batch))[1]
        big, small = np.zeros((1, 3, 5, 6), np.float32), np.zeros((1, 3, 4, 4), np.float32)
        await asyncio.gather(*(ms.run_batched(x) for x in (big, big, small, small)))
        await ms.stop()

    asyncio.run(main())
    assert shapes == [(1, 3, 5, 6), (1, 3, 5, 6), (2, 3, 4, 4)]
