"""The Open Inference Protocol's reference clients against the real ``zoo serve``: KServe's
Python SDK (``kserve.InferenceRESTClient``, which sends ``model_name`` in the body) and Triton's
``tritonclient.http``, JSON and binary tensors, each answer equal to onnxruntime run in this
process on the same input; a wrong dtype or shape sent through the SDK is still a 400 naming
the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.serving import NAME, kserve_infer, kserve_request, server, x_of
from zoo.deploy.runtimes.loader import make_session

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def srv(mobilenet_onnx: Path) -> Iterator[str]:
    with server(mobilenet_onnx, "--max-batch", "4") as (url, _):
        yield url


@pytest.fixture(scope="module")
def direct(mobilenet_onnx: Path) -> Any:
    """onnxruntime in this process: the answer every client must get."""
    sess = make_session(mobilenet_onnx)
    return lambda x: sess.run(None, {"input": x})[0]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_kserve_sdk_answers_like_onnxruntime(srv: str, direct: Any, binary: bool) -> None:
    x = x_of(3, 2)
    request = kserve_request(x, binary=binary)
    body, _ = request.to_rest()  # what the SDK puts on the wire names the model in the body
    assert (b'"model_name"' in body) if binary else (body["model_name"] == NAME)
    res = kserve_infer(srv, request)
    assert res.model_name == NAME and res.id == "sdk-1"
    np.testing.assert_allclose(res.outputs[0].as_numpy(), direct(x), rtol=1e-5, atol=1e-5)


def test_kserve_sdk_model_name_in_the_body_is_not_the_judge(srv: str, direct: Any) -> None:
    """As KServe's server: the URL names the model; the body's ``model_name`` is informational
    (KServe's ``InferenceRequest`` declares no such field and its endpoint passes the path's
    name on). A URL naming a model this server lacks is a 404, whatever the body says."""
    x = x_of(4)
    request = kserve_request(x, binary=False)
    request.model_name = "a-name-the-server-does-not-have"
    res = kserve_infer(srv, request)
    np.testing.assert_allclose(res.outputs[0].as_numpy(), direct(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(httpx.HTTPStatusError) as info:
        kserve_infer(srv, kserve_request(x, binary=False), model="nope")
    assert info.value.response.status_code == 404


@pytest.mark.parametrize(
    ("x", "datatype", "binary", "words"),
    [
        (x_of(5).astype(np.float64), "FP64", False, ["'input'", "FP32", "FP64"]),
        (x_of(5).astype(np.float64), "FP64", True, ["'input'", "FP32", "FP64"]),
        (x_of(5, size=64), "FP32", False, ["'input'", "224"]),
        (x_of(5)[0], "FP32", True, ["'input'", "shape [3, 224, 224]", "[batch, 3, 224, 224]"]),
    ],
    ids=["fp64-json", "fp64-binary", "size-64", "rank-3"],
)
def test_kserve_sdk_wrong_dtype_or_shape_is_a_400_naming_the_field(
    srv: str, x: np.ndarray, datatype: str, binary: bool, words: list[str]
) -> None:
    with pytest.raises(httpx.HTTPStatusError) as info:
        kserve_infer(srv, kserve_request(x, binary=binary, datatype=datatype))
    r = info.value.response
    assert r.status_code == 400, r.text
    message = r.json()["error"]
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_http_answers_like_onnxruntime(srv: str, direct: Any, binary: bool) -> None:
    import tritonclient.http as th

    x = x_of(6, 3)
    client = th.InferenceServerClient(srv.removeprefix("http://"))
    inp = th.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    res = client.infer(
        NAME,
        [inp],
        request_id="triton-1",
        outputs=[th.InferRequestedOutput("logits", binary_data=binary)],
    )
    assert res.get_response()["id"] == "triton-1"
    np.testing.assert_allclose(res.as_numpy("logits"), direct(x), rtol=1e-5, atol=1e-5)
    bad = th.InferInput("input", [1, 3, 224, 224], "INT64")
    bad.set_data_from_numpy(x[:1].astype(np.int64), binary_data=binary)
    with pytest.raises(th.InferenceServerException) as info:
        client.infer(NAME, [bad])
    assert "400" in str(info.value.status()) and "INT64" in info.value.message()


def test_tritons_image_client_steps_work_over_http(srv: str) -> None:
    """What Triton's own example image client does, through ``tritonclient.http``: the model's
    metadata and its configuration (``max_batch_size``, the input's ``format``) decide the
    layout; photos prepared as the metadata's preprocessing says, a batch of them, top-3
    classes asked of the server (Triton's classification extension: "score:index:label")."""
    import tritonclient.http as th
    from PIL import Image

    from zoo.preprocess import preprocess
    from zoo.preprocessing import Preprocessing
    from zoo.samples import sample_image_paths

    client = th.InferenceServerClient(srv.removeprefix("http://"))
    meta = client.get_model_metadata(NAME)
    config = client.get_model_config(NAME)
    assert config == client.get_model_config(NAME, model_version="1")
    # the image client's checks: one input, one FP32 output, NCHW or NHWC, a batch axis
    assert len(meta["inputs"]) == len(config["input"]) == 1 and len(meta["outputs"]) == 1
    assert meta["outputs"][0]["datatype"] == "FP32"
    assert config["name"] == NAME and config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 4  # the server's --max-batch
    assert config["input"] == [
        {"name": "input", "data_type": "TYPE_FP32", "dims": [3, 224, 224], "format": "FORMAT_NCHW"}
    ]
    assert config["output"] == [{"name": "logits", "data_type": "TYPE_FP32", "dims": [1000]}]
    c, h, w = meta["inputs"][0]["shape"][1:]  # NCHW: after the batch axis
    pre = Preprocessing.from_dict(meta["parameters"]["preprocessing"])
    photos = [Image.open(p) for p in sample_image_paths()]  # a cat, an espresso
    x = np.stack([preprocess(im, pre) for im in photos])
    assert x.shape == (2, c, h, w)
    inp = th.InferInput(meta["inputs"][0]["name"], list(x.shape), meta["inputs"][0]["datatype"])
    inp.set_data_from_numpy(x)
    out = th.InferRequestedOutput(meta["outputs"][0]["name"], class_count=3)
    top = client.infer(NAME, [inp], outputs=[out]).as_numpy("logits")
    labels = [[r.decode().split(":")[2] for r in row] for row in top]
    assert labels[0][0] in {"Egyptian cat", "tabby", "tiger cat"} and labels[1][0] == "espresso"
    with pytest.raises(th.InferenceServerException) as info:
        client.get_model_config("nope")
    assert "404" in str(info.value.status())


def test_kserve_sdk_imports_after_a_triton_repository_was_written() -> None:
    """Writing a Triton repository loads Triton's config schema; KServe's SDK must still import
    in the same process (both register gRPC messages named ``inference.*`` with protobuf)."""
    import subprocess
    import sys

    code = (
        "from zoo.deploy.triton_schema import model_config_pb2\n"
        "assert model_config_pb2('a test').ModelConfig\n"
        "import kserve\n"
        "assert kserve.InferenceRESTClient\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
