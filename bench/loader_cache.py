"""Loader throughput alone (decode → augment → batch ready), the decode-once image cache vs
the PIL path, on real photographs (`zoo example photos`: 2,100 JPEGs, 300–640 px), same
workers, same model preprocessing (mobilenet_v2, 224 px: random resized crop, flip, colour
jitter, normalise), batches of 32, at the trainer's default worker count on this machine and
at one worker per CPU. Passes alternate (PIL, cache, PIL, cache, …) on this noisy machine;
the ratio is of the medians. The cache is built first, into a fresh folder, and its build
time is reported separately. Goal: ≥ 3×. Read it with its worker count: with no model to run,
the cached path also uses the idle main process (jitter and normalisation of whole batches),
which a training run keeps busy; so the loader alone flatters the cache at few workers.

Then what the user waits for: `zoo finetune mobilenet_v2 --strategy gradual` at 224 px, one
epoch, on a smaller folder of the same photographs, at the trainer's own worker count (it
picks it; recorded from the run), with the cache (default) and without, each first on a new
folder (`ZOO_CACHE` empty: the data check and, with the cache, the decode pass run inside
the command) and then again warm. The headline is the whole warm epoch (the trainer's own
`epoch_s`) with the cache against without; the cold whole-process time is shown beside it.

    python bench/loader_cache.py            # writes docs/bench/loader_cache.json
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from bench_path import ROOT  # noqa: F401
from common import zoo_finetune
from provenance import Recording, headline

import zoo
from zoo.samples import write_photo_folder
from zoo.system import available_cpus


def _pass(make: Callable[[], Any], limit: int) -> float:
    """img/s of a fresh loader over ``limit`` images, timed from its first batch (worker
    start-up excluded); the loader is shut down afterwards, so no prefetching worker of one
    pass runs into the next."""
    dl = make()
    it = iter(dl)
    next(it)
    n, t0 = 0, time.perf_counter()
    for x, _, _ in it:
        n += len(x)
        if n >= limit:
            break
    rate = n / (time.perf_counter() - t0)
    del it, dl
    gc.collect()
    return rate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--workers", default=None, help="comma-separated counts (default: the trainer's, cpus)"
    )
    p.add_argument("--images", type=int, default=1024, help="images per timed pass")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trainer", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--trainer-per-class", type=int, default=100, help="photographs per class for the runs"
    )
    p.add_argument("--out", default=None, help="default: docs/bench/loader_cache.json")
    args = p.parse_args()
    rec = Recording("loader_cache")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ZOO_CACHE"] = str(Path(tmp) / "cache")  # a cold cache, built below
        from zoo.train import data as data_mod
        from zoo.train.augment import Augment, CachedImageDataset
        from zoo.train.build import auto_workers, loader
        from zoo.train.image_cache import CacheSpec, ImageCache
        from zoo.transforms import train_transform

        folder = write_photo_folder(Path(tmp) / "photos")
        samples = data_mod.scan(folder).samples("train")
        pre = zoo.model_info("mobilenet_v2").preprocessing()
        cache = ImageCache(CacheSpec.for_model(pre))
        t0 = time.perf_counter()
        cache.build([p for p, _ in samples])
        build_s = time.perf_counter() - t0
        sets = {
            "pil": data_mod.ImageFolderDataset(samples, train_transform(pre)),
            "cache": CachedImageDataset(samples, cache, Augment.for_model(pre, train=True)),
        }
        cpu = torch.device("cpu")
        auto = auto_workers(cpu)
        counts = [int(w) for w in args.workers.split(",")] if args.workers else [auto]
        if not args.workers and available_cpus() != auto:
            counts.append(available_cpus())
        by_workers = {}
        for workers in counts:
            makers = {
                k: partial(loader, ds, list(range(len(ds))), 32, workers, 0, cpu)
                for k, ds in sets.items()
            }
            rates: dict[str, list[float]] = {k: [] for k in makers}
            for _ in range(args.rounds):
                for k, make in makers.items():
                    rates[k].append(round(_pass(make, args.images), 1))
                    print(workers, k, rates[k][-1], "img/s", flush=True)
            med = {k: statistics.median(v) for k, v in rates.items()}
            by_workers[str(workers)] = {
                "img_per_s": rates,
                "median_img_per_s": med,
                "ratio": round(med["cache"] / med["pil"], 2),
            }
        ratio = by_workers[str(counts[0])]["ratio"]
        trainer: dict[str, dict[str, Any]] = {}
        epoch_ratio = None
        if args.trainer:
            small = write_photo_folder(Path(tmp) / "small", per_class=args.trainer_per_class)
            opts = ["--strategy", "gradual", "--epochs", "1", "--no-progress"]
            # cold, then warm, per mode; the modes' order alternates between the two passes
            for phase, modes in (("cold", ("on", "off")), ("warm", ("off", "on"))):
                for mode in modes:
                    env = {"ZOO_CACHE": str(Path(tmp) / f"zoo-cache-{mode}")}  # empty when cold
                    proc = zoo_finetune(
                        "mobilenet_v2",
                        small,
                        Path(tmp) / "runs" / f"{mode}-{phase}",
                        *opts,
                        "--image-cache",
                        mode,
                        env=env,
                    )
                    row = proc.extra["rows"][-1]
                    trainer[f"{mode}_{phase}"] = {
                        "mode": mode,
                        "phase": phase,
                        "workers": auto,  # no --num-workers: the trainer's auto_workers
                        "data_wait": round(row["data_wait"], 3),
                        "img_per_s": round(row["img_per_s"], 1),
                        "epoch_s": round(proc.extra["report"]["timing"]["epochs"][-1], 1),
                        "whole_run_s": round(proc.seconds, 1),
                        "val_acc": round(row["val/acc"], 4),
                    }
                    print("trainer", mode, phase, trainer[f"{mode}_{phase}"], flush=True)
            on, off = trainer["on_warm"], trainer["off_warm"]
            if on["epoch_s"] and off["epoch_s"]:
                epoch_ratio = round(off["epoch_s"] / on["epoch_s"], 2)
    results = {
        "data": "zoo example photos (2,100 JPEGs, 300–640 px, 7 classes), train split",
        "batch": 32,
        "images_per_pass": args.images,
        "rounds": args.rounds,
        "auto_workers": counts[0],
        "by_workers": by_workers,
        "ratio_cache_vs_pil": ratio,
        "cache_build_s": round(build_s, 1),
        "cache_build_images": len(samples),
        "trainer": trainer,
        "trainer_images": args.trainer_per_class * 7,
        "trainer_command": "zoo finetune mobilenet_v2 --data PHOTOS --strategy gradual "
        "--epochs 1 --image-cache on|off (cold: a new ZOO_CACHE; warm: the same again)",
        "epoch_speedup_warm": epoch_ratio,
        "headlines": [
            headline(
                f"loader alone img/s, image cache vs PIL path, {counts[0]} worker(s), main "
                "process idle",
                "ratio_cache_vs_pil",
                ratio,
                ">=",
                3.0,
            ),
            *(
                [
                    headline(
                        "whole training epoch (warm), no cache / image cache, the trainer's "
                        "workers (the cache must not slow an epoch)",
                        "epoch_speedup_warm",
                        epoch_ratio,
                        ">=",
                        1.0,
                    )
                ]
                if epoch_ratio is not None
                else []
            ),
        ],
    }
    rec.write(results, args.out)
    print(f"cache vs PIL at {counts[0]} worker(s): {ratio}× (goal ≥ 3); build {build_s:.1f}s")


if __name__ == "__main__":
    main()
