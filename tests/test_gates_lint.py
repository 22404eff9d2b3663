"""The ONNX graph lint on tiny graphs built with onnx.helper (milliseconds each): every rule
fires on the graph it names and stays quiet on its near miss."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.deploy.export.lint import _constants, lint_graph


def _graph(
    nodes: list[onnx.NodeProto],
    *,
    batch: int | str = "batch",
    initializers: list[onnx.TensorProto] = (),  # type: ignore[assignment]
    inputs: int = 1,
) -> onnx.ModelProto:
    ins = [
        helper.make_tensor_value_info(f"x{i}" if i else "x", TensorProto.FLOAT, [batch, 3, 4, 4])
        for i in range(inputs)
    ]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph(nodes, "g", ins, [out], list(initializers)))


def _i64(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _lint(model: onnx.ModelProto, dynamic_batch: bool = True, export_batch: int = 2) -> list[str]:
    return lint_graph(model, dynamic_batch=dynamic_batch, export_batch=export_batch)


def test_a_clean_graph_has_no_problems() -> None:
    m = _graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Reshape", ["r", "shape"], ["y"], name="flat"),
        ],
        initializers=[_i64("shape", [-1, 48])],
    )
    assert _lint(m) == [] and _lint(m, dynamic_batch=False) == []


def test_dropout_is_reported_by_name_or_output() -> None:
    m = _graph(
        [
            helper.make_node("Dropout", ["x"], ["d"], name="drop1"),
            helper.make_node("Dropout", ["d"], ["y"]),  # unnamed: reported by its output
        ]
    )
    expected = [
        "Dropout node 'drop1' in the graph: the model was not exported in eval mode",
        "Dropout node 'y' in the graph: the model was not exported in eval mode",
    ]
    assert _lint(m) == expected and _lint(m, dynamic_batch=False) == expected


def _bn(training_mode: int | None, name: str = "bn") -> onnx.NodeProto:
    kw = {} if training_mode is None else {"training_mode": training_mode}
    return helper.make_node(
        "BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name=name, epsilon=1e-5, **kw
    )


def test_training_mode_batchnorm_is_reported() -> None:
    assert _lint(_graph([_bn(1)]), dynamic_batch=False) == [
        "BatchNormalization 'bn' in training mode: export in eval mode"
    ]
    assert _lint(_graph([_bn(0)])) == []
    assert _lint(_graph([_bn(None)])) == []


@pytest.mark.parametrize("op", ["Reshape", "Expand"])
def test_export_batch_baked_into_a_shape_initializer(op: str) -> None:
    m = _graph(
        [helper.make_node(op, ["x", "shape"], ["y"], name="view")],
        initializers=[_i64("shape", [2, 48])],
    )
    assert _lint(m) == [
        f"{op} 'view' has the export batch size 2 baked into its shape [2, 48]: use "
        "x.flatten(1) or x.view(x.size(0), -1) in the model"
    ]
    assert _lint(m, dynamic_batch=False) == []  # a static graph may bake its batch
    assert _lint(m, export_batch=3) == []  # 2 is not the export batch here


def test_export_batch_baked_into_a_constant_node() -> None:
    const = helper.make_node(
        "Constant",
        [],
        ["shape"],
        value=helper.make_tensor("v", TensorProto.INT64, [3], [2, 3, 16]),
    )
    m = _graph([const, helper.make_node("Reshape", ["x", "shape"], ["y"])])
    assert _lint(m) == [
        "Reshape 'y' has the export batch size 2 baked into its shape [2, 3, 16]: use "
        "x.flatten(1) or x.view(x.size(0), -1) in the model"
    ]


@pytest.mark.parametrize(
    "shape",
    [[2], [-1, 2], [1, 2, 48]],  # a 1-D shape, the batch elsewhere, another leading size
)
def test_shapes_that_do_not_bake_the_batch(shape: list[int]) -> None:
    m = _graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        initializers=[_i64("shape", shape)],
    )
    assert _lint(m) == []


def test_shape_computed_at_runtime_is_not_flagged() -> None:
    m = _graph(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Reshape", ["x", "s"], ["y"]),
            helper.make_node("Expand", ["x"], ["e"]),  # malformed: no shape input at all
            helper.make_node("Flatten", ["x", "shape"], ["f"]),  # not a shape-taking op
        ],
        initializers=[_i64("shape", [2, 48])],
    )
    assert _lint(m) == []


def test_static_batch_input_is_reported_only_when_dynamic_was_asked() -> None:
    m = _graph([helper.make_node("Relu", ["x"], ["y"])], batch=2, inputs=2)
    assert _lint(m) == [
        "input 'x' has a static batch dimension 2",
        "input 'x1' has a static batch dimension 2",
    ]
    assert _lint(m, dynamic_batch=False) == []
    scalar = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
    )
    assert _lint(scalar) == []  # a rank-0 input has no batch dimension to check


def test_constants_collects_only_1d_int64_values() -> None:
    nodes = [
        helper.make_node(
            "Constant", [], ["c1"], value=helper.make_tensor("v", TensorProto.INT64, [2], [4, 5])
        ),
        helper.make_node(
            "Constant", [], ["c2"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
        ),
        helper.make_node(
            "Constant",
            [],
            ["c3"],
            value=helper.make_tensor("v", TensorProto.INT64, [1, 2], [6, 7]),
        ),
        helper.make_node("Constant", [], ["c4"], value_int=3),
        helper.make_node(
            "Constant",
            [],
            ["c5"],
            sparse_value=helper.make_sparse_tensor(
                helper.make_tensor("v", TensorProto.INT64, [1], [9]),
                helper.make_tensor("i", TensorProto.INT64, [1], [0]),
                [1],
            ),
        ),
    ]
    inits = [
        _i64("i1", [8, 9]),
        numpy_helper.from_array(np.array([[1, 2]], np.int64), "i2"),
        numpy_helper.from_array(np.array([1.0], np.float32), "i3"),
        numpy_helper.from_array(np.array([1, 2], np.int32), "i4"),
    ]
    assert _constants(_graph(nodes, initializers=inits)) == {"i1": [8, 9], "c1": [4, 5]}
