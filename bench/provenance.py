"""Raw benchmark results with their provenance: the one place every bench script writes from.

Each run of a script writes one JSON file under ``docs/bench/`` (``--out`` overrides it):

    {"schema": 1, "bench": NAME, "command": ..., "provenance": {...}, "stale": null,
     "results": {...}}

``provenance`` holds what is needed to judge and reproduce a figure: the git commit and whether
the tree was dirty (or, on a machine without ``.git``, ``ZOO_BENCH_COMMIT``), a digest of the
source files, the versions of Python/torch/onnxruntime/…, the machine (CPU model, logical CPUs,
affinity, cgroup quota, RAM, GPUs), the load average before and after, the start date and the
duration. ``results`` is the script's own: every figure the docs show is a value in it
(``scripts/make_benchmarks_doc.py`` only formats; ``tests/test_benchmarks_doc.py`` checks).

    rec = Recording("trainer_overhead")
    ...
    rec.write({"headlines": [...], ...}, out=args.out)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_path import ROOT

SCHEMA = 1
RESULTS_DIR = ROOT / "docs" / "bench"
# the code a benchmark measures: its digest says whether two runs measured the same code
SOURCE_DIRS = ("zoo", "train", "deploy", "cli", "bench")


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout


def git_state() -> dict[str, Any]:
    """Commit and dirtiness from git; without a checkout (a copied tree on a lent machine),
    from ``ZOO_BENCH_COMMIT`` / ``ZOO_BENCH_DIRTY`` set by whoever started the run."""
    commit = (_git("rev-parse", "HEAD") or "").strip()
    if commit:
        status = _git("status", "--porcelain", "--untracked-files=no") or ""
        changed = [line[3:] for line in status.splitlines() if line.strip()]
        return {"commit": commit, "dirty": bool(changed), "changed": changed, "from": "git"}
    env = os.environ.get("ZOO_BENCH_COMMIT")
    dirty = os.environ.get("ZOO_BENCH_DIRTY")
    return {
        "commit": env,
        "dirty": None if dirty is None else dirty not in ("0", "false", ""),
        "changed": [],
        "from": "ZOO_BENCH_COMMIT" if env else "unknown",
    }


def source_digest() -> str:
    """sha256 over the path and bytes of every .py/.sh file in the measured folders."""
    h = hashlib.sha256()
    for d in SOURCE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _cgroup_cpu_quota() -> str | None:
    try:
        return Path("/sys/fs/cgroup/cpu.max").read_text().strip()
    except OSError:
        return None


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine() -> dict[str, Any]:
    from zoo.system import environment_report

    env = environment_report()
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS/Windows
        affinity = []
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "affinity": affinity,
        "cpus_available": env["cpus_available"],
        "cgroup_cpu_max": _cgroup_cpu_quota(),
        "ram_gib": _ram_gib(),
        "platform": env["platform"],
        "hostname_hash": hashlib.sha256(platform.node().encode()).hexdigest()[:12],
        "gpus": env["gpus"],
        "nvidia_smi": env["nvidia_smi"],
        "torch_threads": env["torch_threads"],
        "torch_interop_threads": env["torch_interop_threads"],
        "omp_num_threads": env["omp_num_threads"],
    }


def versions() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out: dict[str, Any] = {"python": sys.version.split()[0], "torch_cuda": torch.version.cuda}
    for mod in (
        "zoo",
        "torch",
        "torchvision",
        "timm",
        "onnx",
        "onnxruntime",
        "onnxruntime-gpu",
        "numpy",
        "pillow",
        "safetensors",
        "scikit-learn",
        "scikit-image",
        "httpx",
        "uvicorn",
        "starlette",
    ):
        try:
            out[mod] = version(mod)
        except PackageNotFoundError:
            out[mod] = None
    return out


def default_out(name: str) -> Path:
    return RESULTS_DIR / f"{name}.json"


class Recording:
    """Started when a benchmark starts: the date, the load, and the code being measured (git
    state and source digest are taken now, so edits made while it runs do not count);
    ``write`` adds the results and saves."""

    def __init__(self, name: str, argv: list[str] | None = None) -> None:
        self.name = name
        self.argv = list(sys.argv if argv is None else argv)
        self.started = dt.datetime.now(dt.timezone.utc)
        self.t0 = time.perf_counter()
        self.load_before = _load()
        self.git = git_state()
        self.source_sha256 = source_digest()

    def document(self, results: dict[str, Any]) -> dict[str, Any]:
        script = Path(self.argv[0]).resolve() if self.argv else None
        rel = (
            str(script.relative_to(ROOT))
            if script and script.is_relative_to(ROOT)
            else (self.argv[0] if self.argv else "?")
        )
        return {
            "schema": SCHEMA,
            "bench": self.name,
            "command": shlex.join(["python", rel, *self.argv[1:]]),
            "provenance": {
                "date": self.started.isoformat(timespec="seconds"),
                "duration_s": round(time.perf_counter() - self.t0, 1),
                "git": self.git,
                "source_sha256": self.source_sha256,
                "versions": versions(),
                "machine": machine(),
                "load_avg_before": self.load_before,
                "load_avg_after": _load(),
            },
            "stale": None,
            "results": results,
        }

    def write(self, results: dict[str, Any], out: str | Path | None = None) -> Path:
        """Write the JSON atomically (``out`` or ``docs/bench/<name>.json``); returns its path."""
        path = Path(out) if out else default_out(self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.document(results), indent=2, sort_keys=False) + "\n")
        os.replace(tmp, path)
        print(f"raw results → {path}", file=sys.stderr, flush=True)
        return path


OPS = {"<=": lambda v, t: v <= t, ">=": lambda v, t: v >= t, "<": lambda v, t: v < t}


def headline(
    what: str, key: str, value: float | None, op: str, target: float, note: str = ""
) -> dict[str, Any]:
    """One row of the summary table: ``value`` (found at ``key`` in ``results``) against the
    goal ``op target`` (``op`` is "<=", ">=" or "<"); the verdict is computed here, once."""
    met = None if value is None else bool(OPS[op](value, target))
    return {
        "what": what,
        "key": key,
        "value": value,
        "goal": {"op": op, "target": target},
        "met": met,
        "note": note,
    }


def mark_stale(path: Path, reason: str) -> None:
    """Flag a result file as stale (the measured code changed since): the generated doc says
    so next to its figures, until the script is run again."""
    doc = json.loads(path.read_text())
    doc["stale"] = {"measured_on": doc["provenance"]["git"]["commit"], "reason": reason}
    path.write_text(json.dumps(doc, indent=2) + "\n")


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(
        description="Print this checkout's commit and source digest (to compare with a result "
        "file's provenance), or flag a result file as stale."
    )
    p.add_argument("--mark-stale", type=Path, help="a docs/bench/*.json file")
    p.add_argument("--reason", default="the measured code changed after this run")
    args = p.parse_args()
    if args.mark_stale:
        mark_stale(args.mark_stale, args.reason)
        return
    print(json.dumps({"git": git_state(), "source_sha256": source_digest()}, indent=2))


if __name__ == "__main__":
    main()
