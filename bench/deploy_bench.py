"""Deploy figures on CPU, measured side by side in one run:

1. zoo's ORT runtime (`OnnxClassifier.run`) vs a raw `session.run` on the same session — goal ≤ 1.05;
2. exported ORT fp32 vs torch eager, ResNet-18, batch 1 — goal ≤ 0.6;
3. static int8 (QDQ) vs ORT fp32, ResNet-18, batch 1 — goal ≤ 0.45; and top-1 agreement of
   int8 with fp32 on real images — goal ≥ 98%. ResNet-18's ImageNet weights are not on this
   machine, so the latency ratio uses ResNet-18 at 224 px (weights do not change its speed) and
   agreement is measured twice on real weights: a ResNet-18 trained here on the real digits
   (64 px, its val split), and the real ImageNet MobileNetV2 on crops of real photographs.

    python bench/deploy_bench.py
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from bench_path import ROOT  # noqa: F401
from PIL import Image

from zoo import create_model
from zoo.deploy.bench_harness import time_session
from zoo.deploy.export import export_onnx
from zoo.deploy.quantize import quantize
from zoo.deploy.runtime import OnnxClassifier
from zoo.system import available_cpus


def real_photos(out: Path, per_image: int, seed: int) -> Path:
    """Random crops of scikit-image's real photographs (public domain), as JPEG files."""
    from skimage import data

    # the photographs shipped inside scikit-image (no download needed)
    names = [
        "astronaut",
        "chelsea",
        "coffee",
        "rocket",
        "cat",
        "camera",
        "coins",
        "moon",
        "hubble_deep_field",
        "immunohistochemistry",
    ]
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        try:
            img = Image.fromarray(getattr(data, name)()).convert("RGB")
        except Exception:  # a few images need optional downloads (pooch); skip those
            continue
        for i in range(per_image):
            w, h = img.size
            s = int(min(w, h) * rng.uniform(0.5, 1.0))
            x, y = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
            img.crop((x, y, x + s, y + s)).save(out / f"{name}_{i}.jpg", quality=92)
    return out


def digits_resnet18(t: Path, threads: int) -> dict[str, object]:
    """ResNet-18 trained on the real digits (64 px), exported, quantized with train images as
    calibration, and compared with fp32 on the val images (class folders give accuracy)."""
    from common import make_data

    from zoo.train import TrainConfig, Trainer
    from zoo.train.data import scan

    data = make_data(t / "digits", 1)
    cfg = TrainConfig(
        model="resnet18",
        data=str(data),
        weights="none",
        epochs=4,
        image_size=64,
        batch_size=64,
        runs_root=str(t / "runs"),
        progress=False,
        num_workers=1,
    )
    run = Trainer(cfg).fit()
    export_onnx(str(run), run / "model" / "model.onnx", dynamic_batch=True)
    splits = scan(data, seed=0)
    val, calib = t / "digits_val", t / "digits_calib"
    for split, dest in (("val", val), ("train", calib)):
        for rel, cls in splits.files[split][:: 1 if split == "val" else 8]:
            (dest / cls).mkdir(parents=True, exist_ok=True)
            (dest / cls / Path(rel).name).symlink_to(data / rel)
    q = quantize(
        run / "model" / "model.onnx",
        t / "digits.int8.onnx",
        mode="static",
        calib=str(calib),
        eval_data=str(val),
        threads=threads,
        per_channel=True,
    )
    return {
        "top1_agreement": q["top1_agreement"],
        "n_images": q["n_images"],
        "accuracy": q.get("accuracy"),
        "latency_ratio_64px": q["latency_ratio"],
        "goal": "agreement >= 0.98",
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args()
    threads = available_cpus()
    torch.set_num_threads(threads)
    result: dict[str, object] = {"threads": threads}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        export_onnx("resnet18", t / "r18.onnx", dynamic_batch=True, weights="none")
        eval_dir, calib_dir = real_photos(t / "eval", 12, 0), real_photos(t / "calib", 8, 1)

        # 1. runtime overhead: same session, same input, alternating windows
        clf = OnnxClassifier(t / "r18.onnx", threads=threads)
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        feed = {clf.input.name: x}
        zoo_t, raw_t = [], []
        for _ in range(3):
            raw_t.append(
                time_session(lambda: clf.session.run(None, feed), min_seconds=args.seconds / 3)[
                    "p50_ms"
                ]
            )
            zoo_t.append(time_session(lambda: clf.run(x), min_seconds=args.seconds / 3)["p50_ms"])
        result["runtime_vs_raw"] = {
            "zoo_p50_ms": zoo_t,
            "raw_p50_ms": raw_t,
            "ratio": round(float(np.median(zoo_t) / np.median(raw_t)), 3),
            "goal": "<= 1.05",
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
            "goal": "<= 0.6",
        }

        # 3. static int8 vs fp32: ResNet-18 latency, MobileNetV2 (real weights) agreement
        q18 = quantize(
            t / "r18.onnx",
            t / "r18.int8.onnx",
            mode="static",
            calib=str(calib_dir),
            eval_data=str(eval_dir),
            threads=threads,
        )
        export_onnx("mobilenet_v2", t / "mb.onnx", dynamic_batch=True)
        qmb = quantize(
            t / "mb.onnx",
            t / "mb.int8.onnx",
            mode="static",
            calib=str(calib_dir),
            eval_data=str(eval_dir),
            threads=threads,
            method="minmax",
            per_channel=True,
            calib_size=200,
        )
        dyn = quantize(
            t / "r18.onnx",
            t / "r18.dyn.onnx",
            mode="dynamic",
            eval_data=str(eval_dir),
            threads=threads,
        )
        result["int8_static_resnet18_digits"] = digits_resnet18(t, threads)
        result["int8_static_resnet18"] = {
            "latency_ms": q18["latency_ms"],
            "ratio": q18["latency_ratio"],
            "size_ratio": q18["size_ratio"],
            "coverage": q18["coverage"],
            "goal": "<= 0.45",
        }
        result["int8_static_mobilenet_v2_real_weights"] = {
            "top1_agreement": qmb["top1_agreement"],
            "n_images": qmb["n_images"],
            "latency_ratio": qmb["latency_ratio"],
            "goal": ">= 0.98",
        }
        result["int8_dynamic_resnet18"] = {
            "latency_ratio": dyn["latency_ratio"],
            "advice": dyn.get("advice_after"),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
