"""`zoo predict DIR --out x.parquet` against the runtime's own ceiling, its memory over growing
input lists, and its resume after random kills; side by side in one run.

- Throughput: images/s of the whole `zoo predict MODEL DIR --out x.parquet` process (start-up,
  model load, listing, parallel decode, batched ORT, chunk commits, merge: what the user waits
  for) vs in-process ONNX Runtime on preprocessed tensors at its best batch size, same
  threads (rounds alternate the two). Goal: ratio ≥ 0.9. Also the single-thread cost per image
  of decode + preprocessing and of inference (batch 32, one thread): their shares, and the
  bound they set when both run on the same cores (every core busy with one or the other:
  CPUS / (decode + inference) per second, over the ceiling).
- Memory: peak RSS of the process over a text file listing SMALL vs BIG inputs (the real
  photos repeated). Goal: BIG / SMALL ≤ 1.1.
- Resume: the process SIGKILLed at random times KILLS times, then run to the end: every
  input exactly once in the output.

Real photographs: zoo.samples.write_photo_folder (scikit-image's photos, seeded crops).

    python bench/predict_throughput.py [--per-class 300] [--mem-sizes 10000,100000]

Writes docs/bench/predict_throughput.json (bench/provenance.py).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_path import ROOT  # noqa: F401
from peak_rss import run_with_peak_rss
from provenance import Recording, headline

from zoo.system import available_cpus

ZOO = str(Path(sys.executable).parent / "zoo")
CACHE = Path(tempfile.gettempdir()) / "zoo-bench-predict"


def run_measured(args: list[str]) -> tuple[float, float, dict[str, Any]]:
    """(wall seconds, the command's own peak RSS in MiB, its --json summary) of one `zoo`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        code, wall, rss = run_with_peak_rss([ZOO, *args, "--json"], stdout=out, stderr=err)
        if code != 0:
            err.seek(0)
            raise SystemExit(f"zoo {' '.join(args)} failed: {err.read().decode()}")
        out.seek(0)
        return wall, rss, json.loads(out.read())


def ceiling(model: Path, images: list[Path], seconds: float) -> dict[str, Any]:
    """In-process ORT on preprocessed tensors: samples/s per batch size, and the single-thread
    cost of decoding + preprocessing one image."""
    import numpy as np

    from zoo.deploy.predict.scoring import load_scorer
    from zoo.deploy.runtimes.loader import OnnxClassifier
    from zoo.images import open_image

    scorer = load_scorer(str(model))
    t0 = time.perf_counter()
    x = np.stack([scorer.prepare(open_image(p)) for p in images])
    decode_s = (time.perf_counter() - t0) / len(images)

    def rate(clf: OnnxClassifier, bs: int) -> float:  # samples/s at batch bs, after a warm-up
        batch = np.ascontiguousarray(np.resize(x, (bs, *x.shape[1:])))
        clf.run(batch)
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds:
            clf.run(batch)
            n += bs
        return round(n / elapsed, 2)

    clf = OnnxClassifier(model)
    per_batch = {str(bs): rate(clf, bs) for bs in (1, 8, 32, 64)}
    # inference's single-thread cost at batch 32 (zoo predict's default batch; the 2-thread
    # ceiling is taken at its own best batch)
    single = rate(OnnxClassifier(model, threads=1), 32)
    return {
        "samples_per_s": per_batch,
        "single_thread_samples_per_s": single,
        "decode_preprocess_s_per_image": round(decode_s, 5),
    }


def resume_check(model: Path, photos: Path, work: Path, kills: int, wall: float) -> dict:
    """SIGKILL the job ``kills`` times, each at a random moment after that attempt committed a
    chunk of its own (a kill during start-up would interrupt nothing), then finish it; count
    the rows, and the chunks each kill left."""
    out = work / "resume.parquet"
    parts = out.with_name(out.name + ".parts")
    rng = random.Random(0)
    args = [ZOO, "predict", str(model), str(photos), "--out", str(out), "--chunk-size", "64"]
    killed: list[dict[str, float | int]] = []
    finished = False

    def chunks() -> int:
        return len(list(parts.glob("part-*.parquet"))) if parts.exists() else 0

    for _ in range(kills):
        before = chunks()
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.perf_counter()
        while proc.poll() is None and chunks() <= before:  # wait for this attempt's first chunk
            time.sleep(0.01)
        if proc.poll() is not None:
            finished = True  # it ended before the kill: nothing left to interrupt
            break
        try:  # then a random moment within the next tenth of the job
            proc.wait(timeout=rng.uniform(0.0, 0.1) * wall)
            finished = True
            break
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        killed.append({"after_s": round(time.perf_counter() - t0, 2), "chunks_before": before,
                       "chunks_after": chunks()})  # fmt: skip
    if not finished:
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import pyarrow.parquet as pq

    paths = pq.read_table(out, columns=["path"]).column("path").to_pylist()
    expected = sum(1 for p in photos.rglob("*.jpg"))
    return {
        "kills": len(killed),
        "killed": killed,
        "each_kill_after_a_new_chunk": all(k["chunks_after"] > k["chunks_before"] for k in killed),
        "inputs": expected,
        "rows": len(paths),
        "unique_rows": len(set(paths)),
        "each_input_once": len(paths) == len(set(paths)) == expected,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-class", type=int, default=300, help="photos per class (7 classes)")
    p.add_argument("--model", type=Path, help="an exported .onnx (default: mobilenet_v2)")
    p.add_argument("--mem-sizes", default="10000,100000", help="SMALL,BIG list lengths")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ceiling-seconds", type=float, default=5.0)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    rec = Recording("predict_throughput")
    from zoo.samples import write_photo_folder

    photos = write_photo_folder(CACHE / f"photos{args.per_class}", per_class=args.per_class)
    images = sorted(photos.rglob("*.jpg"))
    model = args.model or CACHE / "mobilenet_v2.onnx"
    if not model.exists():
        subprocess.run(
            [ZOO, "export", "mobilenet_v2", "--dynamic-batch", "-o", str(model)], check=True
        )
    work = Path(tempfile.mkdtemp(prefix="predict-bench-"))
    cli, ceil = [], []
    for r in range(args.rounds):
        for what in ("cli", "ceiling") if r % 2 == 0 else ("ceiling", "cli"):
            if what == "cli":
                out = work / f"r{r}.parquet"
                wall, rss, s = run_measured(["predict", str(model), str(photos), "--out", str(out)])
                cli.append({"wall_s": round(wall, 2), "peak_rss_mib": round(rss, 1), "summary": s})
            else:
                ceil.append(ceiling(model, images[:64], args.ceiling_seconds))
    cli_ips = statistics.median(len(images) / c["wall_s"] for c in cli)
    best = {
        k: statistics.median(c["samples_per_s"][k] for c in ceil) for k in ceil[0]["samples_per_s"]
    }
    best_bs = max(best, key=lambda k: best[k])
    decode_s = statistics.median(c["decode_preprocess_s_per_image"] for c in ceil)
    infer_s = 1 / statistics.median(c["single_thread_samples_per_s"] for c in ceil)
    # decoding and inference on the same cores: at best every core busy with one or the other
    bound = available_cpus() / (decode_s + infer_s) / best[best_bs]
    small, big = (int(v) for v in args.mem_sizes.split(","))
    memory = {}
    for n in (small, big):
        listing = work / f"list{n}.txt"
        listing.write_text("".join(f"{images[i % len(images)]}\n" for i in range(n)))
        wall, rss, s = run_measured(
            ["predict", str(model), str(listing), "--out", str(work / f"m{n}.parquet")]
        )
        memory[str(n)] = {
            "wall_s": round(wall, 2),
            "peak_rss_mib": round(rss, 1),
            "rows": s["rows"],
        }
    mem_ratio = memory[str(big)]["peak_rss_mib"] / memory[str(small)]["peak_rss_mib"]
    big_ips = big / memory[str(big)]["wall_s"]  # start-up spread over many more inputs
    resume = resume_check(
        model, photos, work, args.kills, statistics.median(c["wall_s"] for c in cli)
    )
    ratio = cli_ips / best[best_bs]
    result = {
        "setup": {
            "model": str(model.name),
            "images": len(images),
            "cpus": available_cpus(),
            "rounds": args.rounds,
        },
        "cli": cli,
        "ceiling": ceil,
        "summary": {
            "cli_images_per_s": round(cli_ips, 2),
            "ort_best_batch": int(best_bs),
            "ort_best_samples_per_s": round(best[best_bs], 2),
            "ratio_cli_vs_ceiling": round(ratio, 3),
            "cli_images_per_s_big_list": round(big_ips, 2),
            "ratio_big_list_vs_ceiling": round(big_ips / best[best_bs], 3),
            "shared_cores_bound": round(min(1.0, bound), 3),
            "decode_share": round(decode_s / (decode_s + infer_s), 3),
            "inference_share": round(infer_s / (decode_s + infer_s), 3),
            "memory_ratio": round(mem_ratio, 3),
        },
        "memory": memory,
        "resume": resume,
        "headlines": [
            headline(
                "`zoo predict DIR --out x.parquet` images/s vs in-process ORT at its best batch",
                "summary.ratio_cli_vs_ceiling", round(ratio, 3), ">=", 0.9,
            ),
            headline(
                f"`zoo predict --out` peak RSS, {big:,} vs {small:,} inputs",
                "summary.memory_ratio", round(mem_ratio, 3), "<=", 1.1,
            ),
        ],
    }  # fmt: skip
    print(json.dumps(result["summary"], indent=2))
    print(
        f"resume after {resume['kills']} random kills: each input once = {resume['each_input_once']}"
    )
    rec.write(result, args.out)


if __name__ == "__main__":
    main()
