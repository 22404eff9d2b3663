"""Trainer overhead on the whole run, as a user waits for it: ``zoo finetune`` as a process vs
the hand-written loop (``bench/hand_train.py``) as a process, same data (sklearn's real
digits), model, transform, batch size and loader workers, no augmentation, on CPU.

Each tool runs at two epoch counts (default 2 and 12), alternating tool order round by round;
the wall-clock time of each process is fitted as ``a + b·epochs``, so the fixed part ``a``
(start-up, imports, data check, preflight, model folder, report…) and the per-epoch part ``b``
(training, validation, checkpoints, metrics…) are reported separately, along with the ratio of
the two tools at the largest epoch count, measured side by side. Goal: ratio ≤ 1.05 at 12
epochs. A warm-up run of each tool (1 epoch) comes first and is reported, not fitted.

    python bench/trainer_overhead.py                     # writes docs/bench/trainer_overhead.json
    python bench/profile_finetune.py                     # where zoo's time goes

Only the command lines and the run folder's public files (metrics.jsonl) are used, so a
refactor of the trainer does not break this script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import Process, hand_train, make_data, zoo_finetune
from provenance import Recording, headline

GOAL = 1.05


def fit_line(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares ``seconds = a + b·epochs`` over {epochs: seconds}; returns (a, b)."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - b * mx, b


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="simple_cnn")
    p.add_argument("--copies", type=int, default=1, help="digits linked N times (1: 1,797)")
    p.add_argument("--epochs", default="2,12", help="two or more epoch counts")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", default=None, help="default: docs/bench/trainer_overhead.json")
    args = p.parse_args()
    epochs = sorted({int(e) for e in args.epochs.split(",")})
    if len(epochs) < 2:
        p.error("--epochs needs two or more counts, e.g. 2,12")
    rec = Recording("trainer_overhead")
    zoo_opts = ["-b", str(args.batch), "--no-augment", "--num-workers", str(args.workers)]
    hand_opts = ["--model", args.model, "--batch", str(args.batch), "--workers", str(args.workers)]
    # tool -> clock ("wall" or "cpu") -> epochs -> seconds per round
    times: dict[str, dict[str, dict[int, list[float]]]] = {
        tool: {"wall": {}, "cpu": {}} for tool in ("hand", "zoo")
    }
    loop: dict[str, list[float]] = {"hand": [], "zoo": []}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        # an empty zoo cache: the first run over the new folder is what a new user waits for
        # (the data check runs inside it); the runs after it find their check done
        os.environ["ZOO_CACHE"] = str(t / "zoo-cache")
        data = make_data(t, args.copies)
        n = 0

        def run(tool: str, e: int) -> Process:
            nonlocal n
            n += 1
            if tool == "zoo":
                proc = zoo_finetune(
                    args.model, data, t / f"runs/zoo{n}", *zoo_opts, "--epochs", str(e)
                )
                proc.extra["train_s"] = [r["epoch_s"] for r in proc.extra["rows"]]
            else:
                proc = hand_train(data, t / f"hand{n}", *hand_opts, "--epochs", str(e))
                proc.extra["train_s"] = [r["train_s"] for r in proc.extra["rows"]]
            return proc

        warm = {tool: run(tool, 1) for tool in ("hand", "zoo")}
        counts = warm["hand"].extra["summary"]
        print(f"warm-up (1 epoch): { {k: round(v.seconds, 2) for k, v in warm.items()} }")
        for r in range(args.rounds):
            order = ("hand", "zoo") if r % 2 == 0 else ("zoo", "hand")
            for e in epochs:
                for tool in order:
                    proc = run(tool, e)
                    times[tool]["wall"].setdefault(e, []).append(proc.seconds)
                    times[tool]["cpu"].setdefault(e, []).append(proc.cpu_s)
                    loop[tool] += proc.extra["train_s"][1:]  # the first epoch warms up
                    print(
                        f"round {r + 1}: {tool} {e} epochs: {proc.seconds:.2f}s wall, "
                        f"{proc.cpu_s:.2f}s cpu",
                        flush=True,
                    )

    last = epochs[-1]
    clocks = {clock: compare(times, clock, epochs) for clock in ("wall", "cpu")}
    wall = clocks["wall"]
    results = {
        "setup": {
            "model": args.model,
            "data": f"sklearn digits x{args.copies}",
            "train_images": counts.get("train_images"),
            "val_images": counts.get("val_images"),
            "batch": args.batch,
            "workers": args.workers,
            "augment": False,
            "device": "cpu",
            "epochs": epochs,
            "rounds": args.rounds,
            "zoo_command": "zoo finetune MODEL --data DIR " + " ".join(zoo_opts) + " --epochs E",
            "hand_command": "python bench/hand_train.py --data DIR "
            + " ".join(hand_opts)
            + " --epochs E",
        },
        # the first run of each tool over the new folder (zoo: data check and cache empty)
        "warmup_1_epoch_s": {k: round(v.seconds, 2) for k, v in warm.items()},
        "first_run": "the warm-up: 1 epoch over a new folder, ZOO_CACHE empty",
        "max_epochs": last,
        **clocks,
        "train_loop_only": {  # the training part of each epoch after the first, as each reports it
            "hand_median_s": round(statistics.median(loop["hand"]), 3),
            "zoo_median_s": round(statistics.median(loop["zoo"]), 3),
            "ratio": round(statistics.median(loop["zoo"]) / statistics.median(loop["hand"]), 3),
        },
        "headlines": [
            headline(
                f"trainer whole run vs hand-written loop, {last} epochs ({args.model}, digits)",
                "wall.ratio_at_max_epochs",
                wall["ratio_at_max_epochs"],
                "<=",
                GOAL,
            )
        ],
    }
    rec.write(results, args.out)
    fit = wall["fit"]
    print(
        f"zoo / hand at {last} epochs: {wall['ratio_at_max_epochs']:.3f} (goal ≤ {GOAL}); "
        f"per epoch {fit['zoo']['per_epoch_s']:.3f}s vs {fit['hand']['per_epoch_s']:.3f}s "
        f"(×{fit['per_epoch_ratio']:.3f}); fixed {fit['zoo']['fixed_s']:.2f}s vs "
        f"{fit['hand']['fixed_s']:.2f}s ({fit['fixed_extra_s']:+.2f}s); CPU-time ratio "
        f"{clocks['cpu']['ratio_at_max_epochs']:.3f}"
    )


def compare(
    times: dict[str, dict[str, dict[int, list[float]]]], clock: str, epochs: list[int]
) -> dict[str, object]:
    """Per-round ratios, medians and the ``a + b·epochs`` fit of each tool for one clock."""
    runs = {tool: times[tool][clock] for tool in times}
    med = {tool: {e: statistics.median(v) for e, v in d.items()} for tool, d in runs.items()}
    (a_h, b_h), (a_z, b_z) = fit_line(med["hand"]), fit_line(med["zoo"])
    ratios = {
        e: [z / h for z, h in zip(runs["zoo"][e], runs["hand"][e], strict=True)] for e in epochs
    }
    return {
        "runs_s": {
            tool: {str(e): [round(x, 2) for x in v] for e, v in d.items()}
            for tool, d in runs.items()
        },
        "median_s": {tool: {str(e): round(x, 2) for e, x in d.items()} for tool, d in med.items()},
        "ratio_per_round": {str(e): [round(x, 3) for x in v] for e, v in ratios.items()},
        "ratio_at_max_epochs": round(statistics.median(ratios[epochs[-1]]), 3),
        "fit": {
            "hand": {"fixed_s": round(a_h, 2), "per_epoch_s": round(b_h, 3)},
            "zoo": {"fixed_s": round(a_z, 2), "per_epoch_s": round(b_z, 3)},
            "per_epoch_ratio": round(b_z / b_h, 3),
            "fixed_extra_s": round(a_z - a_h, 2),
        },
    }


if __name__ == "__main__":
    main()
