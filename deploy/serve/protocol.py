"""Open Inference Protocol (KServe v2) over REST: JSON tensors, the binary-tensor extension
(``Inference-Header-Content-Length``) and the classification extension."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zoo.errors import InputError

HEADER = "Inference-Header-Content-Length"
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


def _decode_tensor(spec: dict[str, Any], binary: memoryview | None) -> np.ndarray:
    name, dtype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
    if (
        not isinstance(name, str)
        or not isinstance(shape, list)
        or not all(isinstance(d, int) and d >= 0 for d in shape)
    ):
        raise InputError("each input needs a string 'name' and a 'shape' list of non-negative ints")
    if dtype not in DTYPES:
        raise InputError(
            f"input {name!r}: unsupported datatype {dtype!r} (use one of {', '.join(DTYPES)})"
        )
    count = int(np.prod(shape)) if shape else 1
    np_dtype = np.dtype(DTYPES[dtype])
    if binary is not None:
        if len(binary) != count * np_dtype.itemsize:
            raise InputError(
                f"input {name!r}: {len(binary)} bytes for shape {shape} {dtype} "
                f"(expected {count * np_dtype.itemsize})"
            )
        return np.frombuffer(binary, dtype=np_dtype).reshape(shape)
    data = spec.get("data")
    if data is None:
        raise InputError(f"input {name!r} has no 'data'")
    try:
        arr = np.asarray(data, dtype=np_dtype)
    except (TypeError, ValueError) as exc:
        raise InputError(f"input {name!r}: data is not {dtype} ({exc})") from exc
    if arr.size != count:
        raise InputError(f"input {name!r}: {arr.size} values for shape {shape} ({count} expected)")
    return arr.reshape(shape)


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    if not body:
        raise InputError("empty request body: send a KServe v2 JSON inference request")
    json_len = len(body)
    if header_length is not None:
        try:
            json_len = int(header_length)
        except ValueError as exc:
            raise InputError(f"{HEADER} must be an integer, got {header_length!r}") from exc
        if not 0 < json_len <= len(body):
            raise InputError(f"{HEADER}={json_len} does not fit a body of {len(body)} bytes")
    try:
        doc = json.loads(body[:json_len])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
        raise InputError("request needs a non-empty 'inputs' list")
    view = memoryview(body)[json_len:]
    offset = 0
    inputs = []
    for spec in doc["inputs"]:
        if not isinstance(spec, dict):
            raise InputError("each input must be an object")
        size = (spec.get("parameters") or {}).get("binary_data_size")
        chunk = None
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(view):
                raise InputError(
                    f"input {spec.get('name')!r}: binary_data_size {size} overruns the body"
                )
            chunk = view[offset : offset + size]
            offset += size
        inputs.append(
            (spec["name"] if isinstance(spec.get("name"), str) else "", _decode_tensor(spec, chunk))
        )
    outputs = []
    for o in doc.get("outputs") or []:
        params = o.get("parameters") or {}
        outputs.append(
            OutputSpec(
                str(o.get("name")),
                bool(params.get("binary_data", False)),
                int(params.get("classification", 0) or 0),
            )
        )
    binary_default = bool((doc.get("parameters") or {}).get("binary_data_output", False))
    return InferRequest(doc.get("id"), inputs, outputs, binary_default)


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


def _bytes_tensor(arr: np.ndarray) -> bytes:
    return b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in arr.ravel())


def encode_response(
    model: str, request_id: str | None, outputs: list[tuple[OutputSpec, np.ndarray]]
) -> tuple[bytes, dict[str, str]]:
    """JSON response, or JSON header + binary tensors when any output asked for binary."""
    docs, blobs = [], []
    for spec, arr in outputs:
        dtype = (
            "BYTES"
            if arr.dtype == object
            else next(k for k, v in DTYPES.items() if np.dtype(v) == arr.dtype)
        )
        doc: dict[str, Any] = {"name": spec.name, "datatype": dtype, "shape": list(arr.shape)}
        if spec.binary:
            blob = _bytes_tensor(arr) if dtype == "BYTES" else np.ascontiguousarray(arr).tobytes()
            doc["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            doc["data"] = arr.ravel().tolist()
        docs.append(doc)
    head: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": docs}
    if request_id is not None:
        head["id"] = request_id
    text = json.dumps(head).encode()
    if not blobs:
        return text, {"content-type": "application/json"}
    return text + b"".join(blobs), {
        "content-type": "application/octet-stream",
        HEADER: str(len(text)),
    }
