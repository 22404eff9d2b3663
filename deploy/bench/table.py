"""``zoo bench``: the same input through eager, torch.compile, TorchScript, ONNX Runtime fp32,
fp16 and int8, and OpenVINO fp32, bf16 and int8, on CPU and CUDA, with one timing protocol and
each backend's top-1 agreement with eager on real images. Rows that cannot run say why;
``min_agreement`` names the fastest backend that keeps the answers. The options are
:mod:`zoo.deploy.bench.options`, the report :mod:`zoo.deploy.bench.report`."""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from zoo.deploy.bench.harness import time_session
from zoo.deploy.bench.options import BenchOptions
from zoo.deploy.bench.report import FAILED, BenchReport, BenchRow, fastest_within
from zoo.deploy.quantize.verdict import wilson
from zoo.errors import BackendUnavailableError, InputError, first_line
from zoo.ref import ModelRef
from zoo.system import mib


def _param_mb(model: torch.nn.Module) -> float:
    return mib(sum(p.numel() * p.element_size() for p in model.state_dict().values()))


def fingerprint(threads: int) -> dict[str, Any]:
    """The machine and versions a bench table was measured on (a subset of
    :func:`zoo.system.environment_report`), with the ``threads`` it ran on."""
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
        "openvino",
        "ort_providers",
        "gpus",
    )
    return {**{k: env.get(k) for k in keys}, "threads": threads}


ORT_FILES = {"ort_fp32": "fp32", "ort_fp16": "fp16", "ort_int8": "int8"}  # backend -> file
OV_PRECISIONS = {"ov_fp32": "fp32", "ov_bf16": "bf16", "ov_int8": "int8"}  # backend -> IR
AGREEMENT_IMAGES = 200  # at most this many of ``data`` for the agreement column
FILE_BACKENDS = (*ORT_FILES, *OV_PRECISIONS)  # timed on the host clock, not CUDA events


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
        self.data: str | None = None  # the agreement images (run_bench's ``data``)
        self._onnx: dict[str, Path] = {}
        self._ir: dict[str, Path] = {}
        self.prebuilt: dict[str, Path] = {}  # backend -> a file the user made (zoo --variant)

    def ir_file(self, precision: str) -> Path:
        """The OpenVINO IR of ``precision``, exported once through zoo's own gate (its
        verdict is the agreement column; a row is timed even where the gate would refuse)."""
        if precision not in self._ir and f"ov_{precision}" in self.prebuilt:
            self._ir[precision] = self.prebuilt[f"ov_{precision}"]
        if precision not in self._ir:
            from zoo.deploy.export.openvino import export_openvino

            self.model.cpu()
            folder = self.workdir / f"ov-{precision}"
            export_openvino(
                self.ref,
                folder,
                precision=precision,
                data=self.data,
                calib=self.calib,
                allow_mismatch=True,
                weights=self.weights,
                model=self.model,
            )
            self._ir[precision] = folder / "model.xml"
        return self._ir[precision]

    def onnx_file(self, kind: str) -> Path:
        """The ONNX file of ``kind`` (``fp32``, ``fp16``, ``int8``): the user's
        (``--variant``), else exported (and quantized) here once."""
        if f"ort_{kind}" in self.prebuilt:
            return self.prebuilt[f"ort_{kind}"]
        if kind not in self._onnx:
            from zoo.deploy.export.onnx_export import export_onnx

            self.model.cpu()  # exported from this very instance (random init differs each time)
            if kind in ("fp32", "int8"):  # int8 is quantized from this fp32 export, never from
                fp32 = self.workdir / "fp32.onnx"  # a variant's (fixed batch, pixels in...)
                if not fp32.exists():
                    export_onnx(
                        self.ref, fp32, dynamic_batch=True, weights=self.weights, model=self.model
                    )
                self._onnx["fp32"] = fp32
            if kind == "fp16":
                fp16 = self.workdir / "fp16.onnx"
                export_onnx(
                    self.ref, fp16, precision="fp16", weights=self.weights, model=self.model
                )
                self._onnx["fp16"] = fp16
            if kind == "int8":
                from zoo.deploy.quantize.int8 import quantize
                from zoo.deploy.quantize.options import QuantizeOptions

                calib = self.calib
                if calib is None:
                    from zoo.samples import sample_image_paths

                    calib = str(sample_image_paths()[0].parent)
                quantize(
                    QuantizeOptions(
                        self._onnx["fp32"],
                        self.workdir / "int8.onnx",
                        mode="static",
                        calib=calib,
                        threads=self.threads,
                    )
                )
                self._onnx["int8"] = self.workdir / "int8.onnx"
        return self._onnx[kind]

    def build(
        self, backend: str, device: torch.device, x: torch.Tensor
    ) -> tuple[Callable[[torch.Tensor], Any], float]:
        """(run function of a batch, size in MiB); raises BackendUnavailableError with the
        reason. ``x`` is the example batch a tracing backend is built with."""
        model = self.model.to(device)
        if backend == "eager":
            return model, _param_mb(model)
        if backend == "compile":
            return torch.compile(model), _param_mb(model)
        if backend == "torchscript":
            ts = torch.jit.trace(model, x)
            path = self.workdir / f"model-{device.type}.ts"
            torch.jit.save(ts, str(path))
            return ts, mib(path.stat().st_size)
        if backend in OV_PRECISIONS:
            from zoo.deploy.runtimes.openvino import OpenVinoClassifier

            ir = self.ir_file(OV_PRECISIONS[backend])
            if device.type != "cpu":
                raise BackendUnavailableError("zoo runs OpenVINO on the CPU only")
            clf = OpenVinoClassifier(ir, threads=self.threads)
            size = mib(sum(f.stat().st_size for f in (ir, ir.with_suffix(".bin"))))
            return (lambda t: clf.run(t.cpu().numpy())), size
        from zoo.deploy.runtimes.loader import make_session

        if backend == "ort_int8" and device.type == "cuda":
            raise BackendUnavailableError(
                "int8 QDQ on GPU needs the TensorRT provider (not in this build)"
            )
        path = self.onnx_file(ORT_FILES[backend])
        size = mib(path.stat().st_size)
        if backend in self.prebuilt:  # the user's file: run as zoo runs it (fixed batch...)
            return self._prebuilt_run(path, device), size
        sess = make_session(path, device=device.type, threads=self.threads)
        name = sess.get_inputs()[0].name
        return (lambda t: sess.run(None, {name: t.cpu().numpy()})[0]), size

    def _prebuilt_run(self, path: Path, device: torch.device) -> Callable[[torch.Tensor], Any]:
        """A ``--variant`` file run as ``zoo predict`` and ``zoo serve`` run it: a fixed batch
        padded and chunked, float16 inputs cast (zoo's classifier, not a bare session).

        Raises:
            BackendUnavailableError: it takes decoded pixels (``--embed-preprocessing``),
                which a tensor timing cannot feed.
        """
        from zoo.deploy.runtimes.loader import OnnxClassifier

        clf = OnnxClassifier(path, device=device.type, threads=self.threads)
        if clf.embedded:
            raise BackendUnavailableError(
                f"{path.name} takes decoded uint8 pixels (exported with --embed-preprocessing): "
                "zoo bench times float tensors; time the run's model.onnx, or run this file "
                "with zoo predict / zoo serve"
            )
        return lambda t: clf.run(t.cpu().numpy())


def _top1(out: Any) -> Any:
    import numpy as np

    arr = out.float().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
    return arr.argmax(1)


def run_bench(options: BenchOptions) -> BenchReport:
    """Time one model through each backend, device and batch size, with one protocol.

    Args:
        options: what to time and how (:class:`~zoo.deploy.bench.options.BenchOptions`).

    Returns:
        The :class:`~zoo.deploy.bench.report.BenchReport`: each row has latency percentiles,
        images/s, cold start, the speed-up over eager and the top-1 agreement with eager (with
        its 95% interval), or status ❌ with the reason it could not run (a missing backend is
        a row, not an exception); ``fastest`` names the picks within ``min_agreement``.

    Raises:
        InputError: ``ov_int8``'s calibration images are also agreement images.
        ModelRefError / UnknownModelError: ``model`` does not parse, or is an ONNX file.
        Everything :meth:`BenchOptions.resolved` and :func:`zoo.create_model` raise.
    """
    from zoo.system import available_cpus

    o = options.resolved()
    backends, devices, batch_sizes, calib, data = (
        o.backends,
        o.devices,
        o.batch_sizes,
        o.calib,
        o.data,
    )
    if "ov_int8" in backends:  # refused before anything is timed
        from zoo.deploy.export.parity import real_images
        from zoo.deploy.quantize.calibration import check_disjoint

        check_disjoint(real_images(calib, limit=300), real_images(data, limit=AGREEMENT_IMAGES))
    ref = ModelRef.parse(o.model)
    threads = o.threads or available_cpus()
    torch.set_num_threads(threads)
    rows: list[BenchRow] = []
    with tempfile.TemporaryDirectory() as tmp:
        builder = _Builder(ref, Path(tmp), threads, calib, o.weights)
        builder.data = data
        builder.prebuilt = dict(o.prebuilt)
        c, h, w = builder.info.input_size
        real = _real_batch(builder.info, data)
        for dev_name in devices:
            if dev_name.startswith("cuda") and not torch.cuda.is_available():
                rows += [
                    BenchRow(
                        b,
                        dev_name,
                        bs,
                        FAILED,
                        "no CUDA device (torch.cuda.is_available() is False)",
                    )
                    for b in backends
                    for bs in batch_sizes
                ]
                continue
            device = torch.device(dev_name)
            eager_p50: dict[int, float] = {}
            agreement: dict[str, float] = {}
            with torch.inference_mode():
                ref_top1 = _top1(builder.model.to(device)(real.to(device)))
            for backend in backends:
                for bs in batch_sizes:
                    x = torch.randn(bs, c, h, w, generator=torch.Generator().manual_seed(0)).to(
                        device
                    )
                    cold_ms: float | None = None
                    try:
                        if backend in ORT_FILES:  # export/quantize: a build step, not cold start
                            builder.onnx_file(ORT_FILES[backend])
                        if backend in OV_PRECISIONS:
                            builder.ir_file(OV_PRECISIONS[backend])
                        with torch.inference_mode(), warnings.catch_warnings():
                            warnings.simplefilter(
                                "ignore", FutureWarning
                            )  # TorchScript deprecation
                            t0 = time.perf_counter()
                            run, size = builder.build(backend, device, x)
                            run(x)
                            if device.type == "cuda":
                                torch.cuda.synchronize()
                            cold_ms = round((time.perf_counter() - t0) * 1000, 1)
                            cuda_timing = device.type == "cuda" and backend not in FILE_BACKENDS
                            stats = time_session(
                                lambda: run(x),  # noqa: B023 (called here, in this iteration)
                                label=backend,
                                cuda=cuda_timing,
                                min_seconds=o.min_seconds,
                            )
                            if backend not in agreement:  # once per backend and device
                                top1 = _top1(run(real.to(device)))
                                agreement[backend] = float((top1 == ref_top1).mean())
                    except InputError:  # the user's input (calibration, data): not a row
                        raise
                    except Exception as exc:  # any backend may be unavailable here: say why
                        reason = f"{type(exc).__name__}: {first_line(exc, 500)}"
                        rows.append(BenchRow(backend, dev_name, bs, FAILED, reason, cold_ms))
                        continue
                    if backend == "eager":
                        eager_p50[bs] = stats["p50_ms"]
                    speedup = round(eager_p50[bs] / stats["p50_ms"], 2) if bs in eager_p50 else None
                    rows.append(
                        BenchRow(
                            backend,
                            dev_name,
                            bs,
                            cold_start_ms=cold_ms,
                            size_mb=size,
                            timing=stats,
                            img_per_s=round(bs * 1000 / stats["p50_ms"], 1),
                            agreement=agreement[backend],
                            agreement_ci95=wilson(agreement[backend], len(real)),
                            speedup_vs_eager=speedup,
                        )
                    )
    floor = o.min_agreement
    return BenchReport(
        model=ref.shown,
        fingerprint=fingerprint(threads),
        rows=tuple(rows),
        torch_threads=torch.get_num_threads(),
        ort_threads=threads,
        agreement_images=len(real),
        fastest=tuple(fastest_within(rows, floor)) if floor is not None else None,
        min_agreement=floor,
        data=data,
    )


def _real_batch(info: Any, data: str | None) -> torch.Tensor:
    """The agreement images, preprocessed as every exported backend's users feed them."""
    import numpy as np

    from zoo.deploy.export.parity import real_images
    from zoo.images import open_image
    from zoo.preprocess import preprocess

    pre = info.preprocessing()
    images = real_images(data, limit=AGREEMENT_IMAGES)
    return torch.from_numpy(np.stack([preprocess(open_image(p), pre) for p in images]))


__all__ = ["fingerprint", "run_bench"]
