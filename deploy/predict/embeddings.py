"""Penultimate-layer embeddings: what the classifier layer receives, for ``zoo predict --out
FILE --embeddings``.

From PyTorch, a pre-forward hook on the model's declared classifier module (:mod:`zoo.embeddings`,
shared with ``zoo enroll``). From an ONNX file, which keeps no module names, the graph
gains one output: the float input of the last linear node before the logits (a ``Gemm`` or
``MatMul``, or their int8 forms, looking through the quantize/dequantize steps in front),
declared with its own element type (float16 in an fp16 export) and read back as float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.embeddings import flat, torch_features
from zoo.errors import InputError

LINEAR = {"Gemm", "MatMul", "MatMulInteger", "QLinearMatMul"}
QUANTIZE = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
MAX_DEPTH = 8  # nodes between the linear layer and the logits (bias, int8 rescaling, casts)


def feature_tensor(graph: Any) -> str:
    """The name of the float tensor the graph's last linear node reads.

    Args:
        graph: an ``onnx.GraphProto`` whose first output is the logits.

    Returns:
        The tensor's name.

    Raises:
        InputError: no linear node within a few steps of the logits.
    """
    producer = {out: node for node in graph.node for out in node.output}
    level, seen = [graph.output[0].name], set()
    for _ in range(MAX_DEPTH):
        nodes = [producer[t] for t in level if t in producer and t not in seen]
        seen.update(level)
        linear = next((n for n in nodes if n.op_type in LINEAR), None)
        if linear is not None:
            name = linear.input[0]
            while name in producer and producer[name].op_type in QUANTIZE:
                name = producer[name].input[0]
            return str(name)
        level = [t for n in nodes for t in n.input if t]
    raise InputError(
        "Cannot find the classifier's input in this ONNX graph (no Gemm or MatMul node just "
        "before the logits), so it has no embeddings to give: drop --embeddings, or predict "
        "with the registry model or run folder instead of the file."
    )


FLOAT_TYPES = frozenset({1, 10, 11})
"""The element types (``onnx.TensorProto`` FLOAT, FLOAT16, DOUBLE) a feature tensor may have:
fp32 and int8 exports, ``--precision fp16`` ones (float16 inside, with or without
``--fp16-io``), and double."""


def _declared_type(model: Any, name: str) -> int:
    """The element type the model states for tensor ``name`` (0 where it states none)."""
    graph = model.graph
    for info in (*graph.value_info, *graph.input, *graph.output):
        if info.name == name and info.type.tensor_type.elem_type:
            return int(info.type.tensor_type.elem_type)
    for init in graph.initializer:
        if init.name == name:
            return int(init.data_type)
    return 0


def element_type(model: Any, name: str) -> int:
    """The element type (an ``onnx.TensorProto`` value) of tensor ``name`` in ``model``: from
    the graph's own ``value_info`` (the exporters and the fp16 converter write it), else from
    ONNX shape inference.

    Returns:
        The type, or 0 where neither says (onnxruntime then types the output itself).
    """
    import onnx

    found = _declared_type(model, name)
    if found:
        return found
    try:  # e.g. a model over 2 GB, which cannot be inferred in memory
        return _declared_type(onnx.shape_inference.infer_shapes(model), name)
    except Exception:  # onnx raises its own InferenceError / ValidationError types
        return 0


def with_feature_output(path: str | Path) -> tuple[bytes, str]:
    """The model at ``path`` with :func:`feature_tensor` added as a second graph output,
    declared with the tensor's own element type (float16 in an fp16 export, whatever its
    inputs and outputs are); callers cast what it gives to float32.

    Returns:
        ``(serialized model, feature tensor name)``.

    Raises:
        InputError: see :func:`feature_tensor`; or the tensor is not floating point.
    """
    import onnx

    model = onnx.load(str(path))
    name = feature_tensor(model.graph)
    if name not in {o.name for o in model.graph.output}:
        kind = element_type(model, name)
        if kind and kind not in FLOAT_TYPES:
            raise InputError(
                f"The classifier's input in {path} ({name!r}) holds "
                f"{onnx.TensorProto.DataType.Name(kind).lower()}, not float32, float16 or "
                "float64, so it gives no embeddings: drop --embeddings, or predict with the "
                "registry model or run folder instead of the file."
            )
        # kind 0 (no type found anywhere): an untyped output, which onnxruntime types itself
        model.graph.output.append(
            onnx.helper.make_tensor_value_info(name, kind, None)
            if kind
            else onnx.ValueInfoProto(name=name)
        )
    return model.SerializeToString(), name


__all__ = ["element_type", "feature_tensor", "flat", "torch_features", "with_feature_output"]
