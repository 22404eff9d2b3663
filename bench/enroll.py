"""A class from five images (issue #33): ``zoo enroll`` on real runs, judged on held-out images.

Digits: per seed, one digit is left out (it changes with the seed); the other nine are split
train / val / test per class and ``zoo finetune MODEL --reject auto`` trains on train (val
picks the epoch and fits the calibration). ``zoo enroll RUN --class digit_N`` adds the
left-out digit from five of its images (a seeded draw); its other images are the held-out
ones. Reported per seed, on images no step saw: the new class's recall (held-out images
answered with it), the old classes' top-1 on their test images before and after (and the
change, paired by seed, with its 95 % t interval), the share of held-out new-class images the
enrolled model's rejection rule accepts (refitted by ``zoo enroll`` on val) next to what the
rule fitted before enrolment would accept, and the same figures for two simpler recipes
computed from the same embeddings (the ablation: Qi et al.'s plain imprint, the centred
imprint without the fit, the fit on the eval views alone, and with augmented views but no cap
on the bias) — the measured reason for the default.

Faces: scikit-image's ``lfw_subset`` has 100 faces and 100 non-faces but no identities, so
no person can be enrolled; what it allows is a *category*: a photos model (the photos
example, pretrained MobileNetV2) enrols ``face`` from five faces; the other 95 are the
held-out faces, and the 100 non-faces (background crops of the same photographs) say whether
the class learnt "face" or "small grey crop".

Accuracy figures, not timings: the machine's load does not change them.

    python bench/enroll.py                       # writes docs/bench/enroll.json
    python bench/enroll.py --seeds 0 --epochs 1 --no-faces --out /tmp/enroll.json  # a smoke
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import t_interval, zoo_cmd, zoo_finetune
from ood import SPLIT, split_folder
from provenance import Recording, headline

from zoo.samples import write_digits_folder, write_photo_folder

SHOTS = 5
NEW_DIGITS = (9, 4, 7, 2, 5)  # the left-out digit of seed i: NEW_DIGITS[i % 5]


def split_old(flat: Path, root: Path, classes: list[str], seed: int) -> Path:
    """``root/train|val|test/<class>/`` for ``classes`` (sorted) of ``flat`` only: ood's
    seeded split over a view of those class folders."""
    view = root.parent / f".{root.name}-classes"
    view.mkdir(parents=True)
    for cls in classes:
        (view / cls).symlink_to(flat / cls, target_is_directory=True)
    return split_folder(view, root, seed)


def enroll_cli(run: Path, name: str, shots: list[Path]) -> dict[str, Any]:
    """``zoo enroll RUN --class NAME SHOTS --json``'s result."""
    argv = [*zoo_cmd(), "enroll", str(run), "--class", name, *map(str, shots), "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"zoo enroll failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def embed(model: Path) -> tuple[Any, Any]:
    """The model (zoo.create_model) and its ``paths → (logits, embeddings)``."""
    from zoo.factory import create_model, info_of
    from zoo.train.enroll_images import embedder

    net = create_model(str(model)).eval()
    return net, embedder(net, info_of(net), "cpu")


def accepted(cal: Any, bank: Any, logits: np.ndarray, feats: np.ndarray) -> float:
    """The share of images a calibration's rule accepts (a knn rule scores ``feats`` against
    ``bank``, the one stored with that model)."""
    rule = cal.reject
    s = rule.scores(logits, cal.temperature, bank.scores(feats) if bank is not None else None)
    return round(float((s >= rule.threshold).mean()), 4)


def plain_imprint(pos: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> tuple[Any, float]:
    """Qi et al. 2018 as written for a cosine head: the mean normalised embedding at the
    rows' mean norm, the mean bias (the baseline ``zoo enroll`` improves on)."""
    u = pos / np.linalg.norm(pos, axis=1, keepdims=True)
    m = u.mean(0) / np.linalg.norm(u.mean(0))
    return m * np.linalg.norm(weight, axis=1).mean(), float(bias.mean())


def judge(
    old_logits: np.ndarray, old_y: np.ndarray, new_logits: np.ndarray, new: int
) -> dict[str, float]:
    return {
        "recall": round(float((new_logits.argmax(1) == new).mean()), 4),
        "old_acc": round(float((old_logits.argmax(1) == old_y).mean()), 4),
    }


def measure(
    run: Path,
    enrolled: Path,
    name: str,
    shots: list[Path],
    old_test: list[tuple[Path, int]],
    held_out: list[Path],
    outside: list[Path] | None = None,
) -> dict[str, Any]:
    """The enrolled model (and the two simpler recipes) on images no step saw."""
    from zoo.artifact import read_config
    from zoo.ref import ModelRef
    from zoo.train.enroll_images import reference_images

    net, run_embed = embed(run)
    run_folder = ModelRef.parse(str(run)).model_folder
    run_config = read_config(run_folder)  # the classes before enrolment
    classes = list(run_config.class_names)
    new = len(classes)
    y = np.array([i for _, i in old_test])
    before, f_old = run_embed([p for p, _ in old_test])
    _, f_new = run_embed(held_out)
    _, f_pos = run_embed(shots)
    head = net.get_submodule(net.zoo_info.classifier)
    w, b = head.weight.detach().double().numpy(), head.bias.detach().double().numpy()

    _, after_embed = embed(enrolled)
    after_old, g_old = after_embed([p for p, _ in old_test])
    after_new, g_new = after_embed(held_out)
    result: dict[str, Any] = {
        "n_old_test": len(old_test),
        "n_held_out": len(held_out),
        "old_acc_before": round(float((before.argmax(1) == y).mean()), 4),
        **judge(after_old, y, after_new, new),
    }
    result["old_acc_change"] = round(result["old_acc"] - result["old_acc_before"], 4)
    if outside:
        after_out, _ = after_embed(outside)
        result["outside_answered_new"] = round(float((after_out.argmax(1) == new).mean()), 4)
        result["n_outside"] = len(outside)

    # the rejection rule: refitted by zoo enroll on val, and the one fitted before enrolment
    cal_after = read_config(enrolled).calibration
    cal_before = read_config(ModelRef.parse(str(run)).model_folder).calibration
    if cal_after and cal_after.reject and cal_before and cal_before.reject:
        from zoo.knn import KnnBank

        for key, cal, folder in (
            ("rule_refit", cal_after, enrolled),
            ("rule_before", cal_before, ModelRef.parse(str(run)).model_folder),
        ):
            rule = cal.reject
            assert rule is not None
            bank = KnnBank.load(folder) if rule.score == "knn" else None  # its own bank
            result[key] = {
                "threshold": round(rule.threshold, 6),
                "score": rule.score,
                "accepted_held_out": accepted(cal, bank, after_new, g_new),
                "accepted_old_test": accepted(cal, bank, after_old, g_old),
            }

    # the ablation, from the same embeddings and the same reference images zoo enroll used
    from zoo.train.enroll_images import (
        REFERENCE_VIEWS,
        VIEWS,
        old_class_validation,
        view_embedder,
    )
    from zoo.train.imprint import cap_bias, fit_new_row

    ref = reference_images(str(run), run_folder, run_config, None)
    _, f_ref = run_embed(list(ref.paths))
    labels = np.asarray(ref.labels)
    fitted = fit_new_row(f_pos, f_ref, labels, w, b)
    views = view_embedder(net, net.zoo_info, "cpu")
    with_views = fit_new_row(
        np.concatenate([f_pos, views(shots, VIEWS)]),
        np.concatenate([f_ref, views(list(ref.paths), REFERENCE_VIEWS)]),
        np.concatenate([labels, np.repeat(labels, REFERENCE_VIEWS)]),
        w,
        b,
    )
    val = old_class_validation(run, run_embed, classes)
    assert val is not None
    capped = cap_bias(with_views, val.features, val.logits, val.labels)
    recipes = {
        "plain_imprint": plain_imprint(f_pos, w, b),
        "centred_imprint": (fitted.imprinted, fitted.imprinted_bias),
        "centred_imprint_then_fit": (fitted.weight, fitted.bias),
        "then_fit_with_views": (with_views.weight, with_views.bias),
        "then_fit_with_views_bias_capped": (capped.weight, capped.bias),
    }
    ablation = {}
    for key, (row, bias) in recipes.items():
        lo_old = np.concatenate([before, (f_old @ row + bias)[:, None]], 1)
        lo_new = np.concatenate([f_new @ w.T + b, (f_new @ row + bias)[:, None]], 1)
        ablation[key] = judge(lo_old, y, lo_new, new)
    result["ablation"] = ablation
    return result


def digits_seed(t: Path, digits: Path, model: str, seed: int, i: int, epochs: int) -> dict:
    new_digit = NEW_DIGITS[i % len(NEW_DIGITS)]
    name = f"digit_{new_digit}"
    old = [f"digit_{d}" for d in range(10) if d != new_digit]
    root = split_old(digits, t / f"digits-{seed}", old, seed)
    pool = sorted((digits / name).iterdir())
    random.Random(seed).shuffle(pool)
    shots, held_out = pool[:SHOTS], pool[SHOTS:]
    run = t / "runs" / f"digits-{seed}"
    opts = ["--epochs", str(epochs), "--seed", str(seed), "--no-progress", "--no-report"]
    zoo_finetune(model, root, run, *opts, "--reject", "auto")
    cli = enroll_cli(run, name, shots)
    old_test = [(p, old.index(c)) for c in old for p in sorted((root / "test" / c).iterdir())]
    row = measure(run, Path(cli["out"]), name, shots, old_test, held_out)
    return {"seed": seed, "new_class": name, "enroll": cli, **row}


def faces_seed(t: Path, photos: Path, seed: int, epochs: int) -> dict:
    from PIL import Image
    from skimage.data import lfw_subset

    lfw = lfw_subset()
    faces_dir, other_dir = t / "lfw" / "face", t / "lfw" / "non_face"
    if not faces_dir.exists():
        for folder, arrays in ((faces_dir, lfw[:100]), (other_dir, lfw[100:])):
            folder.mkdir(parents=True)
            for k, a in enumerate(arrays):
                Image.fromarray(np.asarray(a * 255 if a.max() <= 1 else a, np.uint8)).save(
                    folder / f"{k:03d}.png"
                )
    classes = sorted(p.name for p in photos.iterdir())
    root = split_old(photos, t / f"photos-{seed}", classes, seed)
    faces = sorted(faces_dir.iterdir())
    random.Random(seed).shuffle(faces)
    shots, held_out = faces[:SHOTS], faces[SHOTS:]
    run = t / "runs" / f"photos-{seed}"
    opts = ["--epochs", str(epochs), "--seed", str(seed), "--no-progress", "--no-report"]
    zoo_finetune("mobilenet_v2", root, run, *opts, "--image-size", "96", "--reject", "auto")
    cli = enroll_cli(run, "face", shots)
    old_test = [
        (p, classes.index(c)) for c in classes for p in sorted((root / "test" / c).iterdir())
    ]
    outside = sorted(other_dir.iterdir())
    row = measure(run, Path(cli["out"]), "face", shots, old_test, held_out, outside)
    return {"seed": seed, "new_class": "face", "enroll": cli, **row}


def summarise(rows: list[dict]) -> dict[str, Any]:
    def mean(key: str) -> float:
        return round(float(np.mean([r[key] for r in rows])), 4)

    out = {
        "recall": t_interval([r["recall"] for r in rows]),
        "old_acc_change": t_interval([r["old_acc_change"] for r in rows]),
        "old_acc_before": mean("old_acc_before"),
        "old_acc": mean("old_acc"),
        "min_recall": min(r["recall"] for r in rows),
        "ablation": {
            k: {
                "recall": round(float(np.mean([r["ablation"][k]["recall"] for r in rows])), 4),
                "old_acc_change": round(
                    float(
                        np.mean([r["ablation"][k]["old_acc"] - r["old_acc_before"] for r in rows])
                    ),
                    4,
                ),
            }
            for k in rows[0]["ablation"]
        },
    }
    for key in ("rule_refit", "rule_before"):
        if all(key in r for r in rows):
            out[key] = {
                k: round(float(np.mean([r[key][k] for r in rows])), 4)
                for k in ("accepted_held_out", "accepted_old_test")
            }
    if all("outside_answered_new" in r for r in rows):
        out["outside_answered_new"] = mean("outside_answered_new")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="simple_cnn")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument(
        "--seeds", default="0,1,2,3,4", help="at least 3 (each leaves out another digit)"
    )
    p.add_argument("--faces", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--face-epochs", type=int, default=2)
    p.add_argument("--photos-per-class", type=int, default=60)
    p.add_argument("--out", default=None, help="default: docs/bench/enroll.json")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rec = Recording("enroll")
    runs: dict[str, list[dict]] = {"digits": [], "faces": []}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        digits = write_digits_folder(t / "flat" / "digits")
        for i, seed in enumerate(seeds):
            row = digits_seed(t, digits, args.model, seed, i, args.epochs)
            runs["digits"].append(row)
            print(
                f"digits seed {seed}: {json.dumps({k: v for k, v in row.items() if k != 'enroll'})}",
                flush=True,
            )
        if args.faces:
            photos = write_photo_folder(t / "flat" / "photos", per_class=args.photos_per_class)
            for seed in seeds:
                row = faces_seed(t, photos, seed, args.face_epochs)
                runs["faces"].append(row)
                print(
                    f"faces seed {seed}: {json.dumps({k: v for k, v in row.items() if k != 'enroll'})}",
                    flush=True,
                )
    summary = {k: summarise(v) for k, v in runs.items() if v}
    d = summary["digits"]
    change = d["old_acc_change"]
    heads = [
        headline(
            f"digits: recall of a class enrolled from {SHOTS} images (held-out images, mean "
            "over seeds)",
            "summary.digits.recall.mean",
            d["recall"]["mean"],
            ">=",
            0.8,
        ),
        headline(
            "digits: old classes' top-1 change after enrolment (test images; 95% t interval's "
            "lower end)",
            f"summary.digits.old_acc_change.{'low' if change['low'] is not None else 'mean'}",
            change["low"] if change["low"] is not None else change["mean"],
            ">=",
            -0.02,
            note="paired by seed: the same test images before and after"
            + ("" if change["low"] is not None else "; one seed: its mean, no interval"),
        ),
    ]
    results = {
        "setup": {
            "model": args.model,
            "epochs": args.epochs,
            "seeds": seeds,
            "shots": SHOTS,
            "new_digits": [NEW_DIGITS[i % len(NEW_DIGITS)] for i in range(len(seeds))],
            "split": {"train": 1 - sum(SPLIT.values()), **SPLIT},
            "faces": args.faces,
            "face_model": "mobilenet_v2 (ImageNet weights), --image-size 96",
            "face_epochs": args.face_epochs,
            "photos_per_class": args.photos_per_class,
            "command": f"zoo finetune {args.model} --data OLD --epochs {args.epochs} --seed S "
            "--reject auto; zoo enroll RUN --class NEW 5 IMAGES --json",
        },
        "runs": runs,
        "summary": summary,
        "headlines": heads,
    }
    rec.write(results, args.out)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
