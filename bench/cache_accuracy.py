"""Does the image cache change what a run learns? The same `zoo finetune` with
`--image-cache on` and `off`, three seeds each, on sklearn's real digits (simple_cnn from
scratch, with augmentation) and on the real photographs of `zoo example photos` (mobilenet_v2,
ImageNet weights, gradual, 128 px, a small share of each class for training). Reported: each
run's best validation accuracy, the gap on − off per seed (the same seed, so paired), and the
95 % t interval of the mean gap. The goal (|gap| ≤ 2 points) is met only when the interval
lies inside ±2 points; an interval wider than that is labelled "cannot detect an effect of
this size" (more seeds narrow it). Accuracy figures, not timings: the machine's load does not
change them.

    python bench/cache_accuracy.py              # writes docs/bench/cache_accuracy.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import t_interval, zoo_finetune
from provenance import Recording, headline

from zoo.samples import write_digits_folder, write_photo_folder

GOAL_POINTS = 2.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="at least 3 for an interval worth reading")
    p.add_argument("--out", default=None, help="default: docs/bench/cache_accuracy.json")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rec = Recording("cache_accuracy")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tasks = {
            "digits": (
                "simple_cnn",
                write_digits_folder(root / "digits"),
                ["--weights", "none", "--epochs", "6", "-b", "64"],
            ),
            "photos": (
                "mobilenet_v2",
                write_photo_folder(root / "photos", per_class=60),
                ["--epochs", "3", "--image-size", "128", "--val-fraction", "0.5", "-b", "32"],
            ),
        }
        results: dict[str, dict[str, object]] = {}
        for task, (model, data, opts) in tasks.items():
            acc: dict[str, list[float]] = {"on": [], "off": []}
            for seed in seeds:
                for mode in ("on", "off"):
                    proc = zoo_finetune(
                        model,
                        data,
                        root / "runs" / f"{task}-{mode}-{seed}",
                        *opts,
                        "--seed",
                        str(seed),
                        "--image-cache",
                        mode,
                        "--no-progress",
                    )
                    acc[mode].append(round(proc.extra["report"]["best"]["val/acc"], 4))
                    print(task, mode, seed, acc[mode][-1], flush=True)
            means = {m: round(statistics.mean(v), 4) for m, v in acc.items()}
            spread = max(max(v) - min(v) for v in acc.values())
            gaps = [round(100 * (a - b), 2) for a, b in zip(acc["on"], acc["off"], strict=True)]
            ci = t_interval(gaps)
            bound = None if ci["low"] is None else round(max(abs(ci["low"]), abs(ci["high"])), 2)
            results[task] = {
                "model": model,
                "options": " ".join(opts),
                "val_acc": acc,
                "mean": means,
                "gap_points": round(100 * (means["on"] - means["off"]), 2),
                "gap_points_per_seed": gaps,
                "gap_interval_points": ci,
                "largest_gap_allowed_points": bound,
                "verdict": "no gap over the goal"
                if bound is not None and bound <= GOAL_POINTS
                else "cannot detect an effect of this size",
                "seed_spread_points": round(100 * spread, 2),
            }
    bounds = [r["largest_gap_allowed_points"] for r in results.values()]
    worst = None if None in bounds else max(bounds)  # type: ignore[type-var]
    rec.write(
        {
            "seeds": seeds,
            "tasks": results,
            "max_gap_allowed_points": worst,
            "headlines": [
                headline(
                    "image cache: largest |accuracy gap| on vs off the seeds' 95% interval "
                    "allows, worst of the two tasks (points)",
                    "max_gap_allowed_points",
                    worst,
                    "<=",
                    GOAL_POINTS,
                )
            ],
        },
        args.out,
    )
    print({k: (v["mean"], v["gap_points"], v["seed_spread_points"]) for k, v in results.items()})


if __name__ == "__main__":
    main()
