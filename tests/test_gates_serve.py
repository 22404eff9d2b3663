"""Fast gate tests of ``zoo serve``'s limits, API keys and settings, for mutation testing
(``scripts/mutation.sh serve auth``): the real app (:func:`create_app` under Starlette's
TestClient, which runs its lifespan: batchers, loading, warm-up) on tiny ONNX classifiers
built here with ``onnx.helper`` and run by onnxruntime, so that each mutant of
``deploy/serve/app.py``, ``config.py``, ``inputs.py`` or ``auth.py`` meets, within a second,
every status, header, message, log line and counter it could change. The same paths under a
real uvicorn with real clients are in test_serve.py, test_serve_auth.py and
test_serve_fuzz.py."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from tests.serving import binary_infer, json_infer
from zoo.deploy.runtimes.loader import OnnxClassifier
from zoo.deploy.serve.app import create_app
from zoo.deploy.serve.auth import (
    ENV_VAR,
    MIN_KEY_LENGTH,
    SCOPES,
    ApiKeys,
    Verdict,
    bearer_token,
    check_exposure,
    is_loopback,
    load_keys,
    parse_key_file,
    refusal_message,
)
from zoo.deploy.serve.config import (
    ModelConfig,
    ServeConfig,
    load_served,
    option_defaults,
    split_name,
    thread_shares,
)
from zoo.errors import InputError, UsageError
from zoo.onnx_meta import set_metadata

pytestmark = pytest.mark.serve

RNG = np.random.default_rng(0)
W = RNG.standard_normal((48, 5)).astype(np.float32)  # (3, 4, 4) floats -> 5 classes
W_PIXELS = RNG.standard_normal((3, 5)).astype(np.float32)  # mean pixel per channel -> 5
PRE = {
    "input_size": [3, 4, 4],
    "crop_pct": 1.0,
    "interpolation": "bilinear",
    "mean": [0.5, 0.5, 0.5],
    "std": [0.5, 0.5, 0.5],
}
CLASSES = ["a", "b", "c", "d", "e"]
NAME = "m"
INFER_PATH = f"/v2/models/{NAME}/infer"
PREDICT_PATH = f"/v2/models/{NAME}/predict"

ALL = "all-scopes-0123456789abcdef"  # no scope listed: every scope
INFER = "infer-only-0123456789abcdef"
OPS = "ops-0123456789abcdef-meta+metrics"
KEY_FILE = f"# keys\n{ALL}\n\n{INFER}  infer   # the app\n{OPS} metadata,metrics\n"


def _save(graph: onnx.GraphProto, path: Path, calibration: dict | None = None) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    set_metadata(model, {"preprocessing": PRE, "class_names": CLASSES, "calibration": calibration})
    onnx.save(model, str(path))
    return path


def float_model(path: Path, *, half: bool = False, calibration: dict | None = None) -> Path:
    """input (batch, 3, 4, 4) float -> Flatten -> MatMul W -> logits (batch, 5); ``half``:
    a float16 input (an ``--fp16-io`` graph's), cast to float first."""
    cast = [helper.make_node("Cast", ["input"], ["x"], to=TensorProto.FLOAT)] if half else []
    graph = helper.make_graph(
        [
            *cast,
            helper.make_node("Flatten", ["x" if half else "input"], ["f"], axis=1),
            helper.make_node("MatMul", ["f", "W"], ["logits"]),
        ],
        "tiny",
        [
            helper.make_tensor_value_info(
                "input", TensorProto.FLOAT16 if half else TensorProto.FLOAT, ["N", 3, 4, 4]
            )
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(W, "W")],
    )
    return _save(graph, path, calibration)


def pixel_model(path: Path) -> Path:
    """A graph that preprocesses itself: uint8 pixels (batch, H, W, 3) of any size -> the
    mean of each channel -> MatMul -> logits (batch, 5)."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["input"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceMean", ["f"], ["m"], axes=[1, 2], keepdims=0),
            helper.make_node("MatMul", ["m", "W"], ["logits"]),
        ],
        "tiny_pixels",
        [helper.make_tensor_value_info("input", TensorProto.UINT8, ["N", "H", "W", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(W_PIXELS, "W")],
    )
    return _save(graph, path)


def free_size_model(path: Path, *, refuses_other_sizes: bool = False) -> Path:
    """A ``--dynamic-size`` graph: input (batch, 3, H, W), H and W free -> the mean of each
    channel -> MatMul -> logits (batch, 5). ``refuses_other_sizes``: Flatten -> MatMul W
    instead, which onnxruntime refuses at any size but 4x4 (a graph that declares a size free
    and fails at it)."""
    nodes, weight = (
        ([helper.make_node("Flatten", ["input"], ["m"], axis=1)], W)
        if refuses_other_sizes
        else ([helper.make_node("ReduceMean", ["input"], ["m"], axes=[2, 3], keepdims=0)], W_PIXELS)
    )
    graph = helper.make_graph(
        [*nodes, helper.make_node("MatMul", ["m", "W"], ["logits"])],
        "tiny_free_size",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(weight, "W")],
    )
    return _save(graph, path)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return float_model(tmp_path_factory.mktemp("tiny") / "tiny.onnx")


@contextmanager
def serving(
    path: Path, keys: ApiKeys | None = None, *, hand: str = "loaded", **settings: Any
) -> Iterator[tuple[TestClient, Any]]:
    """``path`` served as ``NAME`` by the app under a TestClient (its lifespan run); yields
    once every model is ready (or has failed to load). ``hand``: how the classifier, loaded
    here (so that the test can instrument it), is handed to the app: ``loaded`` (by name, as
    ``zoo serve`` hands each model), ``clf`` (the first model), or ``none`` (the app loads
    it)."""
    cfg = ServeConfig(str(path), NAME, threads=1, **settings)
    clf = OnnxClassifier(path, threads=1, spin=False) if hand != "none" else None
    if hand == "clf":
        app = create_app(cfg, clf, keys)
    else:
        app = create_app(cfg, keys=keys, loaded={NAME: clf} if clf is not None else None)
    with TestClient(app, raise_server_exceptions=False) as client:
        wait_for(app)
        yield client, clf


def wait_for(app: Any) -> None:
    """Until every model of the app is ready or has failed to load, and its loading thread
    has ended: the state is set before the thread logs it, so a test that clears the log
    once the state is set could otherwise still catch the start-up's line (a CI run did)."""
    import threading

    deadline = time.monotonic() + 60
    models = app.state.models.models
    loading = {f"load-{name}" for name in models}
    while not all(m.ready or m.load_error for m in models.values()) or any(
        t.name in loading and t.is_alive() for t in threading.enumerate()
    ):
        assert time.monotonic() < deadline, "a model was neither ready nor failed in 60 s"
        time.sleep(0.005)


def png(size: tuple[int, int] = (8, 8), seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def counters(client: TestClient, family: str) -> dict[tuple[str, ...], float]:
    """``/metrics``' samples of one counter family, by their label values (sorted by name)."""
    text = client.get("/metrics", headers=bearer(ALL)).text
    found = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            for s in fam.samples:
                if s.name == family + "_total":
                    found[tuple(v for _, v in sorted(s.labels.items()))] = s.value
    return found


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def error_of(r: Any) -> str:
    assert r.headers["content-type"] == "application/json", r.text
    return str(r.json()["error"])


# ---------------------------------------------------------------- answers and refusals
LIMIT = 10_485  # max_body_mb=0.01 in bytes, and the largest tensor in elements
UPLOAD = "multipart body cannot be parsed: missing boundary in the Content-Type (send "
UPLOAD += "multipart/form-data with a boundary and a 'file' field)"
LONG = "n" * 600


def refusals(x: np.ndarray) -> list[tuple[str, dict[str, Any], int, str, str]]:
    """(path, request, status, outcome, the error: whole, or its start when it ends in
    '…') of every bad request the first test sends."""
    nan = x.copy()
    nan[0, 0, 0, 0] = np.nan
    two = json_infer(x)
    two["inputs"] += json_infer(x, name="other")["inputs"]
    multipart = {"Content-Type": "multipart/form-data; boundary=zz"}
    return [
        ("/v2/models/nope/infer", {"json": json_infer(x)}, 404, "unknown_model",
         "unknown model 'nope'; this server serves 'm'"),
        (INFER_PATH, {"content": b"{not json"}, 400, "bad_request",
         "request body is not valid JSON: …"),
        (INFER_PATH, {"content": b"x" * LIMIT}, 400, "bad_request",
         "request body is not valid JSON: …"),  # exactly the limit: read, then judged
        (INFER_PATH, {"json": json_infer(x, name="x\ny")}, 400, "bad_request",
         "unknown input 'x\\ny'; the model's input is 'input'"),
        (INFER_PATH, {"json": json_infer(x, name=LONG)}, 400, "bad_request",
         f"unknown input '{LONG}'; the model's input is 'input'"),
        (INFER_PATH, {"json": two}, 400, "bad_request",
         "this model takes exactly one input ('input'), got 2"),
        (INFER_PATH, {"json": json_infer(x.astype(np.float64), dtype="FP64")}, 400,
         "bad_request", "input 'input' must be FP32, got FP64"),
        (INFER_PATH, {"json": json_infer(np.zeros((2, 3, 4, 5), np.float32))}, 400,
         "bad_request", "input 'input' has shape [2, 3, 4, 5]; expected [batch, 3, 4, 4]"),
        (INFER_PATH, {"json": json_infer(np.zeros((5, 3, 4, 4), np.float32))}, 400,
         "bad_request", "batch of 5 is outside 1..4 (--max-batch)"),
        (INFER_PATH, binary_infer(nan), 400, "bad_request",
         "input 'input' contains NaN or infinite values"),
        (INFER_PATH, {"json": json_infer(x, outputs=[{"name": "nope"}])}, 400,
         "bad_request", "unknown output 'nope'; the model's outputs are 'logits'"),
        (INFER_PATH, {"json": {"inputs": [{"name": "input", "shape": [1000, 3, 4, 4],
                                           "datatype": "FP32", "data": [0.0]}]}},
         413, "too_large", "input 'input': shape [1000, 3, 4, 4] has 48,000 elements, over "
         "the limit of 10,485: send smaller batches"),
        (INFER_PATH, {"content": b"x" * 20_000}, 413, "too_large",
         "request body of 20,000 bytes is over the 10,485-byte limit"),
        (INFER_PATH, {"content": b"x" * (LIMIT + 1)}, 413, "too_large",
         "request body of 10,486 bytes is over the 10,485-byte limit"),
        (INFER_PATH, {"content": b"{}", "headers": {"Content-Encoding": " GZip "}}, 415,
         "bad_request", "Content-Encoding 'gzip' is not supported: send the body uncompressed"),
        (PREDICT_PATH + "?top_k=abc", {"content": png()}, 400, "bad_request",
         "top_k must be an integer"),
        (PREDICT_PATH + "?top_k=0", {"content": png()}, 400, "bad_request",
         "top_k=0: ask for 1 or more classes (default 5)"),
        (PREDICT_PATH, {"content": b""}, 400, "bad_request",
         "empty body: send a JPEG/PNG image (raw body or multipart field 'file')"),
        (PREDICT_PATH, {"content": b"not an image"}, 400, "bad_request", "Cannot decode …"),
        (PREDICT_PATH, {"content": b"--x", "headers": {"Content-Type": "multipart/form-data"}},
         400, "bad_request", UPLOAD),
        (PREDICT_PATH, {"content": iter([b"--zz"]), "headers": multipart}, 400, "bad_request",
         "multipart uploads need a Content-Length header"),
        (PREDICT_PATH, {"content": b"x" * 20_000, "headers": multipart}, 413, "too_large",
         "request body of 20,000 bytes is over the 10,485-byte limit"),
        (PREDICT_PATH, {"content": b"x" * 20_000}, 413, "too_large",
         "request body of 20,000 bytes is over the 10,485-byte limit"),
    ]  # fmt: skip


def test_every_refusal_gets_its_status_message_log_line_and_count(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Answers, then every kind of bad request: each gets its 4xx and a JSON error naming
    what was wrong, one INFO line (the message as ``repr``, so a client's newline stays out
    of the log, and cut at 500 characters; none for a 404, whose paths a scanner walks), and
    a count under its endpoint and outcome; the server answers afterwards."""
    caplog.set_level(logging.INFO, logger="zoo.serve")
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    with serving(model, max_body_mb=0.01, max_batch=4) as (c, _):
        r = c.post(INFER_PATH, json=json_infer(x, id="req-7"))
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        body = r.json()
        assert (body["model_name"], body["id"]) == (NAME, "req-7")
        (out,) = body["outputs"]
        assert (out["name"], out["shape"], out["datatype"]) == ("logits", [2, 5], "FP32")
        want = x.reshape(2, -1) @ W
        np.testing.assert_allclose(np.reshape(out["data"], (2, 5)), want, rtol=1e-5, atol=1e-5)
        huge = np.full((4, 3, 4, 4), 1e5, np.float32)  # a float32 graph takes any finite value
        r = c.post(INFER_PATH, **binary_infer(huge))  # and the largest batch
        head = int(r.headers["inference-header-content-length"])
        assert r.status_code == 200 and json.loads(r.content[:head])["model_name"] == NAME
        got = np.frombuffer(r.content[head:], np.float32).reshape(4, 5)
        np.testing.assert_allclose(got, huge.reshape(4, -1) @ W, rtol=1e-4)
        expected: dict[tuple[str, ...], float] = {("infer", "ok"): 2}
        for path, kwargs, status, outcome, words in refusals(x):
            caplog.clear()
            r = c.post(path, **kwargs)
            assert r.status_code == status, (path, kwargs.get("json"), r.text)
            message = error_of(r)
            if words.endswith("…"):
                assert message.startswith(words[:-1]), (words, message)
            else:
                assert message == words
            endpoint = "predict" if "predict" in path else "infer"
            expected[endpoint, outcome] = expected.get((endpoint, outcome), 0) + 1
            lines = [rec.getMessage() for rec in caplog.records if rec.name == "zoo.serve"]
            if status == 404:
                assert lines == []
            else:
                where = path.split("?")[0]  # the path, without the query
                assert lines == [f"POST {where} -> {status}: {message[:500]!r}"]
                assert len(message) < 500 or len(lines[0]) < len(message)
        assert c.post(INFER_PATH, json=json_infer(x)).status_code == 200
        expected["infer", "ok"] += 1
        assert counters(c, "zoo_requests") == {(e, o): n for (e, o), n in expected.items()}


def test_a_fault_of_ours_is_500_logged_with_its_traceback_and_serving_goes_on(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="zoo.serve")
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    with serving(model, hand="clf") as (c, clf):
        real = clf.outputs
        clf.outputs = lambda batch: (_ for _ in ()).throw(RuntimeError("boom"))
        caplog.clear()  # the start-up's lines
        r = c.post(INFER_PATH, json=json_infer(x))
        assert r.status_code == 500 and error_of(r) == "internal error: RuntimeError: boom"
        (rec,) = [rec for rec in caplog.records if rec.name == "zoo.serve"]
        assert rec.levelno == logging.ERROR and rec.exc_info is not None
        assert rec.getMessage() == f"POST {INFER_PATH} failed"
        clf.outputs = real
        assert c.post(INFER_PATH, json=json_infer(x)).status_code == 200
        assert counters(c, "zoo_requests") == {("infer", "error"): 1, ("infer", "ok"): 1}


def test_a_full_queue_is_429_with_retry_after_and_a_late_answer_is_504(model: Path) -> None:
    """No room in the queue: 429 and ``Retry-After`` (for an image before it is decoded);
    an answer later than ``--timeout-ms``: 504 naming the limit, and the next request is
    answered once the model is free."""
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    with serving(model, max_queue=0) as (c, _):
        for path, kwargs in [
            (INFER_PATH, {"json": json_infer(x)}),
            (PREDICT_PATH, {"content": png()}),
        ]:
            r = c.post(path, **kwargs)
            assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
            assert error_of(r) == "queue full (0 requests waiting); retry later"
        assert counters(c, "zoo_requests") == {
            ("infer", "queue_full"): 1,
            ("predict", "queue_full"): 1,
        }
    with serving(model, timeout_ms=50) as (c, clf):
        release = threading.Event()
        real = clf.outputs

        def held(batch: np.ndarray) -> np.ndarray:
            release.wait(30)
            return real(batch)

        clf.outputs = held
        try:
            r = c.post(INFER_PATH, json=json_infer(x))
            assert r.status_code == 504 and "retry-after" not in r.headers
            assert error_of(r) == "request waited more than 50 ms"
        finally:
            release.set()
        clf.outputs = real
        assert c.post(INFER_PATH, json=json_infer(x)).status_code == 200
        assert counters(c, "zoo_requests") == {("infer", "timeout"): 1, ("infer", "ok"): 1}


def test_images_are_answered_as_the_model_answers_raw_or_uploaded(model: Path) -> None:
    with serving(model) as (c, clf):
        image = png((8, 6), seed=3)
        logits = clf.prepare(Image.open(io.BytesIO(image)).convert("RGB")).reshape(-1) @ W
        order = np.argsort(-logits, kind="stable")
        for kwargs in ({"content": image}, {"files": {"file": ("a.png", image, "image/png")}}):
            r = c.post(PREDICT_PATH + "?top_k=2", **kwargs)
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["model_name"] == NAME and "label" not in body  # no rejection rule
            preds = body["predictions"]
            assert [p["index"] for p in preds] == order[:2].tolist()
            assert [p["label"] for p in preds] == [CLASSES[i] for i in order[:2]]
            probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
            np.testing.assert_allclose([p["score"] for p in preds], probs[order[:2]], rtol=1e-4)
        assert len(c.post(PREDICT_PATH, content=image).json()["predictions"]) == 5  # default


def test_pixels_for_a_graph_that_preprocesses_itself_are_checked(tmp_path: Path) -> None:
    path = pixel_model(tmp_path / "pixels.onnx")
    ok = np.random.default_rng(1).integers(0, 256, (2, 6, 5, 3), np.uint8)
    with serving(path, max_image_pixels=40, max_batch=2) as (c, _):
        r = c.post(INFER_PATH, json=json_infer(ok, dtype="UINT8"))
        assert r.status_code == 200, r.text
        want = ok.astype(np.float32).mean(axis=(1, 2)) @ W_PIXELS
        np.testing.assert_allclose(
            np.reshape(r.json()["outputs"][0]["data"], (2, 5)), want, rtol=1e-4, atol=1e-4
        )
        for x, datatype, words in [
            (ok.astype(np.float32), "FP32", "input 'input' must be UINT8 pixels, got FP32"),
            (ok[..., :2], "UINT8", "has shape [2, 6, 5, 2]; expected [batch, height, width, 3]"),
            (ok[0], "UINT8", "has shape [6, 5, 3]; expected [batch, height, width, 3]"),
            (ok[:, :0], "UINT8", "has shape [2, 0, 5, 3]"),
            (np.zeros((1, 7, 6, 3), np.uint8), "UINT8", "6x7 pixels is over the limit of 40"),
            (np.zeros((3, 4, 4, 3), np.uint8), "UINT8", "batch of 3 is outside 1..2"),
            (np.zeros((1, 1, 101, 3), np.uint8), "UINT8", "The image is 101x1 pixels: its long"),
            (np.zeros((1, 101, 1, 3), np.uint8), "UINT8", "The image is 1x101 pixels: its long"),
        ]:
            r = c.post(INFER_PATH, json=json_infer(x, dtype=datatype))
            assert r.status_code == 400 and words in error_of(r), (words, r.text)
        thin = np.zeros((1, 1, 40, 3), np.uint8)  # 40:1, within the aspect limit
        assert c.post(INFER_PATH, json=json_infer(thin, dtype="UINT8")).status_code == 200
        edge = np.zeros((1, 8, 5, 3), np.uint8)  # exactly 40 pixels: allowed
        assert c.post(INFER_PATH, json=json_infer(edge, dtype="UINT8")).status_code == 200


def test_a_free_size_graph_takes_any_height_and_width_as_much_work_as_a_batch(
    tmp_path: Path,
) -> None:
    """A ``zoo export --dynamic-size`` graph: its metadata and Triton config say height and
    width are free, and tensors of any size are answered as the graph answers, up to a
    request as much work as ``--max-batch`` samples of the export size (a sample of n times
    its pixels counts n times); the channels and an empty side are refused, naming the
    shape."""
    path = free_size_model(tmp_path / "free.onnx")
    rng = np.random.default_rng(2)
    with serving(path, max_batch=2) as (c, _):
        meta = c.get(f"/v2/models/{NAME}").json()
        assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, -1, -1]}]
        config = c.get(f"/v2/models/{NAME}/config").json()
        assert config["input"][0]["dims"] == [3, -1, -1]
        # 4x4 is the export size: 2 of them, or one of 32 pixels, are as much as --max-batch 2
        for shape in [(2, 3, 4, 4), (1, 3, 5, 6), (2, 3, 1, 1), (2, 3, 3, 5), (1, 3, 32, 1)]:
            x = rng.standard_normal(shape).astype(np.float32)
            for body in ({"json": json_infer(x)}, binary_infer(x)):
                r = c.post(INFER_PATH, **body)
                assert r.status_code == 200, (shape, r.text)
                got = r.json()["outputs"][0]["data"] if "json" in body else None
                if got is not None:
                    want = x.mean(axis=(2, 3)) @ W_PIXELS
                    np.testing.assert_allclose(
                        np.reshape(got, (len(x), 5)), want, rtol=1e-4, atol=1e-5
                    )
        over = (
            "the export size [3, 4, 4], over --max-batch (2): send fewer samples or a smaller size"
        )
        for x, words in [
            (np.zeros((1, 2, 4, 4), np.float32),
             "input 'input' has shape [1, 2, 4, 4]; expected [batch, 3, any, any]"),
            (np.zeros((1, 3, 4), np.float32),
             "input 'input' has shape [1, 3, 4]; expected [batch, 3, any, any]"),
            (np.zeros((1, 3, 0, 4), np.float32),
             "input 'input' has shape [1, 3, 0, 4]: an empty dimension"),
            (np.zeros((1, 3, 4, 0), np.float32),
             "input 'input' has shape [1, 3, 4, 0]: an empty dimension"),
            (np.zeros((1, 3, 6, 7), np.float32),
             f"input 'input' has shape [1, 3, 6, 7]: as much work as 2.62 samples of {over}"),
            (np.zeros((2, 3, 5, 4), np.float32),
             f"input 'input' has shape [2, 3, 5, 4]: as much work as 2.5 samples of {over}"),
            (np.zeros((3, 3, 2, 2), np.float32), "batch of 3 is outside 1..2 (--max-batch)"),
        ]:  # fmt: skip
            r = c.post(INFER_PATH, json=json_infer(x))
            assert r.status_code == 400 and error_of(r) == words, (words, r.text)


def test_a_size_a_free_size_graph_fails_at_is_400_naming_the_export_size(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A graph that declares its height and width free but fails at a size (the runtime's
    error) has refused the client's size: 400 naming the size it was exported at, with the
    runtime's first line, and no traceback; at its own size it answers."""
    path = free_size_model(tmp_path / "refuses.onnx", refuses_other_sizes=True)
    x = np.random.default_rng(3).standard_normal((1, 3, 4, 4)).astype(np.float32)
    with serving(path, max_batch=2) as (c, _), caplog.at_level(logging.INFO):
        r = c.post(INFER_PATH, json=json_infer(x))
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(
            r.json()["outputs"][0]["data"], (x.reshape(1, -1) @ W)[0], rtol=1e-4, atol=1e-5
        )
        other = np.zeros((1, 3, 5, 4), np.float32)
        r = c.post(INFER_PATH, json=json_infer(other))
        said = error_of(r)
        assert r.status_code == 400, r.text
        assert said.startswith("input 'input' of shape [1, 3, 5, 4]: the graph does not take it (")
        assert said.endswith("); send [batch, 3, 4, 4], the size it was exported at")
        assert "\n" not in said and len(said) < 500
        assert c.post(INFER_PATH, json=json_infer(x)).status_code == 200  # still serving
    assert not [rec for rec in caplog.records if rec.exc_info], "a client's size is no fault"


def test_a_free_size_graph_failing_at_its_export_size_too_is_a_fault_of_ours(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure at another size is the client's only if the model still answers at its
    export size: a model that fails there too is a 500 with its traceback; a timeout at
    another size stays a 504."""
    caplog.set_level(logging.INFO, logger="zoo.serve")
    path = free_size_model(tmp_path / "free.onnx")
    other = np.zeros((1, 3, 5, 5), np.float32)
    with serving(path, hand="clf", max_batch=2, timeout_ms=50) as (c, clf):
        real = clf.outputs
        clf.outputs = lambda batch: (_ for _ in ()).throw(RuntimeError("boom"))
        caplog.clear()
        r = c.post(INFER_PATH, json=json_infer(other))
        assert r.status_code == 500 and error_of(r) == "internal error: RuntimeError: boom"
        assert [rec for rec in caplog.records if rec.exc_info]
        clf.outputs = lambda batch: (time.sleep(0.3), real(batch))[1]
        r = c.post(INFER_PATH, json=json_infer(other))
        assert r.status_code == 504, r.text
        clf.outputs = real
        time.sleep(0.4)  # the slow batch ends
        assert c.post(INFER_PATH, json=json_infer(other)).status_code == 200


def test_a_model_that_cannot_load_is_503_saying_why_and_health_tells_live_from_ready(
    model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every model endpoint of a model that failed to load answers 503 with the reason,
    counted under its own endpoint; health says live but not ready; the index says why. A
    ready model answers each endpoint in JSON, counted likewise."""
    caplog.set_level(logging.INFO, logger="zoo.serve")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    endpoints = {  # path -> the endpoint it counts under
        f"/v2/models/{NAME}": "metadata",
        f"/v2/models/{NAME}/versions/1": "metadata",
        f"/v2/models/{NAME}/ready": "model_ready",
        f"/v2/models/{NAME}/config": "config",
        f"/v2/models/{NAME}/versions/1/config": "config",
    }
    x = np.zeros((1, 3, 4, 4), np.float32)
    with serving(broken, hand="none") as (c, _):
        caplog.clear()
        assert c.get("/v2/health/live").json() == {"live": True}
        r = c.get("/v2/health/ready")
        assert r.status_code == 503 and r.json() == {"ready": False}
        for path in endpoints:
            r = c.get(path)
            assert r.status_code == 503, path
            assert error_of(r).startswith("model is not ready yet: InputError: "), r.text
        r = c.post(INFER_PATH, json=json_infer(x))
        assert r.status_code == 503 and "broken.onnx" in error_of(r)
        (entry,) = c.get("/v2/repository/index").json()
        assert (entry["name"], entry["state"]) == (NAME, "UNAVAILABLE") and entry["reason"]
        assert c.post("/v2/repository/index", json={"ready": True}).json() == []
        assert [r.getMessage() for r in caplog.records] == []  # a state, not a client's error
        assert counters(c, "zoo_requests") == {
            ("metadata", "not_ready"): 2,
            ("model_ready", "not_ready"): 1,
            ("config", "not_ready"): 2,
            ("infer", "not_ready"): 1,
            ("repository_index", "ok"): 2,
        }
    with serving(model) as (c, _):
        assert c.get("/v2/health/ready").json() == {"ready": True}
        for path, endpoint in endpoints.items():
            r = c.get(path)
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
            if endpoint == "metadata":
                assert r.json()["name"] == NAME and r.json()["inputs"][0]["shape"] == [-1, 3, 4, 4]
            elif endpoint == "config":
                assert r.json()["max_batch_size"] == 16
            else:
                assert r.json() == {"name": NAME, "ready": True}
        assert c.post(f"/v2/models/{NAME}/versions/1/infer", json=json_infer(x)).status_code == 200
        r = c.post("/v2/repository/index", json={"ready": True})
        assert r.headers["content-type"] == "application/json"
        (entry,) = r.json()
        assert (entry["name"], entry["state"]) == (NAME, "READY")
        r = c.post("/v2/repository/index", json={"ready": "yes"})
        assert r.status_code == 400 and error_of(r)
        r = c.post("/v2/repository/index", content=b"x" * 5000)
        assert r.status_code == 413 and error_of(r) == (
            "request body of 5,000 bytes is over the 4,096-byte limit"
        )
        page = c.get("/")
        assert f'<meta name="zoo-model" content="{NAME}">' in page.text
        assert "{{MODEL}}" not in page.text and page.headers["content-type"].startswith("text/html")
        assert "security" not in str(c.get("/openapi.json").json())  # no keys: nothing keyed
        assert c.get("/openapi.json").headers["content-type"] == "application/json"
        metrics = c.get("/metrics")
        assert metrics.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert counters(c, "zoo_requests") == {
            ("metadata", "ok"): 2,
            ("model_ready", "ok"): 1,
            ("config", "ok"): 2,
            ("infer", "ok"): 1,
            ("repository_index", "ok"): 1,
            ("repository_index", "bad_request"): 1,
            ("repository_index", "too_large"): 1,
        }


def test_a_rejection_rule_answers_unknown_or_the_class_with_its_reasons(tmp_path: Path) -> None:
    """A model with a rejection rule: ``/predict`` adds the label (the best class, or
    ``unknown`` below the threshold), ``accepted``, the score and the rule."""
    image = png(seed=5)
    for threshold, accepted in ((0.0, True), (1.5, False)):  # msp is within (0, 1]
        rule = {"score": "msp", "threshold": threshold, "acceptance": 0.95}
        path = float_model(
            tmp_path / f"rule{threshold}.onnx", calibration={"temperature": 1.0, "reject": rule}
        )
        with serving(path) as (c, _):
            r = c.post(PREDICT_PATH + "?top_k=2", content=image)
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
            body = r.json()
            best = body["predictions"][0]
            assert body["label"] == (best["label"] if accepted else "unknown")
            assert body["accepted"] is accepted and body["threshold"] == threshold
            assert body["score_kind"] == "msp" and body["score"] == pytest.approx(best["score"])


def test_an_fp16_io_graph_takes_what_float16_holds(tmp_path: Path) -> None:
    path = float_model(tmp_path / "half.onnx", half=True)
    edge = np.full((1, 3, 4, 4), 65504.0, np.float32)  # float16's largest: allowed
    with serving(path) as (c, _):
        r = c.post(INFER_PATH, json=json_infer(edge / 1e3))
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(
            np.reshape(r.json()["outputs"][0]["data"], (1, 5)),
            (edge / 1e3).reshape(1, -1) @ W,
            rtol=1e-2,
        )
        assert c.post(INFER_PATH, json=json_infer(edge)).status_code == 200
        r = c.post(INFER_PATH, json=json_infer(edge * 1.01))
        assert r.status_code == 400 and error_of(r) == (
            "input 'input' has values beyond float16's range (±65504), which this model "
            "(exported with --fp16-io) takes"
        )


def test_several_models_count_apart_and_an_unknown_name_counts_as_no_model(
    model: Path,
) -> None:
    cfg = ServeConfig(f"a={model}", more_models=(f"b={model}",), threads=2)
    app = create_app(cfg)
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    with TestClient(app) as c:
        wait_for(app)
        assert c.post("/v2/models/a/infer", json=json_infer(x)).status_code == 200
        for _ in range(2):
            assert c.post("/v2/models/b/infer", json=json_infer(x)).status_code == 200
        r = c.post("/v2/models/c/infer", json=json_infer(x))
        assert r.status_code == 404 and error_of(r) == (
            "unknown model 'c'; this server serves 'a', 'b'"
        )
        assert counters(c, "zoo_requests") == {
            ("infer", "a", "ok"): 1,
            ("infer", "b", "ok"): 2,
            ("infer", "", "unknown_model"): 1,
        }
        page = c.get("/").text  # the first model's page
        assert '<meta name="zoo-model" content="a">' in page and "{{MODEL}}" not in page


def request_of(chunks: list[bytes], headers: dict[str, str]) -> Any:
    """A Starlette request whose body arrives in ``chunks`` (as a server streams it)."""
    from starlette.requests import Request

    messages = [
        {"type": "http.request", "body": b, "more_body": i < len(chunks) - 1}
        for i, b in enumerate(chunks)
    ]

    async def receive() -> dict:
        return messages.pop(0)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    return Request(scope, receive)


def test_a_body_is_refused_the_moment_it_passes_the_limit() -> None:
    import asyncio

    from zoo.deploy.serve.inputs import read_body
    from zoo.errors import PayloadTooLargeError, UnsupportedMediaTypeError

    def read(chunks: list[bytes], headers: dict[str, str] | None = None, limit: int = 10) -> bytes:
        return asyncio.run(read_body(request_of(chunks, headers or {}), limit))

    assert read([b"12345", b"67890"]) == b"1234567890"  # exactly the limit, in two parts
    assert read([b"1234567890"], {"Content-Length": "10"}) == b"1234567890"
    assert read([b"12", b""], {"Content-Encoding": ""}) == b"12"
    assert read([b"ab"], {"Content-Encoding": "Identity", "Content-Length": "x"}) == b"ab"
    with pytest.raises(PayloadTooLargeError) as info:
        read([b"123456", b"78901"])  # each part within it, together over it
    assert str(info.value) == "request body is over the 10-byte limit"
    with pytest.raises(PayloadTooLargeError) as info:
        read([b""], {"Content-Length": "11"})  # refused before anything is read
    assert str(info.value) == "request body of 11 bytes is over the 10-byte limit"
    with pytest.raises(UnsupportedMediaTypeError):
        read([b"x"], {"Content-Encoding": "br"})


# ---------------------------------------------------------------- API keys on every route
KEYED = {  # route -> (method, scope): every route but health, by its scope
    "/": ("GET", "metadata"),
    "/v2": ("GET", "metadata"),
    "/v2/repository/index": ("GET", "metadata"),
    f"/v2/models/{NAME}": ("GET", "metadata"),
    f"/v2/models/{NAME}/ready": ("GET", "metadata"),
    f"/v2/models/{NAME}/versions/1": ("GET", "metadata"),
    f"/v2/models/{NAME}/config": ("GET", "metadata"),
    f"/v2/models/{NAME}/versions/1/config": ("GET", "metadata"),
    "/openapi.json": ("GET", "metadata"),
    "/metrics": ("GET", "metrics"),
    INFER_PATH: ("POST", "infer"),
    f"/v2/models/{NAME}/versions/1/infer": ("POST", "infer"),
    PREDICT_PATH: ("POST", "infer"),
}
GRANTS = {ALL: set(SCOPES), INFER: {"infer"}, OPS: {"metadata", "metrics"}}


def test_every_route_but_health_needs_a_key_granting_its_scope(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Health is open; every other route answers 401 without a valid bearer key (with the
    RFC 6750 challenge), 403 to a valid key without its scope, and is served otherwise; an
    unknown path or method is a 401 too until a valid key is shown (no probing); each refusal
    is counted by scope and reason; no key is ever in a body, header or log line."""
    caplog.set_level(logging.DEBUG)
    keys = parse_key_file(KEY_FILE, "keys.txt")
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    bodies = {"POST": {"json": json_infer(x)}, "GET": {}}
    seen: list[str] = []
    with serving(model, keys) as (c, _):
        for path in ("/v2/health/live", "/v2/health/ready"):
            assert c.get(path).status_code == 200
        refused: dict[tuple[str, ...], float] = {}
        for path, (method, scope) in KEYED.items():
            kwargs = {**bodies[method]}
            if path == PREDICT_PATH:
                kwargs = {"content": png()}
            for headers, status, challenge in [
                ({}, 401, 'Bearer realm="zoo"'),
                ({"Authorization": f"Basic {ALL}"}, 401, 'Bearer realm="zoo"'),
                (bearer("x" * len(ALL)), 401, 'Bearer realm="zoo", error="invalid_token"'),
                (bearer(ALL + "x"), 401, 'Bearer realm="zoo", error="invalid_token"'),
            ]:
                r = c.request(method, path, headers=headers, **kwargs)
                assert r.status_code == status, (path, headers, r.text)
                assert r.headers["www-authenticate"] == challenge
                verdict = Verdict.MISSING if "invalid" not in challenge else Verdict.INVALID
                assert error_of(r) == refusal_message(verdict, scope)
                key = (verdict.value, scope)
                refused[key] = refused.get(key, 0) + 1
                seen.append(r.text + str(r.headers))
            for key, grants in GRANTS.items():
                r = c.request(method, path, headers=bearer(key), **kwargs)
                seen.append(r.text + str(r.headers))
                if scope in grants:
                    assert r.status_code == 200, (path, key, r.text)
                    continue
                assert r.status_code == 403, (path, key, r.text)
                assert r.headers["www-authenticate"] == (
                    f'Bearer realm="zoo", error="insufficient_scope", scope="{scope}"'
                )
                assert (
                    error_of(r)
                    == f"the API key does not grant the {scope!r} scope this endpoint needs"
                )
                refused["forbidden", scope] = refused.get(("forbidden", scope), 0) + 1
        for headers in ({}, bearer("x" * len(ALL))):  # no path exists without a valid key
            for r in (c.get("/v2/nope", headers=headers), c.get(INFER_PATH, headers=headers)):
                verdict = Verdict.INVALID if headers else Verdict.MISSING
                assert r.status_code == 401, r.text
                assert r.headers["www-authenticate"] == (
                    'Bearer realm="zoo", error="invalid_token"' if headers else 'Bearer realm="zoo"'
                )
                refused[verdict.value, "metadata"] += 1  # counted like a route's refusal
                assert error_of(r) == refusal_message(verdict, "metadata")
        lines = {  # what each refusal logs: one line, the message as repr
            ("/v2", None): f"GET /v2 -> 401: {refusal_message(Verdict.MISSING, 'metadata')!r}",
            ("/metrics", INFER): "GET /metrics -> 403: "
            + repr(refusal_message(Verdict.FORBIDDEN, "metrics")),
            ("/v2/nope", None): "GET /v2/nope -> 401: "
            + repr(refusal_message(Verdict.MISSING, "metadata")),
            ("/v2/nope", OPS + "x"): "GET /v2/nope -> 401: "
            + repr(refusal_message(Verdict.INVALID, "metadata")),
            ("/v2/nope", INFER): "GET /v2/nope -> 404: \"no such path '/v2/nope'; the "
            'endpoints are listed at /openapi.json"',
            (INFER_PATH, INFER): f"GET {INFER_PATH} -> 405: 'GET is not allowed on "
            f"{INFER_PATH}; use POST'",
        }
        for (path, key), line in lines.items():
            caplog.clear()
            r = c.get(path, headers=bearer(key) if key else {})
            assert [rec.getMessage() for rec in caplog.records if rec.name == "zoo.serve"] == [line]
            seen.append(r.text)
        r = c.get("/v2/nope", headers=bearer(INFER))  # a valid key: the path's real answer
        assert r.status_code == 404 and "/openapi.json" in error_of(r)
        r = c.get(INFER_PATH, headers=bearer(INFER))
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert error_of(r) == f"GET is not allowed on {INFER_PATH}; use POST"
        refused["forbidden", "metrics"] += 1  # the refusals logged above
        refused["missing", "metadata"] += 2
        refused["invalid", "metadata"] += 1
        got = counters(c, "zoo_auth_refusals")
        assert got == refused  # by (reason, scope)
        doc = c.get("/openapi.json", headers=bearer(OPS)).json()
        for path, (method, scope) in KEYED.items():
            template = path.replace(f"/models/{NAME}", "/models/{name}")
            op = doc["paths"][template][method.lower()]
            assert op["security"] == [{"apiKey": []}] and {"401", "403"} <= set(op["responses"])
            assert repr(scope) in op["description"]
        assert "security" not in doc["paths"]["/v2/health/live"]["get"]
    seen += [rec.getMessage() for rec in caplog.records]
    leaked = [s for s in seen for k in GRANTS if k in s]
    assert not leaked, leaked[:3]


def test_upload_refusals_say_what_to_send() -> None:
    from zoo.deploy.serve.inputs import upload_field

    part = b'--zz\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\nok\r\n'
    body = part + b"--zz--\r\n"
    assert upload_field(body, b"zz") == b"ok"
    with pytest.raises(InputError) as info:
        upload_field(b"no boundary at all" + body, b"zz")
    message = str(info.value)
    assert message.startswith("multipart body cannot be parsed: ")
    assert message.endswith(" (send multipart/form-data with a boundary and a 'file' field)")
    with pytest.raises(InputError) as info:
        upload_field(body[:-8], b"zz")
    assert str(info.value) == (
        "multipart body ends before its closing boundary: the upload was cut short"
    )
    with pytest.raises(InputError) as info:
        upload_field(part + body, b"zz")
    assert str(info.value) == (
        "multipart upload has 2 'file' file parts; this endpoint classifies one image a "
        "request: send each in a request of its own, or several as one batch to "
        "/v2/models/NAME/infer"
    )


class BrokenKeys(ApiKeys):
    """Keys whose check has a bug: an exception outside every endpoint's own guard."""

    def check(self, authorization: str | None, scope: str) -> Verdict:
        raise RuntimeError("a bug in the key check")


def test_a_bug_outside_every_endpoints_guard_is_still_a_json_500(model: Path) -> None:
    from zoo.deploy.serve.app import HttpApi
    from zoo.deploy.serve.model import ModelServer

    app = create_app(ServeConfig(str(model), NAME), keys=BrokenKeys(()))
    r = TestClient(app, raise_server_exceptions=False).get("/v2")
    assert r.status_code == 500 and r.json() == {
        "error": "internal error: RuntimeError: a bug in the key check"
    }
    one = HttpApi(ModelServer(ServeConfig(str(model), NAME)), keys=None)  # one model, bare
    assert one.models.names == (NAME,) and one.models.first.name == NAME


# ---------------------------------------------------------------- auth, as functions
BAD_KEY = (
    f"an API key must be at least {MIN_KEY_LENGTH} printable ASCII characters without "
    "spaces (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)"
)


def test_bearer_tokens_and_what_a_refused_client_is_told() -> None:
    for header, token in [
        (None, None),
        ("", None),
        ("Bearer abc", "abc"),
        ("bearer   abc  ", "abc"),
        ("  BEARER abc", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer    ", None),
        ("Bearerabc", None),
        ("Token abc", None),
    ]:
        assert bearer_token(header) == token, header
    assert refusal_message(Verdict.MISSING, "infer") == (
        "this endpoint needs an API key: send 'Authorization: Bearer <key>' (the header; "
        "gRPC: the metadata)"
    )
    assert refusal_message(Verdict.INVALID, "infer") == "the API key is not valid for this server"
    assert refusal_message(Verdict.FORBIDDEN, "metrics") == (
        "the API key does not grant the 'metrics' scope this endpoint needs"
    )


def test_a_key_file_grants_each_key_its_scopes_and_refuses_bad_lines_without_the_key() -> None:
    keys = parse_key_file(KEY_FILE + f"{'k' * MIN_KEY_LENGTH} metadata, infer\n", "keys.txt")
    assert repr(keys) == "ApiKeys(4 keys)" and ALL not in repr(keys)
    assert keys.scopes_of(ALL) == frozenset(SCOPES) == frozenset({"infer", "metadata", "metrics"})
    assert keys.scopes_of(INFER) == {"infer"} and keys.scopes_of(OPS) == {"metadata", "metrics"}
    assert keys.scopes_of("k" * MIN_KEY_LENGTH) == {"metadata", "infer"}
    assert keys.scopes_of("x" * len(ALL)) is None and keys.scopes_of("") is None
    for header, scope, verdict in [
        (f"Bearer {INFER}", "infer", Verdict.OK),
        (f"Bearer {INFER}", "metrics", Verdict.FORBIDDEN),
        (f"Bearer {OPS}", "metrics", Verdict.OK),
        (f"Bearer {OPS}x", "metrics", Verdict.INVALID),
        (None, "infer", Verdict.MISSING),
        (f"Basic {ALL}", "infer", Verdict.MISSING),
        ("Bearer \udcff" + INFER[1:], "infer", Verdict.INVALID),  # undecodable bytes: no 500
        ("Bearer " + "é" * 20, "infer", Verdict.INVALID),
    ]:
        assert keys.check(header, scope) is verdict, (header, scope)
    two = parse_key_file(f"{INFER} infer # the app # a second '#'\n", "k")
    assert two.scopes_of(INFER) == {"infer"}
    short = "s" * (MIN_KEY_LENGTH - 1)
    for text, words in [
        (f"{ALL}\n{short} infer\n", f"keys.txt line 2: {BAD_KEY}"),
        (f"{'é' * 20}\n", f"keys.txt line 1: {BAD_KEY}"),
        (f"\x01{'a' * 20}\n", f"keys.txt line 1: {BAD_KEY}"),
        (f"{'a' * 10}\t{'b' * 10}\n", f"keys.txt line 1: {BAD_KEY}"),
        (
            f"{ALL} infer,admin\n",
            "keys.txt line 1: unknown scope 'admin'; the scopes are infer, metadata, metrics "
            "(comma-separated; none: all of them)",
        ),
        (
            f"{ALL}\n# c\n{ALL} metrics\n",
            "keys.txt line 3: this key was already given on an earlier line",
        ),
        ("# nothing\n\n", "keys.txt holds no API key"),
    ]:
        with pytest.raises(InputError) as info:
            parse_key_file(text, "keys.txt")
        assert str(info.value).startswith(words), str(info.value)
        assert not {ALL, short, "é" * 20} & set(str(info.value).split()), str(info.value)


def test_keys_come_from_the_file_else_the_variable_else_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING, logger="zoo.serve")
    assert load_keys(None, {}) is None and load_keys(None, {ENV_VAR: "  "}) is None
    from_env = load_keys(None, {ENV_VAR: f" {INFER} "})
    assert from_env is not None and from_env.scopes_of(INFER) == frozenset(SCOPES)
    with pytest.raises(InputError) as info:
        load_keys(None, {ENV_VAR: "short"})
    assert str(info.value) == f"{ENV_VAR}: {BAD_KEY}"
    assert caplog.records == []
    path = tmp_path / "keys.txt"
    path.write_text(KEY_FILE)
    path.chmod(0o600)
    keys = load_keys(str(path), {})
    assert keys is not None and keys.check(f"Bearer {OPS}", "metrics") is Verdict.OK
    assert caplog.records == []  # private and no variable: nothing to warn about
    path.chmod(0o640)
    keys = load_keys(str(path), {ENV_VAR: "env-key-0123456789abcdef"})
    assert keys is not None and keys.scopes_of("env-key-0123456789abcdef") is None  # the file's
    assert [r.getMessage() for r in caplog.records] == [
        f"{path} is readable by other users: chmod 600 it",
        f"{ENV_VAR} is set but --api-key-file is given: the file's keys are used",
    ]
    path.write_text(f"{ALL}\nshort-key\n")
    with pytest.raises(InputError) as info:
        load_keys(str(path), {})
    assert str(info.value) == f"{path} line 2: {BAD_KEY}"
    monkeypatch.setenv(ENV_VAR, INFER)  # the process's own environment, read now
    keys = load_keys(None)
    assert keys is not None and keys.scopes_of(INFER) == frozenset(SCOPES)
    monkeypatch.delenv(ENV_VAR)
    assert load_keys(None) is None
    for bad in (tmp_path / "missing.txt", tmp_path):
        with pytest.raises(InputError, match=f"--api-key-file {bad}: cannot read it"):
            load_keys(str(bad), {})
    (tmp_path / "latin1.txt").write_bytes(b"\xe9" * 20)
    with pytest.raises(InputError, match="cannot read it"):
        load_keys(str(tmp_path / "latin1.txt"), {})


def test_only_a_loopback_bind_goes_without_a_key() -> None:
    for host, loopback in [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LocalHost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("128.0.0.1", False),
        ("example.org", False),
        ("localhost.example.org", False),
    ]:
        assert is_loopback(host) is loopback, host
    with pytest.raises(UsageError) as info:
        check_exposure("0.0.0.0", None, allow_unauthenticated=False)
    assert str(info.value) == (
        f"--host 0.0.0.0 serves other machines, and no API key is set: give --api-key-file "
        f"PATH or set {ENV_VAR}, or pass --allow-unauthenticated to serve anyone who can reach "
        "it"
    )
    assert info.value.param_hint == "--host"
    check_exposure("0.0.0.0", None, allow_unauthenticated=True)  # said explicitly
    check_exposure("0.0.0.0", parse_key_file(ALL, "k"), allow_unauthenticated=False)
    check_exposure("127.0.0.1", None, allow_unauthenticated=False)


# ---------------------------------------------------------------- settings
def test_settings_refuse_contradictions_before_anything_loads() -> None:
    for settings, hint, message in [
        ({"name": "x", "more_models": ("b.onnx",)}, "--name",
         "--name names one model, and 2 are served: name each as NAME=MODEL (e.g. `zoo serve "
         "cats=runs/cats dogs=runs/dogs`)"),
        ({"ssl_keyfile": "k.pem"}, "--ssl-certfile",
         "--ssl-keyfile needs --ssl-certfile (the certificate it belongs to)"),
        ({"grpc_port": 8000}, "--grpc-port",
         "--grpc-port 8000 is the HTTP --port too: give gRPC its own port"),
    ]:  # fmt: skip
        with pytest.raises(UsageError) as info:
            ServeConfig("a.onnx", **settings)  # type: ignore[arg-type]
        assert (str(info.value), info.value.param_hint) == (message, hint)
    assert ServeConfig("a.onnx", ssl_certfile="c.pem", ssl_keyfile="k.pem").tls
    assert ServeConfig("a.onnx", ssl_certfile="c.pem").tls and not ServeConfig("a.onnx").tls
    with pytest.raises(UsageError, match="--grpc-port 8000 is the HTTP --port too"):
        ServeConfig("a.onnx", grpc_port=8000)
    with pytest.raises(UsageError, match="--grpc-port 9000 is the HTTP --port too"):
        ServeConfig("a.onnx", port=9000, grpc_port=9000)
    ServeConfig("a.onnx", port=0, grpc_port=0)  # any two free ports
    ServeConfig("a.onnx", grpc_port=8001)
    assert ServeConfig("a.onnx", max_body_mb=1.5).body_limit == 1_572_864
    defaults = option_defaults()
    assert "model_path" not in defaults and defaults["host"] == "127.0.0.1"
    assert defaults["allow_unauthenticated"] is False and defaults["api_key_file"] is None
    from zoo.images import MAX_PIXELS

    assert defaults["max_image_pixels"] < MAX_PIXELS  # a server is stricter than a CLI
    assert defaults == {
        f: getattr(ServeConfig("a.onnx"), f) for f in defaults
    }  # the CLI's defaults are the settings' own


def test_names_references_and_the_thread_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    odd = tmp_path / "a=b.onnx"
    odd.write_bytes(b"")
    for arg, split in [
        ("cats=runs/cats", ("cats", "runs/cats")),
        ("runs/cats", (None, "runs/cats")),
        ("a.b-c_9=x.onnx", ("a.b-c_9", "x.onnx")),
        ("x" * 128 + "=m", ("x" * 128, "m")),
        ("c=d=e", ("c", "d=e")),
        (str(odd), (None, str(odd))),  # an existing file with '=' in its name
    ]:
        assert split_name(arg) == split, arg
    for bad in ("bad/name=x", "=x", "cats=", "-a=x", ".a=x", "x" * 129 + "=m", "a b=x"):
        with pytest.raises(UsageError) as info:
            split_name(bad)
        assert str(info.value) == (
            f"{bad!r}: NAME=MODEL needs a name of letters, digits, '_', '.' or '-' (starting "
            "with a letter or digit) and a model after the '='"
        )
        assert info.value.param_hint == "MODEL"
    assert thread_shares(None, 1) == [None] and thread_shares(4, 1) == [4]
    assert thread_shares(5, 2) == [3, 2] and thread_shares(7, 3) == [3, 2, 2]
    assert thread_shares(6, 3) == [2, 2, 2] and thread_shares(2, 3) == [1, 1, 1]
    monkeypatch.setattr("zoo.system.available_cpus", lambda: 3)
    assert thread_shares(None, 2) == [2, 1]
    cfg = ServeConfig("dir/a.onnx", more_models=("b=x/b.onnx", "x/c.onnx"), threads=5)
    assert cfg.references() == ((None, "dir/a.onnx"), ("b", "x/b.onnx"), (None, "x/c.onnx"))
    assert [(m.name, m.model_path, m.threads) for m in cfg.served()] == [
        ("a", "dir/a.onnx", 2),
        ("b", "x/b.onnx", 2),
        ("c", "x/c.onnx", 1),
    ]
    one = ServeConfig("dir/a.onnx", name="cats", threads=3)
    assert one.references() == (("cats", "dir/a.onnx"),)
    resolved = one.resolved([("/abs/a.onnx", "arch.tag")])
    assert (resolved.model_path, resolved.name) == ("/abs/a.onnx", "cats")
    (m,) = resolved.models
    assert (m.name, m.model_path, m.threads) == ("cats", "/abs/a.onnx", 3)
    two = ServeConfig("a.onnx", more_models=("b.onnx",)).resolved([("/a", "t"), ("/b", "u")])
    assert two.name is None and two.model_path == "/a"
    assert [m.name for m in two.models] == ["t", "u"] and two.served() == two.models
    with pytest.raises(UsageError) as info:
        ServeConfig("a.onnx", more_models=("x/a.onnx",)).served()
    assert str(info.value) == (
        "two models are named 'a' (a.onnx and x/a.onnx): rename one as NAME=MODEL, e.g. "
        "`a-2=x/a.onnx`"
    )
    assert info.value.param_hint == "MODEL"
    with pytest.raises(ValueError, match="zip"):  # a file for each reference, no fewer
        ServeConfig("a.onnx", more_models=("b.onnx",)).resolved([("/a", "t")])
    unnamed = ServeConfig("a.onnx").resolved([("/abs/a.onnx", "arch.tag")])
    assert unnamed.name == "arch.tag" and unnamed.model_path == "/abs/a.onnx"


def test_each_model_gets_the_servers_limits_and_runs_without_spinning(model: Path) -> None:
    settings = dict(
        max_batch=3, max_delay_ms=2.5, max_queue=7, timeout_ms=123.0, device="cpu",
        runtime="onnxruntime", max_body_mb=0.5, max_image_pixels=999,
    )  # fmt: skip
    (m,) = ServeConfig(str(model), "tiny", threads=1, **settings).served()  # type: ignore[arg-type]
    assert m == ModelConfig(model_path=str(model), name="tiny", threads=1, **settings)  # type: ignore[arg-type]
    assert m.body_limit == 524_288
    clf = load_served(m)
    assert clf.runtime == "onnxruntime" and clf.threads == 1
    options = clf.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
