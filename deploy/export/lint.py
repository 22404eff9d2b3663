"""Graph lint for exported ONNX models: what must never ship."""

from __future__ import annotations

import onnx
from onnx import numpy_helper


def _constants(model: onnx.ModelProto) -> dict[str, list[int]]:
    values = {}
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.INT64 and len(init.dims) == 1:
            values[init.name] = numpy_helper.to_array(init).tolist()
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if (
                    attr.name == "value"
                    and attr.t.data_type == onnx.TensorProto.INT64
                    and len(attr.t.dims) == 1
                ):
                    values[node.output[0]] = numpy_helper.to_array(attr.t).tolist()
    return values


def lint_graph(model: onnx.ModelProto, *, dynamic_batch: bool, export_batch: int) -> list[str]:
    """Problems found: Dropout or training-mode BatchNormalization nodes left in the graph, a
    static batch dimension where it should be dynamic, and batch-size constants baked into
    Reshape/Expand shapes."""
    problems = []
    consts = _constants(model)
    for node in model.graph.node:
        name = node.name or node.output[0]
        if node.op_type == "Dropout":
            problems.append(
                f"Dropout node {name!r} in the graph: the model was not exported in eval mode"
            )
        if node.op_type == "BatchNormalization":
            for attr in node.attribute:
                if attr.name == "training_mode" and attr.i == 1:
                    problems.append(
                        f"BatchNormalization {name!r} in training mode: export in eval mode"
                    )
        if dynamic_batch and node.op_type in ("Reshape", "Expand") and len(node.input) > 1:
            shape = consts.get(node.input[1])
            if shape and len(shape) >= 2 and shape[0] == export_batch:
                problems.append(
                    f"{node.op_type} {name!r} has the export batch size {export_batch} baked into its "
                    f"shape {shape}: use x.flatten(1) or x.view(x.size(0), -1) in the model"
                )
    if dynamic_batch:
        for inp in model.graph.input:
            dims = inp.type.tensor_type.shape.dim
            if dims and not dims[0].dim_param:
                problems.append(
                    f"input {inp.name!r} has a static batch dimension {dims[0].dim_value}"
                )
    return problems
