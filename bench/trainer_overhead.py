"""Trainer overhead on CPU: the epoch time of zoo's Trainer vs the field guide's hand-written
loop, same model (simple_cnn), data (real digits), batch size and workers, alternating in one
run. Goal: ratio ≤ 1.03.

    python bench/trainer_overhead.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench_path import ROOT  # noqa: F401
from common import Job, make_data, raw_loop, trainer_run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="simple_cnn")
    p.add_argument("--copies", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(
            make_data(Path(tmp), args.copies),
            model=args.model,
            batch=args.batch,
            workers=args.workers,
            epochs=args.epochs,
        )
        raw, zoo = [], []
        for r in range(args.rounds):  # alternate, and keep the last epoch of each (warm)
            raw.append(raw_loop(job)[-1])
            zoo.append(trainer_run(job, Path(tmp) / f"runs{r}")[-1]["epoch_s"])
            print(f"round {r + 1}: raw {raw[-1]:.2f}s  zoo {zoo[-1]:.2f}s", flush=True)
    result = {
        "model": args.model,
        "batch": args.batch,
        "workers": args.workers,
        "rounds": args.rounds,
        "raw_epoch_s": [round(x, 3) for x in raw],
        "zoo_epoch_s": [round(x, 3) for x in zoo],
        "ratio_median": round(statistics.median(z / r for z, r in zip(zoo, raw, strict=True)), 3),
        "goal": "<= 1.03",
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
