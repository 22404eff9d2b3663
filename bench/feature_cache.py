"""Linear probing with and without the feature cache, 5 epochs on the same data (real digits,
real ImageNet MobileNetV2 weights, eval transform in both): end-to-end time of the whole
`Trainer.fit` and validation accuracy. Goal: ≥ 5× faster, accuracy within 1 point.

    python bench/feature_cache.py
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench_path import ROOT  # noqa: F401
from common import make_data

from zoo.train import TrainConfig, Trainer


def run(
    data: Path, runs: Path, cache: bool, size: int, epochs: int, workers: int
) -> tuple[float, float]:
    cfg = TrainConfig(
        model="mobilenet_v2",
        data=str(data),
        strategy="linear",
        epochs=epochs,
        image_size=size,
        augment=False,
        cache_features=cache,
        num_workers=workers,
        runs_root=str(runs),
        progress=False,
        batch_size=64,
    )
    t0 = time.perf_counter()
    path = Trainer(cfg).fit()
    seconds = time.perf_counter() - t0
    return seconds, json.loads((path / "report.json").read_text())["best"]["val/acc"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(Path(tmp), 1)
        plain_s, plain_acc = run(
            data, Path(tmp) / "runs", False, args.size, args.epochs, args.workers
        )
        cached_s, cached_acc = run(
            data, Path(tmp) / "runs", True, args.size, args.epochs, args.workers
        )
    print(
        json.dumps(
            {
                "image_size": args.size,
                "epochs": args.epochs,
                "plain": {"seconds": round(plain_s, 1), "val_acc": plain_acc},
                "cached": {"seconds": round(cached_s, 1), "val_acc": cached_acc},
                "speedup": round(plain_s / cached_s, 2),
                "acc_delta_points": round(100 * (cached_acc - plain_acc), 2),
                "goal": "speedup >= 5, |delta| <= 1 point",
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
