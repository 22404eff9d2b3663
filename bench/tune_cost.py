"""What does a `zoo tune` search cost, and does it pay? An 8-trial ASHA search against the same
8 trials run to the end (FIFO) and against one `zoo finetune` with zoo's defaults, on the
real digits (simple_cnn from scratch) and on grey patches of real photographs (mobilenet_v2,
ImageNet weights, 96 px, 6 epochs as the digits), for several search seeds.

The photograph task is ``bench/distill_photos.py``'s: which of 15 scikit-image photographs a
grey 64 px patch comes from, 20 training and 40 validation patches per photograph (zoo's
defaults reach ~94 % in 6 epochs there). Until 2026-12-05 it was the seven whole photographs of
`zoo example photos`, where every trial of every search and zoo's defaults reached 100 % at
the first rung at every seed: a search cannot be judged where nothing is left to find, and
ASHA's asynchronous promotion (a trial early at a rung goes on while it is among the few
there) trained 0.528 of FIFO's epochs on it (`bbd6a5b`; in git history).

Since 2026-12-05 a search's first trial is its baseline (``zoo tune --baseline``, the
default): zoo finetune's defaults, the other trials drawn. Under FIFO the baseline trains to the
end, so its run is the default run again (the same seed, one thread): each seed records both
accuracies, and whether they are equal. Under ASHA the baseline is judged like any trial and
may be stopped at a rung.

Reported per task and seed: the epochs each search trained (the sum over its trials, from
tune.json), ASHA's share of FIFO's, the best trial's validation accuracy under each, the
baseline trial's, the default run's, and the images the search decoded (cache entries
written; each image once). Goals (issue #31): ASHA trains ≤ 0.5× FIFO's epochs, and its best
trial is at least as good as the defaults, on the mean over the seeds. The second holds by
construction once the baseline is a trial (ASHA may stop it early, the only way to miss), so the
file also reports the best *drawn* trial against the defaults: what the search itself found,
goal ≥ 0 as well; and FIFO's baseline against the default run epoch by epoch (every validation
loss equal). A trial's accuracy is
the same for the same seed (each run is bitwise repeatable on the CPU), but ASHA's epochs are
not: two trials run at once, and which reaches a rung first decides what asynchronous ASHA
promotes, so the machine's load can change them. The wall time is kept for reference.

    python bench/tune_cost.py                       # writes docs/bench/tune_cost.json
    python bench/tune_cost.py --smoke --out /tmp/t.json   # 2 trials × 1 epoch, digits only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import timed, zoo_cmd, zoo_finetune
from distill_photos import patches
from provenance import Recording, headline

from zoo.samples import write_digits_folder

EPOCH_SHARE_GOAL = 0.5


def search(
    model: str, data: Path, root: Path, name: str, opts: list[str], *, trials: int,
    epochs: int, scheduler: str, seed: int,
) -> dict[str, Any]:  # fmt: skip
    """One `zoo tune` with a fresh image cache; its tune.json, wall time and cache entries."""
    cache = root / f"cache-{name}"
    proc = timed(
        [
            *zoo_cmd(), "tune", model, "--data", str(data), "--trials", str(trials),
            "--max-epochs", str(epochs), "--scheduler", scheduler, "--seed", str(seed),
            "--runs", str(root), "--name", name, "--json", *opts,
        ],
        env={"ZOO_CACHE": str(cache)},
    )  # fmt: skip
    record = json.loads(proc.stdout)
    best = record["best"]
    baseline = next(t for t in record["trials"] if t["baseline"])
    drawn = [  # a drawn trial that failed before its first epoch has no figure
        max(r["val/acc"] for r in t["epochs"])
        for t in record["trials"]
        if not t["baseline"] and t["epochs"]
    ]
    return {
        "epochs": sum(len(t["epochs"]) for t in record["trials"]),
        "stopped": sum(t["status"] == "stopped" for t in record["trials"]),
        "best_trial": best["trial"],
        "best_val_acc": round(best["val/acc"], 4),
        "best_params": next(t["params"] for t in record["trials"] if t["name"] == best["trial"]),
        "baseline_val_acc": round(max(r["val/acc"] for r in baseline["epochs"]), 4),
        "baseline_status": baseline["status"],
        "baseline_val_loss": [r["val/loss"] for r in baseline["epochs"]],
        # the search's own finding: the best of the drawn trials (the baseline is zoo's defaults)
        "best_drawn_val_acc": round(max(drawn), 4) if drawn else None,
        "images_decoded": len(list((cache / "images").rglob("*.npy"))),
        "wall_s": round(proc.seconds, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0,1,2", help="search seeds (at least 3)")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--smoke", action="store_true", help="2 trials × 1 epoch, digits, one seed")
    p.add_argument("--out", default=None, help="default: docs/bench/tune_cost.json")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")][: 1 if args.smoke else None]
    trials = 2 if args.smoke else args.trials
    rec = Recording("tune_cost")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tasks: dict[str, tuple[str, Path, list[str], int]] = {
            "digits": ("simple_cnn", write_digits_folder(root / "digits"), ["-b", "64"], 6),
        }
        if not args.smoke:
            patches(root / "photo_patches", 60, 20, 64)  # distill_photos.py's defaults
            tasks["photo_patches"] = (
                "mobilenet_v2",
                root / "photo_patches",
                ["--image-size", "96", "-b", "32"],
                # 6 epochs as the digits: at 4, ASHA's rungs (1, 2, 4) reach 0.5x FIFO's
                # epochs only when no trial gets to a rung early (seed 0 took 0.625 at 204473e)
                6,
            )
        results: dict[str, Any] = {}
        for task, (model, data, opts, epochs) in tasks.items():
            epochs = 1 if args.smoke else epochs
            n_images = sum(1 for f in data.rglob("*") if f.is_file())
            runs: list[dict[str, Any]] = []
            for seed in seeds:
                row: dict[str, Any] = {"seed": seed}
                for scheduler in ("asha", "fifo"):
                    row[scheduler] = search(
                        model, data, root / "runs" / task, f"{scheduler}-{seed}", opts,
                        trials=trials, epochs=epochs, scheduler=scheduler, seed=seed,
                    )  # fmt: skip
                default = zoo_finetune(
                    model, data, root / "runs" / task / f"default-{seed}", *opts, "--epochs",
                    str(epochs), "--seed", str(seed), "--no-progress",
                    env={"ZOO_FINETUNE_REPORT": "0", "OMP_NUM_THREADS": "1"},
                )  # fmt: skip
                row["default_val_acc"] = round(default.extra["report"]["best"]["val/acc"], 4)
                row["epoch_share"] = round(row["asha"]["epochs"] / row["fifo"]["epochs"], 3)
                # FIFO's baseline trial is the default run again: equal, or something differs
                row["fifo_baseline_is_default"] = row["fifo"]["baseline_val_loss"] == [
                    r["val/loss"] for r in default.extra["rows"] if "val/loss" in r
                ]  # every epoch's validation loss, exactly
                runs.append(row)
                print(task, seed, row["epoch_share"], row["asha"]["best_val_acc"],
                      row["default_val_acc"], flush=True)  # fmt: skip
            mean = statistics.mean
            results[task] = {
                "model": model,
                "options": " ".join(opts),
                "trials": trials,
                "max_epochs": epochs,
                "images": n_images,
                "runs": runs,
                "epoch_share_mean": round(mean(r["epoch_share"] for r in runs), 3),
                "asha_best_mean": round(mean(r["asha"]["best_val_acc"] for r in runs), 4),
                "fifo_best_mean": round(mean(r["fifo"]["best_val_acc"] for r in runs), 4),
                "asha_best_drawn_mean": round(  # every seed's search trains a drawn trial
                    mean(r["asha"]["best_drawn_val_acc"] for r in runs), 4
                ),
                "default_mean": round(mean(r["default_val_acc"] for r in runs), 4),
            }
    worst_share = max(r["epoch_share_mean"] for r in results.values())
    worst_margin = min(r["asha_best_mean"] - r["default_mean"] for r in results.values())
    worst_drawn = min(r["asha_best_drawn_mean"] - r["default_mean"] for r in results.values())
    rec.write(
        {
            "seeds": seeds,
            "smoke": args.smoke,
            "tasks": results,
            "worst_epoch_share": worst_share,
            "worst_margin_over_defaults": round(worst_margin, 4),
            "worst_drawn_margin_over_defaults": round(worst_drawn, 4),
            "headlines": [
                headline(
                    "zoo tune: epochs an ASHA search trains / the same trials to the end, "
                    "worst task (mean over seeds)",
                    "worst_epoch_share",
                    worst_share,
                    "<=",
                    EPOCH_SHARE_GOAL,
                ),
                headline(
                    "zoo tune: best ASHA trial's val/acc (the baseline among them) minus zoo's "
                    "defaults, worst task (mean over seeds)",
                    "worst_margin_over_defaults",
                    round(worst_margin, 4),
                    ">=",
                    0.0,
                ),
                headline(
                    "zoo tune: best drawn ASHA trial's val/acc (the baseline left out) minus "
                    "zoo's defaults, worst task (mean over seeds)",
                    "worst_drawn_margin_over_defaults",
                    round(worst_drawn, 4),
                    ">=",
                    0.0,
                ),
            ],
        },
        args.out,
    )


if __name__ == "__main__":
    os.environ.setdefault("ZOO_FINETUNE_REPORT", "0")
    main()
