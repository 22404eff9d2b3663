"""Raw benchmark results with their provenance: the one place every bench script writes from.

Each run of a script writes one JSON file under ``docs/bench/`` (``--out`` overrides it):

    {"schema": 1, "bench": NAME, "command": ..., "provenance": {...}, "stale": null,
     "results": {...}}

``provenance`` holds what is needed to judge and reproduce a figure: the git commit and whether
the measured paths were dirty (a modified or untracked file under them; on a machine without
``.git``, ``ZOO_BENCH_COMMIT``), the paths the script measures (``MEASURED``) and the digest of
their sources (``scripts/make_benchmarks_doc.py`` compares both with the tree to mark a figure
stale), the versions of Python/torch/onnxruntime/…, the machine (CPU model and its ISA flags,
logical CPUs, affinity, cgroup quota, RAM, GPUs, a hash that tells machines apart), the load
average and the share of the CPUs other work kept busy before the start, a ``busy`` flag, the
start date and the duration. ``results`` is the script's own: every figure the docs show is a value in it
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
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_path import ROOT

SCHEMA = 1
RESULTS_DIR = ROOT / "docs" / "bench"
# the code a benchmark measures: its digest says whether two runs measured the same code
SOURCE_DIRS = ("zoo", "train", "deploy", "cli", "bench")
# what each benchmark measures: the commits that touch these paths make its figures stale
# (zoo/ is the core every command imports; the script itself and its shared helpers count)
_SHARED = ("zoo", "bench/common.py", "bench/bench_path.py")
_TRAIN = (*_SHARED, "train", "cli")
_DEPLOY = (*_SHARED, "deploy", "cli")
MEASURED: dict[str, tuple[str, ...]] = {
    "trainer_overhead": (*_TRAIN, "bench/trainer_overhead.py", "bench/hand_train.py"),
    "feature_cache": (*_TRAIN, "bench/feature_cache.py"),
    "imbalance": (*_TRAIN, "bench/imbalance.py"),
    "distill": (*_TRAIN, "bench/distill.py"),
    "distill_photos": (*_TRAIN, "bench/distill_photos.py", "bench/distill.py"),
    "enroll": (*_TRAIN, "bench/enroll.py"),
    "ood": (*_TRAIN, "deploy/predict", "deploy/index", "bench/ood.py"),
    "tracking_overhead": (*_TRAIN, "bench/tracking_overhead.py"),
    "tune_cost": (*_TRAIN, "bench/tune_cost.py", "bench/distill_photos.py", "bench/distill.py"),
    "loader_cache": (*_TRAIN, "bench/loader_cache.py"),
    "cache_accuracy": (*_TRAIN, "bench/cache_accuracy.py"),
    "gpu_bench": (*_TRAIN, "deploy", "bench/gpu_bench.py", "bench/hand_train.py"),
    "cli_startup": (*_SHARED, "cli", "bench/cli_startup.py", "bench/peak_rss.py"),
    # the README's main job: the script itself is measured too
    "quickstart": (*_TRAIN, "deploy", "bench/quickstart.py", "scripts/quickstart.sh"),
    "deploy_bench": (*_DEPLOY, "bench/deploy_bench.py"),
    "openvino_bench": (*_DEPLOY, "bench/openvino_bench.py"),
    "quantize_defaults": (*_DEPLOY, "bench/quantize_defaults.py"),
    "serve_load": (*_DEPLOY, "bench/serve_load.py"),
    "serve_peers": (*_DEPLOY, "bench/serve_peers.py", "bench/peers"),
    "serve_multi": (*_DEPLOY, "bench/serve_multi.py", "bench/serve_peers.py"),
    "predict_throughput": (*_DEPLOY, "bench/predict_throughput.py", "bench/peak_rss.py"),
    "index_scale": (*_DEPLOY, "bench/index_scale.py", "bench/peak_rss.py"),
}
# what records a run and measures nothing: never among the measured files
RECORDER = ("bench/provenance.py", "bench/bench_path.py", "bench/loaded/sitecustomize.py")
# the hook that makes every Python process of a run list the sources it imported
LOADED_HOOK = ROOT / "bench" / "loaded"
# the CPU flags a figure can depend on (onnxruntime's int8 kernels, OpenVINO's bf16, torch's
# oneDNN): the x86 vector extensions and their int8/bf16/fp16 instructions, and Arm's
ISA_FLAG = re.compile(
    r"^(avx2|avx512\w*|avx_vnni\w*|amx\w*|\w*bf16|\w*fp16\w*|f16c|fma|asimd\w*|sve\w*|i8mm)$"
)
# a run counts as busy when other work kept more than this share of the CPUs busy at its start
BUSY_SHARE = 0.5


def git(*args: str, root: Path = ROOT, stdin: bytes | None = None) -> bytes | None:
    """``git ARGS`` run in ``root`` (the one way bench/ asks git): its stdout, or None where
    git is missing, fails, or takes over a minute (a tree without ``.git`` on a lent machine)."""
    try:
        r = subprocess.run(
            ["git", *args], cwd=root, input=stdin, capture_output=True, timeout=60, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout


def measured_paths(name: str) -> tuple[str, ...]:
    """The paths benchmark ``name`` measures (every source folder for one not in ``MEASURED``)."""
    return MEASURED.get(name, SOURCE_DIRS)


def git_state(paths: tuple[str, ...] = SOURCE_DIRS) -> dict[str, Any]:
    """Commit and dirtiness from git (dirty: a file under ``paths`` modified, staged or
    untracked, since an untracked module is measured too); without a checkout (a copied tree
    on a lent machine), from ``ZOO_BENCH_COMMIT`` / ``ZOO_BENCH_DIRTY`` set by whoever
    started the run."""
    commit = (git("rev-parse", "HEAD") or b"").decode().strip()
    if commit:
        status = (
            git("status", "--porcelain", "--untracked-files=all", "--", *paths) or b""
        ).decode()
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


def is_source(rel: str) -> bool:
    return rel.endswith((".py", ".sh")) and "__pycache__" not in rel.split("/")


def digest(files: dict[str, bytes], paths: tuple[str, ...]) -> str:
    """sha256 over the relative path and bytes of each source file, path by path in the order
    of ``paths``, files in path order: the same value from a working tree (``source_digest``)
    and from a commit's objects (``bench/staleness.py``)."""
    h = hashlib.sha256()
    seen: set[str] = set()
    for d in paths:
        under = [
            r for r in files if (r == d or r.startswith(d.rstrip("/") + "/")) and r not in seen
        ]
        for rel in sorted(under, key=lambda r: r.split("/")):
            seen.add(rel)
            h.update(rel.encode() + b"\0" + files[rel] + b"\0")
    return h.hexdigest()


def tree_sources(paths: tuple[str, ...], root: Path = ROOT) -> dict[str, bytes]:
    """The .py/.sh files under ``paths`` in the working tree (tracked or not), by relative path."""
    out = {}
    for d in paths:
        base = root / d
        for p in [base] if base.is_file() else base.rglob("*"):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and is_source(rel):
                out[rel] = p.read_bytes()
    return out


def loaded_sources(folder: Path | None) -> set[str]:
    """The source files under ``SOURCE_DIRS`` that this process and every Python process it
    started (through ``bench/loaded/sitecustomize.py``, which wrote ``folder``) imported,
    relative to the root; the recorder's own files left out."""
    root = Path(os.path.realpath(ROOT))
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and Path(os.path.realpath(path)).is_relative_to(root):
            files.add(Path(os.path.realpath(path)).relative_to(root).as_posix())
    for listing in folder.glob("*.txt") if folder else ():
        files.update(x for x in listing.read_text().splitlines() if x)
    return {
        f for f in files if is_source(f) and f.split("/", 1)[0] in SOURCE_DIRS and f not in RECORDER
    }


def source_digest(paths: tuple[str, ...] = SOURCE_DIRS) -> str:
    """sha256 over the path and bytes of every .py/.sh file under ``paths``."""
    return digest(tree_sources(paths), paths)


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


def cpu_flags() -> list[str]:
    """The ISA-relevant subset (``ISA_FLAG``) of the CPU's flags (:func:`zoo.system.cpu_flags`)."""
    from zoo.system import cpu_flags as all_flags

    return sorted(f for f in all_flags() if ISA_FLAG.match(f))


def machine_hash() -> str:
    """Tells machines apart and stays the same on one: /etc/machine-id alone is copied with a
    container image and the hostname alone is often the same ("vm"), so both are hashed with
    the hardware a figure depends on (CPU model, logical CPUs, RAM, GPUs)."""
    try:
        machine_id = Path("/etc/machine-id").read_text().strip()
    except OSError:
        machine_id = ""
    from zoo.system import environment_report

    gpus = ",".join(environment_report()["gpus"] or [])
    key = f"{machine_id}|{platform.node()}|{_cpu_model()}|{os.cpu_count()}|{_ram_gib()}|{gpus}"
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def cpu_busy_share(seconds: float = 1.0) -> float | None:
    """The share of all CPUs busy over ``seconds`` (from /proc/stat), sampled while this
    process sleeps: the work of others, where the 1-minute load average still counts the
    previous benchmark of ``bench/run_all.sh``."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return round(1 - (idle1 - idle0) / total, 3) if total > 0 else None


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
        "cpu_flags": cpu_flags(),
        "logical_cpus": os.cpu_count(),
        "affinity": affinity,
        "cpus_available": env["cpus_available"],
        "cgroup_cpu_max": _cgroup_cpu_quota(),
        "ram_gib": _ram_gib(),
        "platform": env["platform"],
        "hostname_hash": machine_hash(),
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
        self.paths = measured_paths(name)
        self.load_before = _load()
        self.cpu_busy_before = cpu_busy_share()
        # busy: others kept over BUSY_SHARE of the CPUs busy, or bench/run_all.sh was told
        # --allow-busy on a loaded machine (ZOO_BENCH_BUSY=1)
        self.busy = os.environ.get("ZOO_BENCH_BUSY", "0") not in ("0", "") or bool(
            self.cpu_busy_before is not None and self.cpu_busy_before > BUSY_SHARE
        )
        self.started = dt.datetime.now(dt.timezone.utc)
        self.t0 = time.perf_counter()
        self.git = git_state(self.paths)
        # as they were at the start (with a measured script outside them, as quickstart's)
        self.sources = tree_sources((*SOURCE_DIRS, *self._outside()))
        self.source_sha256 = digest(self.sources, SOURCE_DIRS)
        # every Python process from here on lists the sources it imports (see ``measured``)
        self.loaded = Path(tempfile.mkdtemp(prefix="zoo-bench-loaded-"))
        os.environ["ZOO_BENCH_LOADED"] = str(self.loaded)
        os.environ["ZOO_BENCH_ROOT"] = str(ROOT)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(LOADED_HOOK), *filter(None, [os.environ.get("PYTHONPATH")])]
        )

    def _outside(self) -> tuple[str, ...]:
        """The measured files outside ``SOURCE_DIRS`` (a shell script the benchmark runs)."""
        return tuple(p for p in self.paths if p.split("/", 1)[0] not in SOURCE_DIRS)

    def measured(self) -> dict[str, Any]:
        """The files this run measured: the sources its processes imported and the script's
        own files (``MEASURED``'s entries under ``bench/``, and a shell script outside the
        source folders), with their digest at the start. Commits touching other files leave
        its figures current. Where no process listed
        anything (the hook did not load), the declared folders of ``MEASURED``."""
        loaded = loaded_sources(self.loaded)
        if not loaded:
            return {
                "paths": list(self.paths),
                "sha256": digest(self.sources, self.paths),
                "from": "declared",
            }
        own = {p for p in self.paths if p.startswith("bench/") and p not in RECORDER}
        own |= set(self._outside())
        paths = tuple(sorted(loaded | own))
        return {"paths": list(paths), "sha256": digest(self.sources, paths), "from": "imported"}

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
                "measured": self.measured(),
                "versions": versions(),
                "machine": machine(),
                "load_avg_before": self.load_before,
                "load_avg_after": _load(),
                "cpu_busy_before": self.cpu_busy_before,
                "busy": self.busy,
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
        shutil.rmtree(self.loaded, ignore_errors=True)
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
    measured = {name: source_digest(paths) for name, paths in MEASURED.items()}
    print(
        json.dumps(
            {"git": git_state(), "source_sha256": source_digest(), "measured_sha256": measured},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
