"""OpenVINO's CPU plugin as a zoo runtime, with the inference precision always set explicitly.

The plugin otherwise picks its own: on a CPU with AVX512_BF16 or AMX it silently runs bf16
(ResNet-18 4.7x faster, MobileNetV2 logits off by up to 0.25), and asked for bf16 on a CPU
without it, it silently runs f32. So zoo passes ``INFERENCE_PRECISION_HINT`` on every compile,
reads back what the plugin chose, and refuses a precision the processor cannot run instead of
labelling an f32 figure bf16.

An IR written by ``zoo export --format openvino`` carries zoo's metadata (the ONNX file's, plus
``precision`` and ``openvino``) in its ``rt_info`` under ``zoo``; an ``.onnx`` file run with
``--runtime openvino`` is compiled from the file in fp32, with its ONNX metadata.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from zoo.deploy.runtimes.classifier import Classifier
from zoo.errors import BackendUnavailableError, InputError
from zoo.knn import KNN_OUTPUT
from zoo.system import available_cpus

META_KEY = "zoo"
HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}  # int8: FakeQuantize nodes, the rest f32
_TYPES = {"f32": "tensor(float)", "f16": "tensor(float16)", "u8": "tensor(uint8)"}


def openvino() -> Any:
    """The ``openvino`` module, or an error that says how to install it."""
    try:
        import openvino
    except ImportError as exc:
        raise BackendUnavailableError(
            f"OpenVINO is not installed: pip install 'zoo[openvino]' ({exc})."
        ) from None
    return openvino


def require_precision(core: Any, precision: str) -> None:
    """Refuse a precision this CPU's plugin cannot run (bf16 needs AVX512_BF16 or AMX).

    Raises:
        BackendUnavailableError: the plugin does not list it (it would silently run f32).
    """
    caps = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    if {"fp32": "FP32", "bf16": "BF16", "int8": "INT8"}[precision] not in caps:
        raise BackendUnavailableError(
            f"This CPU cannot run OpenVINO {precision} (its plugin offers {', '.join(caps)}; bf16 "
            "needs AVX512_BF16 or AMX), and the plugin would silently run f32 instead: use fp32 "
            "or int8 here, or a CPU with bf16."
        )


def compile_cpu(core: Any, model: Any, precision: str, threads: int | None) -> Any:
    """Compile ``model`` for the CPU at exactly ``precision`` with one stream of ``threads``.

    Raises:
        BackendUnavailableError: the plugin cannot run ``precision``, or compiled another one
            than asked (read back after compiling, never assumed).
    """
    require_precision(core, precision)
    compiled = core.compile_model(
        model,
        "CPU",
        {
            "INFERENCE_PRECISION_HINT": HINTS[precision],
            "INFERENCE_NUM_THREADS": threads or available_cpus(),
            "NUM_STREAMS": 1,
            "PERFORMANCE_HINT": "LATENCY",
        },
    )
    got = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
    if got != HINTS[precision]:
        raise BackendUnavailableError(
            f"Asked OpenVINO for {HINTS[precision]} inference but it compiled {got}."
        )
    return compiled


def read_ir_metadata(model: Any, path: Path) -> dict[str, Any]:
    """zoo's metadata in a read IR (``rt_info['zoo']``).

    Raises:
        InputError: the IR was not written by ``zoo export --format openvino``.
    """
    if not model.has_rt_info(META_KEY):
        raise InputError(
            f"{path} carries no zoo metadata: write it with `zoo export --format openvino`."
        )
    return dict(json.loads(model.get_rt_info(META_KEY).astype(str)))


def read_ir(core: Any, path: Path) -> Any:
    """The model at ``path`` (an ``.xml`` IR or an ``.onnx`` file) as OpenVINO reads it.

    Raises:
        InputError: the file is missing or OpenVINO cannot read it.
    """
    if not path.is_file():
        raise InputError(f"Model file {path} does not exist.")
    if path.suffix == ".xml":
        with open(path, "rb") as f:
            head = f.read(4096)
        if b"<net" not in head:
            raise InputError(f"{path} is not an OpenVINO IR (no <net> element in it).")
        if not path.with_suffix(".bin").is_file():
            raise InputError(
                f"{path.with_suffix('.bin')} is missing: an IR is the .xml and its .bin side by "
                "side; export it again with `zoo export --format openvino`."
            )
    try:
        return core.read_model(str(path))
    except Exception as exc:  # OpenVINO raises its own RuntimeError kinds
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise InputError(f"OpenVINO cannot read {path}: {first[:300]}") from exc


def read_ir_file_metadata(path: str | Path) -> dict[str, Any]:
    """zoo's metadata of an IR file (see :func:`read_ir_metadata`)."""
    path = Path(path)
    return read_ir_metadata(read_ir(openvino().Core(), path), path)


def _dims(shape: Any) -> list[Any]:
    return [d.get_length() if d.is_static else None for d in shape]


class OpenVinoClassifier(Classifier):
    """An IR written by ``zoo export --format openvino`` (or an fp32 ``.onnx`` file) run by
    OpenVINO's CPU plugin at the precision recorded in it."""

    runtime = "openvino"

    def __init__(self, path: str | Path, *, device: str = "cpu", threads: int | None = None):
        ov = openvino()
        if device.split(":")[0] not in ("cpu", "auto"):  # auto: the CPU, where zoo runs it
            raise BackendUnavailableError(
                f"zoo runs OpenVINO on the CPU only, not {device!r}: use --device cpu."
            )
        self.path = Path(path)
        t0 = time.perf_counter()
        core = ov.Core()
        model = read_ir(core, self.path)
        if self.path.suffix == ".xml":
            self.meta = read_ir_metadata(model, self.path)
        else:
            from zoo.onnx_meta import read_metadata

            self.meta = read_metadata(self.path)
            if self.meta.get("precision", "fp32") != "fp32" or "quantization" in self.meta:
                raise InputError(
                    f"{self.path} is not an fp32 ONNX file; --runtime openvino compiles fp32 "
                    "files: export one with `zoo export --format openvino --precision ...`."
                )
        if model.inputs[0].get_element_type().to_string() == "u8":
            raise InputError(
                f"{self.path} preprocesses images in its graph (--embed-preprocessing), which "
                "zoo runs in ONNX Runtime only: use --runtime onnxruntime."
            )
        self.precision = str(self.meta.get("precision", "fp32"))
        self.threads = threads or available_cpus()
        self.compiled = compile_cpu(core, model, self.precision, self.threads)
        self._request = self.compiled.create_infer_request()
        self._lock = threading.Lock()  # one infer request: calls never overlap on it
        self.load_s = time.perf_counter() - t0
        port = self.compiled.inputs[0]
        self.input_name = model.inputs[0].get_any_name()
        self.output_name = model.outputs[0].get_any_name()
        self.input_shape = _dims(model.inputs[0].get_partial_shape())
        self.input_type = _TYPES.get(port.get_element_type().to_string(), "tensor(float)")
        last = model.outputs[0].get_partial_shape()[-1]
        self.width = last.get_length() if last.is_static else None
        names = [o.get_names() for o in model.outputs]
        self._knn_at = next((i for i, n in enumerate(names) if KNN_OUTPUT in n), None)
        self.knn = self._knn_at is not None
        self._init_common()

    def _run_once(self, batch: np.ndarray) -> np.ndarray:
        with self._lock:
            self._request.infer({0: np.ascontiguousarray(batch, dtype=np.float32)})
            logits = np.array(self._request.get_output_tensor(0).data, dtype=np.float32)
            if self._knn_at is None:
                return logits
            knn = np.array(self._request.get_output_tensor(self._knn_at).data, np.float32)
            return np.concatenate([logits, knn.reshape(-1, 1)], axis=1)


__all__ = [
    "HINTS",
    "OpenVinoClassifier",
    "compile_cpu",
    "openvino",
    "read_ir",
    "read_ir_file_metadata",
    "read_ir_metadata",
    "require_precision",
]
