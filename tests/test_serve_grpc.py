"""The v2 gRPC service of ``zoo serve --grpc-port``, against the protocol's reference clients:
KServe's ``InferenceGRPCClient`` in this process, Triton's ``tritonclient.grpc`` in a process
of its own (it registers the same protobuf names as KServe's SDK: "duplicate symbol" in one
process), each answer equal to onnxruntime's; the API key in the ``authorization`` metadata;
the queue limit as RESOURCE_EXHAUSTED; and a seeded fuzz of malformed requests that is
answered INVALID_ARGUMENT (or NOT_FOUND, RESOURCE_EXHAUSTED), never INTERNAL."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from tests.conftest import ROOT
from tests.serving import NAME, free_port, kserve_request, metric, server, x_of
from zoo.deploy.runtimes.loader import make_session
from zoo.deploy.serve.auth import ENV_VAR
from zoo.deploy.serve.grpc_protocol import repository_messages

pytestmark = pytest.mark.serve

KEY = "grpc-test-key-0123456789abcdef"
AUTH = (("authorization", f"Bearer {KEY}"),)
FUZZ_REQUESTS = 400
CLIENT_ERRORS = {"INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED"}


@pytest.fixture(scope="module")
def srv_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-grpc") / "server.log"


@pytest.fixture(scope="module")
def srv(mobilenet_onnx: Path, srv_log: Path) -> Iterator[tuple[str, int]]:
    grpc_port = free_port()
    args = ["--grpc-port", str(grpc_port), "--max-batch", "4", "--max-queue", "2"]
    args += ["--threads", "1", "--max-body-mb", "8"]
    with server(mobilenet_onnx, *args, log=srv_log, env={ENV_VAR: KEY}) as (url, _):
        yield url, grpc_port
    assert KEY not in srv_log.read_text(errors="replace")


@pytest.fixture(scope="module")
def direct(mobilenet_onnx: Path) -> Any:
    sess = make_session(mobilenet_onnx)
    return lambda x: sess.run(None, {"input": x})[0]


@pytest.fixture(scope="module")
def stub(srv: tuple[str, int]) -> Iterator[Any]:
    """KServe's generated stub on a plain channel (messages of any size leave the client)."""
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as v2_grpc

    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(f"127.0.0.1:{srv[1]}", options=options) as channel:
        yield v2_grpc.GRPCInferenceServiceStub(channel)


def pb() -> Any:
    from kserve.protocol.grpc import grpc_predict_v2_pb2

    return grpc_predict_v2_pb2


def code_of(call: Any) -> str:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code().name
    return "OK"


def raw_request(x: np.ndarray, model: str = NAME, datatype: str = "FP32") -> Any:
    req = pb().ModelInferRequest(model_name=model, id="raw-1")
    req.inputs.add(name="input", datatype=datatype, shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


def test_kserve_grpc_client_answers_like_onnxruntime(
    srv: tuple[str, int], stub: Any, direct: Any
) -> None:
    import kserve

    url, port = srv
    x = x_of(21, 2)

    async def calls() -> dict[str, Any]:
        client = kserve.InferenceGRPCClient(f"127.0.0.1:{port}", retries=0)
        try:
            got: dict[str, Any] = {
                "live": await client.is_server_live(),  # health: no key
                "ready": await client.is_server_ready(),
                "model_ready": await client.is_model_ready(NAME, headers=AUTH),
            }
            for binary in (True, False):  # raw_input_contents, then typed fp32_contents
                got[f"binary={binary}"] = await client.infer(
                    kserve_request(x, binary=binary), headers=AUTH
                )
            return got
        finally:
            await client.close()

    got = asyncio.run(calls())
    assert got["live"] and got["ready"] and got["model_ready"]
    for binary in (True, False):
        res = got[f"binary={binary}"]
        assert res.model_name == NAME and res.id == "sdk-1"
        np.testing.assert_allclose(res.outputs[0].as_numpy(), direct(x), rtol=1e-5, atol=1e-5)

    meta = stub.ModelMetadata(pb().ModelMetadataRequest(name=NAME), metadata=AUTH)
    assert meta.platform == "onnxruntime_onnx" and list(meta.inputs[0].shape) == [-1, 3, 224, 224]
    assert meta.inputs[0].datatype == "FP32" and list(meta.outputs[0].shape) == [-1, 1000]
    server_meta = stub.ServerMetadata(pb().ServerMetadataRequest(), metadata=AUTH)
    assert server_meta.name == "zoo"
    request = raw_request(x[:1])
    assert code_of(lambda: stub.ModelInfer(request)) == "UNAUTHENTICATED"
    wrong = (("authorization", "Bearer " + "k" * 7),)
    assert code_of(lambda: stub.ModelInfer(request, metadata=wrong)) == "UNAUTHENTICATED"
    assert code_of(lambda: stub.ModelMetadata(pb().ModelMetadataRequest(name=NAME))) == (
        "UNAUTHENTICATED"
    )
    assert code_of(lambda: stub.ModelInfer(raw_request(x[:1], "nope"), metadata=AUTH)) == (
        "NOT_FOUND"
    )
    # one batcher for both transports: the gRPC samples are in the HTTP server's metrics
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert metric(text, 'zoo_requests_total{endpoint="grpc_ModelInfer",outcome="ok"}') >= 2
    assert metric(text, "zoo_batch_size_sum") == 2 + 2  # the two requests of 2 samples


TRITON_SCRIPT = """
import sys, numpy as np, tritonclient.grpc as tg
port, key, folder = sys.argv[1:4]
x, expected = np.load(folder + "/x.npy"), np.load(folder + "/expected.npy")
client = tg.InferenceServerClient(f"127.0.0.1:{port}")
assert client.is_server_live() and client.is_server_ready()
headers = {"authorization": f"Bearer {key}"}
assert client.is_model_ready("NAME", headers=headers)
meta = client.get_model_metadata("NAME", headers=headers)
assert meta.inputs[0].name == "input" and list(meta.inputs[0].shape) == [-1, 3, 224, 224]
from tritonclient.grpc import model_config_pb2 as mc
config = client.get_model_config("NAME", headers=headers).config  # as Triton's image client
assert config.name == "NAME" and config.max_batch_size == 4 and config.backend == "onnxruntime"
assert config.input[0].format == mc.ModelInput.FORMAT_NCHW, config
assert list(config.input[0].dims) == [3, 224, 224] and config.input[0].data_type == mc.TYPE_FP32
assert list(config.output[0].dims) == [1000] and config.output[0].name == "logits"
assert client.get_model_config("NAME", headers=headers, as_json=True)["config"]["max_batch_size"] == 4
index = client.get_model_repository_index(headers=headers, as_json=True)["models"]
assert index == [{"name": "NAME", "version": "1", "state": "READY"}], index
try:
    client.get_model_repository_index()
    raise SystemExit("an index without a key")
except tg.InferenceServerException as exc:
    assert exc.status() == "StatusCode.UNAUTHENTICATED", exc.status()
try:
    client.get_model_config("nope", headers=headers)
    raise SystemExit("a config for a model not served")
except tg.InferenceServerException as exc:
    assert exc.status() == "StatusCode.NOT_FOUND", exc.status()
inp = tg.InferInput("input", list(x.shape), "FP32")
inp.set_data_from_numpy(x)
res = client.infer("NAME", [inp], request_id="triton-grpc", headers=headers)
assert res.get_response().id == "triton-grpc"
np.testing.assert_allclose(res.as_numpy("logits"), expected, rtol=1e-5, atol=1e-5)
top = client.infer("NAME", [inp], headers=headers,
                   outputs=[tg.InferRequestedOutput("logits", class_count=3)]).as_numpy("logits")
assert top.shape == (len(x), 3), top.shape
assert [int(r[0].decode().split(":")[1]) for r in top] == list(expected.argmax(1))
try:
    client.infer("NAME", [inp])
    raise SystemExit("no key, yet answered")
except tg.InferenceServerException as exc:
    assert exc.status() == "StatusCode.UNAUTHENTICATED", exc.status()
bad = tg.InferInput("input", [1, 3, 224, 224], "INT64")
bad.set_data_from_numpy(x[:1].astype(np.int64))
try:
    client.infer("NAME", [bad], headers=headers)
    raise SystemExit("INT64 input accepted")
except tg.InferenceServerException as exc:
    assert exc.status() == "StatusCode.INVALID_ARGUMENT" and "INT64" in exc.message(), exc
print("ok")
"""


def test_tritonclient_grpc_in_its_own_process(
    srv: tuple[str, int], direct: Any, tmp_path: Path
) -> None:
    x = x_of(22, 3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "expected.npy", direct(x))
    script = TRITON_SCRIPT.replace("NAME", NAME)
    r = subprocess.run(
        [sys.executable, "-c", script, str(srv[1]), KEY, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_limits_map_to_grpc_status_codes(srv: tuple[str, int], stub: Any) -> None:
    """``--max-queue 2``: a burst gets RESOURCE_EXHAUSTED for what does not fit, OK for the
    rest; a message over ``--max-body-mb`` is refused by gRPC itself, RESOURCE_EXHAUSTED."""
    request = raw_request(x_of(23, 4))

    def call(_: int) -> str:
        return code_of(lambda: stub.ModelInfer(request, metadata=AUTH, timeout=120))

    with ThreadPoolExecutor(12) as pool:
        codes = Counter(pool.map(call, range(12)))
    assert codes["OK"] >= 1 and codes["RESOURCE_EXHAUSTED"] >= 1, codes
    assert set(codes) == {"OK", "RESOURCE_EXHAUSTED"}, codes
    huge = raw_request(np.zeros((12, 3, 224, 224), np.float32))  # 7.2 MB raw, 8 MB limit: fits
    huge.raw_input_contents[0] += b"\0" * (2 << 20)  # now over it
    assert code_of(lambda: stub.ModelInfer(huge, metadata=AUTH)) == "RESOURCE_EXHAUSTED"


def test_grpc_status_of_each_error() -> None:
    from zoo.deploy.serve.grpc_server import _status
    from zoo.errors import (
        InputError,
        ModelNotReadyError,
        ModelNotServedError,
        PayloadTooLargeError,
        ServerBusyError,
    )

    cases = [
        (InputError("x"), "INVALID_ARGUMENT"),
        (PayloadTooLargeError("x"), "RESOURCE_EXHAUSTED"),
        (ServerBusyError("x", retry_after_s=3), "RESOURCE_EXHAUSTED"),
        (ModelNotServedError("x"), "NOT_FOUND"),
        (ModelNotReadyError("x"), "UNAVAILABLE"),
        (TimeoutError(), "DEADLINE_EXCEEDED"),
        (RuntimeError("bug"), "INTERNAL"),
    ]
    for exc, name in cases:
        assert _status(exc)[0].name == name, exc
    assert "retry in 3 s" in _status(ServerBusyError("x", retry_after_s=3))[1]


def _fuzzed(rng: np.random.Generator) -> bytes:
    """One malformed (rarely valid) serialized ModelInferRequest."""
    if rng.random() < 0.1:  # not a protobuf message at all
        return rng.bytes(int(rng.integers(1, 300)))
    m = pb()
    req = m.ModelInferRequest(model_name=str(rng.choice([NAME, NAME, NAME, "", "nope"])))
    datatypes = ["FP32", "FP32", "FP16", "FP64", "INT8", "INT64", "UINT8", "BOOL", "BYTES", "fp32"]
    for _ in range(int(rng.choice([0, 1, 1, 1, 2]))):
        rank = int(rng.integers(0, 10))
        dims = [-3, 0, 1, 2, 3, 224, 2**40]
        shape = [int(rng.choice(dims)) for _ in range(rank)]
        if rng.random() < 0.4:
            shape = [1, 3, 224, 224][: max(rank, 1)] if rng.random() < 0.5 else [1, 3, 224, 224]
        t = req.inputs.add(
            name=str(rng.choice(["input", "input", "pixels"])),
            datatype=str(rng.choice(datatypes)),
            shape=shape,
        )
        mode = rng.integers(0, 3)
        count = int(np.prod([d for d in shape if 0 <= d < 1000] or [1]))
        n = int(rng.choice([0, 1, count, count + 1])) if count < 200_000 else 3
        if mode == 0:  # raw bytes, right or wrong length
            req.raw_input_contents.append(rng.bytes(int(rng.choice([0, 3, n * 4, n * 8]))))
        elif mode == 1:  # a typed field, maybe the wrong one
            field = str(rng.choice(["fp32_contents", "int_contents", "bool_contents"]))
            values = rng.standard_normal(n) * float(rng.choice([1, 1e6]))
            if field == "fp32_contents":
                t.contents.fp32_contents.extend(values.tolist())
            elif field == "int_contents":
                t.contents.int_contents.extend(np.clip(values, -(2**31), 2**31 - 1).astype(int))
            else:
                t.contents.bool_contents.extend((values > 0).tolist())
    if rng.random() < 0.3:
        out = req.outputs.add(name=str(rng.choice(["logits", "probs"])))
        param = out.parameters["classification"]
        if rng.random() < 0.5:
            param.int64_param = int(rng.choice([-1, 0, 3, 2**40]))
        else:
            param.string_param = "3"
    return req.SerializeToString()


def test_fuzzed_requests_are_refused_by_status_never_internal(
    srv: tuple[str, int], stub: Any, direct: Any, srv_log: Path
) -> None:
    port = srv[1]
    rng = np.random.default_rng(2026)
    codes: Counter[str] = Counter()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in/out
        for _ in range(FUZZ_REQUESTS):
            data = _fuzzed(rng)
            codes[code_of(lambda data=data: infer(data, metadata=AUTH, timeout=60))] += 1
        unknown = channel.unary_unary("/inference.GRPCInferenceService/RepositoryModelLoad")
        assert code_of(lambda: unknown(b"", metadata=AUTH)) == "UNIMPLEMENTED"
        index = channel.unary_unary("/inference.GRPCInferenceService/RepositoryIndex")
        assert code_of(lambda: index(b"\xff\xff\xff", metadata=AUTH)) == "INVALID_ARGUMENT"
        other = repository_messages().RepositoryIndexRequest(repository_name="other")
        assert code_of(lambda: index(other.SerializeToString(), metadata=AUTH)) == (
            "INVALID_ARGUMENT"  # one repository, as Triton refuses a named one
        )
    assert set(codes) <= CLIENT_ERRORS | {"OK"}, codes
    assert codes["INVALID_ARGUMENT"] > FUZZ_REQUESTS // 2, codes
    x = x_of(24)  # still right afterwards
    res = stub.ModelInfer(raw_request(x), metadata=AUTH)
    got = np.frombuffer(res.raw_output_contents[0], np.float32).reshape(1, 1000)
    np.testing.assert_allclose(got, direct(x), rtol=1e-5, atol=1e-5)
    log = srv_log.read_text(errors="replace")
    assert "Traceback" not in log and "INTERNAL" not in log


CONFIG_SCRIPT = """
import sys
from tritonclient.grpc import service_pb2
for path, name in zip(sys.argv[1::2], sys.argv[2::2]):
    r = service_pb2.ModelConfigResponse.FromString(open(path, "rb").read())
    assert r.config.name == name and r.config.max_batch_size == 16, r
    assert list(r.config.input[0].dims) == [3, 8, 8] and r.config.output[0].name == "logits"
print("ok")
"""


def test_model_config_response_is_tritons_message(tmp_path: Path) -> None:
    """The bytes written around Triton's ``ModelConfig`` parse as Triton's own
    ``ModelConfigResponse`` (in a process of its own: its module clashes with KServe's), for a
    config under 128 bytes and one over (a length of one varint byte, and of two)."""
    from zoo.deploy.serve.grpc_server import config_response
    from zoo.deploy.serve.protocol import ModelMetadata, TensorMetadata, triton_config

    args = []
    for name in ("m", "m" * 300):
        meta = ModelMetadata(
            name,
            ["1"],
            "onnxruntime_onnx",
            [TensorMetadata("input", "FP32", [-1, 3, 8, 8])],
            [TensorMetadata("logits", "FP32", [-1, 4])],
            {},
        )
        body = config_response(triton_config(meta, 16))
        assert body[0] == 0x0A and (len(body) > 130) == (len(name) > 100)
        path = tmp_path / f"{len(name)}.bin"
        path.write_bytes(body)
        args += [str(path), name]
    r = subprocess.run(
        [sys.executable, "-c", CONFIG_SCRIPT, *args], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
