"""OpenVINO (fp32, bf16, int8) beside ONNX Runtime (fp32, int8) on CPU, measured side by side in
one run by `zoo bench` itself (`zoo.deploy.bench.table.run_bench`): p50 latency at batch 1 and 16 and
top-1 agreement with PyTorch eager on real photographs, and the fastest backend within an
agreement floor (`--min-agreement`).

- MobileNetV2, real ImageNet weights: agreement on 120 crops of scikit-image's photographs;
  int8 calibrated (ORT's static QDQ, NNCF for OpenVINO) on 80 crops of *other* photographs.
- ResNet-18 at 224 px, random weights (its ImageNet weights are not on this machine; weights do
  not change its speed): latency only, its agreement is not a figure.

bf16 runs only on a CPU with AVX512_BF16 or AMX; elsewhere its rows say why they did not run
(OpenVINO would silently run f32 under a bf16 label).

    python bench/openvino_bench.py            # writes docs/bench/openvino_bench.json
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench_path import ROOT  # noqa: F401
from common import PHOTOS, photo_crops
from provenance import Recording, headline

from zoo.deploy.bench.options import BenchOptions
from zoo.deploy.bench.table import run_bench
from zoo.system import available_cpus

BACKENDS = ["eager", "ort_fp32", "ort_int8", "ov_fp32", "ov_int8", "ov_bf16"]
EVAL_PHOTOS, CALIB_PHOTOS = PHOTOS[0::2], PHOTOS[1::2]  # different source photographs
FLOOR = 0.99


def _ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """p50 of each backend over ORT fp32's at the same batch: ``{batch: {backend: ratio}}``."""
    base = {r["batch"]: r["p50_ms"] for r in rows if r["backend"] == "ort_fp32" and "p50_ms" in r}
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if "p50_ms" in r and r["batch"] in base:
            out.setdefault(str(r["batch"]), {})[r["backend"]] = round(
                r["p50_ms"] / base[r["batch"]], 3
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0, help="minimum timed seconds per row")
    p.add_argument("--out", type=Path, default=None, help="default: docs/bench/openvino_bench.json")
    args = p.parse_args()
    rec = Recording("openvino_bench")
    threads = available_cpus()
    with tempfile.TemporaryDirectory() as tmp:
        eval_dir, calib_dir = Path(tmp) / "eval", Path(tmp) / "calib"
        eval_counts = photo_crops(eval_dir, EVAL_PHOTOS, 24, seed=0)
        calib_counts = photo_crops(calib_dir, CALIB_PHOTOS, 16, seed=1)
        common: dict[str, Any] = {
            "backends": tuple(BACKENDS),
            "devices": ("cpu",),
            "batch_sizes": (1, 16),
            "threads": threads,
            "calib": str(calib_dir),
            "data": str(eval_dir),
            "min_seconds": args.seconds,
            "min_agreement": FLOOR,
        }
        mnv2 = run_bench(BenchOptions("mobilenet_v2", **common)).to_dict()
        r18 = run_bench(BenchOptions("resnet18", weights="none", **common)).to_dict()
    for report in (mnv2, r18):
        report["ratio_vs_ort_fp32"] = _ratios(report["rows"])
    rows = {(r["backend"], r["batch"]): r for r in mnv2["rows"]}
    ov8, ort8 = rows[("ov_int8", 1)], rows[("ort_int8", 1)]
    ratio = mnv2["ratio_vs_ort_fp32"]["1"]
    result = {
        "threads": threads,
        "eval_crops": eval_counts,
        "calib_crops": calib_counts,
        "floor": FLOOR,
        "mobilenet_v2": mnv2,
        "resnet18": r18,
        "headlines": [
            headline(
                "OpenVINO int8 (NNCF) top-1 agreement, MobileNetV2 ImageNet weights, photo crops",
                f"mobilenet_v2.rows.{mnv2['rows'].index(ov8)}.agreement",
                ov8.get("agreement"),
                ">=",
                0.98,
                note=f"ORT int8 {ort8.get('agreement')}",
            ),
            headline(
                "OpenVINO int8 vs ORT fp32 latency, MobileNetV2, batch 1",
                "mobilenet_v2.ratio_vs_ort_fp32.1.ov_int8",
                ratio.get("ov_int8"),
                "<=",
                0.7,
            ),
        ],
    }
    for name, report in (("mobilenet_v2", mnv2), ("resnet18 (random weights)", r18)):
        print(f"\n{name}: agreement on {report['agreement_images']} photo crops")
        for r in report["rows"]:
            if r["status"] != "✅":
                print(f"  {r['backend']:<9} b{r['batch']:<3} ❌ {r['reason']}")
                continue
            x = report["ratio_vs_ort_fp32"][str(r["batch"])].get(r["backend"])
            print(
                f"  {r['backend']:<9} b{r['batch']:<3} p50 {r['p50_ms']:8.2f} ms  ×{x} of ORT "
                f"fp32  agreement {r['agreement']:.1%}"
            )
        for f in report["fastest"]:
            print(f"  fastest with agreement ≥ {FLOOR:.0%}, batch {f['batch']}: {f['backend']}")
    rec.write(result, args.out)


if __name__ == "__main__":
    main()
