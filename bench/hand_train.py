"""The reference every trainer benchmark compares against: the field guide's training loop
written by hand, as a careful user would, doing the same job as ``zoo finetune``:

seeded 80/20 split per class (zoo's rule, so both see the same counts) → the model from zoo's
registry and zoo's transform for it → AdamW + per-step warmup/cosine → each epoch: train,
validate, print a line, append a metrics CSV, save ``last.pt`` (and ``best.pt`` when it
improved) → at the end, the best weights as ``model.safetensors``.

It uses only zoo's public model API (``zoo.create_model``, ``zoo.model_info``,
``zoo.transforms``), never the trainer, so a trainer refactor cannot change what it does.
One JSON line per epoch on stdout (train seconds, img/s, val seconds, val acc), then a summary.

    python bench/hand_train.py --model simple_cnn --data DIR --epochs 12 --batch 64 --workers 1
    python bench/hand_train.py ... --synthetic   # the same loop on random tensors (no loading)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import time
from dataclasses import replace
from pathlib import Path

import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

import zoo
from zoo.transforms import eval_transform, train_transform

EXTS = {".png", ".jpg", ".jpeg", ".bmp", ".webp"}


def split(root: Path, val_fraction: float, seed: int) -> tuple[list[str], dict[str, list]]:
    """Per class: seeded shuffle, round(n × val_fraction) to val (the rule zoo uses)."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    rng = random.Random(seed)
    out: dict[str, list] = {"train": [], "val": []}
    for label, cls in enumerate(classes):
        files = sorted(p for p in (root / cls).iterdir() if p.suffix.lower() in EXTS)
        rng.shuffle(files)
        n_val = max(1, round(len(files) * val_fraction))
        out["val"] += [(p, label) for p in files[:n_val]]
        out["train"] += [(p, label) for p in files[n_val:]]
    return classes, out


class Folder(Dataset):
    def __init__(self, samples: list, transform) -> None:
        self.samples, self.transform = samples, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        with Image.open(path) as im:
            return self.transform(im), label


def set_tf32(mode: str) -> dict[str, str]:
    """``on``/``off`` set TF32 for CUDA matmuls and cuDNN convs explicitly; ``default`` leaves
    torch's defaults (matmul off, cuDNN conv on). Returns the effective flags ("tf32"/"ieee")."""
    b = torch.backends
    new_api = hasattr(b, "fp32_precision")  # torch ≥ 2.9: per-backend flags (never mix the two)
    if mode != "default":
        if new_api:
            value = "tf32" if mode == "on" else "ieee"
            b.cuda.matmul.fp32_precision = value
            b.cudnn.conv.fp32_precision = value
            b.cudnn.rnn.fp32_precision = value
        else:  # pragma: no cover - older torch
            b.cuda.matmul.allow_tf32 = b.cudnn.allow_tf32 = mode == "on"

    def effective(new: str, legacy: bool) -> str:
        return new if new in ("tf32", "ieee") else ("tf32" if legacy else "ieee")

    matmul = b.cuda.matmul.fp32_precision if new_api else "none"
    conv = b.cudnn.conv.fp32_precision if new_api else "none"
    return {
        "mode": mode,
        "cuda_matmul": effective(matmul, matmul == "none" and b.cuda.matmul.allow_tf32),
        "cudnn_conv": effective(conv, conv == "none" and b.cudnn.allow_tf32),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="simple_cnn")
    p.add_argument("--data", required=True)
    p.add_argument("--out", default="hand-run", help="folder for checkpoints, metrics, weights")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--val-batch", type=int, default=None, help="default: --batch")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--augment", action="store_true", help="zoo's train augmentation")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--tf32", choices=["default", "on", "off"], default="default")
    p.add_argument("--synthetic", action="store_true", help="random tensors on the device")
    p.add_argument("--val-fraction", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    tf32 = set_tf32(args.tf32)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    classes, samples = split(Path(args.data), args.val_fraction, args.seed)
    info = zoo.model_info(args.model)
    if args.image_size:
        info = replace(info, input_size=(info.input_size[0], args.image_size, args.image_size))
    model = zoo.create_model(args.model, weights="none", num_classes=len(classes)).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    train_set = Folder(samples["train"], train_transform(info, augment=args.augment))
    val_set = Folder(samples["val"], eval_transform(info))
    common = {
        "num_workers": args.workers,
        "pin_memory": device.type == "cuda",
        "persistent_workers": args.workers > 0,
    }
    train_loader = DataLoader(
        train_set, batch_size=args.batch, shuffle=True, drop_last=has_bn, **common
    )
    val_loader = DataLoader(val_set, batch_size=args.val_batch or args.batch, **common)
    steps = len(train_loader)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    warmup, total = max(1, steps // 2), steps * args.epochs

    def lr_factor(step: int) -> float:  # linear warm-up over half an epoch, then cosine
        if step < warmup:
            return 0.01 + 0.99 * (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    loss_fn = nn.CrossEntropyLoss()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size = (args.batch, *info.input_size)
    fake = (torch.randn(size, device=device), torch.randint(0, len(classes), (args.batch,)))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    best = -1.0
    for epoch in range(args.epochs):
        model.train()
        t0, seen, running = time.perf_counter(), 0, 0.0
        batches = (
            ((fake[0], fake[1].to(device)) for _ in range(steps))
            if args.synthetic
            else train_loader
        )
        for x, y in batches:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if args.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = loss_fn(model(x).float(), y)
            loss.backward()
            opt.step()
            sched.step()
            running += loss.item() * len(y)
            seen += len(y)
        sync()
        train_s = time.perf_counter() - t0
        row = {"epoch": epoch + 1, "train_s": train_s, "img_per_s": seen / train_s}
        if not args.synthetic:
            t1 = time.perf_counter()
            model.eval()
            correct = n = 0
            with torch.inference_mode():
                for x, y in val_loader:
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    if args.channels_last:
                        x = x.contiguous(memory_format=torch.channels_last)
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                        correct += int((model(x).argmax(1) == y).sum())
                    n += len(y)
            acc = correct / max(1, n)
            row.update(val_s=time.perf_counter() - t1, val_acc=acc, train_loss=running / seen)
            t2 = time.perf_counter()
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}
            torch.save(state, out / "last.pt")
            if acc > best:
                best = acc
                torch.save(state, out / "best.pt")
            with open(out / "metrics.csv", "a", newline="") as f:
                csv.writer(f).writerow([row["epoch"], row["train_loss"], acc])
            row["save_s"] = time.perf_counter() - t2
        print(json.dumps(row), flush=True)
    if not args.synthetic:
        from safetensors.torch import save_file

        sd = torch.load(out / "best.pt", weights_only=True)["model"]
        save_file({k: v.contiguous() for k, v in sd.items()}, str(out / "model.safetensors"))
    summary = {
        "done": True,
        "train_images": len(train_set),
        "val_images": len(val_set),
        "steps_per_epoch": steps,
        "best_val_acc": best,
        "tf32": tf32,
        "torch_threads": torch.get_num_threads(),
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
