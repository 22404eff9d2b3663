"""Request validation edges that mutation testing found unchecked (scripts/mutation.sh
protocol): each test pins one boundary or one message exactly, on plain bytes, in ms."""

from __future__ import annotations

import json
import re
import struct

import msgspec
import numpy as np
import pytest

from zoo.deploy.serve import protocol
from zoo.deploy.serve.protocol import (
    MAX_RANK,
    OutputSpec,
    classification,
    decode_request,
    encode_response,
    parse_request,
)
from zoo.errors import InputError, PayloadTooLargeError


def _req(**over: object) -> bytes:
    tensor = {"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}
    return json.dumps({"inputs": [tensor], **over}).encode()


def _nest(value: object, depth: int) -> object:
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [1, 2, 3, MAX_RANK])
def test_tensor_data_nests_exactly_depth_deep(depth: int) -> None:
    schema = protocol._nested_data(depth)
    for leaf in (1, 2.5, True):
        inside = json.dumps(_nest(leaf, depth)).encode()
        assert msgspec.json.decode(inside, type=schema) == _nest(leaf, depth)
    assert msgspec.json.decode(b"[1, 2.5, false]", type=schema) == [1, 2.5, False]
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(_nest(1, depth + 1)).encode(), type=schema)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'["1"]', type=schema)


def test_request_data_accepts_max_rank_nesting_and_refuses_one_more() -> None:
    shape = [1] * MAX_RANK
    body = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": shape, "datatype": "FP32", "data": _nest(3.0, MAX_RANK)}
            ]
        }
    ).encode()
    assert parse_request(body, None).inputs[0][1].shape == tuple(shape)
    deeper = body.replace(b"[[", b"[[[", 1).replace(b"]]", b"]]]", 1)
    with pytest.raises(InputError, match=r"\$\.inputs\[0\]\.data"):
        parse_request(deeper, None)


def test_header_length_may_be_one_byte_or_the_whole_body() -> None:
    body = _req()
    assert parse_request(body, str(len(body))).inputs[0][0] == "input"  # JSON only, no binary
    with pytest.raises(InputError) as info:
        parse_request(body, "1")  # fits the body; b"{" is not a JSON document
    assert str(info.value).startswith("request body is not valid JSON: ")


def test_decode_errors_carry_their_hint_only_when_it_applies() -> None:
    bad_type = json.dumps(
        {"inputs": [{"name": "x", "shape": [1], "datatype": "FP8", "data": [1]}]}
    ).encode()
    with pytest.raises(msgspec.ValidationError) as raw:
        msgspec.json.decode(bad_type, type=protocol.InferenceRequest)
    with pytest.raises(InputError) as info:
        decode_request(bad_type)
    assert str(info.value) == (
        f"invalid inference request: {raw.value} "
        "(use one of FP32, FP64, FP16, INT8, INT16, INT32, INT64, UINT8, BOOL)"
    )
    wrong_id = _req(id=5)
    with pytest.raises(msgspec.ValidationError) as raw:
        msgspec.json.decode(wrong_id, type=protocol.InferenceRequest)
    with pytest.raises(InputError) as info:
        decode_request(wrong_id)
    assert str(info.value) == f"invalid inference request: {raw.value}"


@pytest.mark.parametrize(
    ("body", "hint"),
    [
        (b'{"inputs": [NaN]}', " (NaN and Infinity are not JSON numbers)"),
        (b'{"inputs": [Infinity]}', " (NaN and Infinity are not JSON numbers)"),
        (b'{"inputs": [-Infinity, NaN]}', " (NaN and Infinity are not JSON numbers)"),
        (b'{"inputs": [nan]}', ""),
        (b'{"inputs": [', ""),
    ],
)
def test_not_json_names_nan_and_infinity_only_when_sent(body: bytes, hint: str) -> None:
    with pytest.raises(msgspec.DecodeError) as raw:
        msgspec.json.decode(body)
    with pytest.raises(InputError) as info:
        decode_request(body)
    assert str(info.value) == f"request body is not valid JSON{hint}: {raw.value}"


def test_exact_messages_of_the_plain_errors() -> None:
    with pytest.raises(InputError) as info:
        parse_request(b"", None)
    assert str(info.value) == "empty request body: send a KServe v2 JSON inference request"
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(InputError) as info:
        parse_request(_req()[:-1] + b', "parameters": {"other": ' + deep + b"}}", None)
    assert str(info.value) == "request JSON is nested too deeply: send a KServe v2 request"


def test_binary_size_messages_give_the_right_numbers() -> None:
    a = np.arange(6, dtype=np.float32)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "px",
                    "shape": [2, 3],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 20},
                }
            ]
        }
    ).encode()
    with pytest.raises(InputError) as info:
        parse_request(head + a.tobytes()[:20], str(len(head)))
    assert str(info.value) == "input 'px': 20 bytes for shape [2, 3] FP32 (expected 24)"
    two = json.dumps(
        {
            "inputs": [
                {
                    "name": f"p{i}",
                    "shape": [6],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 24},
                }
                for i in range(2)
            ]
        }
    ).encode()
    with pytest.raises(InputError) as info:  # the second input starts 24 bytes in
        parse_request(two + a.tobytes() + a.tobytes()[:20], str(len(two)))
    assert str(info.value).startswith(
        "input 'p1': binary_data_size 24 overruns the 20 bytes left in the body"
    )


def test_too_large_names_the_input() -> None:
    body = json.dumps(
        {"inputs": [{"name": "pixels", "shape": [3, 4], "datatype": "FP32", "data": [0] * 12}]}
    ).encode()
    with pytest.raises(PayloadTooLargeError, match=r"^input 'pixels': shape \[3, 4\] has 12 "):
        parse_request(body, None, max_elements=11)


def test_outputs_without_parameters_take_the_defaults() -> None:
    req = parse_request(_req(outputs=[{"name": "y"}, {"name": "z", "parameters": {}}]), None)
    assert req.outputs == [OutputSpec("y", False, 0), OutputSpec("z", False, 0)]


def test_classification_labels_missing_classes_by_index() -> None:
    logits = np.array([[0.0, 5.0, 1.0], [9.0, 0.0, 2.0]], np.float32)
    assert classification(logits, 2, ["a"]).tolist() == [
        ["5.000000:1:1", "1.000000:2:2"],
        ["9.000000:0:a", "2.000000:2:2"],
    ]
    assert classification(logits, 10, []).shape == (2, 3)  # k capped at the class count


def test_binary_bytes_tensor_frames_every_string() -> None:
    top = np.array([["x", "yz"], ["", "éé"]], dtype=object)
    body, headers = encode_response("m", None, [(OutputSpec("t", binary=True), top)])
    blob = body[int(headers[protocol.HEADER]) :]
    out, pos = [], 0
    while pos < len(blob):
        (n,) = struct.unpack("<I", blob[pos : pos + 4])
        out.append(blob[pos + 4 : pos + 4 + n].decode())
        pos += 4 + n
    assert out == ["x", "yz", "", "éé"]


def _values(datatype: str, data: list) -> np.ndarray:
    tensor = {"name": "x", "shape": list(np.shape(data)), "datatype": datatype, "data": data}
    return parse_request(json.dumps({"inputs": [tensor]}).encode(), None).inputs[0][1]


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("UINT8", [1.5, 2], "input 'x': UINT8 data must be integers, got 1.5"),
        ("UINT8", [True, False], "input 'x': UINT8 data must be integers, got True"),
        ("UINT8", [0, 256], "input 'x': 256 is outside UINT8's range 0..255"),
        ("UINT8", [-1, 3], "input 'x': -1 is outside UINT8's range 0..255"),
        ("INT8", [128], "input 'x': 128 is outside INT8's range -128..127"),
        ("BOOL", [1, 2], "input 'x': BOOL data must be true/false, got 2"),
        ("BOOL", [0.0, 0.5], "input 'x': BOOL data must be true/false, got 0.5"),
        ("INT64", [2**70], "input 'x': 1180591620717411303424 is outside INT64's range"),
        ("FP32", [True], "input 'x': FP32 data must be numbers, got True"),
        ("INT32", [1, True, 2], "input 'x': INT32 data must be integers, got True or False"),
        ("FP32", [1.5, False], "input 'x': FP32 data must be numbers, got True or False"),
        ("UINT8", [[1, 2], [True, 3]], "input 'x': UINT8 data must be integers, got True or False"),
        ("INT16", [2.5, 3], "input 'x': INT16 data must be integers, got 2.5"),
        ("INT32", [3e9], "input 'x': 3000000000 is outside INT32's range -2147483648..2147483647"),
        ("INT16", [40000], "input 'x': 40000 is outside INT16's range -32768..32767"),
        (
            "INT32",
            [-(2**31) - 1],
            "input 'x': -2147483649 is outside INT32's range -2147483648..2147483647",
        ),
        ("FP16", [-70000.0, 1], "input 'x': -70000.0 is outside FP16's range"),
        ("FP32", [1.0, 1e39], "input 'x': 1e+39 is outside FP32's range"),
        ("FP16", [65504.0, 70000.0], "input 'x': 70000.0 is outside FP16's range"),
    ],
)
def test_json_values_are_never_cast_silently(datatype: str, data: list, message: str) -> None:
    with pytest.raises(InputError) as info:
        _values(datatype, data)
    assert str(info.value) == message


def test_json_values_each_datatype_holds_exactly_pass() -> None:
    np.testing.assert_array_equal(_values("UINT8", [0, 2.0, 255]), np.array([0, 2, 255], np.uint8))
    assert _values("UINT8", [0, 255]).dtype == np.uint8
    assert _values("INT8", [-128, 127]).tolist() == [-128, 127]
    assert _values("FP16", [65504.0]).tolist() == [65504.0]
    assert _values("FP32", [1, 2.5]).tolist() == [1.0, 2.5]
    assert _values("BOOL", [True, False]).tolist() == [True, False]
    assert _values("BOOL", [0.0, 1]).tolist() == [False, True]  # fuzzing found a 500 here
    assert _values("INT32", []).dtype == np.int32


# ``zoo predict``'s input protocol: what a file given as INPUTS may be (deploy/predict/inputs.py)


@pytest.fixture(scope="module")
def not_lists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Files that are neither images (by extension) nor text lists of paths, and a good list."""
    from zoo.samples import sample_image_paths

    folder = tmp_path_factory.mktemp("inputs")
    coffee = sample_image_paths()[1]
    files = {
        "notes.bin": bytes(range(256)) * 4,  # not UTF-8
        "nul.txt": b"abc\x00\x01def\nghi\x1b[31mred\n",  # UTF-8, but NUL and ESC bytes
        "photo.dat": coffee.read_bytes(),  # a JPEG under another name
        "ok.txt": b"\xef\xbb\xbf# a byte-order mark, a comment\n" + str(coffee).encode() + b"\n",
        "late.txt": str(coffee).encode() + b"\n" * 10000 + b"x\x1b[2Jy\n",  # past the sniff
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)  # type: ignore[arg-type]
    return {"folder": folder, "coffee": coffee}


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("notes.bin", ["'notes.bin'", "neither an image nor a list", "not UTF-8", ".jpg"]),
        ("nul.txt", ["'nul.txt'", "neither an image nor a list", "'\\x00'", "folders"]),
        ("photo.dat", ["'photo.dat'", "JPEG image without an image extension", "'photo.jpeg'"]),
    ],
)
def test_predict_refuses_a_file_that_is_no_image_and_no_list(
    not_lists: dict[str, object], name: str, words: list[str]
) -> None:
    import subprocess

    from tests.conftest import ZOO

    r = subprocess.run(
        [ZOO, "predict", "mobilenet_v2", name],
        cwd=not_lists["folder"],  # type: ignore[arg-type]
        capture_output=True,
        timeout=300,
    )
    assert r.returncode == 1, r.stderr
    message = r.stderr.decode()
    for word in words:
        assert word in message, (word, message)
    # never a raw control byte on the terminal, whatever the file held
    assert not [c for c in message if ord(c) < 32 and c not in "\t\n\r"], message


def test_a_list_with_a_bom_reads_and_late_control_bytes_are_refused_escaped(
    not_lists: dict[str, object],
) -> None:
    from zoo.deploy.predict.inputs import check_inputs, iter_inputs

    folder = not_lists["folder"]
    ok, late = str(folder / "ok.txt"), str(folder / "late.txt")  # type: ignore[operator]
    check_inputs([ok, late])  # both start as text
    assert list(iter_inputs([ok])) == [str(not_lists["coffee"])]
    with pytest.raises(InputError) as info:
        list(iter_inputs([late]))
    assert "Line 10001" in str(info.value) and "'x\\x1b[2Jy'" in str(info.value)
    with pytest.raises(InputError, match=r"nul\.txt' is neither"):
        check_inputs([ok, str(folder / "nul.txt")])  # type: ignore[operator]


# The cases mutation testing found untested at ac6006c (docs/quality.md, protocol): each pins
# which value a refusal names and that no other path is taken.
def _values_raw(datatype: str, data_json: str, shape: list[int]) -> np.ndarray:
    """Like ``_values`` with the data written as JSON text (``1e999`` is no Python float)."""
    body = (
        f'{{"inputs": [{{"name": "x", "shape": {shape}, "datatype": "{datatype}", '
        f'"data": {data_json}}}]}}'
    ).encode()
    return parse_request(body, None).inputs[0][1]


@pytest.mark.parametrize(
    ("data", "where"),
    [("[1e999]", "data[0]"), ('[1, "a"]', "data[1]"), ("[null]", "data[0]")],
)
def test_the_schema_refuses_infinity_strings_and_null_by_json_path(data: str, where: str) -> None:
    """msgspec refuses them before numpy sees the data: the message names where."""
    with pytest.raises(InputError, match=re.escape(f"at `$.inputs[0].{where}`")):
        _values_raw("INT32", data, [len(json.loads(data.replace("1e999", "1")))])


@pytest.mark.parametrize(
    ("datatype", "raw", "message"),
    [
        # check_values on its own (what a caller other than the JSON decoder may pass)
        ("INT32", np.array([1.0, np.inf]), "INT32 data must be integers, got inf"),
        ("UINT8", np.array([2.0, -np.inf]), "UINT8 data must be integers, got -inf"),
        ("BOOL", np.array(["a"]), "BOOL data must be true/false, got 'a'"),
        ("BOOL", np.array([None], dtype=object), "BOOL data must be true/false, got None"),
        ("BOOL", np.array([True, "b"]), "BOOL data must be true/false, got 'True'"),
        ("INT32", np.array([1, "a"]), "INT32 data must be integers, got '1'"),
        ("FP32", np.array([1.5, "a"]), "FP32 data must be numbers, got '1.5'"),
        ("INT64", np.array([True, None], dtype=object), "INT64 data must be integers, got True"),
    ],
)
def test_check_values_names_the_offending_value(
    datatype: str, raw: np.ndarray, message: str
) -> None:
    dtype = np.dtype(protocol.DTYPES[datatype])
    with pytest.raises(InputError) as info:
        protocol.check_values("x", datatype, raw, dtype)
    assert str(info.value) == f"input 'x': {message}"


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        # integers beyond 64 bits beside smaller ones: an object array; the big one is named
        ("INT64", [1, 2**70, 3], "input 'x': 1180591620717411303424 is outside INT64's range"),
        ("INT64", [-(2**70), 5], "input 'x': -1180591620717411303424 is outside INT64's range"),
        ("INT32", [True, 2**70], "input 'x': 1180591620717411303424 is outside INT32's range"),
        # the first value past 64 bits is named: 2**63 itself, not a smaller one, not a later
        ("INT64", [2**63, -(2**70)], "input 'x': 9223372036854775808 is outside INT64's range"),
        ("INT64", [200, 2**70], "input 'x': 1180591620717411303424 is outside INT64's range"),
        # a float type never looks for big integers: true beside one is refused as not a number
        ("FP32", [True, 2**70], "input 'x': FP32 data must be numbers, got True"),
        # the 2**63 boundary: one past INT64's largest is refused with the range
        (
            "INT64",
            [2**63],
            "input 'x': 9223372036854775808 is outside INT64's range "
            "-9223372036854775808..9223372036854775807",
        ),
        (
            "INT64",
            [2**63, -1],
            "input 'x': 9223372036854775808 is outside INT64's range "
            "-9223372036854775808..9223372036854775807",
        ),
    ],
)
def test_big_integers_name_the_offending_value(datatype: str, data: list, message: str) -> None:
    with pytest.raises(InputError) as info:
        _values(datatype, data)
    assert str(info.value) == message


def test_in_range_boundaries_of_int64_pass() -> None:
    assert _values("INT64", [2**63 - 1, -(2**63)]).tolist() == [2**63 - 1, -(2**63)]
    assert _values("INT64", [0, 2**63 - 1]).dtype == np.int64


def test_float_overflow_is_refused_without_a_runtime_warning() -> None:
    """The cast that finds the overflow runs silenced: a warning turned into an error (as
    under ``-W error``) must not replace the InputError that names the value."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=re.escape("70000.0 is outside FP16's range")):
            _values("FP16", [1.0, 70000.0])
        with pytest.raises(InputError, match=re.escape("1e+39 is outside FP32's range")):
            _values("FP32", [1e39])


def test_datatype_names_and_the_fallback_for_a_dtype_without_one() -> None:
    assert protocol.datatype_of(np.dtype("float32")) == "FP32"
    assert protocol.datatype_of(np.dtype("uint8")) == "UINT8"
    assert protocol.datatype_of(np.dtype("bool")) == "BOOL"
    assert protocol.datatype_of(np.dtype(object)) == "BYTES"
    assert protocol.datatype_of(np.dtype("complex64")) == "complex64"
    assert protocol.datatype_of(np.dtype("datetime64[s]")) == "datetime64[s]"


def _form(files: list[tuple[str, str | None, bytes]]) -> tuple[bytes, bytes]:
    """A multipart body as httpx writes it: (name, filename or None for a text field, bytes)."""
    import httpx

    req = httpx.Request(
        "POST",
        "http://zoo/",
        files=[(n, (f, b, "image/png") if f is not None else (None, b)) for n, f, b in files],
    )
    boundary = req.headers["content-type"].split("boundary=")[1]
    return req.read(), boundary.encode()


def test_upload_field_is_the_one_file_part_named_file_byte_for_byte() -> None:
    from zoo.deploy.serve.inputs import upload_field

    payload = b"\x89PNG\r\n--\r\n\x00" + bytes(range(256)) * 40  # a boundary-like run inside
    body, boundary = _form(
        [("note", None, b"hi"), ("other", "a.png", b"first"), ("file", "b.png", payload)]
    )
    assert upload_field(body, boundary) == payload
    assert upload_field(body + b"an epilogue after the close", boundary) == payload
    two, boundary = _form([("file", "a.png", b"first"), ("file", "b.png", payload)])
    with pytest.raises(InputError, match=r"has 2 'file' file parts; .* one image a request"):
        upload_field(two, boundary)  # not one answer for two images, in silence
    # a part without a Content-Disposition is no field, not the part before it again
    bare = b"--zz\r\nContent-Type: image/png\r\n\r\nbare\r\n--zz--\r\n"
    named = b'--zz\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\nok\r\n'
    assert upload_field(named + bare, b"zz") == b"ok"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda b: b[:-12], "cut short"),  # inside the closing boundary
        (lambda b: b[: len(b) // 2], "cut short"),  # inside the file's bytes
        (lambda b: b"no boundary at all" + b, "cannot be parsed"),
        (lambda b: b.replace(b'name="file"', b'name="image"'), "'file' field"),
    ],
    ids=["closing", "middle", "garbage", "other-name"],
)
def test_upload_field_refuses_what_is_not_a_whole_file_part(make: object, words: str) -> None:
    from zoo.deploy.serve.inputs import upload_field

    body, boundary = _form([("file", "a.png", b"x" * 100)])
    with pytest.raises(InputError, match=words):
        upload_field(make(body), boundary)  # type: ignore[operator]


def test_upload_field_refuses_a_text_field_and_too_many_parts() -> None:
    from zoo.deploy.serve.inputs import MAX_PARTS, upload_field

    body, boundary = _form([("file", None, b"not a file")])
    with pytest.raises(InputError, match="a file part"):
        upload_field(body, boundary)
    parts = [(f"f{i}", None, b"v") for i in range(MAX_PARTS)]
    body, boundary = _form([*parts[:-1], ("file", "a.png", b"ok")])
    assert upload_field(body, boundary) == b"ok"  # exactly MAX_PARTS parts
    body, boundary = _form([*parts, ("file", "a.png", b"ok")])
    with pytest.raises(InputError, match=f"more than {MAX_PARTS} parts"):
        upload_field(body, boundary)
