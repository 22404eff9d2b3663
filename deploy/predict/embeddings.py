"""Penultimate-layer embeddings: what the classifier layer receives, for ``zoo predict --out
FILE --embeddings``.

From PyTorch, a pre-forward hook on the model's declared classifier module (:mod:`zoo.embeddings`,
shared with ``zoo enroll``). From an ONNX file, which keeps no module names, the graph
gains one output: the float input of the last linear node before the logits (a ``Gemm`` or
``MatMul``, or their int8 forms, looking through the quantize/dequantize steps in front).
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


def with_feature_output(path: str | Path) -> tuple[bytes, str]:
    """The model at ``path`` with :func:`feature_tensor` added as a second graph output.

    Returns:
        ``(serialized model, feature tensor name)``.
    """
    import onnx

    model = onnx.load(str(path))
    name = feature_tensor(model.graph)
    if name not in {o.name for o in model.graph.output}:
        model.graph.output.append(
            onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
        )
    return model.SerializeToString(), name


__all__ = ["feature_tensor", "flat", "torch_features", "with_feature_output"]
