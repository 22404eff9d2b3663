"""`zoo index` and `zoo similar` as the index grows (issue #33): time and peak memory per image
at 1k, 5k and 10k images, and numpy against FAISS query time by size.

Images: seeded random crops of scikit-image's real colour photographs
(:func:`zoo.samples.write_photo_folder`: each file a different crop, flip and size of one of 7
photographs, so "augmented copies" of real photos), the first N of one folder for each size.
Each size is indexed by the real `zoo index MODEL DIR -o INDEX` and queried by the real
`zoo similar INDEX IMAGE… -k 5`, each as its own process, its peak RSS read by
``bench/peak_rss.py``. Indexing streams (one shard of rows held), so its peak should stay flat;
a query holds the index's rows (N × D float32, reported beside it) and one block of
similarities. The backend table times both exact searches in this process on the largest
real index, and on larger ones made of its rows repeated with small noise (the crossover
``zoo.deploy.index.search`` picks by lies beyond 10k real images).

    python bench/index_scale.py                       # writes docs/bench/index_scale.json
    python bench/index_scale.py --sizes 20,40 --backend-rows 2000 --out /tmp/index_scale.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import zoo_cmd
from peak_rss import run_with_peak_rss
from provenance import Recording, headline

from zoo.samples import write_photo_folder

QUERIES = 8  # images per `zoo similar` call


def first_n(images: list[Path], n: int, dest: Path) -> Path:
    """``dest``: symlinks to the first ``n`` images, in their class folders."""
    for img in images[:n]:
        (dest / img.parent.name).mkdir(parents=True, exist_ok=True)
        (dest / img.parent.name / img.name).symlink_to(img)
    return dest


def measured(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one command."""
    with tempfile.TemporaryFile("w+") as out:
        code, wall, peak = run_with_peak_rss(cmd, stdout=out, stderr=subprocess.DEVNULL)
        out.seek(0)
        text = out.read()
    if code:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {code}")
    return wall, peak, text


def median_ms(fn, rounds: int = 3) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1000, 3)


def backend_table(index: Path, rows_list: list[int], queries: list[int]) -> list[dict]:
    """numpy vs FAISS (exact) search time by index rows and queries per search."""
    from zoo.deploy.index.search import FaissSearcher, NumpySearcher, faiss_installed, normalise
    from zoo.deploy.index.store import IndexManifest, read_shards

    m = IndexManifest.read(index)
    real = np.concatenate([e for _, e in read_shards(index, m)])
    rng = np.random.default_rng(0)
    table = []
    for n in rows_list:
        reps = math.ceil(n / len(real))
        rows = np.tile(real, (reps, 1))[:n]
        if n > len(real):  # the real rows repeated, with noise so that no two are equal
            rows = normalise(rows + rng.normal(0, 0.01, rows.shape).astype(np.float32))
        searchers = {"numpy": NumpySearcher(n, m.dim)}
        if faiss_installed():
            searchers["faiss"] = FaissSearcher(m.dim)
        for s in searchers.values():
            s.add(rows)
        for q in queries:
            qs = rows[rng.integers(0, n, q)]
            ms = {
                name: median_ms(lambda s=s, qs=qs: s.search(qs, 5)) for name, s in searchers.items()
            }
            row = {"rows": n, "queries": q, **{f"{k}_ms": v for k, v in ms.items()}}
            if "faiss" in ms:
                row["faiss_speedup"] = round(ms["numpy"] / max(ms["faiss"], 1e-9), 3)
            table.append(row)
            print(json.dumps(row), flush=True)
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="mobilenet_v2", help="any model `zoo index` takes")
    p.add_argument("--sizes", default="1000,5000,10000")
    p.add_argument("--backend-rows", default="10000,30000,100000")
    p.add_argument("--backend-queries", default="1,32,1024")
    p.add_argument("--out", default=None, help="default: docs/bench/index_scale.json")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rec = Recording("index_scale")
    by_size: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        photos = write_photo_folder(t / "photos", per_class=math.ceil(max(sizes) / 7))
        images = sorted(photos.rglob("*.jpg"), key=lambda f: (f.stem, f.parent.name))
        for n in sizes:
            folder, index = first_n(images, n, t / f"n{n}"), t / f"n{n}.index"
            wall, peak, out = measured(
                [*zoo_cmd(), "index", args.model, str(folder), "-o", str(index), "--json"]
            )
            summary = json.loads(out)
            queries = [str(q) for q in images[:QUERIES]]
            q_wall, q_peak, _ = measured(
                [*zoo_cmd(), "similar", str(index), *queries, "-k", "5", "--json"]
            )
            row = {
                "images": n,
                "dim": summary["dim"],
                "index_wall_s": round(wall, 3),
                "index_ms_per_image": round(1000 * wall / n, 3),
                "index_peak_rss_mib": round(peak, 1),
                "query_wall_s": round(q_wall, 3),
                "query_peak_rss_mib": round(q_peak, 1),
                "index_rows_mib": round(n * summary["dim"] * 4 / 2**20, 2),
            }
            by_size[str(n)] = row
            print(json.dumps(row), flush=True)
        table = backend_table(
            t / f"n{max(sizes)}.index",
            [int(r) for r in args.backend_rows.split(",")],
            [int(q) for q in args.backend_queries.split(",")],
        )
    small, big = by_size[str(min(sizes))], by_size[str(max(sizes))]
    mem_ratio = round(big["index_peak_rss_mib"] / small["index_peak_rss_mib"], 3)
    time_ratio = round(big["index_ms_per_image"] / small["index_ms_per_image"], 3)
    results = {
        "setup": {
            "model": args.model,
            "sizes": sizes,
            "images": "seeded random crops of scikit-image's 7 colour photographs "
            "(zoo.samples.write_photo_folder): augmented copies of real photos",
            "query_images": QUERIES,
            "backend_rows_beyond_real": "the largest real index's rows repeated with N(0, 0.01) "
            "noise, renormalised",
        },
        "by_size": by_size,
        "backends": table,
        "summary": {
            "index_peak_rss_ratio": mem_ratio,
            "index_ms_per_image_ratio": time_ratio,
        },
        "headlines": [
            headline(
                f"zoo index peak RSS at {max(sizes)} images / at {min(sizes)}",
                "summary.index_peak_rss_ratio", mem_ratio, "<=", 1.1,
                note="streams: one shard of rows held whatever the number of images",
            ),
            headline(
                f"zoo index time per image at {max(sizes)} images / at {min(sizes)}",
                "summary.index_ms_per_image_ratio", time_ratio, "<=", 1.1,
                note="start-up (model load) spread over more images: at most flat",
            ),
        ],
    }  # fmt: skip
    rec.write(results, args.out)
    print(json.dumps(results["summary"], indent=2))


if __name__ == "__main__":
    main()
