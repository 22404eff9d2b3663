"""Open Inference Protocol (KServe v2) over REST: JSON tensors, the binary-tensor extension
(``Inference-Header-Content-Length``) and the classification extension.

The request is a typed msgspec model, decoded and validated in one pass over the bytes before
numpy sees any of it: every field's type, non-negative shapes of bounded rank, nesting bounded
by the schema itself. msgspec was chosen over pydantic and JSON Schema validators because it is
the fastest of them on large tensors (one C pass, ~5× ``json.loads`` on a 224² FP32 image), its
errors name the field by JSON path (``at $.inputs[0].shape[1]``), and the same types give the
OpenAPI schema. Everything here is a pure function of bytes: testable without a server."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from zoo.errors import InputError, PayloadTooLargeError

HEADER = "Inference-Header-Content-Length"
ACCEPTED_OUTPUT = "accepted"
"""A model with a rejection rule adds this output: BOOL ``[N]``, False for an image the rule
answers ``unknown`` for (declared in the model metadata; the logits come first as always)."""
SCORE_OUTPUT = "score"
"""And this one: FP32 ``[N]``, each image's score of the rule (``parameters.rejection`` in the
model metadata names its kind and threshold)."""
LABELS_OUTPUT = "labels"
"""A multi-label model adds this output: BYTES ``[N]``, each image's decided classes (its score
at or over the class's threshold, ``parameters.thresholds`` in the model metadata) joined by
``;`` in class order, empty for none: the ``labels`` column of ``zoo predict --out``."""
MAX_RANK = 8  # dimensions of a tensor; also the deepest nesting of its JSON ``data``
MAX_ELEMENTS = 1 << 28  # default cap on one tensor's element count (the server uses its body limit)
DTYPES: dict[str, Any] = {
    "FP32": np.float32,
    "FP64": np.float64,
    "FP16": np.float16,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "BOOL": np.bool_,
}
Datatype = Literal["FP32", "FP64", "FP16", "INT8", "INT16", "INT32", "INT64", "UINT8", "BOOL"]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Dim = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]  # numpy's largest dimension


def _nested_data(depth: int) -> Any:
    """``data`` is a flat row-major list or the tensor's nested form, at most ``depth`` deep."""
    element: Any = int | float | bool
    for _ in range(depth - 1):
        element = int | float | bool | list[element]
    return list[element]


TensorData = _nested_data(MAX_RANK)


# The protocol's objects are closed (an unknown field is a 400 naming it); its ``parameters``
# are open maps, so other keys are skipped (their nesting is bounded by the JSON decoder).
# Closed to what the Open Inference Protocol's servers accept, not to what its schema prints:
# KServe's own SDK (``InferRequest.to_rest``) sends ``model_name`` in the body, and KServe's and
# Triton's servers take it. KServe reads the model from the URL and ignores the body's
# ``model_name`` and ``model_version`` (``kserve/protocol/rest/v2_datamodels.py`` declares
# neither; its endpoint passes the path's name on); zoo does the same.
class InputParameters(msgspec.Struct, omit_defaults=True):
    binary_data_size: NonNegative | None = None  # bytes of this tensor after the JSON header


class InputTensor(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    name: str
    shape: Annotated[list[Dim], msgspec.Meta(max_length=MAX_RANK)]
    datatype: Datatype
    parameters: InputParameters | None = None
    data: TensorData | None = None  # type: ignore[valid-type]


class OutputParameters(msgspec.Struct, omit_defaults=True):
    binary_data: bool = False
    classification: NonNegative = 0  # top-k "score:index:label" strings instead of the tensor


class RequestedOutput(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    name: str
    parameters: OutputParameters | None = None


class RequestParameters(msgspec.Struct, omit_defaults=True):
    binary_data_output: bool = False


class InferenceRequest(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    inputs: Annotated[list[InputTensor], msgspec.Meta(min_length=1)]
    id: str | None = None
    model_name: str | None = None  # informational: the URL names the model (as KServe)
    model_version: str | None = None  # informational, as model_name
    parameters: RequestParameters | None = None
    outputs: list[RequestedOutput] | None = None


class OutputTensor(msgspec.Struct, omit_defaults=True):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, int] | None = None
    data: list[Any] | None = None


class InferenceResponse(msgspec.Struct, omit_defaults=True):
    model_name: str
    model_version: str
    outputs: list[OutputTensor]
    id: str | None = None


class IndexEntry(msgspec.Struct, omit_defaults=True):
    """One model in the repository index (Triton's model repository extension):
    ``state`` is READY, LOADING (warming up) or UNAVAILABLE (``reason`` says why)."""

    name: str
    version: str
    state: str
    reason: str = ""


class TensorMetadata(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]  # -1 for a dynamic dimension


class ModelMetadata(msgspec.Struct):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    # zoo's extras: max_batch, static_batch, multi_label, classes, a multi-label model's
    # thresholds, preprocessing, a rejection rule
    parameters: dict[str, Any]


class TritonTensorConfig(msgspec.Struct, omit_defaults=True):
    """One input or output of :class:`TritonConfig`."""

    name: str
    data_type: str  # Triton's names: TYPE_FP32, TYPE_UINT8, TYPE_BOOL, TYPE_STRING (BYTES)
    dims: list[int]  # without the batch dimension; -1 for a dynamic one
    format: str = ""  # inputs: FORMAT_NCHW, FORMAT_NHWC or FORMAT_NONE


class TritonConfig(msgspec.Struct):
    """A served model's configuration in Triton's form (its model configuration extension:
    ``GET /v2/models/NAME/config``, gRPC ``ModelConfig``), the JSON Triton itself answers:
    what Triton's clients read before they infer (its image client reads ``max_batch_size``
    and the input's ``format``)."""

    name: str
    platform: str
    backend: str
    max_batch_size: int  # the largest batch a request may carry (--max-batch)
    input: list[TritonTensorConfig]
    output: list[TritonTensorConfig]


def triton_config(meta: ModelMetadata, max_batch: int) -> TritonConfig:
    """``meta`` in Triton's configuration form: the batch axis left out of the dims (every
    served model takes one), datatypes with Triton's ``TYPE_`` names (BYTES is its
    ``TYPE_STRING``), and the input's layout: uint8 pixels ``[N, H, W, C]`` (a graph that
    preprocesses itself) FORMAT_NHWC, a float image tensor ``[N, C, H, W]`` FORMAT_NCHW,
    anything else FORMAT_NONE."""

    def layout(t: TensorMetadata) -> str:
        if len(t.shape) != 4:
            return "FORMAT_NONE"
        return "FORMAT_NHWC" if t.datatype == "UINT8" else "FORMAT_NCHW"

    def tensor(t: TensorMetadata, fmt: str = "") -> TritonTensorConfig:
        kind = "STRING" if t.datatype == "BYTES" else t.datatype  # Triton's name for BYTES
        return TritonTensorConfig(t.name, f"TYPE_{kind}", t.shape[1:], fmt)

    return TritonConfig(
        name=meta.name,
        platform=meta.platform,
        backend="openvino" if meta.platform == "openvino" else "onnxruntime",
        max_batch_size=max_batch,
        input=[tensor(t, layout(t)) for t in meta.inputs],
        output=[tensor(t) for t in meta.outputs],
    )


_DECODER = msgspec.json.Decoder(InferenceRequest)
_ENCODER = msgspec.json.Encoder()


@dataclass
class OutputSpec:
    name: str
    binary: bool = False
    classification: int = 0


@dataclass
class InferRequest:
    id: str | None
    inputs: list[tuple[str, np.ndarray]]
    outputs: list[OutputSpec] = field(default_factory=list)
    binary_default: bool = False


def _header_length(header_length: str | None, body_len: int) -> int:
    if header_length is None:
        return body_len
    text = header_length.strip()
    if not (text.isascii() and text.isdigit()):
        raise InputError(f"{HEADER} must be a non-negative integer, got {header_length!r}")
    json_len = int(text)
    if not 0 < json_len <= body_len:
        raise InputError(f"{HEADER}={json_len} does not fit a body of {body_len} bytes")
    return json_len


def decode_request(header: bytes | memoryview) -> InferenceRequest:
    """The JSON part of a request, validated against the v2 schema.

    Raises:
        InputError: the bytes are not JSON, or a field has the wrong type or value (the message
            names the field's JSON path).
    """
    try:
        return _DECODER.decode(header)
    except msgspec.ValidationError as exc:
        hint = f" (use one of {', '.join(DTYPES)})" if str(exc).endswith(".datatype`") else ""
        raise InputError(f"invalid inference request: {exc}{hint}") from exc
    except msgspec.DecodeError as exc:
        raw = bytes(header)
        hint = (
            " (NaN and Infinity are not JSON numbers)"
            if b"NaN" in raw or b"Infinity" in raw
            else ""
        )
        raise InputError(f"request body is not valid JSON{hint}: {exc}") from exc
    except RecursionError as exc:  # deep nesting in a field the schema ignores
        raise InputError("request JSON is nested too deeply: send a KServe v2 request") from exc


def element_count(name: str, shape: list[int], max_elements: int) -> int:
    """Elements of ``shape`` as an exact Python int (numpy's product would wrap around).

    Raises:
        PayloadTooLargeError: the count is over ``max_elements``.
    """
    count = math.prod(shape)
    if count > max_elements:
        raise PayloadTooLargeError(
            f"input {name!r}: shape {shape} has {count:,} elements, over the limit of "
            f"{max_elements:,}: send smaller batches"
        )
    big = [d for d in shape if d > max_elements]  # an empty tensor with an absurd dimension
    if big:
        raise PayloadTooLargeError(
            f"input {name!r}: dimension {big[0]:,} of shape {shape} is over the limit of "
            f"{max_elements:,}"
        )
    return count


def _tensor(spec: InputTensor, binary: memoryview | None, count: int) -> np.ndarray:
    name, shape = spec.name, spec.shape
    np_dtype = np.dtype(DTYPES[spec.datatype])
    if binary is not None:
        if spec.data is not None:
            raise InputError(f"input {name!r} has both 'data' and binary_data_size: send one")
        if len(binary) != count * np_dtype.itemsize:
            raise InputError(
                f"input {name!r}: {len(binary)} bytes for shape {shape} {spec.datatype} "
                f"(expected {count * np_dtype.itemsize})"
            )
        return np.frombuffer(binary, dtype=np_dtype).reshape(shape)
    if spec.data is None:
        raise InputError(f"input {name!r} has no 'data' (nor parameters.binary_data_size)")
    try:
        raw = np.asarray(spec.data)
    except (TypeError, ValueError, OverflowError) as exc:  # ragged nesting
        raise InputError(f"input {name!r}: data is not {spec.datatype} ({exc})") from exc
    if raw.size != count:
        raise InputError(f"input {name!r}: {raw.size} values for shape {shape} ({count} expected)")
    if raw.size:
        if raw.dtype.kind in "iuf" and np_dtype.kind != "b" and _holds_bool(spec.data):
            raise InputError(  # numpy reads [1, true] as [1, 1]: a silent cast
                f"input {name!r}: {spec.datatype} data must be "
                f"{'integers' if np_dtype.kind in 'iu' else 'numbers'}, got True or False"
            )
        check_values(name, spec.datatype, raw, np_dtype)
    return raw.astype(np_dtype).reshape(shape)


def _holds_bool(data: Any) -> bool:
    """Whether JSON data holds ``true``/``false`` anywhere in its nesting."""
    stack = [data]
    while stack:
        v = stack.pop()
        if type(v) is bool:
            return True
        if isinstance(v, list):
            stack.extend(v)
    return False


def check_values(name: str, datatype: str, raw: np.ndarray, dtype: np.dtype) -> None:
    """JSON values that the tensor's datatype holds exactly: integers in range for an integer
    type, true/false (or 0/1) for BOOL, finite numbers in range for a float type; never a
    silent cast (1.5 sent as UINT8 is not pixel 1, 300 is not 44, 1e39 as FP32 is not inf).

    Raises:
        InputError: naming the input, the datatype and an offending value.
    """
    kind = raw.dtype.kind  # b: all booleans, i/u: all integers, f: numbers, O: mixed or huge

    def refuse(what: str, bad: Any) -> InputError:
        shown = bad.item() if isinstance(bad, np.generic) else bad
        return InputError(f"input {name!r}: {datatype} data must be {what}, got {shown!r}")

    if dtype.kind == "b":
        ok = np.isin(raw, (0, 1)) if kind in "biuf" else np.zeros(raw.shape, bool)
        if not ok.all():  # true/false, or 0/1
            raise refuse("true/false", raw[~ok].flat[0])
        return
    if kind == "O" and dtype.kind in "iu":  # integers beyond 64 bits (or mixed with true)
        big = next((v for v in raw.flat if type(v) is int and abs(v) >= 2**63), None)
        if big is not None:
            raise InputError(f"input {name!r}: {big} is outside {datatype}'s range")
    if kind not in "iuf":  # true/false
        raise refuse("integers" if dtype.kind in "iu" else "numbers", raw.flat[0])
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            over = ~np.isfinite(raw.astype(dtype))
        if over.any():
            raise InputError(
                f"input {name!r}: {raw[over].flat[0].item()!r} is outside {datatype}'s range"
            )
        return
    if kind == "f" and not np.isfinite(raw).all():  # 1e999 parses as infinity
        raise refuse("integers", raw[~np.isfinite(raw)].flat[0])
    fractions = raw[raw != np.floor(raw)] if kind == "f" else raw[:0]
    if fractions.size:  # 2.0 is the integer 2; 2.5 is not
        raise refuse("integers", fractions.flat[0])
    info = np.iinfo(dtype)
    low, high = int(raw.min()), int(raw.max())
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise InputError(
            f"input {name!r}: {bad} is outside {datatype}'s range {info.min}..{info.max}"
        )


def parse_request(
    body: bytes, header_length: str | None, *, max_elements: int = MAX_ELEMENTS
) -> InferRequest:
    """A v2 inference request (JSON, or JSON header + binary tensors) as numpy arrays.

    Args:
        body: the whole request body.
        header_length: the ``Inference-Header-Content-Length`` header, if sent.
        max_elements: the largest element count accepted for one tensor.

    Returns:
        The request id, the named input arrays, the requested outputs.

    Raises:
        InputError: the request breaks the protocol; the message names the field.
        PayloadTooLargeError: a shape has more than ``max_elements`` elements.
    """
    if not body:
        raise InputError("empty request body: send a KServe v2 JSON inference request")
    json_len = _header_length(header_length, len(body))
    view = memoryview(body)
    req = decode_request(view[:json_len])
    binary, offset = view[json_len:], 0
    inputs = []
    for spec in req.inputs:
        count = element_count(spec.name, spec.shape, max_elements)
        size = spec.parameters.binary_data_size if spec.parameters else None
        chunk = None
        if size is not None:
            if offset + size > len(binary):
                raise InputError(
                    f"input {spec.name!r}: binary_data_size {size} overruns the "
                    f"{len(binary) - offset} bytes left in the body"
                )
            chunk = binary[offset : offset + size]
            offset += size
        inputs.append((spec.name, _tensor(spec, chunk, count)))
    if offset != len(binary):
        raise InputError(
            f"{len(binary) - offset} bytes after the JSON header belong to no input: check "
            f"{HEADER} and each input's binary_data_size"
        )
    outputs = [
        OutputSpec(
            o.name,
            o.parameters.binary_data if o.parameters else False,
            o.parameters.classification if o.parameters else 0,
        )
        for o in req.outputs or []
    ]
    binary_default = req.parameters.binary_data_output if req.parameters else False
    return InferRequest(req.id, inputs, outputs, binary_default)


def classification(logits: np.ndarray, k: int, labels: list[str]) -> np.ndarray:
    """Top-k ``"score:index:label"`` strings per sample (scores are the raw outputs)."""
    k = min(k, logits.shape[-1])
    idx = np.argsort(-logits, axis=-1)[:, :k]
    return np.array(
        [
            [f"{row[i]:f}:{i}:{labels[i] if i < len(labels) else i}" for i in r]
            for row, r in zip(logits, idx, strict=True)
        ],
        dtype=object,
    )


def datatype_of(dtype: np.dtype) -> str:
    """The protocol's name of a numpy dtype (``FP32``), for responses and for messages that
    quote what a client sent; ``BYTES`` for strings."""
    if dtype.kind == "O":
        return "BYTES"
    return next((k for k, v in DTYPES.items() if np.dtype(v) == dtype), str(dtype))


def bytes_tensor(arr: np.ndarray) -> bytes:
    """A BYTES tensor's wire form: each string as a little-endian uint32 length, then UTF-8."""
    return b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in arr.ravel())


def encode_response(
    model: str, request_id: str | None, outputs: list[tuple[OutputSpec, np.ndarray]]
) -> tuple[bytes, dict[str, str]]:
    """JSON response, or JSON header + binary tensors when any output asked for binary."""
    docs, blobs = [], []
    for spec, arr in outputs:
        dtype = datatype_of(arr.dtype)
        doc = OutputTensor(spec.name, dtype, list(arr.shape))
        if spec.binary:
            blob = bytes_tensor(arr) if dtype == "BYTES" else np.ascontiguousarray(arr).tobytes()
            doc.parameters = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            doc.data = arr.ravel().tolist()
        docs.append(doc)
    text = _ENCODER.encode(InferenceResponse(model, "1", docs, request_id))
    if not blobs:
        return text, {"content-type": "application/json"}
    return text + b"".join(blobs), {
        "content-type": "application/octet-stream",
        HEADER: str(len(text)),
    }
