"""Deploy figures on CPU, measured side by side in one run:

1. zoo's ORT runtime (`OnnxClassifier.run`) vs a raw `session.run` on the same session — goal ≤ 1.05;
2. exported ORT fp32 vs torch eager, ResNet-18, batch 1 — goal ≤ 0.6;
3. static int8 (QDQ) vs ORT fp32, ResNet-18, batch 1 — goal ≤ 0.45, both files timed here by one
   harness in alternating windows (this run's own fp32 baseline); and top-1 agreement of
   int8 with fp32 on real images — goal ≥ 98%. ResNet-18's ImageNet weights are not on this
   machine, so the latency ratio uses ResNet-18 at 224 px (weights do not change its speed) and
   agreement is measured twice on real weights: a ResNet-18 trained here on the real digits
   (64 px), and the real ImageNet MobileNetV2 on crops of real photographs;
4. ``zoo quantize --target-agreement 0.98`` on that MobileNetV2 (the calibration tried and
   chosen on the calibration crops, the most sensitive nodes kept float until 98% of the
   evaluation crops agree) — goal ≥ 98% agreement at ≤ 0.7× the fp32 latency, batch 1. The
   number of float nodes is chosen on the evaluation crops, so its agreement is the stopping
   rule's own figure, not an independent estimate.

Agreement samples are stratified and disjoint from calibration: digits, the same number of
evaluation images from every class of the val split and calibration images from every class of
the train split; photographs, calibration and evaluation crops cut from *different* source
photographs, the same number per photograph. The counts written are those the quantizer used
(read with the same sampling function, ``zoo.deploy.export.parity.real_images``).

    python bench/deploy_bench.py                # writes docs/bench/deploy_bench.json
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_path import ROOT  # noqa: F401
from common import PHOTOS, make_data, photo_crops, zoo_finetune
from provenance import Recording, headline

from zoo import create_model
from zoo.deploy.bench.harness import time_session
from zoo.deploy.export.onnx_export import export_onnx
from zoo.deploy.export.parity import real_images
from zoo.deploy.quantize.int8 import quantize as quantize_report
from zoo.deploy.quantize.options import QuantizeOptions
from zoo.deploy.quantize.verdict import wilson
from zoo.deploy.runtimes.loader import OnnxClassifier
from zoo.system import available_cpus

# photographs: evaluation and calibration crops come from different source photos
EVAL_PHOTOS = PHOTOS[0::2]
CALIB_PHOTOS = PHOTOS[1::2]


def quantize(*args: Any, **kw: Any) -> dict[str, Any]:
    """``zoo quantize --allow-drop --json``'s report: every setting is measured, none refused."""
    return quantize_report(QuantizeOptions(*args, allow_drop=True, **kw)).to_dict()


def stratified_split(data: Path, out: Path, val_per_class: int, seed: int) -> Path:
    """``out/train/<cls>`` and ``out/val/<cls>`` (hard links): per class, a seeded shuffle and
    ``val_per_class`` images to val, the rest to train."""
    rng = random.Random(seed)
    for cls in sorted(d for d in data.iterdir() if d.is_dir()):
        files = sorted(cls.iterdir())
        rng.shuffle(files)
        for split, part in (("val", files[:val_per_class]), ("train", files[val_per_class:])):
            (out / split / cls.name).mkdir(parents=True, exist_ok=True)
            for f in part:
                os.link(f, out / split / cls.name / f.name)
    return out


def sample_per_class(src: Path, dest: Path, per_class: int, seed: int) -> dict[str, int]:
    """``per_class`` images of every class folder of ``src`` linked into ``dest``."""
    rng = random.Random(seed)
    counts = {}
    for cls in sorted(d for d in src.iterdir() if d.is_dir()):
        files = sorted(cls.iterdir())
        pick = rng.sample(files, min(per_class, len(files)))
        (dest / cls.name).mkdir(parents=True, exist_ok=True)
        for f in pick:
            os.link(f, dest / cls.name / f.name)
        counts[cls.name] = len(pick)
    return counts


def used(folder: Path, limit: int) -> int:
    """How many images of ``folder`` the quantizer reads with this limit."""
    return len(real_images(str(folder), limit=limit))


def digits_resnet18(t: Path, threads: int, epochs: int) -> dict[str, object]:
    """ResNet-18 trained on the real digits (64 px) with `zoo finetune`, exported, quantized with
    train images as calibration, compared with fp32 on val images (class folders give accuracy)."""
    data = stratified_split(make_data(t / "digits_src", 1), t / "digits", 40, seed=0)
    run = t / "runs" / "r18-digits"
    options = ["--weights", "none", "--epochs", str(epochs), "--image-size", "64"]
    zoo_finetune("resnet18", data, run, *options, "-b", "64", "--num-workers", "1")
    export_onnx(str(run), run / "model" / "model.onnx", dynamic_batch=True)
    val, calib = t / "digits_eval", t / "digits_calib"
    eval_counts = sample_per_class(data / "val", val, 20, seed=1)
    calib_counts = sample_per_class(data / "train", calib, 18, seed=2)
    n_eval, n_calib = sum(eval_counts.values()), sum(calib_counts.values())
    q = quantize(
        run / "model" / "model.onnx",
        t / "digits.int8.onnx",
        mode="static",
        calib=str(calib),
        eval_data=str(val),
        threads=threads,
        per_channel=True,
        calib_size=n_calib,
    )
    if not q["n_images"] == used(val, 200) == n_eval:
        raise RuntimeError(f"the quantizer evaluated {q['n_images']} images, not all {n_eval}")
    return {
        "train": f"zoo finetune resnet18 --data DIGITS {' '.join(options)} -b 64 --num-workers 1",
        "top1_agreement": q["top1_agreement"],
        "agreement_ci95": wilson(q["top1_agreement"], q["n_images"]),
        "n_eval_images": q["n_images"],
        "eval_per_class": eval_counts,
        "n_calibration_images": used(calib, n_calib),
        "calibration_per_class": calib_counts,
        "calibration_disjoint_from_eval": True,
        "accuracy": q.get("accuracy"),
        "latency_ratio_64px": q["latency_ratio"],
    }


def target_row(q: dict[str, Any], seconds: float) -> dict[str, object]:
    """The figures of a ``--target-agreement`` run: the agreement with its interval (on the
    evaluation crops, where the float count was chosen), latency, float nodes, calibration."""
    s = q["search"]
    return {
        "target": s["target"],
        "top1_agreement": q["top1_agreement"],
        "agreement_ci95": q["agreement_ci95"],
        "n_eval_images": q["n_images"],
        "float_count_chosen_on": "the evaluation crops",
        "float_nodes": s["k"],
        "quantizable_nodes": s["sensitivity"]["candidates"],
        "float_ops": s["float_ops"],
        "calibration": {
            "method": s["calibration"]["method"],
            "per_channel": s["calibration"]["per_channel"],
            "symmetric_activations": s["calibration"]["symmetric_activations"],
        },
        "calibration_tried": s["calibration"]["tried"],
        "steps": s["steps"],
        "latency_ms": q["latency_ms"],
        "latency_ratio": q["latency_ratio"],
        "coverage": q["coverage"],
        "size_ratio": q["size_ratio"],
        "seconds": round(seconds, 1),
        "search_seconds": s["seconds"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--digits-epochs", type=int, default=4)
    p.add_argument("--out", default=None, help="default: docs/bench/deploy_bench.json")
    args = p.parse_args()
    rec = Recording("deploy_bench")
    threads = available_cpus()
    torch.set_num_threads(threads)
    result: dict[str, object] = {"threads": threads, "model": "resnet18", "image_size": 224}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        export_onnx("resnet18", t / "r18.onnx", dynamic_batch=True, weights="none")
        eval_dir, calib_dir = t / "photo_eval", t / "photo_calib"
        eval_counts = photo_crops(eval_dir, EVAL_PHOTOS, 24, seed=0)
        calib_counts = photo_crops(calib_dir, CALIB_PHOTOS, 16, seed=1)
        n_eval, n_calib = sum(eval_counts.values()), sum(calib_counts.values())

        # 1. runtime overhead: same session, same input, alternating windows
        clf = OnnxClassifier(t / "r18.onnx", threads=threads)
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        feed = {clf.input.name: x}
        zoo_t, raw_t = [], []
        for _ in range(3):
            window = args.seconds / 3
            raw_t.append(
                time_session(lambda: clf.session.run(None, feed), min_seconds=window)["p50_ms"]
            )
            zoo_t.append(time_session(lambda: clf.run(x), min_seconds=window)["p50_ms"])
        result["runtime_vs_raw"] = {
            "zoo_p50_ms": zoo_t,
            "raw_p50_ms": raw_t,
            "zoo_median_ms": round(float(np.median(zoo_t)), 3),
            "raw_median_ms": round(float(np.median(raw_t)), 3),
            "ratio": round(float(np.median(zoo_t) / np.median(raw_t)), 3),
        }

        # 2. ORT fp32 vs torch eager, batch 1
        model = create_model("resnet18", weights="none").eval()
        xt = torch.from_numpy(x)
        with torch.inference_mode():
            eager = time_session(lambda: model(xt), min_seconds=args.seconds)
        ort32 = time_session(lambda: clf.run(x), min_seconds=args.seconds)
        result["ort_fp32_vs_eager"] = {
            "eager_p50_ms": eager["p50_ms"],
            "ort_p50_ms": ort32["p50_ms"],
            "ratio": round(ort32["p50_ms"] / eager["p50_ms"], 3),
        }

        # 3. static int8 vs fp32: ResNet-18 latency, MobileNetV2 (real weights) agreement
        # every static quantization below: the same calibration and evaluation images
        static = partial(
            quantize,
            mode="static",
            calib=str(calib_dir),
            eval_data=str(eval_dir),
            threads=threads,
            calib_size=n_calib,
        )
        q18 = static(t / "r18.onnx", t / "r18.int8.onnx")
        export_onnx("mobilenet_v2", t / "mb.onnx", dynamic_batch=True)
        qmb = static(t / "mb.onnx", t / "mb.int8.onnx", method="minmax", per_channel=True)
        # the same images, NNCF's ranges (zoo quantize --engine nncf)
        nncf_mb = static(t / "mb.onnx", t / "mb.nncf.onnx", engine="nncf")
        # and each weight width forced (--weight-bits): what zoo's choice between them is worth
        nncf_bits = {
            bits: static(t / "mb.onnx", t / f"mb.nncf{bits}.onnx", engine="nncf", weight_bits=bits)
            for bits in (7, 8)
        }
        # the same images, the search (zoo quantize --target-agreement 0.98)
        started = time.perf_counter()
        search_mb = static(t / "mb.onnx", t / "mb.search.onnx", target_agreement=0.98)
        search_s = time.perf_counter() - started
        dyn = quantize(
            t / "r18.onnx",
            t / "r18.dyn.onnx",
            mode="dynamic",
            eval_data=str(eval_dir),
            threads=threads,
        )
        # the ratio against this run's own fp32 baseline: the int8 file and the fp32 file
        # timed by one harness, same threads, in alternating windows (the quantize report's
        # own fp32 timing is another session, measured at another moment: kept for reference)
        clf8 = OnnxClassifier(t / "r18.int8.onnx", threads=threads)
        fp32_t, int8_t = [], []
        for _ in range(3):
            window = args.seconds / 3
            fp32_t.append(time_session(lambda: clf.run(x), min_seconds=window)["p50_ms"])
            int8_t.append(time_session(lambda: clf8.run(x), min_seconds=window)["p50_ms"])
        result["int8_static_resnet18"] = {
            "latency_ms": {
                "fp32_p50": round(float(np.median(fp32_t)), 3),
                "int8_p50": round(float(np.median(int8_t)), 3),
                "fp32_windows": fp32_t,
                "int8_windows": int8_t,
            },
            "ratio": round(float(np.median(int8_t) / np.median(fp32_t)), 3),
            "baseline": "this run: fp32 and int8 in 3 alternating windows, one harness",
            "quantize_report_latency_ms": q18["latency_ms"],
            "quantize_report_ratio": q18["latency_ratio"],
            "size_ratio": q18["size_ratio"],
            "coverage": q18["coverage"],
        }
        result["int8_static_mobilenet_v2_real_weights"] = {
            "method": "minmax",
            "per_channel": True,
            "top1_agreement": qmb["top1_agreement"],
            "agreement_ci95": wilson(qmb["top1_agreement"], qmb["n_images"]),
            "n_eval_images": qmb["n_images"],
            "eval_photos": eval_counts,
            "n_calibration_images": used(calib_dir, n_calib),
            "calibration_photos": calib_counts,
            "calibration_disjoint_from_eval": not set(eval_counts) & set(calib_counts),
            "latency_ratio": qmb["latency_ratio"],
        }
        result["int8_static_mobilenet_v2_nncf"] = {
            "engine": "nncf",
            "top1_agreement": nncf_mb["top1_agreement"],
            "agreement_ci95": nncf_mb["agreement_ci95"],
            "n_eval_images": nncf_mb["n_images"],
            "latency_ms": nncf_mb["latency_ms"],
            "latency_ratio": nncf_mb["latency_ratio"],
            "coverage": nncf_mb["coverage"],
            "weight_bits": nncf_mb["weight_bits"],
            # zoo's choice where the CPU has no VNNI: agreement on the calibration crops
            "weight_bits_agreement_on_calibration": nncf_mb["weight_bits_agreement"],
            "top1_agreement_by_weight_bits": {
                str(b): r["top1_agreement"] for b, r in nncf_bits.items()
            },
            "latency_ratio_by_weight_bits": {
                str(b): r["latency_ratio"] for b, r in nncf_bits.items()
            },
        }
        result["int8_static_mobilenet_v2_target_agreement"] = target_row(search_mb, search_s)
        if qmb["n_images"] != n_eval:
            raise RuntimeError(f"the quantizer evaluated {qmb['n_images']} images, not {n_eval}")
        result["int8_dynamic_resnet18"] = {
            "latency_ratio": dyn["latency_ratio"],
            "advice": dyn.get("advice_after"),
        }
        result["int8_static_resnet18_digits"] = digits_resnet18(t, threads, args.digits_epochs)
    d18 = result["int8_static_resnet18_digits"]
    mb = result["int8_static_mobilenet_v2_real_weights"]
    result["headlines"] = [
        headline(
            "zoo ORT runtime vs raw `session.run`",
            "runtime_vs_raw.ratio",
            result["runtime_vs_raw"]["ratio"],  # type: ignore[index]
            "<=",
            1.05,
        ),
        headline(
            "ORT fp32 vs torch eager, ResNet-18, batch 1",
            "ort_fp32_vs_eager.ratio",
            result["ort_fp32_vs_eager"]["ratio"],  # type: ignore[index]
            "<=",
            0.6,
        ),
        headline(
            "static int8 vs ORT fp32 latency, ResNet-18, batch 1",
            "int8_static_resnet18.ratio",
            result["int8_static_resnet18"]["ratio"],  # type: ignore[index]
            "<=",
            0.45,
        ),
        headline(
            "int8 top-1 agreement, ResNet-18 trained on the digits",
            "int8_static_resnet18_digits.top1_agreement",
            d18["top1_agreement"],  # type: ignore[index]
            ">=",
            0.98,
        ),
        headline(
            "int8 top-1 agreement, MobileNetV2 ImageNet weights, photo crops",
            "int8_static_mobilenet_v2_real_weights.top1_agreement",
            mb["top1_agreement"],  # type: ignore[index]
            ">=",
            0.98,
        ),
        headline(
            "int8 top-1 agreement, MobileNetV2 ImageNet weights, photo crops, --engine nncf",
            "int8_static_mobilenet_v2_nncf.top1_agreement",
            result["int8_static_mobilenet_v2_nncf"]["top1_agreement"],  # type: ignore[index]
            ">=",
            0.98,
        ),
        headline(
            "int8 (--engine nncf) vs ORT fp32 latency, MobileNetV2, batch 1",
            "int8_static_mobilenet_v2_nncf.latency_ratio",
            result["int8_static_mobilenet_v2_nncf"]["latency_ratio"],  # type: ignore[index]
            "<=",
            0.7,
        ),
        headline(
            "int8 top-1 agreement, MobileNetV2, photo crops, --target-agreement 0.98",
            "int8_static_mobilenet_v2_target_agreement.top1_agreement",
            result["int8_static_mobilenet_v2_target_agreement"]["top1_agreement"],  # type: ignore[index]
            ">=",
            0.98,
        ),
        headline(
            "int8 (--target-agreement 0.98) vs ORT fp32 latency, MobileNetV2, batch 1",
            "int8_static_mobilenet_v2_target_agreement.latency_ratio",
            result["int8_static_mobilenet_v2_target_agreement"]["latency_ratio"],  # type: ignore[index]
            "<=",
            0.7,
        ),
    ]
    path = rec.write(result, args.out)
    print(path.read_text())


if __name__ == "__main__":
    main()
