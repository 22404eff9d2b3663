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

from tests.serving import binary_infer
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


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    set_metadata(model, {"preprocessing": PRE, "class_names": CLASSES})
    onnx.save(model, str(path))
    return path


def float_model(path: Path) -> Path:
    """input (batch, 3, 4, 4) float -> Flatten -> MatMul W -> logits (batch, 5)."""
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["input"], ["f"], axis=1),
            helper.make_node("MatMul", ["f", "W"], ["logits"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 4, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(W, "W")],
    )
    return _save(graph, path)


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


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return float_model(tmp_path_factory.mktemp("tiny") / "tiny.onnx")


@contextmanager
def serving(
    path: Path, keys: ApiKeys | None = None, *, loaded: bool = True, **settings: Any
) -> Iterator[tuple[TestClient, Any]]:
    """``path`` served as ``NAME`` by the app under a TestClient (its lifespan run); yields
    once the model is ready (or has failed to load). ``loaded``: the classifier is loaded
    here and handed over (the test can then instrument it), as ``zoo serve`` hands it."""
    cfg = ServeConfig(str(path), NAME, threads=1, **settings)
    clf = OnnxClassifier(path, threads=1, spin=False) if loaded else None
    app = create_app(cfg, keys=keys, loaded={NAME: clf} if clf is not None else None)
    with TestClient(app, raise_server_exceptions=False) as client:
        first = app.state.server
        deadline = time.monotonic() + 60
        while not (first.ready or first.load_error):
            assert time.monotonic() < deadline, "the model was neither ready nor failed in 60 s"
            time.sleep(0.005)
        yield client, clf


def infer_body(x: np.ndarray, name: str = "input", datatype: str = "FP32", **extra: Any) -> dict:
    return {
        "inputs": [
            {"name": name, "shape": list(x.shape), "datatype": datatype, "data": x.ravel().tolist()}
        ],
        **extra,
    }


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
def test_every_refusal_gets_its_status_message_log_line_and_count(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One answer, then every kind of bad request: each gets its 4xx and a JSON error naming
    what was wrong, one INFO line (a client's newline kept out of it; none for 404, whose
    paths a scanner walks), and a count under its outcome; the server answers afterwards."""
    caplog.set_level(logging.INFO, logger="zoo.serve")
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    with serving(model, max_body_mb=0.01, max_batch=4) as (c, _):  # 10,485 bytes
        r = c.post(INFER_PATH, json=infer_body(x))
        assert r.status_code == 200, r.text
        (out,) = r.json()["outputs"]
        assert (out["name"], out["shape"], out["datatype"]) == ("logits", [2, 5], "FP32")
        want = x.reshape(2, -1) @ W
        np.testing.assert_allclose(np.reshape(out["data"], (2, 5)), want, rtol=1e-5, atol=1e-5)
        nan = x.copy()
        nan[0, 0, 0, 0] = np.nan
        cases: list[tuple[str, dict[str, Any], int, str, str]] = [
            ("/v2/models/nope/infer", {"json": infer_body(x)}, 404, "unknown_model",
             "unknown model 'nope'; this server serves 'm'"),
            (INFER_PATH, {"content": b"{not json"}, 400, "bad_request", "JSON"),
            (INFER_PATH, {"json": infer_body(x, name="x\ny")}, 400, "bad_request",
             "unknown input 'x\\ny'; the model's input is 'input'"),
            (INFER_PATH, {"json": infer_body(x.astype(np.float64), datatype="FP64")}, 400,
             "bad_request", "input 'input' must be FP32, got FP64"),
            (INFER_PATH, {"json": infer_body(np.zeros((2, 3, 4, 5), np.float32))}, 400,
             "bad_request", "input 'input' has shape [2, 3, 4, 5]; expected [batch, 3, 4, 4]"),
            (INFER_PATH, {"json": infer_body(np.zeros((5, 3, 4, 4), np.float32))}, 400,
             "bad_request", "batch of 5 is outside 1..4 (--max-batch)"),
            (INFER_PATH, binary_infer(nan), 400, "bad_request",
             "input 'input' contains NaN or infinite values"),
            (INFER_PATH, {"json": infer_body(x, outputs=[{"name": "nope"}])}, 400,
             "bad_request", "unknown output 'nope'; the model's outputs are 'logits'"),
            (INFER_PATH, {"content": b"x" * 20_000}, 413, "too_large",
             "request body of 20,000 bytes is over the 10,485-byte limit"),
            (INFER_PATH, {"content": iter([b"x" * 6000, b"x" * 6000])}, 413, "too_large",
             "request body is over the 10,485-byte limit"),
            (INFER_PATH, {"content": b"{}", "headers": {"Content-Encoding": "gzip"}}, 415,
             "bad_request", "Content-Encoding 'gzip' is not supported"),
            (PREDICT_PATH + "?top_k=abc", {"content": png()}, 400, "bad_request",
             "top_k must be an integer"),
            (PREDICT_PATH + "?top_k=0", {"content": png()}, 400, "bad_request",
             "top_k=0: ask for 1 or more classes"),
            (PREDICT_PATH, {"content": b""}, 400, "bad_request", "empty body"),
            (PREDICT_PATH, {"content": b"not an image"}, 400, "bad_request", "image"),
            (PREDICT_PATH, {"content": b"--x", "headers": {"Content-Type": "multipart/form-data"}},
             400, "bad_request", "missing boundary"),
            (PREDICT_PATH, {"content": b"x" * 20_000}, 413, "too_large", "20,000 bytes"),
        ]  # fmt: skip
        expected: dict[tuple[str, ...], float] = {("infer", "ok"): 1}
        for path, kwargs, status, outcome, words in cases:
            caplog.clear()
            r = c.post(path, **kwargs)
            assert r.status_code == status, (path, kwargs.get("json"), r.text)
            assert words in error_of(r), (words, r.text)
            endpoint = "predict" if "predict" in path else "infer"
            expected[endpoint, outcome] = expected.get((endpoint, outcome), 0) + 1
            lines = [rec.getMessage() for rec in caplog.records if rec.name == "zoo.serve"]
            if status == 404:
                assert lines == []
            else:
                assert len(lines) == 1 and f"POST /v2/models/{NAME}/" in lines[0], lines
                assert f"-> {status}: " in lines[0] and "\n" not in lines[0], lines
        assert c.post(INFER_PATH, json=infer_body(x)).status_code == 200
        expected["infer", "ok"] += 1
        assert counters(c, "zoo_requests") == {(e, o): n for (e, o), n in expected.items()}


def test_a_fault_of_ours_is_500_logged_with_its_traceback_and_serving_goes_on(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="zoo.serve")
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    with serving(model) as (c, clf):
        real = clf.outputs
        clf.outputs = lambda batch: (_ for _ in ()).throw(RuntimeError("boom"))
        caplog.clear()  # the start-up's lines
        r = c.post(INFER_PATH, json=infer_body(x))
        assert r.status_code == 500 and error_of(r) == "internal error: RuntimeError: boom"
        (rec,) = [rec for rec in caplog.records if rec.name == "zoo.serve"]
        assert rec.levelno == logging.ERROR and rec.exc_info is not None
        assert rec.getMessage() == f"POST {INFER_PATH} failed"
        clf.outputs = real
        assert c.post(INFER_PATH, json=infer_body(x)).status_code == 200
        assert counters(c, "zoo_requests") == {("infer", "error"): 1, ("infer", "ok"): 1}


def test_a_full_queue_is_429_with_retry_after_and_a_late_answer_is_504(model: Path) -> None:
    """No room in the queue: 429 and ``Retry-After`` (for an image before it is decoded);
    an answer later than ``--timeout-ms``: 504 naming the limit, and the next request is
    answered once the model is free."""
    x = RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)
    with serving(model, max_queue=0) as (c, _):
        for path, kwargs in [
            (INFER_PATH, {"json": infer_body(x)}),
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
            r = c.post(INFER_PATH, json=infer_body(x))
            assert r.status_code == 504 and "retry-after" not in r.headers
            assert error_of(r) == "request waited more than 50 ms"
        finally:
            release.set()
        clf.outputs = real
        assert c.post(INFER_PATH, json=infer_body(x)).status_code == 200
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
        r = c.post(INFER_PATH, json=infer_body(ok, datatype="UINT8"))
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
        ]:
            r = c.post(INFER_PATH, json=infer_body(x, datatype=datatype))
            assert r.status_code == 400 and words in error_of(r), (words, r.text)
        edge = np.zeros((1, 8, 5, 3), np.uint8)  # exactly 40 pixels: allowed
        assert c.post(INFER_PATH, json=infer_body(edge, datatype="UINT8")).status_code == 200


def test_a_model_that_cannot_load_is_503_saying_why_and_health_tells_live_from_ready(
    model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="zoo.serve")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with serving(broken, loaded=False) as (c, _):
        assert c.get("/v2/health/live").json() == {"live": True}
        r = c.get("/v2/health/ready")
        assert r.status_code == 503 and r.json() == {"ready": False}
        for path in (f"/v2/models/{NAME}", f"/v2/models/{NAME}/ready", f"/v2/models/{NAME}/config"):
            r = c.get(path)
            assert r.status_code == 503, path
            assert error_of(r).startswith("model is not ready yet: InputError: "), r.text
        x = np.zeros((1, 3, 4, 4), np.float32)
        r = c.post(INFER_PATH, json=infer_body(x))
        assert r.status_code == 503 and "broken.onnx" in error_of(r)
        (entry,) = c.get("/v2/repository/index").json()
        assert (entry["name"], entry["state"]) == (NAME, "UNAVAILABLE") and entry["reason"]
        assert c.post("/v2/repository/index", json={"ready": True}).json() == []
        served = [r for r in caplog.records if "->" in r.getMessage()]
        assert served == []  # a 503 is the server's state, not a client's error: no line
    with serving(model) as (c, _):
        assert c.get("/v2/health/ready").json() == {"ready": True}
        assert c.get(f"/v2/models/{NAME}/ready").json() == {"name": NAME, "ready": True}
        for path in (f"/v2/models/{NAME}", f"/v2/models/{NAME}/versions/1"):
            meta = c.get(path).json()
            assert meta["name"] == NAME and meta["inputs"][0]["shape"] == [-1, 3, 4, 4]
        for path in (f"/v2/models/{NAME}/config", f"/v2/models/{NAME}/versions/1/config"):
            assert c.get(path).json()["max_batch_size"] == 16
        assert c.post(f"/v2/models/{NAME}/versions/1/infer", json=infer_body(x)).status_code == 200
        (entry,) = c.post("/v2/repository/index", json={"ready": True}).json()
        assert (entry["name"], entry["state"]) == (NAME, "READY")
        r = c.post("/v2/repository/index", json={"ready": "yes"})
        assert r.status_code == 400 and error_of(r)
        r = c.post("/v2/repository/index", content=b"x" * 5000)
        assert r.status_code == 413 and "4,096-byte limit" in error_of(r)
        assert c.get("/v2").json()["name"] == "zoo"
        page = c.get("/")
        assert NAME in page.text and page.headers["content-type"].startswith("text/html")
        assert "security" not in str(c.get("/openapi.json").json())  # no keys: nothing keyed


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
    bodies = {"POST": {"json": infer_body(x)}, "GET": {}}
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
                assert r.status_code == 401 and "www-authenticate" in r.headers, r.text
                verdict = Verdict.INVALID if headers else Verdict.MISSING
                assert error_of(r) == refusal_message(verdict, "metadata")
        r = c.get("/v2/nope", headers=bearer(INFER))  # a valid key: the path's real answer
        assert r.status_code == 404 and "/openapi.json" in error_of(r)
        r = c.get(INFER_PATH, headers=bearer(INFER))
        assert r.status_code == 405 and r.headers["allow"] == "POST"
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


# ---------------------------------------------------------------- auth, as functions
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
    ]:
        assert keys.check(header, scope) is verdict, (header, scope)
    short = "s" * (MIN_KEY_LENGTH - 1)
    for text, words in [
        (
            f"{ALL}\n{short} infer\n",
            f"keys.txt line 2: an API key must be at least {MIN_KEY_LENGTH}",
        ),
        (f"{'é' * 20}\n", "keys.txt line 1: an API key must be"),
        (f"\x01{'a' * 20}\n", "line 1: an API key must be"),
        (f"{'a' * 10}\t{'b' * 10}\n", "line 1: an API key must be"),
        (
            f"{ALL} infer,admin\n",
            "keys.txt line 1: unknown scope 'admin'; the scopes are infer, metadata, metrics",
        ),
        (
            f"{ALL}\n# c\n{ALL} metrics\n",
            "keys.txt line 3: this key was already given on an earlier line",
        ),
        ("# nothing\n\n", "keys.txt holds no API key"),
    ]:
        with pytest.raises(InputError) as info:
            parse_key_file(text, "keys.txt")
        assert words in str(info.value), str(info.value)
        assert not {ALL, short, "é" * 20} & set(str(info.value).split()), str(info.value)


def test_keys_come_from_the_file_else_the_variable_else_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="zoo.serve")
    assert load_keys(None, {}) is None and load_keys(None, {ENV_VAR: "  "}) is None
    from_env = load_keys(None, {ENV_VAR: f" {INFER} "})
    assert from_env is not None and from_env.scopes_of(INFER) == frozenset(SCOPES)
    with pytest.raises(InputError) as info:
        load_keys(None, {ENV_VAR: "short"})
    message = str(info.value)
    assert message.startswith(f"{ENV_VAR}: an API key must be") and "short" not in message
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
    assert str(info.value).startswith("--host 0.0.0.0 serves other machines, and no API key")
    for words in ("--api-key-file PATH", ENV_VAR, "--allow-unauthenticated"):
        assert words in str(info.value)
    check_exposure("0.0.0.0", None, allow_unauthenticated=True)  # said explicitly
    check_exposure("0.0.0.0", parse_key_file(ALL, "k"), allow_unauthenticated=False)
    check_exposure("127.0.0.1", None, allow_unauthenticated=False)


# ---------------------------------------------------------------- settings
def test_settings_refuse_contradictions_before_anything_loads() -> None:
    with pytest.raises(UsageError) as info:
        ServeConfig("a.onnx", name="x", more_models=("b.onnx",))
    assert str(info.value).startswith("--name names one model, and 2 are served")
    with pytest.raises(UsageError, match="--ssl-keyfile needs --ssl-certfile"):
        ServeConfig("a.onnx", ssl_keyfile="k.pem")
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
        assert str(info.value).startswith(f"{bad!r}: NAME=MODEL needs a name"), bad
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
