"""Class imbalance on real data: ``zoo finetune`` on sklearn's digits with classes 5–9 cut to
10 % of their training images (validation kept balanced, so every class is judged on as many
images), with and without ``--class-weights auto`` and ``--sampler balanced``.

Reported per option set (mean over seeds): balanced accuracy and accuracy of the shipped
(best) weights on the balanced validation split, and the mean recall of the five minority
classes. The goal row is the gain of the better single option over none, paired by seed, with
its 95 % t interval: the headline is the interval's lower end (the gain the seeds support),
and fewer than three seeds are labelled "cannot detect an effect of this size". Accuracy
figures, not timings: the machine's load does not change them.

    python bench/imbalance.py                  # writes docs/bench/imbalance.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import t_interval, zoo_finetune
from provenance import Recording, headline

from zoo.samples import write_digits_folder

MINORITY = ("digit_5", "digit_6", "digit_7", "digit_8", "digit_9")
OPTION_SETS = {
    "none": [],
    "class-weights": ["--class-weights", "auto"],
    "sampler": ["--sampler", "balanced"],
    "both": ["--class-weights", "auto", "--sampler", "balanced"],
}


def imbalanced_folder(root: Path, keep: float, val_per_class: int, seed: int) -> dict[str, int]:
    """``root/train|val/<class>/``: ``val_per_class`` images per class held out, then the
    minority classes' training images cut to ``keep``. Returns the training counts."""
    digits = write_digits_folder(root / "all")
    rng = random.Random(seed)
    counts = {}
    for cls in sorted(p.name for p in digits.iterdir()):
        files = sorted((digits / cls).iterdir())
        rng.shuffle(files)
        val, train = files[:val_per_class], files[val_per_class:]
        if cls in MINORITY:
            train = train[: max(1, round(keep * len(train)))]
        for split, chosen in (("train", train), ("val", val)):
            (root / split / cls).mkdir(parents=True)
            for f in chosen:
                (root / split / cls / f.name).symlink_to(f)
        counts[cls] = len(train)
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="simple_cnn")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--keep", type=float, default=0.1, help="share of minority training images kept")
    p.add_argument("--seeds", default="0,1,2", help="at least 3 for an interval")
    p.add_argument("--out", default=None, help="default: docs/bench/imbalance.json")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rec = Recording("imbalance")
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in OPTION_SETS}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "imbalanced"
        counts = imbalanced_folder(data, args.keep, val_per_class=40, seed=0)
        for seed in seeds:
            for name, opts in OPTION_SETS.items():
                common = ["--epochs", str(args.epochs), "--seed", str(seed), "--no-progress"]
                proc = zoo_finetune(
                    args.model, data, Path(tmp) / "runs" / f"{name}-{seed}", *common, *opts
                )
                report = proc.extra["report"]
                recall = {r["class"]: r["recall"] for r in report["per_class"]}
                row = {
                    "balanced_acc": report["best"]["val/balanced_acc"],
                    "acc": report["best"]["val/acc"],
                    "minority_recall": statistics.fmean(recall[c] for c in MINORITY),
                    "majority_recall": statistics.fmean(
                        v for c, v in recall.items() if c not in MINORITY
                    ),
                }
                runs[name].append(row)
                print(f"seed {seed} {name}: {row}", flush=True)
    mean = {
        name: {k: round(statistics.fmean(r[k] for r in rows), 4) for k in rows[0]}
        for name, rows in runs.items()
    }
    # The goal is one option's gain: both at once weigh the rare classes twice (loss × draws).
    best = max(("class-weights", "sampler"), key=lambda k: mean[k]["balanced_acc"])
    gain = round(mean[best]["balanced_acc"] - mean["none"]["balanced_acc"], 4)
    gains = [
        round(a["balanced_acc"] - b["balanced_acc"], 4)
        for a, b in zip(runs[best], runs["none"], strict=True)
    ]
    ci = t_interval(gains)
    goal = 0.1
    results = {
        "setup": {
            "model": args.model,
            "epochs": args.epochs,
            "seeds": seeds,
            "train_counts": counts,
            "val_per_class": 40,
            "minority": list(MINORITY),
            "command": f"zoo finetune {args.model} --data DIR --epochs {args.epochs} --seed S "
            "[--class-weights auto] [--sampler balanced]",
        },
        "runs": runs,
        "mean": mean,
        "best_single_option": best,
        "balanced_acc_gain_best_option_vs_none": gain,
        "gain_per_seed": gains,
        "gain_interval": ci,
        "verdict": "the interval clears the goal"
        if ci["low"] is not None and ci["low"] >= goal
        else "cannot detect an effect of this size"
        if ci["low"] is None or ci["high"] - ci["low"] > goal
        else "the interval does not clear the goal",
        "headlines": [
            headline(
                f"imbalanced digits: balanced accuracy gain, {best} vs none "
                "(lower end of the seeds' 95% interval)",
                "gain_interval.low",
                ci["low"],
                ">=",
                goal,
            )
        ],
    }
    rec.write(results, args.out)
    for name, m in mean.items():
        print(f"{name:>14}: {m}")


if __name__ == "__main__":
    main()
