"""Pieces the benchmark scripts share: real data sets, and the two ways of running a training
job as a whole process, as a user would: ``zoo finetune`` and the hand-written loop
(``bench/hand_train.py``). Both go through their command line only, so a refactor of the
trainer's internals changes neither what is measured nor these scripts."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from bench_path import ROOT
from PIL import Image

from zoo.samples import write_digits_folder

BENCH = ROOT / "bench"
# scikit-image's own photographs (public domain, shipped in the package, no download).
# `cat` is `chelsea` again, so it is left out: every source below is a different photograph.
PHOTOS = (
    "astronaut",
    "camera",
    "chelsea",
    "coffee",
    "coins",
    "hubble_deep_field",
    "immunohistochemistry",
    "moon",
    "retina",
    "rocket",
)


def make_data(root: Path, copies: int) -> Path:
    """sklearn's 1,797 real digits, linked ``copies`` times (distinct files) into one image folder."""
    base = write_digits_folder(root / "digits")
    if copies == 1:
        return base
    data = root / f"digits_x{copies}"
    for cls in sorted(base.iterdir()):
        (data / cls.name).mkdir(parents=True, exist_ok=True)
        for f in cls.iterdir():
            for c in range(copies):
                dst = data / cls.name / f"{c}_{f.name}"
                if not dst.exists():
                    os.link(f, dst)
    return data


def photo_crops(out: Path, sources: tuple[str, ...], per_source: int, seed: int) -> dict[str, int]:
    """``per_source`` random square crops (50–100% of the short side) of each photograph in
    ``sources``, as JPEG files ``out/<source>/<i>.jpg``; returns the count per source."""
    from skimage import data

    rng = np.random.default_rng(seed)
    for name in sources:
        crops(Image.fromarray(getattr(data, name)()).convert("RGB"), out / name, per_source, rng)
    return dict.fromkeys(sources, per_source)


def crops(img: Image.Image, out: Path, n: int, rng: np.random.Generator) -> None:
    """``n`` random square crops (50–100% of the short side) of ``img``: ``out/<i>.jpg``."""
    out.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        w, h = img.size
        s = int(min(w, h) * rng.uniform(0.5, 1.0))
        x, y = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
        img.crop((x, y, x + s, y + s)).save(out / f"{i:03d}.jpg", quality=92)


def t_interval(values: list[float], level: float = 0.95) -> dict[str, Any]:
    """Student's t interval of the mean of ``values`` (paired differences, one per seed): what
    the seeds allow the true mean to be. Fewer than two values give no interval."""
    from scipy import stats

    n = len(values)
    mean = float(np.mean(values))
    if n < 2:
        return {"n": n, "mean": round(mean, 4), "low": None, "high": None, "level": level}
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * np.std(values, ddof=1) / np.sqrt(n))
    return {
        "n": n,
        "mean": round(mean, 4),
        "low": round(mean - half, 4),
        "high": round(mean + half, 4),
        "level": level,
    }


def v2_binary(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 binary-tensor request for ``x`` (the model input named ``input``): body and
    headers, asking for the ``logits`` output in binary too."""
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return head + x.tobytes(), {
        "Inference-Header-Content-Length": str(len(head)),
        "Content-Type": "application/octet-stream",
    }


@dataclass
class Process:
    """A finished command: wall-clock seconds from spawn to exit, the CPU seconds it and its
    children used (user + system: less sensitive to a busy machine), and its output."""

    argv: list[str]
    seconds: float
    cpu_s: float
    stdout: str
    stderr: str
    extra: dict[str, Any] = field(default_factory=dict)


def timed(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 3600) -> Process:
    """Run ``argv`` to completion and time the whole process; raise with its stderr on failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout
    )
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return Process(argv, seconds, cpu, r.stdout, r.stderr)


def zoo_cmd() -> list[str]:
    """The `zoo` command of this interpreter's environment (as the user types it)."""
    exe = Path(sys.executable).parent / "zoo"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "zoo"]


def zoo_finetune(model: str, data: Path, run: Path, *options: str, **kw: Any) -> Process:
    """``zoo finetune MODEL --data DATA OPTIONS`` as a subprocess, writing the run folder
    ``run`` (which must not exist yet); ``extra`` holds its metrics rows (metrics.jsonl) and
    report.json, the run's public outputs."""
    if run.exists():
        raise FileExistsError(f"{run} exists: give each zoo run a fresh folder")
    argv = [*zoo_cmd(), "finetune", model, "--data", str(data)]
    proc = timed([*argv, "--runs", str(run.parent), "--name", run.name, *options], **kw)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    proc.extra = {"run": run, "rows": rows, "report": json.loads((run / "report.json").read_text())}
    return proc


def hand_train(data: Path, out: Path, *options: str, **kw: Any) -> Process:
    """``python bench/hand_train.py --data DATA --out OUT OPTIONS``; ``extra`` holds its epoch
    rows and summary (its JSON lines)."""
    proc = timed(
        [
            sys.executable,
            str(BENCH / "hand_train.py"),
            "--data",
            str(data),
            "--out",
            str(out),
            *options,
        ],
        **kw,
    )
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    proc.extra = {"rows": [x for x in lines if "epoch" in x], "summary": lines[-1]}
    return proc
