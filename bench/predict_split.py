"""How `zoo predict --out`'s local engine should split the cores between decoding threads and
ONNX Runtime's threads: images/s of the engine in-process (the model loaded before the clock
starts, so start-up is not in it) for several splits, against in-process ORT on preprocessed
tensors with every core, side by side in one run (rounds alternate the order of the splits).

The default today is one decoding thread per core beside ORT's one thread per core: on 16
cores (bench/run_gpu_checks.sh, 2026-12-04) the whole process reached 0.26 of the ceiling
while the shared-cores bound was 0.88 (docs/benchmarks.md). This measures whether giving each
side its own cores closes the gap, before the default changes.

    python bench/predict_split.py [--per-class 300] [--rounds 2]

Writes docs/bench/predict_split.json (bench/provenance.py); bench/run_gpu_checks.sh writes
predict_split_16cpu.json on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from predict_throughput import CACHE, ZOO, ceiling
from provenance import Recording, headline

from zoo.system import available_cpus


def splits(cpus: int) -> list[tuple[int, int]]:
    """(decoding threads, ORT threads): today's default (both every core), then the cores
    divided between them at a quarter, half and three quarters for decoding."""
    out = [(cpus, cpus)]
    for share in (0.25, 0.5, 0.75):
        d = max(1, round(cpus * share))
        pair = (d, max(1, cpus - d))
        if pair not in out:
            out.append(pair)
    return out


def engine_rate(model: Path, photos: Path, work: Path, decode: int, ort: int) -> float:
    """images/s of predict_to_file over the folder with these threads, the model loaded first."""
    from zoo.deploy.predict.batch import predict_to_file
    from zoo.deploy.predict.options import PredictFileOptions
    from zoo.deploy.predict.scoring import load_scorer

    scorer = load_scorer(str(model), threads=ort, spin=False)
    out = work / f"split-{decode}-{ort}.parquet"
    options = PredictFileOptions(
        model=scorer, inputs=[str(photos)], out=out, workers=decode, overwrite=True
    )
    t0 = time.perf_counter()
    summary = predict_to_file(options)
    return summary.rows / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-class", type=int, default=300, help="photos per class (7 classes)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ceiling-seconds", type=float, default=3.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    rec = Recording("predict_split")
    from zoo.samples import write_photo_folder

    cpus = available_cpus()
    photos = write_photo_folder(CACHE / f"photos{args.per_class}", per_class=args.per_class)
    images = sorted(photos.rglob("*.jpg"))
    model = CACHE / "mobilenet_v2.onnx"
    if not model.exists():
        subprocess.run(
            [ZOO, "export", "mobilenet_v2", "--dynamic-batch", "-o", str(model)], check=True
        )
    work = Path(tempfile.mkdtemp(prefix="predict-split-"))
    pairs = splits(cpus)
    rates: dict[tuple[int, int], list[float]] = {pair: [] for pair in pairs}
    ceil = []
    engine_rate(model, photos, work, *pairs[0])  # warm-up (first imports, page cache), not kept
    for r in range(args.rounds):
        ceil.append(ceiling(model, images[:64], args.ceiling_seconds))
        for pair in pairs if r % 2 == 0 else pairs[::-1]:
            rates[pair].append(engine_rate(model, photos, work, *pair))
    best = statistics.median(max(c["samples_per_s"].values()) for c in ceil)
    rows = [
        {
            "decode_threads": d,
            "ort_threads": t,
            "default": (d, t) == pairs[0],
            "images_per_s": round(statistics.median(v), 1),
            "rounds": [round(x, 1) for x in v],
            "vs_ceiling": round(statistics.median(v) / best, 3),
        }
        for (d, t), v in rates.items()
    ]
    top = max(rows, key=lambda row: row["images_per_s"])
    result = {
        "setup": {"model": model.name, "images": len(images), "cpus": cpus, "rounds": args.rounds},
        "ort_ceiling_best_samples_per_s": round(best, 1),
        "ceiling": ceil,
        "splits": rows,
        "best": {
            k: top[k] for k in ("decode_threads", "ort_threads", "images_per_s", "vs_ceiling")
        },
        "best_vs_default": round(top["images_per_s"] / rows[0]["images_per_s"], 3),
        "default_vs_best": round(rows[0]["images_per_s"] / top["images_per_s"], 3),
    }
    result["headlines"] = [
        headline(
            "`zoo predict --out` engine: the default split of the cores vs the best split measured",
            "default_vs_best",
            result["default_vs_best"],
            ">=",
            0.95,
        )
    ]
    print(json.dumps({k: result[k] for k in ("splits", "best", "best_vs_default")}, indent=2))
    rec.write(result, args.out)


if __name__ == "__main__":
    main()
