"""Quantization-aware fine-tuning on real data: ``zoo distill RUN --qat`` against the same
fine-tune without the int8 rounding (the control: ``zoo distill RUN --student RUN`` with every
--qat default spelled out), each then exported and quantized by zoo's own post-training code.

The starting model is the one ``bench/quantize_defaults.py`` makes (and the one a new user
makes): MobileNetV2 with real ImageNet weights, a linear probe on sklearn's real digits at
96 px, 5 epochs, exported. Every arm is judged on that run's own validation images (never
trained on); calibration images are a seeded 300 of its training split.

Per seed (≥ 3) and arm: the arm's fp32 accuracy, its int8 accuracy with onnxruntime's U8S8
minmax (``--engine ort``, the scheme QAT trains for) and with NNCF (``--engine nncf``), and the
drops; the starting model's own fp32 and post-training int8 once. The onnxruntime int8 weights
have the bits ``zoo quantize`` gives them (``default_calibration``): 8 on a CPU with VNNI, 7
(``reduce_range``) without, or 7 where the model trained (``--qat``) for 7; each export is
also quantized at the other bits (``int8_ort_other``). On a CPU without VNNI a third arm,
``--qat --qat-weights 8``, is a QAT model trained for a VNNI CPU's 8-bit weights, quantized
here (as ``zoo quantize`` does: at this CPU's 7 bits). Goal (#32): the QAT model's
int8 (ort) within 0.5 point of fp32 — of its own fp32 and of the starting model's. The QAT −
control difference of the int8 drop is paired by seed with its 95 % t interval. Accuracy
figures: the load does not change them (latency ratios in the rows are noisy on a busy machine).

    python bench/qat.py                     # writes docs/bench/qat.json
    python bench/qat.py --work /tmp/qd      # reuses the starting run in /tmp/qd
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import make_data, t_interval, zoo_cmd
from provenance import Recording, headline
from quantize_defaults import make_run, run_images

from zoo.cli.distill import QAT_DEFAULTS
from zoo.system import int8_weight_bits


def run_cmd(args: list[str]) -> None:
    r = subprocess.run([*zoo_cmd(), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"zoo {' '.join(args)} failed:\n{r.stderr[-3000:]}")


class Judge:
    """The starting run's validation and calibration images, and int8 of any export of it."""

    def __init__(self, run: Path, n_calib: int) -> None:
        self.x_val, self.labels, x_cal = run_images(run, n_calib)
        self.x_cal = [x[None] for x in x_cal]

    def arm(self, model: Path, work: Path) -> dict[str, Any]:
        """fp32, ort int8 (at the weight bits ``zoo quantize`` would use for ``model`` here,
        and at the other bits) and nncf int8 accuracy of the export ``model``."""
        from onnxruntime.quantization.shape_inference import quant_pre_process

        from zoo.deploy.quantize.calibration import Calibration, calibrate, quantize_qdq
        from zoo.deploy.quantize.nncf_engine import quantize_choosing_bits
        from zoo.deploy.quantize.options import (
            default_calibration,
            nncf_weight_bits_to_try,
            trained_weight_bits,
        )
        from zoo.deploy.quantize.search import logits
        from zoo.deploy.runtimes.loader import make_session

        work.mkdir(parents=True, exist_ok=True)
        name = make_session(model).get_inputs()[0].name
        prepped = work / "prepped.onnx"
        quant_pre_process(str(model), str(prepped), skip_symbolic_shape=False)
        calibrate(prepped, self.x_cal, name, "minmax", work / "ranges.json")
        cal = default_calibration("minmax", True, weight_bits=trained_weight_bits(model))
        bits = 7 if cal.reduce_range else 8
        quantize_qdq(prepped, work / "ort.onnx", work / "ranges.json", cal)
        other = Calibration("minmax", True, reduce_range=not cal.reduce_range)
        quantize_qdq(prepped, work / "ort_other.onnx", work / "ranges.json", other)
        # as zoo quantize --engine nncf makes it (both widths tried on a CPU without VNNI
        # unless the model trained for its bits)
        tries = nncf_weight_bits_to_try(trained_weight_bits(model), None)
        x = np.concatenate(self.x_cal)
        quantize_choosing_bits(prepped, work / "nncf.onnx", self.x_cal, x, name, tries, None)
        y32 = logits(model, self.x_val, None).argmax(1)
        row: dict[str, Any] = {"fp32": self.acc(y32), "weight_bits": bits}
        y8 = logits(work / "ort_other.onnx", self.x_val, None).argmax(1)
        row["int8_ort_other"] = self.acc(y8)  # at 15 - bits: 7 where ort used 8, and back
        for engine in ("ort", "nncf"):
            y8 = logits(work / f"{engine}.onnx", self.x_val, None).argmax(1)
            row[f"int8_{engine}"] = self.acc(y8)
            row[f"drop_{engine}_points"] = round(100 * (row["fp32"] - row[f"int8_{engine}"]), 2)
            row[f"agreement_{engine}"] = round(float((y8 == y32).mean()), 4)
        return row

    def acc(self, pred: np.ndarray) -> float:
        return round(float((pred == self.labels).mean()), 4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", default=None, help="folder for the data and runs (default: temp)")
    p.add_argument("--seeds", default="0,1,2", help="at least 3 for an interval")
    p.add_argument("--calib", type=int, default=300, help="calibration images (training split)")
    p.add_argument("--out", default=None, help="default: docs/bench/qat.json")
    args = p.parse_args()
    rec = Recording("qat")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = measure(work, [int(s) for s in args.seeds.split(",")], args.calib)
    rec.write(results, out=args.out)


def measure(work: Path, seeds: list[int], n_calib: int) -> dict[str, Any]:
    base = make_run(work)
    data = make_data(work, 1)
    judge = Judge(base, n_calib)
    start = judge.arm(base / "model" / "model.onnx", work / "q-base")
    print("start", start, flush=True)
    spelled = [
        *("--strategy", str(QAT_DEFAULTS["strategy"])),
        *("--backbone-lr-mult", str(QAT_DEFAULTS["backbone_lr_mult"])),
        *("--epochs", str(QAT_DEFAULTS["epochs"]), "--lr", str(QAT_DEFAULTS["lr"])),
        *("-T", str(QAT_DEFAULTS["temperature"]), "--alpha", str(QAT_DEFAULTS["alpha"])),
    ]
    arms = {
        "qat": ["--qat"],  # its own defaults
        "control": ["--student", str(base), *spelled],
    }
    if int8_weight_bits() == 7:  # no VNNI here: a model trained for a VNNI CPU's 8-bit weights
        arms["qat_w8"] = ["--qat", "--qat-weights", "8"]
    rows = []
    for seed in seeds:
        for arm, extra in arms.items():
            name = f"{arm}-{seed}"
            run_cmd(
                [
                    *("distill", str(base), "--data", str(data), *extra, "--seed", str(seed)),
                    *("--runs", str(work / "arms"), "--name", name, "--no-progress", "--no-report"),
                ]
            )
            run_cmd(["export", str(work / "arms" / name)])
            row = {"arm": arm, "seed": seed}
            row |= judge.arm(work / "arms" / name / "model" / "model.onnx", work / f"q-{name}")
            row["int8_ort_vs_start_points"] = round(100 * (row["int8_ort"] - start["fp32"]), 2)
            print(row, flush=True)
            rows.append(row)

    def per_arm(arm: str, key: str) -> list[float]:
        return [r[key] for r in rows if r["arm"] == arm]

    paired = [
        q - c
        for q, c in zip(
            per_arm("qat", "drop_ort_points"), per_arm("control", "drop_ort_points"), strict=True
        )
    ]
    qat_drop = statistics.mean(per_arm("qat", "drop_ort_points"))
    qat_vs_start = statistics.mean(per_arm("qat", "int8_ort_vs_start_points"))
    return {
        "model": "mobilenet_v2 fine-tuned on digits (linear, feature cache, 96 px), exported",
        "cpu_int8_weight_bits": int8_weight_bits(),
        "qat_defaults": QAT_DEFAULTS,
        "n_val": len(judge.labels),
        "n_calibration": n_calib,
        "start": start,
        "rows": rows,
        "qat_int8_ort_drop_points_mean": round(qat_drop, 2),
        "qat_int8_ort_vs_start_fp32_points_mean": round(qat_vs_start, 2),
        "qat_minus_control_drop_ort_points": t_interval(paired),
        "headlines": [
            headline(
                "QAT model: int8 (ort) accuracy drop vs its own fp32, points (mean of seeds)",
                "qat_int8_ort_drop_points_mean",
                round(qat_drop, 2),
                "<=",
                0.5,
            ),
            headline(
                "QAT model's int8 (ort) vs the starting model's fp32, points (mean of seeds)",
                "qat_int8_ort_vs_start_fp32_points_mean",
                round(qat_vs_start, 2),
                ">=",
                -0.5,
            ),
        ],
    }


if __name__ == "__main__":
    main()
