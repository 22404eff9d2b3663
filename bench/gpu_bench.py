"""GPU figures, measured side by side in one run (needs a CUDA device):

1. trainer throughput: zoo's Trainer vs a hand-written loop in the field guide's style, resnet18,
   batch 256, bf16 autocast, channels_last, same data, loader and workers; plus the same loop on
   synthetic GPU tensors (the compute ceiling, no data loading);
2. inference latency: eager vs torch.compile at batch 1 and 64;
3. parity of each CUDA path against CPU eager on real images (real ImageNet weights).

    python bench/gpu_bench.py --out gpu_bench.json          (bench/run_gpu_checks.sh runs it)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import Job, make_data, n_train, raw_loop, trainer_run
from torch import nn

from zoo import create_model
from zoo.deploy.bench_harness import time_session
from zoo.factory import info_of
from zoo.samples import sample_image_paths
from zoo.transforms import eval_transform


def latency() -> list[dict[str, object]]:
    out = []
    for dtype in (torch.float32,):
        model = create_model("resnet18", weights="none").cuda().eval().to(dtype)
        compiled = torch.compile(model)
        for bs in (1, 64):
            x = torch.randn(bs, 3, 224, 224, device="cuda", dtype=dtype)
            with torch.inference_mode():
                t0 = time.perf_counter()
                compiled(x)
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0
                e = time_session(lambda m=model, x=x: m(x), cuda=True, min_seconds=0.5)
                c = time_session(lambda m=compiled, x=x: m(x), cuda=True, min_seconds=0.5)
            out.append(
                {
                    "dtype": str(dtype).split(".")[1],
                    "batch": bs,
                    "eager_p50_ms": e["p50_ms"],
                    "compiled_p50_ms": c["p50_ms"],
                    "speedup": round(e["p50_ms"] / c["p50_ms"], 2),
                    "compile_s": round(compile_s, 1),
                }
            )
    return out


def parity() -> dict[str, object]:
    info = info_of(create_model("mobilenet_v2"))
    tf = eval_transform(info)
    from PIL import Image

    x = torch.stack([tf(Image.open(p)) for p in sample_image_paths()])
    cpu = create_model("mobilenet_v2")
    with torch.inference_mode():
        ref = cpu(x)
        gpu = create_model("mobilenet_v2").cuda()
        paths = {
            "eager": gpu,
            "compile": torch.compile(create_model("mobilenet_v2").cuda()),
            "torchscript": torch.jit.trace(gpu, x.cuda()),
            "bf16_autocast": lambda t: _autocast(gpu, t),
        }
        result = {}
        for name, fn in paths.items():
            y = fn(x.cuda()).float().cpu()
            result[name] = {
                "max_abs": float((y - ref).abs().max()),
                "top1_agree": bool(torch.equal(y.argmax(1), ref.argmax(1))),
            }
    return result


def _autocast(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return model(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="gpu_bench.json")
    p.add_argument("--copies", type=int, default=6)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument(
        "--smoke-cpu", action="store_true", help="tiny CPU run that only checks the script works"
    )
    args = p.parse_args()
    device = "cpu" if args.smoke_cpu else "cuda"
    if not args.smoke_cpu:
        assert torch.cuda.is_available(), "needs a CUDA device"
    report: dict[str, object] = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(
            make_data(Path(tmp), args.copies),
            batch=args.batch,
            workers=args.workers,
            epochs=args.epochs,
            device=device,
            bf16=device == "cuda",
            channels_last=True,
        )
        n = n_train(job)
        raw1 = n / raw_loop(job)[-1]
        rows = trainer_run(job, Path(tmp) / "runs", val_fraction=0.2)
        raw2 = n / raw_loop(job)[-1]
        ceiling = n / raw_loop(job, synthetic=True)[-1]
        raw = (raw1 + raw2) / 2
        tr = rows[-1]
        report["trainer"] = {
            "raw_img_per_s": [round(raw1), round(raw2)],
            "trainer_img_per_s": round(tr["img_per_s"]),
            "trainer_data_wait": round(tr["data_wait"], 3),
            "ratio_trainer_vs_raw": round(tr["img_per_s"] / raw, 3),
            "synthetic_ceiling_img_per_s": round(ceiling),
            "train_images": n,
        }
        print(json.dumps(report, indent=2), flush=True)
    if device == "cuda":
        report["latency"] = latency()
        report["parity"] = parity()
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
