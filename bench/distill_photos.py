"""Knowledge distillation on real photographs: ``zoo distill`` of a MobileNetV2 fine-tuned from
its ImageNet weights into a small student trained from scratch, against the same student
trained without the teacher (``zoo finetune``) at the same budget (epochs, batch, LR, seed,
augmentation). ``bench/distill.py`` does the same on the digits; this file reuses its
comparison and latency code.

The task: which photograph a patch comes from. Fifteen of scikit-image's local photographs and
textures (``SOURCES``), in grey (colour alone tells most of them apart), 60 square patches of
each (15–35 % of the short side, a seeded draw, 64 px): the first 20 of each source train, the
other 40 are the validation images every run is judged on (the teacher never trains on them).
A patch of sky, skin or background can come from several photographs, so the task is not
saturated: the photos example's seven whole-photo classes are (the plain student reaches
99.7 % there, leaving distillation nothing to show).

The teacher sees what the student sees: with random training views, ``zoo distill`` maps the
student's input (32 px for ``simple_cnn``) to the teacher's size. So the file also records the
teacher's accuracy on the validation images through that mapping, beside its own: the soft
targets are only as good as the teacher is on the student's views. And it records the
teacher's calibration temperature (``zoo finetune`` fits it on the validation images): below 1,
its logits are softer than its accuracy warrants, and T 4 flattens them further, so a second
arm distils at T 1 (same α).

Reported: the teacher's accuracy (own views and the student's), parameters and size; per seed
the KD and plain students' validation accuracy; the KD gain paired by seed with its 95 % t
interval, and the KD student's gap to the teacher; the ONNX Runtime CPU latency (batch 1) of
both exports in alternating windows. Accuracy figures do not depend on the load; the latency
ratio is noisy on a busy machine.

    python bench/distill_photos.py              # writes docs/bench/distill_photos.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import PHOTOS, timed, zoo_cmd, zoo_finetune
from distill import compare, ort_latency, report_of
from PIL import Image
from provenance import Recording, headline

# PHOTOS and five more of scikit-image's local photographs and textures (no download)
SOURCES = (*PHOTOS, "stereo_motorcycle", "clock", "brick", "grass", "gravel")


def patches(root: Path, per_source: int, train_per_source: int, size: int) -> dict[str, int]:
    """``root/train|val/<source>/<i>.jpg``: grey square patches (15–35 % of the short side) of
    each photograph in :data:`SOURCES`, resized to ``size`` px, a seeded draw; the first
    ``train_per_source`` of each source train. Returns the image counts per split."""
    from skimage import data

    rng = np.random.default_rng(0)
    counts = {"train": 0, "val": 0}
    for name in SOURCES:
        img = getattr(data, name)()
        img = Image.fromarray(img[0] if isinstance(img, tuple) else img).convert("L")
        w, h = img.size
        for i in range(per_source):
            s = int(min(w, h) * rng.uniform(0.15, 0.35))
            x, y = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
            split = "train" if i < train_per_source else "val"
            (root / split / name).mkdir(parents=True, exist_ok=True)
            patch = img.crop((x, y, x + s, y + s)).resize((size, size), Image.Resampling.BICUBIC)
            patch.save(root / split / name / f"{i:03d}.jpg", quality=92)
            counts[split] += 1
    return counts


def teacher_on_views(teacher: Path, student: Path, val: Path) -> dict[str, float]:
    """The teacher's top-1 accuracy on ``val`` through its own eval transform and through the
    student's, mapped to the teacher's input as ``zoo distill`` maps each training batch."""
    import torch

    from zoo.factory import create_model, info_of
    from zoo.images import list_images, open_image
    from zoo.train.distill import view_adapter
    from zoo.transforms import eval_transform

    model = create_model(str(teacher / "model")).eval()
    info = info_of(model)
    own = info.preprocessing()
    theirs = info_of(create_model(str(student / "model"))).preprocessing()
    names = list(info.label_names or ())
    paths = list_images(val)
    labels = torch.tensor([names.index(p.parent.name) for p in paths])
    adapt = view_adapter(theirs, own)
    out: dict[str, float] = {}
    for view, (pre, fn) in {"own": (own, lambda x: x), "student": (theirs, adapt)}.items():
        transform = eval_transform(pre)
        x = torch.stack([transform(open_image(p)) for p in paths])
        with torch.inference_mode():
            pred = torch.cat([model(fn(b)).argmax(1) for b in x.split(64)])
        out[view] = round(float((pred == labels).float().mean()), 4)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--teacher", default="mobilenet_v2", help="fine-tuned from its own weights")
    p.add_argument("--teacher-epochs", type=int, default=5)
    p.add_argument("--teacher-size", type=int, default=96, help="the teacher's --image-size")
    p.add_argument("--student", default="simple_cnn", help="trained from scratch")
    p.add_argument("--epochs", type=int, default=20, help="each student's budget")
    p.add_argument(
        "--kd",
        default="4:0.5,1:0.5",
        help="KD settings T:ALPHA, each an arm; the first (zoo distill's defaults) is the "
        "headline; T 1 for a teacher whose logits are already soft (see the docstring)",
    )
    p.add_argument("--per-source", type=int, default=60, help="patches of each photograph")
    p.add_argument("--train-per-source", type=int, default=20, help="of those, training ones")
    p.add_argument("--seeds", default="0,1,2", help="at least 3 for an interval")
    p.add_argument("--latency-rounds", type=int, default=3, help="alternating windows")
    p.add_argument("--latency-seconds", type=float, default=1.0, help="each window")
    p.add_argument("--out", default=None, help="default: docs/bench/distill_photos.json")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = [tuple(float(v) for v in kd.split(":")) for kd in args.kd.split(",")]
    names = [f"T{t:g}_a{a:g}".replace(".", "p") for t, a in arms]  # no dots: headline keys
    rec = Recording("distill_photos")
    quiet = ["--no-progress", "--no-report", "--num-workers", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        data, runs = Path(tmp) / "patches", Path(tmp) / "runs"
        counts = patches(data, args.per_source, args.train_per_source, 64)
        teacher = zoo_finetune(
            args.teacher,
            data,
            runs / "teacher",
            *("--epochs", str(args.teacher_epochs), "--image-size", str(args.teacher_size)),
            *quiet,
        ).extra["run"]
        teacher_report = report_of(teacher)
        teacher_temperature = teacher_report["calibration"]["temperature"]
        print(
            f"teacher: {teacher_report['best']['val/acc']:.4f}, T {teacher_temperature}", flush=True
        )
        budget = ["--epochs", str(args.epochs), *quiet]
        rows: list[dict[str, Any]] = []
        summary = None
        for seed in seeds:
            plain = zoo_finetune(
                args.student, data, runs / f"plain-{seed}", *budget, "--seed", str(seed)
            ).extra["report"]
            row: dict[str, Any] = {"seed": seed, "plain": plain["best"]["val/acc"]}
            best_epoch = {"plain": plain["best"]["epoch"]}  # where each run peaked
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
                best_epoch[name] = kd["best"]["epoch"]
            rows.append({**row, "best_epoch": best_epoch})
            print(f"seed {seed}: {row}", flush=True)
        assert summary is not None
        head_run = runs / f"{names[0]}-{seeds[0]}"
        views = teacher_on_views(teacher, head_run, data / "val")
        print(f"teacher on its own views / the student's: {views}", flush=True)
        latency = ort_latency(teacher, head_run, args.latency_rounds, args.latency_seconds)
    teacher_acc = summary["teacher"]["val_acc"]
    budget_key = f"e{args.epochs}"
    fig = compare(rows, names, teacher_acc)
    head = names[0]  # zoo distill's defaults: the headline, chosen before the run
    ci, gap = fig["kd_gain_interval"][head], fig["teacher_minus_kd_student"]
    size_ratio = summary["student"]["params"] / summary["teacher"]["params"]
    results = {
        "setup": {
            "task": f"which of {len(SOURCES)} photographs a grey 64 px patch comes from",
            "sources": list(SOURCES),
            "teacher": args.teacher,
            "teacher_epochs": args.teacher_epochs,
            "teacher_image_size": args.teacher_size,
            "student": args.student,
            "student_budgets_epochs": [args.epochs],
            "headline_budget": budget_key,
            "augment": True,
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
                f"--epochs {args.epochs} --seed S",
                f"zoo finetune {args.student} --data DIR --epochs {args.epochs} --seed S",
                "zoo export RUN (the teacher and the first seed's headline student)",
            ],
        },
        "teacher": summary["teacher"],
        "teacher_on_views": views,
        "teacher_calibration_temperature": round(teacher_temperature, 4),
        "student_size": {k: summary["student"][k] for k in ("params", "weights_mb")},
        "budgets": {budget_key: fig},
        "latency": latency,
        "verdict": f"at {args.epochs} epochs, KD ({head}) beats the plain student (the interval "
        "is above 0)"
        if ci["low"] is not None and ci["low"] > 0
        else f"at {args.epochs} epochs, no gain the seeds support (the interval reaches 0 or "
        "below)",
        "headlines": [
            headline(
                f"photos: {args.student} distilled from {args.teacher} ({head}, {args.epochs} "
                "epochs) vs trained alone, val accuracy gain (lower end of the seeds' 95% interval)",
                f"budgets.{budget_key}.kd_gain_interval.{head}.low",
                ci["low"],
                ">=",
                0.0,
                note="above 0: the seeds support a gain",
            ),
            headline(
                f"photos: {args.teacher} teacher minus the distilled {args.student} "
                f"({args.epochs} epochs), val accuracy (mean over seeds)",
                f"budgets.{budget_key}.teacher_minus_kd_student.mean",
                gap["mean"],
                "<=",
                0.02,
                note=f"student {size_ratio:.2f}× the teacher's parameters",
            ),
            headline(
                f"photos: the distilled {args.student}'s ORT CPU latency / the {args.teacher} "
                "teacher's, batch 1",
                "latency.student_over_teacher",
                latency["student_over_teacher"],
                "<=",
                0.3,
                note="the student the accuracy goal is about must be this fast",
            ),
        ],
    }
    rec.write(results, args.out)
    print(json.dumps({k: results[k] for k in ("teacher", "teacher_on_views", "verdict")}))
    print(json.dumps({k: fig[k] for k in ("mean", "kd_gain_interval")}))


if __name__ == "__main__":
    main()
