"""The named choices of the deploy functions, each defined once as a ``Literal`` type.

The functions' signatures, their own checks and the CLI's options all read these; the CLI turns
each into an option that lists the values in its help and refuses anything else with exit code
2 and a did-you-mean. Nothing here imports torch or onnxruntime, so the CLI can read it at
start-up.
"""

from __future__ import annotations

from typing import Literal, get_args

Format = Literal["onnx", "torchscript", "pt2", "triton", "openvino", "kserve"]
"""``zoo export --format``."""
KServeRuntime = Literal["triton", "zoo"]
"""``zoo export --format kserve --kserve-runtime``: KServe's Triton runtime over zoo's Triton
repository, or a ``zoo serve`` container (the repository's ``Dockerfile``)."""
Exporter = Literal["auto", "dynamo", "legacy"]
"""ONNX exporter: torch.export-based (dynamo), TorchScript-based (legacy), or dynamo first."""
Precision = Literal["fp32", "fp16", "bf16", "int8"]
"""``zoo export --precision``: onnx fp32|fp16 (the graph's weights and compute; inputs/outputs
stay fp32), openvino fp32|bf16|int8 (the inference precision, always set explicitly)."""
JitMode = Literal["trace", "script"]
"""How ``--format torchscript`` builds its graph."""
QuantMode = Literal["dynamic", "static"]
"""int8 quantization: weights only (dynamic) or weights and activations, calibrated (static)."""
CalibMethod = Literal["minmax", "entropy", "percentile"]
"""How static quantization picks activation ranges (onnxruntime's ``CalibrationMethod``)."""
QuantEngine = Literal["auto", "ort", "nncf"]
"""``zoo quantize --engine``: ``auto`` is NNCF where it is installed and applies (static, no
``--method``/``--per-channel``/``--target-agreement``), else onnxruntime's quantizer."""
"""Who quantizes statically: onnxruntime's ``quantize_static``, or NNCF (``quantize_nncf.py``)."""
Backend = Literal[
    "eager",
    "compile",
    "torchscript",
    "ort_fp32",
    "ort_fp16",
    "ort_int8",
    "ov_fp32",
    "ov_bf16",
    "ov_int8",
]
"""``zoo bench --backends``."""
Runtime = Literal["auto", "onnxruntime", "openvino"]
"""``zoo serve --runtime``: by the file (``.xml`` OpenVINO, ``.onnx`` ONNX Runtime), or named."""
PredictEngine = Literal["local", "ray"]
"""``zoo predict --out --engine``: this process, or Ray Data."""
SearchBackend = Literal["auto", "numpy", "faiss"]
"""``zoo similar --backend``: exact inner product in numpy or FAISS (``auto``: by size,
:mod:`zoo.deploy.index.search`)."""

FORMATS: tuple[str, ...] = get_args(Format)
EXPORTERS: tuple[str, ...] = get_args(Exporter)
PRECISIONS: tuple[str, ...] = get_args(Precision)
ONNX_PRECISIONS: tuple[str, ...] = ("fp32", "fp16")
OPENVINO_PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "int8")
JIT_MODES: tuple[str, ...] = get_args(JitMode)
QUANT_MODES: tuple[str, ...] = get_args(QuantMode)
CALIB_METHODS: tuple[str, ...] = get_args(CalibMethod)
QUANT_ENGINES: tuple[str, ...] = get_args(QuantEngine)
BACKENDS: tuple[str, ...] = get_args(Backend)
ENGINES: tuple[str, ...] = get_args(PredictEngine)
SEARCH_BACKENDS: tuple[str, ...] = get_args(SearchBackend)
RUNTIMES: tuple[str, ...] = get_args(Runtime)
KSERVE_RUNTIMES: tuple[str, ...] = get_args(KServeRuntime)
