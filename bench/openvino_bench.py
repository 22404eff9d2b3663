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

On a CPU with AMX, OpenVINO's int8 kernels use it, and for MobileNetV2 at batch 1 they are slower
than its AVX512-VNNI ones while ResNet-18's are faster. oneDNN's ISA is chosen once per process,
from ``ONEDNN_MAX_CPU_ISA``, so zoo cannot choose per model; ``isa_capped`` holds both models'
int8 row and ORT fp32 baseline re-timed side by side in a child process capped at AVX512-VNNI.

    python bench/openvino_bench.py            # writes docs/bench/openvino_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_path import ROOT  # noqa: F401
from common import PHOTOS, photo_crops
from provenance import Recording, headline

from zoo.deploy.bench.options import BenchOptions
from zoo.deploy.bench.table import run_bench
from zoo.system import available_cpus, cpu_flags

BACKENDS = ["eager", "ort_fp32", "ort_int8", "ov_fp32", "ov_int8", "ov_bf16"]
EVAL_PHOTOS, CALIB_PHOTOS = PHOTOS[0::2], PHOTOS[1::2]  # different source photographs
FLOOR = 0.99
CAP = "AVX512_CORE_VNNI"  # the highest oneDNN ISA below AMX


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


def _capped_rows(common: dict[str, Any]) -> dict[str, Any] | None:
    """ORT fp32 and OpenVINO int8 at batch 1 for both models, timed in a child process whose
    oneDNN is capped below AMX (None on a CPU without AMX, where the cap changes nothing)."""
    if "amx_int8" not in cpu_flags():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "capped.json"
        spec = {**common, "backends": ["ort_fp32", "ov_int8"], "batch_sizes": [1]}
        subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec), "--out", str(out)],
            env={**os.environ, "ONEDNN_MAX_CPU_ISA": CAP},
            check=True,
        )
        rows = json.loads(out.read_text())
    ratios = {
        model: round(r["ov_int8"]["p50_ms"] / r["ort_fp32"]["p50_ms"], 3)
        for model, r in rows.items()
        if "p50_ms" in r["ov_int8"] and "p50_ms" in r["ort_fp32"]
    }
    return {"ONEDNN_MAX_CPU_ISA": CAP, "rows": rows, "ov_int8_vs_ort_fp32_b1": ratios}


def _child(spec: str, out: Path) -> None:
    common = json.loads(spec)
    common.update(backends=tuple(common["backends"]), devices=tuple(common["devices"]))
    common["batch_sizes"] = tuple(common["batch_sizes"])
    rows = {}
    for model, weights in (("mobilenet_v2", None), ("resnet18", "none")):
        report = run_bench(BenchOptions(model, weights=weights, **common)).to_dict()
        rows[model] = {r["backend"]: r for r in report["rows"]}
    out.write_text(json.dumps(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0, help="minimum timed seconds per row")
    p.add_argument("--out", type=Path, default=None, help="default: docs/bench/openvino_bench.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        _child(args.child, args.out)
        return
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
        capped = _capped_rows(common)
    for report in (mnv2, r18):
        report["ratio_vs_ort_fp32"] = _ratios(report["rows"])
    rows = {(r["backend"], r["batch"]): r for r in mnv2["rows"]}
    ov8, ort8 = rows[("ov_int8", 1)], rows[("ort_int8", 1)]
    ratio = mnv2["ratio_vs_ort_fp32"]["1"]
    capped_note = ""
    if capped is not None:
        c = capped["ov_int8_vs_ort_fp32_b1"]
        capped_note = (
            f"with oneDNN capped below AMX ({CAP}): {c.get('mobilenet_v2')}, and ResNet-18 "
            f"{c.get('resnet18')} against {r18['ratio_vs_ort_fp32']['1'].get('ov_int8')} uncapped"
        )
    result = {
        "threads": threads,
        "eval_crops": eval_counts,
        "calib_crops": calib_counts,
        "floor": FLOOR,
        "mobilenet_v2": mnv2,
        "resnet18": r18,
        "isa_capped": capped,
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
                note=capped_note,
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
