"""``zoo export --embed-preprocessing``: the model's eval preprocessing as the first nodes of
the graph, so a client sends decoded pixels — ``uint8 (N, H, W, C)``, any height and width,
in the model's channel count — and never re-implements resize, crop and normalisation.

The nodes do what :func:`zoo.preprocess.preprocess` does, step for step: the short
side resized to ``resize_size`` with the long side truncated as torchvision's ``Resize(int)``
(integer arithmetic on the input's shape), ONNX ``Resize`` with ``antialias`` (PIL's
reducing filters; opset 18) and the result rounded back to uint8 levels as PIL's is; the
centre crop's offsets rounded half to even (ONNX ``Round``, as Python's ``round()``); then
``(x / 255 - mean) / std`` in float32. What remains different is the resampling arithmetic
(PIL's 8-bit fixed point vs ONNX Runtime's float), which the export's gate bounds.
Written with onnx.helper because no kept library builds such a prefix for a given
preprocessing (onnxruntime-extensions' pre/post-processing tools target fixed sizes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from zoo.errors import InputError
from zoo.preprocessing import Preprocessing

INPUT = "pixels"
# PIL's filters ONNX Resize reproduces (within 2 levels). Nearest is not offered: ONNX
# Runtime maps output to input pixels in float32, PIL in float64, and when upscaling the two
# pick different source pixels where the mapping lands on a whole number (measured: 78 levels).
MODES = {"bilinear": "linear", "bicubic": "cubic"}
MIN_OPSET = 18  # Resize's antialias attribute


def preprocessing_graph(pre: Preprocessing, output: str, opset: int) -> Any:
    """A model from ``uint8 (N, H, W, C)`` pixels to the normalised ``(N, C, crop, crop)``
    float32 batch named ``output``.

    Raises:
        InputError: an interpolation ONNX ``Resize`` cannot reproduce, or ``opset`` < 18.
    """
    from onnx import TensorProto, helper, numpy_helper

    if pre.interpolation not in MODES:
        raise InputError(
            f"--embed-preprocessing: the model resizes with {pre.interpolation!r}, which ONNX "
            f"Resize cannot reproduce ({', '.join(MODES)} only). Export without it."
        )
    if opset < MIN_OPSET:
        raise InputError(
            f"--embed-preprocessing needs --opset {MIN_OPSET} or higher (Resize with "
            f"antialias); got {opset}."
        )
    c = pre.channels

    def const(name: str, value: Any, dtype: Any) -> Any:
        return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)

    inits = [
        const("pp_0", [0], np.int64),
        const("pp_1", [1], np.int64),
        const("pp_2", [2], np.int64),
        const("pp_3", [3], np.int64),
        const("pp_4", [4], np.int64),
        const("pp_resize", [pre.resize_size], np.int64),
        const("pp_crop_f", [float(pre.crop_size)], np.float32),
        const("pp_crop_i", [pre.crop_size, pre.crop_size], np.int64),
        const("pp_half", [0.5], np.float32),
        const("pp_axes", [2, 3], np.int64),
        const("pp_zero", 0.0, np.float32),
        const("pp_255", 255.0, np.float32),
        const("pp_mean", np.asarray(pre.mean, np.float32).reshape(1, c, 1, 1), np.float32),
        const("pp_std", np.asarray(pre.std, np.float32).reshape(1, c, 1, 1), np.float32),
    ]
    mode = MODES[pre.interpolation]
    resize_attrs: dict[str, Any] = {
        "mode": mode,
        "coordinate_transformation_mode": "half_pixel",
        # PIL's filters: support widened by the reduction, weights renormalised at the edges
        "antialias": 1,
        "exclude_outside": 1,
    }
    if mode == "cubic":
        resize_attrs["cubic_coeff_a"] = -0.5  # PIL's bicubic
    n = helper.make_node
    nodes = [
        n("Cast", [INPUT], ["pp_f"], to=TensorProto.FLOAT),
        n("Transpose", ["pp_f"], ["pp_nchw"], perm=[0, 3, 1, 2]),
        n("Shape", ["pp_nchw"], ["pp_shape"]),
        n("Slice", ["pp_shape", "pp_0", "pp_2"], ["pp_nc"]),
        n("Slice", ["pp_shape", "pp_2", "pp_4"], ["pp_hw"]),
        n("ReduceMin", ["pp_hw"], ["pp_short"], keepdims=1),
        # torchvision's Resize(int): short side → resize, long side int(resize * long / short)
        n("Mul", ["pp_hw", "pp_resize"], ["pp_hw_r"]),
        n("Div", ["pp_hw_r", "pp_short"], ["pp_new_hw"]),  # int64 Div: floor for positives
        # PIL resizes in two passes, width then height, each rounded and clipped to uint8
        n("Slice", ["pp_shape", "pp_2", "pp_3"], ["pp_h"]),
        n("Slice", ["pp_new_hw", "pp_1", "pp_2"], ["pp_new_w"]),
        n("Concat", ["pp_nc", "pp_h", "pp_new_w"], ["pp_sizes_w"], axis=0),
        n("Resize", ["pp_nchw", "", "", "pp_sizes_w"], ["pp_wide_f"], **resize_attrs),
        n("Round", ["pp_wide_f"], ["pp_wide_r"]),
        n("Clip", ["pp_wide_r", "pp_zero", "pp_255"], ["pp_wide"]),
        n("Concat", ["pp_nc", "pp_new_hw"], ["pp_sizes"], axis=0),
        n("Resize", ["pp_wide", "", "", "pp_sizes"], ["pp_resized_f"], **resize_attrs),
        n("Round", ["pp_resized_f"], ["pp_rounded"]),
        n("Clip", ["pp_rounded", "pp_zero", "pp_255"], ["pp_resized"]),
        # CenterCrop: offsets round((size - crop) / 2), half to even as Python's round()
        n("Cast", ["pp_new_hw"], ["pp_new_hw_f"], to=TensorProto.FLOAT),
        n("Sub", ["pp_new_hw_f", "pp_crop_f"], ["pp_margin"]),
        n("Mul", ["pp_margin", "pp_half"], ["pp_offset_f"]),
        n("Round", ["pp_offset_f"], ["pp_offset_r"]),
        n("Cast", ["pp_offset_r"], ["pp_start"], to=TensorProto.INT64),
        n("Add", ["pp_start", "pp_crop_i"], ["pp_end"]),
        n("Slice", ["pp_resized", "pp_start", "pp_end", "pp_axes"], ["pp_crop"]),
        n("Div", ["pp_crop", "pp_255"], ["pp_unit"]),
        n("Sub", ["pp_unit", "pp_mean"], ["pp_centred"]),
        n("Div", ["pp_centred", "pp_std"], [output]),
    ]
    graph = helper.make_graph(
        nodes,
        "zoo_preprocessing",
        [helper.make_tensor_value_info(INPUT, TensorProto.UINT8, ["batch", "height", "width", c])],
        [
            helper.make_tensor_value_info(
                output, TensorProto.FLOAT, ["batch", c, pre.crop_size, pre.crop_size]
            )
        ],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def embed_file(path: Path, pre: Preprocessing) -> dict[str, Any]:
    """Prepend :func:`preprocessing_graph` to the exported graph at ``path`` (in place).

    Returns:
        What the export reports: the new input's name, dtype and layout.

    Raises:
        InputError: see :func:`preprocessing_graph`.
    """
    import onnx
    from onnx import compose

    model = onnx.load(str(path))
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    x = model.graph.input[0].name
    prefix = preprocessing_graph(pre, "pp_" + x, opset)
    prefix.ir_version = model.ir_version
    merged = compose.merge_models(prefix, model, io_map=[("pp_" + x, x)])
    onnx.save(merged, str(path))
    return {"input": INPUT, "dtype": "uint8", "layout": "NHWC", "channels": pre.channels}


def pixels(image: Any, channels: int) -> np.ndarray:
    """A decoded image as the embedded graph takes it: ``uint8 (H, W, C)`` in ``channels``.

    Raises:
        InputError: an image too thin to resize (``preprocess.check_aspect``).
    """
    from zoo.images import to_channels
    from zoo.preprocess import check_aspect

    check_aspect(*image.size)  # the graph would resize a thin strip to gigabytes
    a = np.asarray(to_channels(image, channels), dtype=np.uint8)
    return a[..., None] if a.ndim == 2 else a
