"""``zoo bench``: the same input through eager, torch.compile, TorchScript, ONNX Runtime fp32
and int8, on CPU and CUDA, with one timing protocol. Rows that cannot run say why."""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zoo.deploy.bench_harness import time_session
from zoo.deploy.choices import BACKENDS
from zoo.errors import BackendUnavailableError, ChoiceError
from zoo.ref import ModelRef


def _param_mb(model: torch.nn.Module) -> float:
    return round(sum(p.numel() * p.element_size() for p in model.state_dict().values()) / 2**20, 2)


def fingerprint(threads: int) -> dict[str, Any]:
    from zoo.system import environment_report

    env = environment_report()
    keys = (
        "python",
        "platform",
        "processor",
        "cpus_available",
        "torch",
        "torch_cuda",
        "onnxruntime",
        "ort_providers",
        "gpus",
    )
    return {**{k: env.get(k) for k in keys}, "threads": threads}


ORT_FILES = {"ort_fp32": "fp32", "ort_fp16": "fp16", "ort_int8": "int8"}  # backend -> file


class _Builder:
    """Builds each backend once per device (cold start timed), shared across batch sizes."""

    def __init__(
        self, ref: ModelRef, workdir: Path, threads: int, calib: str | None, weights: str | None
    ) -> None:
        from zoo.factory import create_model, info_of

        self.weights = weights
        self.model = create_model(ref, weights=weights).eval()
        self.info = info_of(self.model)
        self.ref, self.workdir, self.threads, self.calib = ref, workdir, threads, calib
        self._onnx: dict[str, Path] = {}

    def onnx_file(self, kind: str) -> Path:
        if kind not in self._onnx:
            from zoo.deploy.export import export_onnx

            fp32 = self.workdir / "fp32.onnx"
            if "fp32" not in self._onnx:
                export_onnx(self.ref, fp32, dynamic_batch=True, weights=self.weights)
                self._onnx["fp32"] = fp32
            if kind == "fp16":
                fp16 = self.workdir / "fp16.onnx"
                export_onnx(self.ref, fp16, precision="fp16", weights=self.weights)
                self._onnx["fp16"] = fp16
            if kind == "int8":
                from zoo.deploy.quantize import quantize

                calib = self.calib
                if calib is None:
                    from zoo.samples import sample_image_paths

                    calib = str(sample_image_paths()[0].parent)
                quantize(
                    fp32,
                    self.workdir / "int8.onnx",
                    mode="static",
                    calib=calib,
                    threads=self.threads,
                )
                self._onnx["int8"] = self.workdir / "int8.onnx"
        return self._onnx[kind]

    def build(
        self, backend: str, device: torch.device, x: torch.Tensor
    ) -> tuple[Callable[[], Any], float]:
        """(run-once function, size in MB); raises BackendUnavailableError with the reason."""
        model = self.model.to(device)
        if backend == "eager":
            return (lambda: model(x)), _param_mb(model)
        if backend == "compile":
            compiled = torch.compile(model)
            return (lambda: compiled(x)), _param_mb(model)
        if backend == "torchscript":
            ts = torch.jit.trace(model, x)
            path = self.workdir / f"model-{device.type}.ts"
            torch.jit.save(ts, str(path))
            return (lambda: ts(x)), round(path.stat().st_size / 2**20, 2)
        from zoo.deploy.runtime import make_session

        if backend == "ort_int8" and device.type == "cuda":
            raise BackendUnavailableError(
                "int8 QDQ on GPU needs the TensorRT provider (not in this build)"
            )
        path = self.onnx_file(ORT_FILES[backend])
        sess = make_session(path, device=device.type, threads=self.threads)
        feed = {sess.get_inputs()[0].name: x.cpu().numpy()}
        return (lambda: sess.run(None, feed)), round(path.stat().st_size / 2**20, 2)


def run_bench(
    name: str | ModelRef,
    *,
    backends: list[str],
    devices: list[str],
    batch_sizes: list[int],
    threads: int | None = None,
    calib: str | None = None,
    min_seconds: float = 1.0,
    weights: str | None = None,
) -> dict[str, Any]:
    """Time one model through each backend, device and batch size, with one protocol.

    Args:
        name: a model reference (registry, ``timm:`` or Hub name, run or model folder).
        backends: any of ``eager``, ``compile``, ``torchscript``, ``ort_fp32``, ``ort_fp16``,
            ``ort_int8``.
        devices: ``cpu``, ``cuda``, ``cuda:N``.
        batch_sizes: batch sizes to time.
        threads: torch and ORT intra-op threads (default: available CPUs).
        calib: calibration images for ``ort_int8`` (default: the bundled samples).
        min_seconds: time each row for at least this long.
        weights: as for :func:`zoo.create_model`.

    Returns:
        ``{"model", "fingerprint", "rows", "torch_threads", "ort_threads"}``; each row has
        latency percentiles, images/s, cold start and the speed-up over eager, or status ❌
        with the reason it could not run (a missing backend is a row, not an exception).

    Raises:
        ChoiceError: an unknown backend.
        ModelRefError / UnknownModelError: ``name`` does not parse, or is an ONNX file.
        Everything :func:`zoo.create_model` raises while loading the model.
    """
    from zoo.system import available_cpus

    for b in backends:
        ChoiceError.check("backend", b, BACKENDS)
    ref = ModelRef.parse(name)
    threads = threads or available_cpus()
    torch.set_num_threads(threads)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        builder = _Builder(ref, Path(tmp), threads, calib, weights)
        c, h, w = builder.info.input_size
        for dev_name in devices:
            if dev_name.startswith("cuda") and not torch.cuda.is_available():
                rows += [
                    {
                        "backend": b,
                        "device": dev_name,
                        "batch": bs,
                        "status": "❌",
                        "reason": "no CUDA device (torch.cuda.is_available() is False)",
                    }
                    for b in backends
                    for bs in batch_sizes
                ]
                continue
            device = torch.device(dev_name)
            eager_p50: dict[int, float] = {}
            for backend in backends:
                for bs in batch_sizes:
                    x = torch.randn(bs, c, h, w, generator=torch.Generator().manual_seed(0)).to(
                        device
                    )
                    row: dict[str, Any] = {"backend": backend, "device": dev_name, "batch": bs}
                    try:
                        if backend.startswith(
                            "ort"
                        ):  # export/quantize: a build step, not cold start
                            builder.onnx_file(ORT_FILES[backend])
                        with torch.inference_mode(), warnings.catch_warnings():
                            warnings.simplefilter(
                                "ignore", FutureWarning
                            )  # TorchScript deprecation
                            t0 = time.perf_counter()
                            fn, size = builder.build(backend, device, x)
                            fn()
                            if device.type == "cuda":
                                torch.cuda.synchronize()
                            row["cold_start_ms"] = round((time.perf_counter() - t0) * 1000, 1)
                            cuda_timing = device.type == "cuda" and not backend.startswith("ort")
                            stats = time_session(
                                fn, label=backend, cuda=cuda_timing, min_seconds=min_seconds
                            )
                    except Exception as exc:  # any backend may be unavailable here: say why
                        row.update(
                            {
                                "status": "❌",
                                "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                            }
                        )
                        rows.append(row)
                        continue
                    row.update(
                        {
                            "status": "✅",
                            "size_mb": size,
                            **stats,
                            "img_per_s": round(bs * 1000 / stats["p50_ms"], 1),
                        }
                    )
                    if backend == "eager":
                        eager_p50[bs] = stats["p50_ms"]
                    if bs in eager_p50:
                        row["speedup_vs_eager"] = round(eager_p50[bs] / stats["p50_ms"], 2)
                    rows.append(row)
    return {
        "model": ref.shown,
        "fingerprint": fingerprint(threads),
        "rows": rows,
        "torch_threads": torch.get_num_threads(),
        "ort_threads": threads,
    }
