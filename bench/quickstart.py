"""The main job's wall clock: `bash scripts/quickstart.sh` (the README's first command after the
install: write the digits, fine-tune MobileNetV2 on them, export the gated ONNX file while a
pretrained model classifies two photos, predict from the file) run whole, as a new user runs
it, each round into an empty output folder (nothing cached from the round before: the image
cache, the feature cache and the run are new each time; the operating system's file cache
is warm after the first round, which is reported on its own). Goal: ≤ 30 s on 2 cores.

    python bench/quickstart.py [--rounds 3]

Writes the raw samples, with provenance, to docs/bench/quickstart.json (bench/provenance.py).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench_path import ROOT
from provenance import Recording, headline

SCRIPT = ROOT / "scripts" / "quickstart.sh"


def run_once(out: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process it started) of one whole quickstart."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "QUICKSTART_DIR": str(out)},
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"quickstart.sh exited {r.returncode}:\n{r.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="default: docs/bench/quickstart.json")
    args = p.parse_args()
    rec = Recording("quickstart")
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            wall, cpu = run_once(Path(tmp) / f"round{r}")
            walls.append(round(wall, 2))
            cpus.append(round(cpu, 2))
            print(f"round {r}: {wall:.1f} s wall, {cpu:.1f} s CPU")
    median = round(statistics.median(walls), 2)
    result = {
        "rounds": args.rounds,
        "script_sha256": hashlib.sha256(SCRIPT.read_bytes()).hexdigest(),
        "summary": {
            "median_wall_s": median,
            "first_round_wall_s": walls[0],
            "max_wall_s": max(walls),
            "median_cpu_s": round(statistics.median(cpus), 2),
        },
        "samples": {"wall_s": walls, "cpu_s": cpus},
        "headlines": [
            headline(
                "`bash scripts/quickstart.sh` wall clock, seconds (median of rounds)",
                "summary.median_wall_s",
                median,
                "<=",
                30.0,
            ),
        ],
    }
    print(f"median {median} s (goal ≤ 30), first round {walls[0]} s")
    rec.write(result, args.out)


if __name__ == "__main__":
    main()
