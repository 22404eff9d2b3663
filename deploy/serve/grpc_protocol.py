"""The Open Inference Protocol's gRPC form (KServe's ``grpc_predict_v2.proto``): its messages,
and a ``ModelInferRequest`` read into the same :class:`~zoo.deploy.serve.protocol.InferRequest`
the REST form gives, with the same checks, so both transports refuse the same inputs the
same way. Pure functions of messages: testable without a server.

The messages are KServe's own generated module, loaded from its file alone: importing it the
usual way runs ``kserve``'s ``__init__`` (a second or more, and a web framework), and the
generated ``*_pb2_grpc`` module imports it so. The service's method table is small enough to
write by hand (:mod:`zoo.deploy.serve.grpc_server`)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np

from zoo.deploy.serve.protocol import (
    DTYPES,
    MAX_RANK,
    InferRequest,
    OutputSpec,
    bytes_tensor,
    check_values,
    datatype_of,
    element_count,
)
from zoo.errors import InputError

SERVICE = "inference.GRPCInferenceService"
_MODULE = "zoo_grpc_predict_v2_pb2"
_KSERVE_MODULE = "kserve.protocol.grpc.grpc_predict_v2_pb2"
# which typed field of InferTensorContents holds each datatype (FP16 travels raw only)
_CONTENTS = {
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "BOOL": "bool_contents",
}


def messages() -> Any:
    """KServe's ``grpc_predict_v2_pb2`` (the v2 messages), loaded once.

    Raises:
        InputError: KServe's SDK, which ships them, is not installed.
    """
    for name in (_MODULE, _KSERVE_MODULE):  # already loaded: by us, or by kserve itself
        if name in sys.modules:
            return sys.modules[name]
    package = importlib.util.find_spec("kserve")
    locations = list(package.submodule_search_locations or []) if package else []
    found = next(
        (
            f
            for loc in locations
            if (f := Path(loc) / "protocol" / "grpc" / "grpc_predict_v2_pb2.py").is_file()
        ),
        None,
    )
    if found is None:
        raise InputError(
            "--grpc-port needs the v2 gRPC messages KServe's SDK ships: pip install 'zoo[grpc]'"
        )
    spec = importlib.util.spec_from_file_location(_MODULE, found)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = module  # before executing: protobuf registers the file once
    spec.loader.exec_module(module)
    return module


def _contents(tensor: Any) -> tuple[str, Any] | None:
    """The one typed contents field ``tensor`` fills, as (field name, values); None if none.

    Raises:
        InputError: more than one field is filled.
    """
    filled = [(f.name, v) for f, v in tensor.contents.ListFields()]
    if len(filled) > 1:
        raise InputError(
            f"input {tensor.name!r} fills {', '.join(n for n, _ in filled)}: send its values "
            "in one contents field"
        )
    return filled[0] if filled else None


def _tensor(tensor: Any, raw: bytes | None, max_elements: int) -> np.ndarray:
    name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
    if datatype not in DTYPES:
        raise InputError(
            f"input {name!r}: datatype {datatype!r} is not supported; use one of {', '.join(DTYPES)}"
        )
    if len(shape) > MAX_RANK or any(d < 0 for d in shape):
        raise InputError(
            f"input {name!r}: shape {shape} must have at most {MAX_RANK} non-negative dimensions"
        )
    count = element_count(name, shape, max_elements)
    dtype = np.dtype(DTYPES[datatype])
    contents = _contents(tensor)
    if raw is not None:
        if contents is not None:
            raise InputError(f"input {name!r} has both contents and raw_input_contents: send one")
        if len(raw) != count * dtype.itemsize:
            raise InputError(
                f"input {name!r}: {len(raw)} raw bytes for shape {shape} {datatype} "
                f"(expected {count * dtype.itemsize})"
            )
        return np.frombuffer(raw, dtype=dtype).reshape(shape)
    field = _CONTENTS.get(datatype)
    if contents is None and count:
        raise InputError(f"input {name!r} has no data: fill contents.{field} or raw_input_contents")
    if contents is not None and contents[0] != field:
        where = f"contents.{field}" if field else "raw_input_contents (FP16 has no typed field)"
        raise InputError(f"input {name!r}: {datatype} values go in {where}, not {contents[0]}")
    values = np.asarray(contents[1] if contents else [])
    if values.size != count:
        raise InputError(
            f"input {name!r}: {values.size} values for shape {shape} ({count} expected)"
        )
    if values.size:
        check_values(name, datatype, values, dtype)
    return values.astype(dtype).reshape(shape)


def _classification(output: Any) -> int:
    if "classification" not in output.parameters:
        return 0
    param = output.parameters["classification"]
    k = param.int64_param if param.WhichOneof("parameter_choice") == "int64_param" else -1
    if k < 0:
        raise InputError(
            f"output {output.name!r}: parameters.classification must be a non-negative int64_param"
        )
    return k


def parse_infer(data: bytes, *, max_elements: int) -> tuple[str, InferRequest]:
    """A serialized ``ModelInferRequest`` as (model name, the request in numpy arrays).

    Args:
        data: the message's bytes, as received.
        max_elements: the largest element count accepted for one tensor.

    Raises:
        InputError: the bytes are not the message, or it breaks the protocol (the message
            names the input or output).
        PayloadTooLargeError: a shape has more than ``max_elements`` elements.
    """
    from google.protobuf.message import DecodeError

    try:
        req = messages().ModelInferRequest.FromString(data)
    except DecodeError as exc:
        raise InputError(f"the request is not a ModelInferRequest: {exc}") from exc
    if not req.inputs:
        raise InputError("a ModelInferRequest needs at least one input")
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise InputError(
            f"{len(raw)} raw_input_contents for {len(req.inputs)} inputs: one per input, in order"
        )
    inputs = [
        (t.name, _tensor(t, raw[i] if raw else None, max_elements))
        for i, t in enumerate(req.inputs)
    ]
    outputs = [OutputSpec(o.name, True, _classification(o)) for o in req.outputs]
    return req.model_name, InferRequest(req.id or None, inputs, outputs, binary_default=True)


def infer_response(
    model: str, request_id: str | None, outputs: list[tuple[OutputSpec, np.ndarray]]
) -> Any:
    """The ``ModelInferResponse``: every output in ``raw_output_contents``, as Triton answers
    (strings length-prefixed, as the binary extension)."""
    pb = messages()
    resp = pb.ModelInferResponse(model_name=model, model_version="1", id=request_id or "")
    for spec, arr in outputs:
        datatype = datatype_of(arr.dtype)
        resp.outputs.add(name=spec.name, datatype=datatype, shape=list(arr.shape))
        resp.raw_output_contents.append(
            bytes_tensor(arr) if datatype == "BYTES" else np.ascontiguousarray(arr).tobytes()
        )
    return resp


@functools.cache
def repository_messages() -> Any:
    """Triton's ``RepositoryIndexRequest`` and ``RepositoryIndexResponse`` (its model repository
    extension over gRPC, which tritonclient's ``get_model_repository_index`` calls; KServe's
    proto has no such method), as a namespace of the two classes. Declared here from Triton's
    field numbers into a private descriptor pool: tritonclient's generated module, the only
    one that ships them, would clash with KServe's messages in the default pool (both
    declare ``inference.*``)."""
    from types import SimpleNamespace

    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    string, boolean = (
        descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    )
    optional, repeated = (
        descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    file = descriptor_pb2.FileDescriptorProto(
        name="zoo_triton_repository.proto", package="inference"
    )
    file.syntax = "proto3"
    request = file.message_type.add(name="RepositoryIndexRequest")
    request.field.add(name="repository_name", number=1, type=string, label=optional)
    request.field.add(name="ready", number=2, type=boolean, label=optional)
    response = file.message_type.add(name="RepositoryIndexResponse")
    index = response.nested_type.add(name="ModelIndex")
    for number, field in enumerate(("name", "version", "state", "reason"), start=1):
        index.field.add(name=field, number=number, type=string, label=optional)
    response.field.add(
        name="models",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        label=repeated,
        type_name=".inference.RepositoryIndexResponse.ModelIndex",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return SimpleNamespace(
        **{
            n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"inference.{n}"))
            for n in ("RepositoryIndexRequest", "RepositoryIndexResponse")
        }
    )
