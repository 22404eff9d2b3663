"""Pieces the benchmark scripts share: a bigger real data set, the field guide's hand-written
training loop, and the same job through zoo's Trainer."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from torch import nn

from zoo import create_model
from zoo.factory import info_of
from zoo.samples import write_digits_folder
from zoo.train import TrainConfig, Trainer
from zoo.train.data import ImageFolderDataset, ResumableSampler, scan
from zoo.transforms import train_transform


def make_data(root: Path, copies: int) -> Path:
    """sklearn's 1,797 real digits, linked ``copies`` times (distinct files) into one image folder."""
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


@dataclass
class Job:
    """One training job, run either by hand or by zoo's Trainer."""

    data: Path
    model: str = "resnet18"
    weights: str = "none"
    batch: int = 256
    workers: int = 0
    epochs: int = 2
    image_size: int | None = None
    device: str = "cpu"
    bf16: bool = False
    channels_last: bool = False

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()


def raw_loop(job: Job, *, synthetic: bool = False) -> list[float]:
    """The field guide's loop, written out by hand (train() every epoch, zero_grad every step,
    loss.item() for logging). Returns each epoch's seconds."""
    device = torch.device(job.device)
    model = create_model(job.model, weights=job.weights, num_classes=10)
    info = info_of(model)
    if job.image_size:
        from dataclasses import replace

        info = replace(info, input_size=(info.input_size[0], job.image_size, job.image_size))
    model = model.to(device)
    if job.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    crit = nn.CrossEntropyLoss()
    torch.backends.cudnn.benchmark = True
    splits = scan(job.data, seed=0)
    ds = ImageFolderDataset(splits.samples("train"), train_transform(info), seed=0)
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    sampler = ResumableSampler(
        len(ds), shuffle=True, seed=0, batch_size=job.batch, drop_last=has_bn
    )
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=job.batch,
        sampler=sampler,
        num_workers=job.workers,
        pin_memory=device.type == "cuda",
        persistent_workers=job.workers > 0,
        prefetch_factor=4 if job.workers > 0 else None,
    )
    steps = sampler.batches_per_epoch()
    size = info.input_size
    fake = (
        torch.randn(job.batch, *size, device=device),
        torch.randint(0, 10, (job.batch,), device=device),
    )
    times = []
    for epoch in range(job.epochs):
        model.train()
        sampler.set_epoch(epoch)
        t0, running = time.perf_counter(), 0.0
        batches = ((fake[0], fake[1], None) for _ in range(steps)) if synthetic else loader
        for x, y, _ in batches:
            x = x.to(device, non_blocking=True)
            if job.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=job.bf16):
                loss = crit(model(x).float(), y)
            loss.backward()
            opt.step()
            running += loss.item()
        job.sync()
        times.append(time.perf_counter() - t0)
    return times


def trainer_run(job: Job, runs: Path, **overrides: object) -> list[dict[str, float]]:
    """The same job through zoo's Trainer; returns the metrics rows (epoch_s is the train part)."""
    cfg = TrainConfig(
        model=job.model,
        data=str(job.data),
        weights=job.weights,
        strategy="full",
        epochs=job.epochs,
        batch_size=job.batch,
        amp="bf16" if job.bf16 else None,
        channels_last=job.channels_last,
        num_workers=job.workers,
        device=job.device,
        runs_root=str(runs),
        progress=False,
        image_size=job.image_size,
        **overrides,  # type: ignore[arg-type]
    )
    run = Trainer(cfg).fit()
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def n_train(job: Job) -> int:
    return len(scan(job.data, seed=0).files["train"])
