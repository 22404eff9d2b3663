"""KServe v2 request validation on plain bytes (no server, no model): every malformed request
that once reached numpy and earned a 500 is now a 400/413 whose message names the field."""

from __future__ import annotations

import json
import struct

import msgspec
import numpy as np
import pytest

from zoo.deploy.serve.openapi import openapi_document
from zoo.deploy.serve.protocol import (
    HEADER,
    MAX_RANK,
    ModelMetadata,
    OutputSpec,
    TensorMetadata,
    classification,
    element_count,
    encode_response,
    parse_request,
    triton_config,
)
from zoo.errors import InputError, PayloadTooLargeError


def _tensor(**over: object) -> dict:
    return {"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0], **over}


def _req(**over: object) -> bytes:
    return json.dumps({"inputs": [_tensor()], **over}).encode()


MALFORMED = [
    # (body, error type, words the message must contain)
    (_req(outputs=[3]), InputError, ["$.outputs[0]", "object"]),
    (_req(outputs=["logits"]), InputError, ["$.outputs[0]"]),
    (_req(outputs={"name": "logits"}), InputError, ["$.outputs", "array"]),
    (_req(outputs="logits"), InputError, ["$.outputs"]),
    (_req(parameters=[1]), InputError, ["$.parameters", "object"]),
    (_req(parameters="binary"), InputError, ["$.parameters"]),
    (_req(parameters={"binary_data_output": "yes"}), InputError, ["binary_data_output", "bool"]),
    (_req(outputs=[{"name": "y", "parameters": 5}]), InputError, ["$.outputs[0].parameters"]),
    (_req(outputs=[{"name": "y", "parameters": []}]), InputError, ["$.outputs[0].parameters"]),
    (
        _req(outputs=[{"name": "y", "parameters": {"classification": -1}}]),
        InputError,
        ["classification", ">= 0"],
    ),
    (
        _req(outputs=[{"name": "y", "parameters": {"classification": True}}]),
        InputError,
        ["classification", "bool"],
    ),
    (
        _req(outputs=[{"name": "y", "parameters": {"classification": "3"}}]),
        InputError,
        ["classification", "str"],
    ),
    (
        _req(outputs=[{"name": "y", "parameters": {"classification": 2.5}}]),
        InputError,
        ["classification"],
    ),
    (_req(outputs=[{"name": "y", "parameters": {"binary_data": 1}}]), InputError, ["binary_data"]),
    (_req(outputs=[{"parameters": {}}]), InputError, ["name", "$.outputs[0]"]),
    (
        json.dumps({"inputs": [_tensor(parameters=7)]}).encode(),
        InputError,
        ["$.inputs[0].parameters"],
    ),
    (
        json.dumps({"inputs": [_tensor(parameters={"binary_data_size": -4})]}).encode(),
        InputError,
        ["binary_data_size", ">= 0"],
    ),
    (json.dumps({"inputs": [_tensor(shape=[1, -2])]}).encode(), InputError, ["shape[1]", ">= 0"]),
    (json.dumps({"inputs": [_tensor(shape=[1.5])]}).encode(), InputError, ["shape[0]"]),
    (json.dumps({"inputs": [_tensor(shape="1,2")]}).encode(), InputError, ["shape"]),
    (
        json.dumps({"inputs": [_tensor(shape=[1] * (MAX_RANK + 1))]}).encode(),
        InputError,
        ["shape", str(MAX_RANK)],
    ),
    (json.dumps({"inputs": [_tensor(datatype="FP8")]}).encode(), InputError, ["datatype", "FP32"]),
    (json.dumps({"inputs": [_tensor(name=3)]}).encode(), InputError, ["$.inputs[0].name"]),
    (json.dumps({"inputs": [_tensor(data="1,2")]}).encode(), InputError, ["data"]),
    (json.dumps({"inputs": [_tensor(data=[1, "2"])]}).encode(), InputError, ["data[1]"]),
    (json.dumps({"inputs": [_tensor(data=[[1, 2], [3]])]}).encode(), InputError, ["'input'"]),
    (json.dumps({"inputs": [_tensor(data=[1.0])]}).encode(), InputError, ["1 values", "shape"]),
    (json.dumps({"inputs": [_tensor(data=None)]}).encode(), InputError, ["no 'data'"]),
    (json.dumps({"inputs": [_tensor(typo=1)]}).encode(), InputError, ["unknown field", "typo"]),
    (json.dumps({"inputs": [3]}).encode(), InputError, ["$.inputs[0]"]),
    (json.dumps({"inputs": []}).encode(), InputError, ["$.inputs", "length"]),
    (json.dumps({"inputs": {}}).encode(), InputError, ["$.inputs"]),
    (json.dumps({"id": 5, "inputs": [_tensor()]}).encode(), InputError, ["$.id"]),
    # the fields KServe's and Triton's servers take are typed, not waved through
    (_req(model_name=3), InputError, ["$.model_name", "str"]),
    (_req(model_version=["1"]), InputError, ["$.model_version", "str"]),
    (_req(model="m"), InputError, ["unknown field", "model"]),
    (b"[]", InputError, ["object"]),
    (b"", InputError, ["empty"]),
    (b"{not json", InputError, ["JSON"]),
    (b"\xff\xfe", InputError, ["JSON"]),
    # data out of range for its datatype (numpy raised OverflowError → 500 before)
    (
        json.dumps({"inputs": [_tensor(datatype="INT8", shape=[1], data=[1000])]}).encode(),
        InputError,
        ["INT8"],
    ),
    (
        json.dumps({"inputs": [_tensor(datatype="INT64", shape=[1], data=[2**70])]}).encode(),
        InputError,
        ["INT64"],
    ),
    # element counts that overflow int64 (numpy's product of [2**32, 2**32] is 0)
    (
        json.dumps({"inputs": [_tensor(shape=[2**32, 2**32])]}).encode(),
        PayloadTooLargeError,
        ["18,446,744,073,709,551,616 elements"],
    ),
    (
        json.dumps({"inputs": [_tensor(shape=[2**62, 4, 0])]}).encode(),
        PayloadTooLargeError,
        ["dimension 4,611,686,018,427,387,904"],
    ),
    (
        json.dumps({"inputs": [_tensor(shape=[2**62, 2])]}).encode(),
        PayloadTooLargeError,
        ["9,223,372,036,854,775,808 elements"],
    ),
    (json.dumps({"inputs": [_tensor(shape=[2**63])]}).encode(), InputError, ["shape[0]"]),
    (json.dumps({"inputs": [_tensor(shape=[2**64])]}).encode(), InputError, ["shape[0]"]),
    (
        json.dumps({"inputs": [_tensor(shape=[2**40, 0], data=[])]}).encode(),
        PayloadTooLargeError,
        ["dimension 1,099,511,627,776 of shape [1099511627776, 0]"],
    ),
]


@pytest.mark.parametrize(("body", "error", "words"), MALFORMED)
def test_malformed_request_names_the_field(body: bytes, error: type, words: list[str]) -> None:
    with pytest.raises(error) as info:
        parse_request(body, None)
    assert type(info.value) is error
    for word in words:
        assert word.lower() in str(info.value).lower(), (word, str(info.value))


def test_the_fields_kserve_and_triton_servers_accept() -> None:
    """KServe's SDK sends ``model_name`` in the body (``InferRequest.to_rest``), and the Open
    Inference Protocol gives requests, inputs and outputs ``id``/``parameters``: all taken; the
    URL names the model, as on KServe."""
    body = json.dumps(
        {
            "id": "r-1",
            "model_name": "some-other-name",
            "model_version": "7",
            "parameters": {"binary_data_output": False, "priority": 1, "sequence_id": "s"},
            "inputs": [_tensor(parameters={"content_type": "np", "binary_data": False})],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True, "x": "y"}}],
        }
    ).encode()
    req = parse_request(body, None)
    assert req.id == "r-1" and req.inputs[0][0] == "input"
    np.testing.assert_array_equal(req.inputs[0][1], np.array([[1.0, 2.0]], np.float32))
    assert req.outputs == [OutputSpec("logits", binary=True)]


@pytest.mark.parametrize("depth", [MAX_RANK + 1, 10_000, 1_000_000])
def test_deep_nesting_is_a_400_not_a_recursion_error(depth: int) -> None:
    deep = b"[" * depth + b"]" * depth
    bodies = [
        deep,  # the whole document
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ' + deep + b"}]}",
        _req()[:-1] + b', "extra": ' + deep + b"}",
    ]
    for body in bodies:
        with pytest.raises(InputError) as info:
            parse_request(body, None)
        assert type(info.value) is InputError
    # an unknown key of an open ``parameters`` map is skipped, unless nested past the decoder
    unknown = _req()[:-1] + b', "parameters": {"other": ' + deep + b"}}"
    if depth < 1000:
        assert parse_request(unknown, None).inputs[0][0] == "input"
    else:
        with pytest.raises(InputError, match="nested too deeply"):
            parse_request(unknown, None)


def test_element_count_is_exact_and_limited() -> None:
    assert element_count("x", [], 10) == 1
    assert element_count("x", [5, 0], 10) == 0
    with pytest.raises(PayloadTooLargeError, match=r"'x': shape \[3, 4\] has 12 elements"):
        element_count("x", [3, 4], 11)
    body = json.dumps({"inputs": [_tensor(shape=[1, 4096], data=[0.0] * 4096)]}).encode()
    assert parse_request(body, None, max_elements=4096).inputs[0][1].shape == (1, 4096)
    with pytest.raises(PayloadTooLargeError, match="4,096 elements, over the limit of 4,095"):
        parse_request(body, None, max_elements=4095)


def test_valid_json_flat_nested_and_every_datatype() -> None:
    flat = parse_request(_req(id="a1"), None)
    assert flat.id == "a1" and flat.outputs == [] and not flat.binary_default
    name, x = flat.inputs[0]
    assert name == "input" and x.dtype == np.float32 and x.tolist() == [[1.0, 2.0]]
    nested = parse_request(json.dumps({"inputs": [_tensor(data=[[1.0, 2.0]])]}).encode(), None)
    np.testing.assert_array_equal(nested.inputs[0][1], x)
    big = parse_request(
        json.dumps(
            {"inputs": [_tensor(datatype="INT64", shape=[2], data=[2**62 + 1, -(2**63)])]}
        ).encode(),
        None,
    )
    assert big.inputs[0][1].tolist() == [2**62 + 1, -(2**63)]  # exact, not via float
    flags = parse_request(
        json.dumps(
            {"inputs": [_tensor(datatype="BOOL", shape=[3], data=[True, False, 1])]}
        ).encode(),
        None,
    )
    assert flags.inputs[0][1].tolist() == [True, False, True]
    req = parse_request(
        _req(
            outputs=[{"name": "logits", "parameters": {"classification": 3, "binary_data": True}}],
            parameters={"binary_data_output": True, "priority": 2, "note": "x"},
        ),
        None,
    )
    assert req.outputs == [OutputSpec("logits", True, 3)] and req.binary_default


def _binary(*arrays: np.ndarray, extra: bytes = b"", **head_over: object) -> tuple[bytes, str]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": f"in{i}",
                    "shape": list(a.shape),
                    "datatype": {np.float32: "FP32", np.int8: "INT8"}[a.dtype.type],
                    "parameters": {"binary_data_size": a.nbytes},
                }
                for i, a in enumerate(arrays)
            ],
            **head_over,
        }
    ).encode()
    return head + b"".join(a.tobytes() for a in arrays) + extra, str(len(head))


def test_binary_extension_round_trip_and_its_errors() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(4, dtype=np.int8)
    body, n = _binary(a, b)
    req = parse_request(body, n)
    np.testing.assert_array_equal(req.inputs[0][1], a)
    np.testing.assert_array_equal(req.inputs[1][1], b)
    body, n = _binary(a, extra=b"\0\0\0\0")
    with pytest.raises(InputError, match="4 bytes after the JSON header belong to no input"):
        parse_request(body, n)
    body, n = _binary(a)
    with pytest.raises(InputError, match="overruns"):
        parse_request(body[:-1], n)
    for bad in ("abc", "-5", "٣", "1e3", ""):
        with pytest.raises(InputError, match=HEADER):
            parse_request(body, bad)
    for bad in ("0", str(len(body) + 1)):
        with pytest.raises(InputError, match="does not fit"):
            parse_request(body, bad)
    head = json.loads(body[: int(n)])
    head["inputs"][0]["parameters"]["binary_data_size"] = 20  # 5 floats for a [2, 3] tensor
    text = json.dumps(head).encode()
    with pytest.raises(InputError, match="20 bytes for shape"):
        parse_request(text + a.tobytes()[:20] + b"\0" * 4, str(len(text)))
    head["inputs"][0]["data"] = a.ravel().tolist()
    head["inputs"][0]["parameters"]["binary_data_size"] = a.nbytes
    text = json.dumps(head).encode()
    with pytest.raises(InputError, match="both 'data' and binary_data_size"):
        parse_request(text + a.tobytes(), str(len(text)))


def test_encode_response_json_binary_and_classification() -> None:
    y = np.array([[0.1, 3.0, -1.0]], np.float32)
    body, headers = encode_response("m", "r1", [(OutputSpec("logits"), y)])
    doc = json.loads(body)
    assert headers == {"content-type": "application/json"}
    assert doc == {
        "model_name": "m",
        "model_version": "1",
        "id": "r1",
        "outputs": [
            {"name": "logits", "datatype": "FP32", "shape": [1, 3], "data": y.ravel().tolist()}
        ],
    }
    top = classification(y, 2, ["a", "b", "c"])
    assert top.tolist() == [["3.000000:1:b", "0.100000:0:a"]]
    body, headers = encode_response(
        "m", None, [(OutputSpec("logits", binary=True), y), (OutputSpec("logits", True, 2), top)]
    )
    n = int(headers[HEADER])
    head = json.loads(body[:n])
    assert "id" not in head and headers["content-type"] == "application/octet-stream"
    size0 = head["outputs"][0]["parameters"]["binary_data_size"]
    np.testing.assert_array_equal(np.frombuffer(body[n : n + size0], np.float32).reshape(1, 3), y)
    rest = body[n + size0 :]
    first = struct.unpack("<I", rest[:4])[0]
    assert rest[4 : 4 + first] == b"3.000000:1:b"
    assert head["outputs"][1]["datatype"] == "BYTES" and head["outputs"][1]["shape"] == [1, 2]


def test_openapi_document_covers_every_route() -> None:
    from zoo.deploy.serve.app import create_app
    from zoo.deploy.serve.config import ServeConfig

    app = create_app(ServeConfig(model_path="unused.onnx", name="m1"))
    routes = {
        (method, route.path)  # type: ignore[attr-defined]
        for route in app.routes
        for method in route.methods - {"HEAD"}  # type: ignore[attr-defined]
    }
    doc = openapi_document("m1")
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    assert documented == routes
    assert doc["openapi"].startswith("3.1")
    infer = doc["paths"]["/v2/models/{name}/infer"]["post"]
    assert set(infer["requestBody"]["content"]) == {"application/json", "application/octet-stream"}
    assert {p["name"] for p in infer["parameters"]} == {"name", HEADER}
    assert infer["parameters"][0]["schema"]["enum"] == ["m1"]
    assert {"400", "413", "415", "429", "503", "504"} <= set(infer["responses"])
    predict = doc["paths"]["/v2/models/{name}/predict"]["post"]["requestBody"]["content"]
    assert {"image/jpeg", "image/png", "multipart/form-data"} <= set(predict)
    schemas = doc["components"]["schemas"]
    assert schemas["InputTensor"]["additionalProperties"] is False
    assert schemas["InputTensor"]["properties"]["shape"]["items"]["minimum"] == 0


def test_server_metadata_and_routing_errors_are_json() -> None:
    """``GET /v2`` is the protocol's server metadata; a wrong path or method gets JSON like
    every other error (not Starlette's plain text), naming what to do instead."""
    import importlib.metadata

    from starlette.testclient import TestClient

    from zoo.deploy.serve.app import create_app
    from zoo.deploy.serve.config import ServeConfig

    client = TestClient(create_app(ServeConfig(model_path="unused.onnx", name="m1")))
    meta = client.get("/v2")
    assert meta.status_code == 200 and meta.json()["name"] == "zoo"
    assert meta.json()["extensions"] == []
    assert meta.json()["version"] == importlib.metadata.version("zoo")
    missing = client.get("/v2/nope")
    assert missing.status_code == 404
    assert "/v2/nope" in missing.json()["error"] and "/openapi.json" in missing.json()["error"]
    wrong = client.get("/v2/models/m1/infer")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"] == "GET is not allowed on /v2/models/m1/infer; use POST"


def test_a_bug_outside_the_guarded_endpoints_still_answers_json() -> None:
    from starlette.testclient import TestClient

    from zoo.deploy.serve.app import create_app
    from zoo.deploy.serve.config import ServeConfig

    app = create_app(ServeConfig(model_path="unused.onnx", name="m1"))
    app.state.server.ready = True  # ready, yet no model: the metadata endpoint's assert fails
    r = TestClient(app, raise_server_exceptions=False).get("/v2/models/m1")
    assert r.status_code == 500 and r.json()["error"].startswith("internal error: AssertionError")


def test_triton_config_is_the_metadata_in_tritons_form() -> None:
    """Dims lose the batch axis, datatypes take Triton's names, the input's layout follows
    what it is (float image tensor NCHW, uint8 pixels NHWC, anything else NONE), outputs carry
    no format, and the backend follows the platform."""
    t = TensorMetadata
    meta = ModelMetadata(
        name="m",
        versions=["1"],
        platform="onnxruntime_onnx",
        inputs=[t("input", "FP32", [-1, 3, 32, 32])],
        outputs=[t("logits", "FP32", [-1, 10]), t("accepted", "BOOL", [-1])],
        parameters={"max_batch": 8},
    )
    config = msgspec.to_builtins(triton_config(meta, 8))
    assert config == {
        "name": "m",
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [
            {
                "name": "input",
                "data_type": "TYPE_FP32",
                "dims": [3, 32, 32],
                "format": "FORMAT_NCHW",
            }
        ],
        "output": [
            {"name": "logits", "data_type": "TYPE_FP32", "dims": [10]},
            {"name": "accepted", "data_type": "TYPE_BOOL", "dims": []},
        ],
    }
    layouts = {
        ("UINT8", (-1, -1, -1, 3)): "FORMAT_NHWC",  # pixels: a graph that preprocesses itself
        ("FP32", (-1, 64)): "FORMAT_NONE",
        ("FP32", (-1, 1, 8, 8)): "FORMAT_NCHW",
    }
    for (dtype, shape), layout in layouts.items():
        meta.inputs = [t("x", dtype, list(shape))]
        (inp,) = triton_config(meta, 1).input
        assert (inp.format, inp.dims, inp.data_type) == (layout, list(shape[1:]), f"TYPE_{dtype}")
    meta.platform = "openvino"
    assert triton_config(meta, 1).backend == "openvino"
