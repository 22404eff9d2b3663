"""What machine this is: CPUs actually available, versions, CUDA, ORT providers."""

from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def mib(nbytes: float) -> float:
    """``nbytes`` in MiB (2**20 bytes) to 4 significant figures: the one rule for every size zoo
    reports, so a model of a few kB reads 0.002861, never 0.0."""
    return float(f"{nbytes / 2**20:.4g}")


def available_cpus() -> int:
    """CPUs this process may use: the affinity mask, capped by a cgroup CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS/Windows
        n = os.cpu_count() or 1
    quota = Path("/sys/fs/cgroup/cpu.max")
    try:
        q, period = quota.read_text().split()
        if q != "max":
            n = min(n, max(1, math.floor(int(q) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The flags of this machine's first CPU (x86 ``flags``, Arm ``Features``).

    Args:
        cpuinfo: the file to read them from.

    Returns:
        The flags; empty where ``cpuinfo`` is not there (macOS, Windows) or lists none.
    """
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
"""CPU flags of integer dot-product instructions: with one, uint8 × int8 products cannot
saturate in onnxruntime's int8 kernels."""


def int8_weight_bits(flags: frozenset[str] | None = None) -> int:
    """The bits of int8 weights onnxruntime's kernels take on a CPU (``flags``: this one's by
    default): 7 (onnxruntime's ``reduce_range``, weights in [-64, 64]) on an x86 CPU with AVX2
    and no integer dot-product instruction (VNNI), whose kernels sum pairs of uint8 × int8
    products in 16 bits, which 8-bit weights can saturate; else 8 (onnxruntime's default: VNNI,
    Arm, or flags this machine does not list)."""
    flags = cpu_flags() if flags is None else flags
    return 7 if "avx2" in flags and not flags & VNNI_FLAGS else 8


def expand_home(
    path: str | os.PathLike[str], *, what: str, fix: str = "Give the full path instead."
) -> Path:
    """``Path(path).expanduser()``, whose failure is a plain error, not pathlib's bare
    ``RuntimeError`` ("Could not determine home directory.").

    Args:
        path: the path as given (``~/data``, ``~alice/runs``, or no ``~`` at all).
        what: what the path is for, named first in the error ("Data folder").
        fix: what the error tells the user to do instead.

    Raises:
        NoHomeFolderError: ``~user`` names no user here, or ``~`` has no home folder.
    """
    from zoo.errors import NoHomeFolderError

    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise NoHomeFolderError(os.fspath(path), what, fix) from None


def cache_home() -> Path:
    """zoo's cache folder (data-check results, decoded images): ``$ZOO_CACHE``, else
    ``$XDG_CACHE_HOME/zoo``, else ``~/.cache/zoo``."""
    if os.environ.get("ZOO_CACHE"):
        return expand_home(os.environ["ZOO_CACHE"], what="ZOO_CACHE")
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (
        Path(xdg)
        if xdg
        else expand_home(
            "~/.cache", what="zoo's cache folder", fix="Set ZOO_CACHE (or HOME) to a folder."
        )
    ) / "zoo"


def _version(mod: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(mod)
    except PackageNotFoundError:
        return None


def _nvidia_smi() -> dict[str, Any] | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        head = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    cuda = None
    for token in head.split("CUDA Version:")[1:2]:
        cuda = token.split()[0]
    gpus = [
        dict(zip(("name", "driver", "memory"), (c.strip() for c in line.split(",")), strict=False))
        for line in out.strip().splitlines()
    ]
    return {"gpus": gpus, "driver_cuda": cuda}


def environment_report() -> dict[str, Any]:
    """The facts ``zoo doctor`` prints and benchmarks record as their fingerprint."""
    import torch

    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus_available": available_cpus(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cuda_available": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
    for mod in (
        "torchvision",
        "timm",
        "onnx",
        "onnxruntime",
        "onnxruntime-gpu",
        "openvino",
        "nncf",
        "huggingface_hub",
        "safetensors",
        "numpy",
    ):
        report[mod.replace("-", "_")] = _version(mod)
    try:
        import onnxruntime as ort

        report["ort_providers"] = ort.get_available_providers()
    except ImportError:
        report["ort_providers"] = []
    smi = _nvidia_smi()
    report["nvidia_smi"] = smi
    warnings = []
    if report["torch_cuda"] and smi is None and not report["cuda_available"]:
        warnings.append("torch is a CUDA build but no NVIDIA driver was found: running on CPU.")
    if smi and smi.get("driver_cuda") and report["torch_cuda"]:
        drv = tuple(int(x) for x in smi["driver_cuda"].split(".")[:2])
        built = tuple(int(x) for x in report["torch_cuda"].split(".")[:2])
        if drv < built:
            warnings.append(
                f"torch was built for CUDA {report['torch_cuda']} but the driver supports "
                f"CUDA {smi['driver_cuda']}: upgrade the driver or install a torch built for "
                "an older CUDA."
            )
    if smi and not report["cuda_available"]:
        warnings.append("An NVIDIA GPU is present but torch cannot use it (CPU-only torch build?).")
    report["warnings"] = warnings
    return report
