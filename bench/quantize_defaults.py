"""Which int8 settings keep a fine-tuned model's accuracy: the choice behind ``zoo quantize``'s
defaults, measured on the run's own validation images.

The model is the one a new user makes: MobileNetV2 (real ImageNet weights) fine-tuned on
sklearn's real digits at 96 px, linear probe with the feature cache, 5 epochs, exported with
``zoo export RUN``. Calibration images come from the run's training split (seeded sample),
evaluation is every image of its validation split: the two never meet.

Compared, each through zoo's own quantization code (``zoo.deploy.quantize.search``'s
``calibrate`` + ``quantize_qdq``, ``zoo.deploy.quantize.nncf_engine``):

- the old default: onnxruntime U8S8 QDQ (uint8 asymmetric activations), minmax, per-channel,
  64 calibration images;
- ``zoo quantize --engine ort``'s default on this CPU (``default_calibration``: the same with
  ``reduce_range`` where the CPU has no VNNI), on ``--calib`` images;
- onnxruntime S8S8 QDQ, symmetric, per-channel, with minmax / entropy / percentile ranges,
  ``reduce_range`` off and on, on ``--calib`` images;
- NNCF (``--engine nncf``) on the same images: its default on this CPU (``nncf``: without VNNI
  both weight widths made, the one agreeing more with fp32 on the calibration images kept), and
  each width forced (``nncf-weights-7``, ``nncf-weights-8``: ``--weight-bits``);
- ``zoo quantize --mode dynamic``'s setting (int8 per-channel weights, uint8 activations
  quantized at run time), ``reduce_range`` off and on: not a candidate for the static default.

Each gets top-1 accuracy, top-1 agreement with fp32 and its 95 % Wilson interval, the int8
node coverage and its p50 latency against fp32's, timed in this process one after the other.
The CPU's flags (VNNI, BF16) are recorded: ``reduce_range`` matters only without VNNI. The
machine may be shared: the provenance says ``busy`` and the choice rests on accuracy/agreement.

    python bench/quantize_defaults.py            # writes docs/bench/quantize_defaults.json
    python bench/quantize_defaults.py --work /tmp/qd   # reuses the run in /tmp/qd if there
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from bench_path import ROOT  # noqa: F401
from common import make_data, zoo_cmd, zoo_finetune
from provenance import Recording, headline

if TYPE_CHECKING:
    from zoo.deploy.choices import QuantMode

SIZE = 96
EPOCHS = 5
OLD_CALIB = 64  # the old default's --calib sample


def cpu_flags() -> dict[str, bool]:
    from zoo.system import cpu_flags as flags

    found = flags()
    return {f: f in found for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16")}


def make_run(work: Path) -> Path:
    """The fine-tuned, exported run (reused when ``work`` already holds one)."""
    run = work / "runs" / "mnv2-digits"
    if (run / "model" / "model.onnx").is_file():
        return run
    if not (run / "model").is_dir():  # timed() raises with the stderr on failure
        zoo_finetune(
            "mobilenet_v2",
            make_data(work, 1),
            run,
            *("--strategy", "linear", "--cache-features", "--epochs", str(EPOCHS)),
            *("--image-size", str(SIZE), "--no-progress"),
        )
    r = subprocess.run([*zoo_cmd(), "export", str(run)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"export failed: {r.stderr[-2000:]}")
    return run


def split_images(run: Path, split: str) -> list[tuple[Path, str]]:
    doc = json.loads((run / "split.json").read_text())
    root = Path(doc["root"])
    return [(root / rel, str(label)) for rel, label in doc["splits"][split]]


def run_images(run: Path, n_calib: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exported run's validation images and their class indices, and a seeded
    ``n_calib`` of its training images, each preprocessed as its ONNX file expects."""
    from zoo.images import open_image
    from zoo.onnx_meta import read_metadata, read_preprocessing
    from zoo.preprocess import preprocess

    model = run / "model" / "model.onnx"
    meta = read_metadata(model)
    pre = read_preprocessing(meta, model)
    classes = list(meta["class_names"])
    train = split_images(run, "train")
    random.Random(0).shuffle(train)
    val = split_images(run, "val")

    def load(rows: list[tuple[Path, str]]) -> np.ndarray:
        return np.stack([preprocess(open_image(path), pre) for path, _ in rows])

    labels = np.array([classes.index(label) for _, label in val])
    return load(val), labels, load(train[:n_calib])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", default=None, help="folder for the data and run (default: temp)")
    p.add_argument("--calib", type=int, default=300, help="calibration images (training split)")
    p.add_argument("--threads", type=int, default=None, help="ORT intra-op threads")
    p.add_argument("--out", default=None, help="default: docs/bench/quantize_defaults.json")
    args = p.parse_args()
    rec = Recording("quantize_defaults")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = measure(work, args)
    results["cpu_flags"] = cpu_flags()
    rec.write(results, out=args.out)


def measure(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from zoo.deploy.bench.harness import time_session
    from zoo.deploy.quantize.calibration import Calibration, calibrate, quantize_qdq
    from zoo.deploy.quantize.nncf_engine import nncf_quantize, quantize_choosing_bits
    from zoo.deploy.quantize.options import default_calibration, nncf_weight_bits_to_try
    from zoo.deploy.quantize.search import logits
    from zoo.deploy.quantize.verdict import coverage, op_counts
    from zoo.deploy.runtimes.loader import make_session

    t0 = time.perf_counter()
    run = make_run(work)
    seconds = {"finetune_export": round(time.perf_counter() - t0, 1)}
    model = run / "model" / "model.onnx"
    x_val, labels, x_cal = run_images(run, args.calib)
    name = make_session(model).get_inputs()[0].name
    work_q = work / "q"
    work_q.mkdir(exist_ok=True)
    prepped = work_q / "prepped.onnx"
    quant_pre_process(str(model), str(prepped), skip_symbolic_shape=False)
    fp32_ops = op_counts(model)
    y32 = logits(model, x_val, args.threads)
    s32 = make_session(model, threads=args.threads)
    one = x_val[:1]
    t32 = time_session(lambda: s32.run(None, {name: one}), label="fp32")["p50_ms"]

    def judge(
        label: str, path: Path, settings: dict[str, Any], n_calib: int, mode: QuantMode = "static"
    ) -> dict[str, Any]:
        y8 = logits(path, x_val, args.threads)
        s8 = make_session(path, threads=args.threads)
        t8 = time_session(lambda: s8.run(None, {name: one}), label=label)["p50_ms"]
        row = scored_row(label, settings, n_calib, (y8, y32, labels), (t8, t32))
        row["coverage"] = coverage(fp32_ops, path, mode).to_dict()
        print(json.dumps(row), flush=True)
        return row

    acc32 = float((y32.argmax(1) == labels).mean())
    rows = []
    caches: dict[tuple[str, int], Path] = {}

    def ort(label: str, c: Calibration, n: int) -> None:
        key = (c.method, n)
        if key not in caches:
            caches[key] = work_q / f"ranges-{c.method}-{n}.json"
            calibrate(prepped, [x[None] for x in x_cal[:n]], name, c.method, caches[key])
        out = work_q / f"{label}.onnx"
        quantize_qdq(prepped, out, caches[key], c)
        rows.append(judge(label, out, {"engine": "ort", **c.to_dict()}, n))

    t1 = time.perf_counter()
    ort("old-default", Calibration("minmax", True), min(OLD_CALIB, len(x_cal)))
    # zoo quantize --engine ort's setting on this CPU (reduce_range from its flags)
    ort("ort-default", default_calibration(), len(x_cal))
    for method in ("minmax", "entropy", "percentile"):
        for reduce in (False, True):
            c = Calibration(method, True, True, int8_activations=True, reduce_range=reduce)  # type: ignore[arg-type]
            ort(f"s8s8-{method}{'-reduce_range' if reduce else ''}", c, len(x_cal))
    for reduce in (False, True):  # zoo quantize --mode dynamic: int8 weights, uint8 activations
        label = f"dynamic{'-reduce_range' if reduce else ''}"
        out = work_q / f"{label}.onnx"
        quantize_dynamic(
            str(prepped),
            str(out),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=reduce,
        )
        settings = {"engine": "ort", "mode": "dynamic", "reduce_range": reduce}
        rows.append(judge(label, out, settings, 0, mode="dynamic"))
    cal = [x[None] for x in x_cal]
    # zoo quantize's default (on a CPU without VNNI: both widths made, the one agreeing more
    # with fp32 on the calibration images kept), then each width forced (--weight-bits)
    choice = quantize_choosing_bits(
        prepped, work_q / "nncf.onnx", cal, x_cal, name, nncf_weight_bits_to_try(None, None), None
    )
    said = {"engine": "nncf", "weight_bits": choice.bits, "weight_bits_agreement": choice.tried()}
    rows.append(judge("nncf", work_q / "nncf.onnx", said, len(x_cal)))
    for bits in (7, 8):
        label = f"nncf-weights-{bits}"
        nncf_quantize(prepped, work_q / f"{label}.onnx", cal, name, bits)
        said = {"engine": "nncf", "weight_bits": bits}
        rows.append(judge(label, work_q / f"{label}.onnx", said, len(x_cal)))
    rows += openvino_rows(model, x_val, x_cal, labels, y32)
    seconds["quantize_and_measure"] = round(time.perf_counter() - t1, 1)

    # the static default's choice (zoo quantize's engines; OpenVINO's rows are another format)
    static = [r for r in rows if r.get("mode") != "dynamic" and r["engine"] != "openvino-nncf"]
    best = max(static, key=lambda r: (r["accuracy"], r["top1_agreement"]))
    best_ort = max(
        (r for r in static if r["engine"] == "ort"),
        key=lambda r: (r["accuracy"], r["top1_agreement"]),
    )
    results: dict[str, Any] = {
        "model": "mobilenet_v2 fine-tuned on digits (linear, feature cache)",
        "image_size": SIZE,
        "epochs": EPOCHS,
        "n_val": len(labels),
        "n_calibration": len(x_cal),
        "fp32": {"accuracy": round(acc32, 4), "latency_p50_ms": t32},
        "threads": s32.get_session_options().intra_op_num_threads,
        "rows": rows,
        "best": best["config"],
        "best_ort": best_ort["config"],
        "seconds": seconds,
    }
    results["headlines"] = [
        headline(
            "int8 (best setting) accuracy drop on the run's val images, points",
            "best_drop_points",
            round(100 * best["accuracy_drop"], 2),
            "<=",
            1.0,
            note=best["config"],
        ),
    ]
    results["best_drop_points"] = round(100 * best["accuracy_drop"], 2)
    return results


def scored_row(
    label: str,
    settings: dict[str, Any],
    n_calib: int,
    outputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    times: tuple[float, float],
) -> dict[str, Any]:
    """A setting's row: accuracy, drop and top-1 agreement (``outputs``: its logits, fp32's,
    the labels) and its p50 latency against the baseline's (``times``)."""
    from zoo.deploy.quantize.verdict import wilson

    y8, y32, labels = outputs
    agree = float((y8.argmax(1) == y32.argmax(1)).mean())
    acc, acc32 = (float((y.argmax(1) == labels).mean()) for y in (y8, y32))
    return {
        "config": label,
        **settings,
        "n_calibration": n_calib,
        "accuracy": round(acc, 4),
        "accuracy_drop": round(acc32 - acc, 4),
        "top1_agreement": round(agree, 4),
        "agreement_ci95": wilson(agree, len(labels)),
        "latency_p50_ms": times[0],
        "latency_ratio": round(times[0] / times[1], 3),
    }


def openvino_rows(
    model: Path,
    x_val: np.ndarray,
    x_cal: np.ndarray,
    labels: np.ndarray,
    y32: np.ndarray,
) -> list[dict[str, Any]]:
    """``zoo export --format openvino --precision int8``'s NNCF int8 of the same model as it
    makes it on this CPU (``openvino-nncf``), and at each weight width forced; latency against
    OpenVINO's own fp32, the agreement against onnxruntime's fp32 as every other row's."""
    import openvino as ov

    from zoo.deploy.bench.harness import time_session
    from zoo.deploy.export.openvino import _int8_choosing_bits, _nncf_int8
    from zoo.deploy.runtimes.openvino import compile_cpu

    core = ov.Core()
    one = x_val[:1]

    def compiled(ir: Any) -> tuple[Any, float]:
        c = compile_cpu(core, ir, "fp32", None)
        return c, time_session(lambda: c(one), label="openvino")["p50_ms"]

    _, t32 = compiled(core.read_model(str(model)))
    cal = [x[None] for x in x_cal]
    rows = []
    for label, forced in (
        ("openvino-nncf", None),
        *((f"openvino-nncf-weights-{b}", b) for b in (7, 8)),
    ):
        fp32_ir = core.read_model(str(model))
        if forced is None:
            ir, choice = _int8_choosing_bits(core, fp32_ir, cal, None)
            bits, tried = choice.bits, choice.tried()
        else:
            ir, bits, tried = _nncf_int8(fp32_ir, cal, forced), forced, None
        c, t8 = compiled(ir)
        y8 = np.concatenate([c(x[None])[0] for x in x_val])
        said = {"engine": "openvino-nncf", "weight_bits": bits, "weight_bits_agreement": tried}
        row = scored_row(label, said, len(x_cal), (y8, y32, labels), (t8, t32))
        row["latency_baseline"] = "openvino fp32"
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
