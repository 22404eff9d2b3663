"""GPU figures, measured side by side in one run (needs a CUDA device):

1. trainer throughput: `zoo finetune`'s Trainer vs a hand-written loop in the field guide's style,
   resnet18, batch 256, bf16 autocast, channels_last, same data, loader and workers;
   plus the same loop on synthetic GPU tensors (the compute ceiling, no data loading);
2. inference latency: eager vs torch.compile at batch 1 and 64 (fp32 and bf16);
3. parity of each CUDA path against CPU eager on real images (real ImageNet weights).

    python bench/gpu_bench.py --out gpu_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deploy.bench_harness import time_session
from train import TrainConfig, Trainer
from train.data import ImageFolderDataset, ResumableSampler, scan
from zoo import create_model
from zoo.factory import info_of
from zoo.samples import sample_image_paths, write_digits_folder
from zoo.transforms import eval_transform, train_transform


def make_data(root: Path, copies: int) -> Path:
    """sklearn's digits, written `copies` times (distinct files) as one image folder."""
    base = write_digits_folder(root / "base")
    data = root / "data"
    for cls in sorted(base.iterdir()):
        (data / cls.name).mkdir(parents=True, exist_ok=True)
        for f in cls.iterdir():
            for c in range(copies):
                dst = data / cls.name / f"{c}_{f.name}"
                if not dst.exists():
                    os.link(f, dst)
    return data


DEVICE = torch.device("cuda")


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def raw_loop(
    data: Path, *, batch: int, workers: int, epochs: int, synthetic: bool = False
) -> float:
    """The field guide's loop, written out by hand. Returns img/s of the last epoch."""
    device = DEVICE
    model = create_model("resnet18", weights="none", num_classes=10)
    info = info_of(model)
    model = model.to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    crit = nn.CrossEntropyLoss()
    torch.backends.cudnn.benchmark = True
    splits = scan(data)
    ds = ImageFolderDataset(splits.samples("train"), train_transform(info), seed=0)
    sampler = ResumableSampler(len(ds), shuffle=True, seed=0, batch_size=batch, drop_last=True)
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=batch,
        sampler=sampler,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
    )
    steps = sampler.batches_per_epoch()
    fake = (
        torch.randn(batch, 3, 224, 224, device=device).contiguous(
            memory_format=torch.channels_last
        ),
        torch.randint(0, 10, (batch,), device=device),
    )
    rate = 0.0
    for epoch in range(epochs):
        model.train()  # every epoch, per the guide
        sampler.set_epoch(epoch)
        t0, seen, running = time.perf_counter(), 0, 0.0
        batches = ((fake[0], fake[1], None) for _ in range(steps)) if synthetic else loader
        for x, y, _ in batches:
            x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = crit(model(x).float(), y)
            loss.backward()
            opt.step()
            running += loss.item()
            seen += len(y)
        _sync()
        rate = seen / (time.perf_counter() - t0)
    return rate


def trainer_run(
    data: Path, runs: Path, *, batch: int, workers: int, epochs: int
) -> dict[str, float]:
    cfg = TrainConfig(
        model="resnet18",
        data=str(data),
        weights="none",
        strategy="full",
        epochs=epochs,
        batch_size=batch,
        amp="bf16" if DEVICE.type == "cuda" else None,
        channels_last=True,
        num_workers=workers,
        device=DEVICE.type,
        runs_root=str(runs),
        progress=False,
        val_fraction=0.05,
    )
    run = Trainer(cfg).fit()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {"img_per_s": rows[-1]["img_per_s"], "data_wait": rows[-1]["data_wait"]}


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
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--smoke-cpu", action="store_true", help="tiny CPU run that only checks the script works")
    args = p.parse_args()
    global DEVICE
    if args.smoke_cpu:
        DEVICE = torch.device("cpu")
    else:
        assert torch.cuda.is_available(), "needs a CUDA device"
    report: dict[str, object] = {"device": torch.cuda.get_device_name(0) if DEVICE.type == "cuda" else "cpu",
                                 "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(Path(tmp), args.copies)
        kw = {"batch": args.batch, "workers": args.workers, "epochs": args.epochs}
        raw1 = raw_loop(data, **kw)
        tr = trainer_run(data, Path(tmp) / "runs", **kw)
        raw2 = raw_loop(data, **kw)
        ceiling = raw_loop(data, **{**kw, "epochs": 2}, synthetic=True)
        raw = (raw1 + raw2) / 2
        report["trainer"] = {
            "raw_img_per_s": [round(raw1), round(raw2)],
            "trainer_img_per_s": round(tr["img_per_s"]),
            "trainer_data_wait": round(tr["data_wait"], 3),
            "ratio_trainer_vs_raw": round(tr["img_per_s"] / raw, 3),
            "synthetic_ceiling_img_per_s": round(ceiling),
            "images": len(list(data.rglob("*.png"))),
        }
        print(json.dumps(report, indent=2), flush=True)
    if DEVICE.type == "cuda":
        report["latency"] = latency()
        report["parity"] = parity()
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
