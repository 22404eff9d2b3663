"""Knowledge distillation on real data: ``zoo distill`` of a teacher fine-tuned on sklearn's
digits into a small student, against the same student trained without the teacher
(``zoo finetune``) at the same budget (epochs, batch, LR, seed, views).

The digits are split once into ``train/`` and ``val/`` folders (20 % of each class held out,
seed 0), so the teacher and every student are judged on the same images and the teacher never
trained on them. Training views are deterministic (``--no-augment``) for both arms, so the
teacher's logits are computed once and cached; the KD arm's only difference is the loss.

Reported: the teacher's accuracy, parameters and size; per seed the KD and plain students'
validation accuracy (the shipped weights); the KD gain paired by seed with its 95 % t
interval, and the KD student's gap to the teacher. Accuracy figures, not timings: the load
does not change them. Latency is not measured here (``zoo bench`` on the exports).

Defaults: a simple_cnn teacher (620 k parameters, 8 epochs) and an mlp student (204 k, 0.33×)
at 2 epochs, where the plain mlp is still short of the teacher; two KD arms, zoo distill's
defaults (T 4, α 0.5: the headline, chosen before running) and T 2, α 0.9.

    python bench/distill.py                  # writes docs/bench/distill.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import t_interval, timed, zoo_cmd, zoo_finetune
from provenance import Recording, headline

from zoo.samples import write_digits_folder


def split_folder(root: Path, val_share: float, seed: int) -> dict[str, int]:
    """``root/train|val/<class>/`` from the digits (symlinks): ``val_share`` of each class held
    out. Returns the image counts per split."""
    digits = write_digits_folder(root / "all")
    rng = random.Random(seed)
    counts = {"train": 0, "val": 0}
    for cls in sorted(p.name for p in digits.iterdir()):
        files = sorted((digits / cls).iterdir())
        rng.shuffle(files)
        cut = round(val_share * len(files))
        for split, chosen in (("val", files[:cut]), ("train", files[cut:])):
            (root / split / cls).mkdir(parents=True)
            for f in chosen:
                (root / split / cls / f.name).symlink_to(f)
            counts[split] += len(chosen)
    return counts


def report_of(run: Path) -> dict:
    return json.loads((run / "report.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--teacher", default="simple_cnn", help="trained on the digits first")
    p.add_argument("--teacher-epochs", type=int, default=8)
    p.add_argument("--teacher-size", type=int, default=32, help="the teacher's --image-size")
    p.add_argument("--student", default="mlp")
    p.add_argument("--epochs", type=int, default=2, help="each student's budget")
    p.add_argument(
        "--kd",
        default="4:0.5,2:0.9",
        help="KD settings T:ALPHA, each an arm; the first (zoo distill's defaults) is the headline",
    )
    p.add_argument(
        "--augment",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="random training views for both arms (the teacher then judges every view)",
    )
    p.add_argument("--seeds", default="0,1,2", help="at least 3 for an interval")
    p.add_argument("--out", default=None, help="default: docs/bench/distill.json")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = [tuple(float(v) for v in kd.split(":")) for kd in args.kd.split(",")]
    names = [f"T{t:g}_a{a:g}".replace(".", "p") for t, a in arms]  # no dots: headline keys
    rec = Recording("distill")
    quiet = ["--no-progress", "--no-report", "--num-workers", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "digits"
        counts = split_folder(data, 0.2, seed=0)
        runs = Path(tmp) / "runs"
        teacher = zoo_finetune(
            args.teacher,
            data,
            runs / "teacher",
            *("--epochs", str(args.teacher_epochs), "--image-size", str(args.teacher_size)),
            *quiet,
        ).extra["run"]
        print(f"teacher: {report_of(teacher)['best']['val/acc']:.4f}", flush=True)
        views = [] if args.augment else ["--no-augment"]
        budget = ["--epochs", str(args.epochs), *views, *quiet]
        rows = []
        summary = None
        for seed in seeds:
            plain = zoo_finetune(
                args.student, data, runs / f"plain-{seed}", *budget, "--seed", str(seed)
            ).extra["report"]
            row = {"seed": seed, "plain": plain["best"]["val/acc"]}
            for name, (t, a) in zip(names, arms, strict=True):
                kd_run = runs / f"{name}-{seed}"
                timed(
                    [
                        *zoo_cmd(),
                        "distill",
                        str(teacher),
                        *("--student", args.student, "--data", str(data)),
                        *("-T", str(t), "--alpha", str(a)),
                        *("--runs", str(runs), "--name", kd_run.name, "--seed", str(seed)),
                        *budget,
                    ]
                )
                kd = report_of(kd_run)
                summary = summary or kd["distill"]
                row[name] = kd["best"]["val/acc"]
            rows.append(row)
            print(f"seed {seed}: {row}", flush=True)
    assert summary is not None
    gains = {n: [round(r[n] - r["plain"], 4) for r in rows] for n in names}
    intervals = {n: t_interval(g) for n, g in gains.items()}
    head = names[0]  # zoo distill's defaults: the headline, chosen before the run
    ci = intervals[head]
    gap = t_interval([round(summary["teacher"]["val_acc"] - r[head], 4) for r in rows])
    size_ratio = summary["student"]["params"] / summary["teacher"]["params"]
    results = {
        "setup": {
            "teacher": args.teacher,
            "teacher_epochs": args.teacher_epochs,
            "teacher_image_size": args.teacher_size,
            "student": args.student,
            "student_epochs": args.epochs,
            "kd_arms": {
                n: {"temperature": t, "alpha": a} for n, (t, a) in zip(names, arms, strict=True)
            },
            "seeds": seeds,
            "images": counts,
            "teacher_logits": summary["teacher_logits"],
            "commands": [
                f"zoo finetune {args.teacher} --data DIR --epochs {args.teacher_epochs} "
                f"--image-size {args.teacher_size}",
                f"zoo distill TEACHER_RUN --student {args.student} --data DIR -T T --alpha A "
                f"--epochs {args.epochs} --no-augment --seed S",
                f"zoo finetune {args.student} --data DIR --epochs {args.epochs} --no-augment "
                "--seed S",
            ],
        },
        "teacher": summary["teacher"],
        "student_size": {k: summary["student"][k] for k in ("params", "weights_mb")},
        "runs": rows,
        "mean": {k: round(statistics.fmean(r[k] for r in rows), 4) for k in ("plain", *names)},
        "kd_gain_per_seed": gains,
        "kd_gain_interval": intervals,
        "teacher_minus_kd_student": gap,
        "latency": "not measured: zoo export each model folder, then zoo bench",
        "verdict": f"KD ({head}) beats the plain student (the interval is above 0)"
        if ci["low"] is not None and ci["low"] > 0
        else "no gain the seeds support (the interval reaches 0 or below)",
        "headlines": [
            headline(
                f"digits: {args.student} distilled from {args.teacher} ({head}) vs trained "
                "alone, val accuracy gain (lower end of the seeds' 95% interval)",
                f"kd_gain_interval.{head}.low",
                ci["low"],
                ">=",
                0.0,
                note="above 0: the seeds support a gain",
            ),
            headline(
                f"digits: {args.teacher} teacher minus the distilled {args.student}, val "
                "accuracy (mean over seeds)",
                "teacher_minus_kd_student.mean",
                gap["mean"],
                "<=",
                0.02,
                note=f"student {size_ratio:.2f}× the teacher's parameters; latency not measured",
            ),
        ],
    }
    rec.write(results, args.out)
    print(json.dumps({k: results[k] for k in ("teacher", "mean", "kd_gain_interval")}, indent=1))


if __name__ == "__main__":
    main()
