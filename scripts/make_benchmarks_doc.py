"""Generate docs/benchmarks.md from the raw results in docs/bench/*.json.

The generator owns every table and every figure: the prose around them lives in
docs/bench/benchmarks.template.md, which holds ``{{summary}}`` (the goals table, from each
file's ``results.headlines``) and one ``{{bench NAME}}`` per benchmark script (the provenance
line, the staleness mark, and the script's tables; "not measured yet" while docs/bench has no
file of it). Renderers only format values found in the JSON; they compute nothing.
Staleness is computed, never set by hand (``bench/staleness.py``): each file names the commit
and the paths it measured, and every commit since that touched those paths (uncommitted
changes count as one) marks its figures "stale: N commits touched the measured code since",
in the summary row and above the section. The same marks go into docs/quality.md's
mutation-score table (from docs/quality.json), between its ``<!-- staleness:begin -->`` and
``<!-- staleness:end -->`` lines.

    python scripts/make_benchmarks_doc.py           # rewrite docs/bench/../benchmarks.md
    python scripts/make_benchmarks_doc.py --check   # exit 1 if the committed doc differs

The marks depend on git history: in a copy of the tree without ``.git`` they read "stale?"
and the check cannot pass (tests/test_benchmarks_doc.py skips it there).

``check_doc`` (used by tests/test_benchmarks_doc.py) also proves that every number in a table
row traces to the row's own JSON file, that the template holds no table rows with numbers nor
measured-looking figures, and that every result file is shown.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import provenance  # noqa: E402  (bench/: the measured paths and the source digest)
from staleness import Staleness, has_history, staleness  # noqa: E402

BENCH_DIR = ROOT / "docs" / "bench"
QUALITY = ROOT / "docs" / "quality.md"
QUALITY_DATA = ROOT / "docs" / "quality.json"
QUALITY_MARKS = ("<!-- staleness:begin -->", "<!-- staleness:end -->")
# the CPU flags a figure's ISA-dependent kind relies on (a headline names its kind in "what",
# or lists its flags in "isa"): shown beside the figure, with what is missing
ISA_KINDS = {
    "int8": ("avx2", "avx512_vnni", "avx_vnni", "amx_int8"),
    "bf16": ("avx512_bf16", "amx_bf16"),
    "fp16": ("f16c", "avx512_fp16", "amx_fp16"),
}
TEMPLATE = BENCH_DIR / "benchmarks.template.md"
OUTPUT = ROOT / "docs" / "benchmarks.md"
REQUIRED = ("schema", "bench", "command", "provenance", "stale", "results")
PLACEHOLDER = re.compile(r"\{\{\s*(summary|bench\s+([\w-]+))\s*\}\}")
# a number standing alone (not part of a word such as fp32, ResNet-18, p50 or v2)
NUMBER = re.compile(r"(?<![\w.\-/])(\d(?:[\d,]*\d)?(?:\.\d+)?)(?![\w])(%?)")
# what a measured figure looks like in prose: a decimal, a percentage or a number with a unit
FIGURE = re.compile(
    r"(?<![\w.\-/])\d[\d,]*(?:\.\d+)?\s*(?:%|×|x\b|ms\b|s\b|img/s|RPS|MB|GiB)|(?<![\w.\-/])\d+\.\d+"
)


@dataclass
class Doc:
    """The generated text and, for every table row, the result file it came from."""

    text: str
    rows: list[tuple[str, str]] = field(default_factory=list)
    # numbers the generator computed for a source (a staleness count), not values of its file
    computed: dict[str, set[str]] = field(default_factory=dict)


# ---------------------------------------------------------------------------- formatting
def fmt(v: Any, digits: int = 2) -> str:
    """A JSON number as the docs show it (thousands separators, fixed decimals)."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and digits == 0):
        return f"{int(v):,}"
    return f"{v:,.{digits}f}"


def short(v: float) -> str:
    """At most three decimals, trailing zeros dropped: 3.96, 0.983, 1.2."""
    return f"{v:,.3f}".rstrip("0").rstrip(".")


def pct(v: Any, digits: int = 1) -> str:
    return "—" if v is None else f"{100 * v:.{digits}f}%"


def dig(doc: dict[str, Any], key: str) -> Any:
    """``results`` value at a dotted key (a list's item by its index: ``images.1.rps_ratio``)."""
    node: Any = doc["results"]
    for part in key.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


class Table:
    """A markdown table whose rows remember the result file their values come from."""

    def __init__(self, source: str, *header: str) -> None:
        self.source, self.header = source, list(header)
        self.rows: list[tuple[list[str], str]] = []

    def add(self, *cells: Any, source: str | None = None) -> None:
        self.rows.append(([str(c) for c in cells], source or self.source))

    def lines(self, out: Doc) -> list[str]:
        head = "| " + " | ".join(self.header) + " |"
        out.rows.append((head, self.source))
        lines = [head, "|" + " --- |" * len(self.header)]
        for cells, source in self.rows:
            line = "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
            out.rows.append((line, source))
            lines.append(line)
        return lines


# ---------------------------------------------------------------------------- provenance
def provenance_line(name: str, doc: dict[str, Any]) -> str:
    p = doc["provenance"]
    git, m, v = p["git"], p["machine"], p["versions"]
    commit = (git.get("commit") or "unknown")[:7]
    if git.get("dirty"):
        tree = "dirty tree: " + ", ".join(git.get("changed") or []) or "dirty tree"
    else:
        tree = "clean tree" if git.get("dirty") is False else "tree state unknown"
    cpus = m.get("logical_cpus")
    aff = m.get("affinity")
    cpu = f"{m.get('cpu_model') or 'CPU model unknown'}, {cpus} logical CPUs" if cpus else "CPU ?"
    if aff:
        cpu += f" ({len(aff)} usable by the process)"
    ram = f", {m['ram_gib']} GiB RAM" if m.get("ram_gib") else ""
    gpu = ", GPU: " + ", ".join(m["gpus"]) if m.get("gpus") else ", no GPU"
    vers = ", ".join(
        f"{k} {v[k]}" for k in ("python", "torch", "onnxruntime") if v.get(k) is not None
    )
    load = ""
    if p.get("load_avg_before"):
        load = f"; load average {p['load_avg_before'][0]} before, {p['load_avg_after'][0]} after"
    if p.get("busy"):
        load += " (**busy**: recorded on a loaded machine)"
    flags = m.get("cpu_flags")
    isa = (
        f"CPU flags: {', '.join(flags) or 'none of interest'}"
        if flags is not None
        else ("CPU flags not recorded")
    )
    host = f"; machine `{m['hostname_hash']}`" if m.get("hostname_hash") else ""
    return (
        f"Measured {p['date'][:10]} at commit `{commit}` ({tree}) on {cpu}{ram}{gpu}; "
        f"{isa}{host}; {vers}{load}. Command: `{doc['command']}`. Raw results: "
        f"[`docs/bench/{name}.json`](bench/{name}.json)."
    )


def stale_line(doc: dict[str, Any], mark: Staleness) -> list[str]:
    """A visible block above a section whose figures are stale (computed, or flagged by hand)."""
    lines = []
    if mark.stale:
        paths = paths_text(measured_paths(doc))
        dirs = ", ".join(f"`{d}/`" for d in provenance.SOURCE_DIRS)
        label = (
            f" Its recorded source digest ({dirs}) is not that commit's: it measured other code"
            " (a dirty tree, or a copy labelled with another commit)."
            if mark.label_true is False
            else ""
        )
        lines.append(
            f"> **{mark.count_text().capitalize()}** `{(mark.commit or 'unknown')[:7]}` "
            f"({mark.date}; measured paths: {paths}).{label} These figures are kept for "
            "reference until `bench/run_all.sh` re-measures them."
        )
    s = doc.get("stale")
    if s:
        lines.append(f"> Flagged by hand: {s['reason']}.")
    return [*lines, ""] if lines else []


def paths_text(paths: tuple[str, ...]) -> str:
    """The measured paths in a line: named where few, else counted by folder (the JSON lists
    them: a run records every source file its processes imported)."""
    if len(paths) <= 8:
        return ", ".join(f"`{x}`" for x in paths)
    folders: dict[str, int] = {}
    for x in paths:
        folders[x.split("/", 1)[0]] = folders.get(x.split("/", 1)[0], 0) + 1
    counts = ", ".join(f"`{d}/` {n}" for d, n in folders.items())
    return f"the {len(paths)} source files its processes imported ({counts})"


def measured_paths(doc: dict[str, Any]) -> tuple[str, ...]:
    recorded = doc["provenance"].get("measured")
    return tuple(recorded["paths"]) if recorded else provenance.measured_paths(doc["bench"])


def mark_of(doc: dict[str, Any], root: Path = ROOT) -> Staleness:
    """The computed staleness of one result file against the tree at ``root``."""
    p = doc["provenance"]
    recorded = p.get("measured")
    return staleness(
        root,
        commit=p["git"].get("commit"),
        date=p["date"][:10],
        paths=measured_paths(doc),
        measured_sha256=recorded["sha256"] if recorded else None,
        label=(provenance.SOURCE_DIRS, p["source_sha256"]),
    )


def isa_note(h: dict[str, Any], d: dict[str, Any]) -> str:
    """For a figure that depends on the CPU's instructions (int8, bf16, fp16 kernels): which
    of the relevant flags the machine had."""
    what = h["what"].lower()
    kinds = h.get("isa") or [k for k in ISA_KINDS if k in what]
    if "openvino" in what and not kinds:
        kinds = ["int8"]
    if not kinds:
        return ""
    flags = d["provenance"]["machine"].get("cpu_flags")
    if flags is None:
        return "; ISA-dependent, CPU flags not recorded"
    wanted = [f for k in kinds for f in ISA_KINDS.get(k, (k,))]
    have = [f for f in wanted if f in flags]
    return f"; ISA: {', '.join(have) or 'none'} (of {', '.join(wanted)})"


# ---------------------------------------------------------------------------- renderers
def trainer_overhead(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r, s = d["results"], d["results"]["setup"]
    eps = s["epochs"]
    lines = [
        f"`{s['model']}` on {s['data']} ({fmt(s['train_images'])} train / "
        f"{fmt(s['val_images'])} val images), batch {s['batch']}, {s['workers']} loader "
        f"worker(s), no augmentation, {s['device']}; each tool at "
        f"{' and '.join(str(e) for e in eps)} epochs, {s['rounds']} round(s), the order of the "
        "two tools alternating. zoo: "
        f"`{s['zoo_command']}`; hand-written: `{s['hand_command']}`.",
        "",
    ]
    t = Table(name, "epochs", "hand-written (s)", "zoo finetune (s)", "zoo / hand (per round)")
    for e in eps:
        k = str(e)
        ratios = ", ".join(fmt(x, 3) for x in r["wall"]["ratio_per_round"][k])
        t.add(
            e, fmt(r["wall"]["median_s"]["hand"][k]), fmt(r["wall"]["median_s"]["zoo"][k]), ratios
        )
    lines += ["Whole-process wall clock (median over rounds):", "", *t.lines(out), ""]
    f = Table(
        name,
        "clock",
        "hand fixed (s)",
        "zoo fixed (s)",
        "zoo − hand fixed (s)",
        "hand per epoch (s)",
        "zoo per epoch (s)",
        "per-epoch ratio",
        f"ratio at {r['max_epochs']} epochs",
    )
    for clock in ("wall", "cpu"):
        c = r[clock]["fit"]
        f.add(
            "wall clock" if clock == "wall" else "CPU time",
            fmt(c["hand"]["fixed_s"]),
            fmt(c["zoo"]["fixed_s"]),
            fmt(c["fixed_extra_s"]),
            fmt(c["hand"]["per_epoch_s"], 3),
            fmt(c["zoo"]["per_epoch_s"], 3),
            f"**{fmt(c['per_epoch_ratio'], 3)}**",
            f"**{fmt(r[clock]['ratio_at_max_epochs'], 3)}**",
        )
    lines += ["Fit `seconds = fixed + per_epoch × epochs`:", "", *f.lines(out), ""]
    lo = r["train_loop_only"]
    w = r["warmup_1_epoch_s"]
    g = Table(name, "", "hand-written", "zoo", "ratio")
    g.add(
        "training part of an epoch (s, median)",
        fmt(lo["hand_median_s"], 3),
        fmt(lo["zoo_median_s"], 3),
        fmt(lo["ratio"], 3),
    )
    first = (
        "first run over a new folder (zoo's data check empty), 1 epoch, not fitted (s)"
        if "first_run" in r
        else "warm-up run, 1 epoch, not fitted (s)"
    )
    g.add(first, fmt(w["hand"]), fmt(w["zoo"]), "")
    return [*lines, *g.lines(out), ""]


def feature_cache(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    t = Table(name, "run", "wall clock (s)", "CPU time (s)", "best val accuracy")
    for k, label in (("plain", "backbone every epoch"), ("cached", "`--cache-features`")):
        t.add(label, fmt(r[k]["seconds"], 1), fmt(r[k]["cpu_s"], 1), fmt(r[k]["val_acc"], 4))
    t.add(
        "**cached vs plain**",
        f"**{fmt(r['speedup'])}× faster**",
        "",
        f"{fmt(r['acc_delta_points'])} points",
    )
    if "again" in r:  # the same cached run once more: its features read from disk
        a = r["again"]
        t.add(
            "`--cache-features` again (its features read from disk, not a goal)",
            fmt(a["seconds"], 1),
            fmt(a["cpu_s"], 1),
            fmt(a["val_acc"], 4),
        )
        t.add("plain vs again", f"{fmt(r['again_speedup'])}× faster", "", "")
    if "backbone_pass_s" in r:
        t.add("one backbone pass over every image, alone", fmt(r["backbone_pass_s"], 1), "", "")
        t.add("**cached run / one pass**", f"**{fmt(r['cached_vs_one_pass'])}×**", "", "")
    if "speedup_per_round" in r:
        t.add("speed-up per round", ", ".join(f"{fmt(v)}×" for v in r["speedup_per_round"]), "", "")
    rounds = (
        f"medians of {r['rounds']} rounds, the order alternating"
        if "rounds" in r
        else "one run each, not alternated (before the method fix)"
    )
    features = (
        " Every cached run computes its features (the feature cache emptied before it)."
        if "again" in r
        else " Measured before every cached run computed its features: after the first "
        "round they were read from the feature cache, so the cached figures are those of a "
        "re-run."
    )
    return [
        f"`{r['command']}`, {r['epochs']} epochs at {r['image_size']} px; {rounds}. The one "
        f"backbone pass runs in this process, the model already built.{features}",
        "",
        *t.lines(out),
        "",
    ]


def imbalance(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    setup, mean = r["setup"], r["mean"]
    t = Table(
        name,
        "options",
        "balanced accuracy",
        "accuracy",
        "minority-class recall",
        "majority-class recall",
    )
    labels = {
        "none": "none (plain loss, shuffled)",
        "class-weights": "`--class-weights auto`",
        "sampler": "`--sampler balanced`",
        "both": "both",
    }
    for key, label in labels.items():
        m = mean[key]
        t.add(
            label,
            fmt(m["balanced_acc"], 4),
            fmt(m["acc"], 4),
            fmt(m["minority_recall"], 4),
            fmt(m["majority_recall"], 4),
        )
    ci = r.get("gain_interval") or {}
    if ci.get("low") is not None:
        t.add(
            f"gain of `{r['best_single_option']}` over none, paired by seed (balanced accuracy)",
            f"{fmt(ci['mean'], 4)} ({fmt(ci['low'], 4)} to {fmt(ci['high'], 4)})",
            r["verdict"],
            "",
            "",
        )
    else:
        t.add(
            f"gain of `{r['best_single_option']}` over none",
            fmt(r["balanced_acc_gain_best_option_vs_none"], 4),
            "cannot detect an effect of this size (one seed)",
            "",
            "",
        )
    counts = ", ".join(f"{c.removeprefix('digit_')}: {n}" for c, n in setup["train_counts"].items())
    seeds = ", ".join(str(s) for s in setup["seeds"])
    return [
        f"`{setup['command']}`, {setup['epochs']} epochs, mean of seeds {seeds}; training "
        f"images per class: {counts}; {setup['val_per_class']} validation images per class.",
        "",
        *t.lines(out),
        "",
    ]


def deploy_bench(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    rt, oe, q = r["runtime_vs_raw"], r["ort_fp32_vs_eager"], r["int8_static_resnet18"]
    t = Table(name, "comparison", "p50", "ratio")
    t.add(
        "`OnnxClassifier.run` vs raw `session.run` (3 alternating windows, medians)",
        f"{fmt(rt['zoo_median_ms'])} vs {fmt(rt['raw_median_ms'])} ms",
        f"**{fmt(rt['ratio'], 3)}**",
    )
    t.add(
        "ORT fp32 vs torch eager",
        f"{fmt(oe['ort_p50_ms'])} vs {fmt(oe['eager_p50_ms'])} ms",
        f"**{fmt(oe['ratio'], 3)}**",
    )
    t.add(
        "ORT static int8 (QDQ, per-channel, minmax) vs ORT fp32",
        f"{fmt(q['latency_ms']['int8_p50'])} vs {fmt(q['latency_ms']['fp32_p50'])} ms",
        f"**{fmt(q['ratio'], 3)}**",
    )
    t.add("ORT dynamic int8 vs ORT fp32", "", fmt(r["int8_dynamic_resnet18"]["latency_ratio"], 3))
    cov = q["coverage"]
    lines = [
        f"{r['model']} at {r['image_size']} px, batch 1, {r['threads']} threads for torch and ORT.",
        "",
        *t.lines(out),
        "",
        f"Static int8: {cov['quantized']}/{cov['heavy_ops']} Conv/Gemm nodes quantized, file size × {fmt(q['size_ratio'], 3)}.",
        "",
    ]
    a = Table(
        name,
        "model",
        "evaluation images",
        "calibration images (disjoint)",
        "top-1 agreement",
        "confidence interval",
        "accuracy fp32 → int8",
    )
    dg, mb = r["int8_static_resnet18_digits"], r["int8_static_mobilenet_v2_real_weights"]
    acc = dg.get("accuracy") or {}
    a.add(
        "ResNet-18 trained on the real digits (64 px)",
        f"{dg['n_eval_images']} val digits, {spread(dg['eval_per_class'], 'class')}",
        f"{dg['n_calibration_images']} train digits, {spread(dg['calibration_per_class'], 'class')}",
        f"**{pct(dg['top1_agreement'])}**",
        f"{pct(dg['agreement_ci95'][0])}–{pct(dg['agreement_ci95'][1])}",
        f"{fmt(acc.get('fp32'), 3)} → {fmt(acc.get('int8'), 3)}",
    )
    a.add(
        "MobileNetV2, real ImageNet weights",
        f"{mb['n_eval_images']} crops, {spread(mb['eval_photos'], 'photo')}",
        f"{mb['n_calibration_images']} crops, {spread(mb['calibration_photos'], 'photo')}",
        f"**{pct(mb['top1_agreement'])}**",
        f"{pct(mb['agreement_ci95'][0])}–{pct(mb['agreement_ci95'][1])}",
        "(no labels)",
    )
    nn = r.get("int8_static_mobilenet_v2_nncf")
    if nn:  # the same images, quantized by NNCF (zoo quantize --engine nncf)
        a.add(
            "MobileNetV2, real ImageNet weights, `--engine nncf` "
            f"(latency × {fmt(nn['latency_ratio'], 3)}; "
            f"{nn['coverage']['quantized']}/{nn['coverage']['heavy_ops']} Conv/Gemm in int8)",
            "the same",
            "the same",
            f"**{pct(nn['top1_agreement'])}**",
            f"{pct(nn['agreement_ci95'][0])}–{pct(nn['agreement_ci95'][1])}",
            "(no labels)",
        )
        for bits, agree in (nn.get("top1_agreement_by_weight_bits") or {}).items():
            a.add(  # each weight width forced (--weight-bits), beside zoo's choice above
                f"MobileNetV2, real ImageNet weights, `--engine nncf --weight-bits {bits}` "
                f"(latency × {fmt(nn['latency_ratio_by_weight_bits'][bits], 3)})",
                "the same",
                "the same",
                f"{pct(agree)}",
                "",
                "(no labels)",
            )
    ta = r.get("int8_static_mobilenet_v2_target_agreement")
    if ta:  # the same images, zoo quantize --target-agreement (quantize_search.py)
        cal = ta["calibration"]
        a.add(
            f"MobileNetV2, real ImageNet weights, `--target-agreement {ta['target']}` "
            f"(latency × {fmt(ta['latency_ratio'], 3)}; {ta['float_nodes']} of "
            f"{ta['quantizable_nodes']} quantizable nodes kept float; calibration: "
            f"{cal['method']}, per-channel {fmt(cal['per_channel'])}; the float count is chosen "
            "on the evaluation crops)",
            "the same",
            "the same",
            f"**{pct(ta['top1_agreement'])}**",
            f"{pct(ta['agreement_ci95'][0])}–{pct(ta['agreement_ci95'][1])}",
            "(no labels)",
        )
    photos = ", ".join(mb["eval_photos"]) + " | " + ", ".join(mb["calibration_photos"])
    return [*lines, *a.lines(out), "", f"Photographs (evaluation | calibration): {photos}.", ""]


def quantize_defaults(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    t = Table(name, "setting", "calib", "accuracy", "drop", "agreement", "interval", "× fp32")
    for row in r["rows"]:
        low, high = row["agreement_ci95"]
        t.add(
            f"`{row['config']}`",
            row["n_calibration"] if row.get("mode") != "dynamic" else "at run time",
            pct(row["accuracy"]),
            pct(row["accuracy_drop"]),
            pct(row["top1_agreement"]),
            f"{pct(low)}–{pct(high)}",
            fmt(row["latency_ratio"], 3),
        )
    flags = ", ".join(f for f, on in r["cpu_flags"].items() if on)
    return [
        *t.lines(out),
        "",
        f"fp32 accuracy {pct(r['fp32']['accuracy'])} on {r['n_val']} validation images; "
        f"CPU flags: {flags}."
        + (
            " `dynamic` rows are `zoo quantize --mode dynamic`'s setting (activations "
            "quantized at run time), not candidates for the static default."
            if any(row.get("mode") == "dynamic" for row in r["rows"])
            else ""
        )
        + (
            " `openvino-*` rows run in OpenVINO: their × fp32 is against OpenVINO's own fp32."
            if any(row.get("latency_baseline") == "openvino fp32" for row in r["rows"])
            else ""
        ),
    ]


def openvino_bench(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    lines: list[str] = []
    for key, title, agree in (
        ("mobilenet_v2", "MobileNetV2, real ImageNet weights", True),
        ("resnet18", "ResNet-18 at 224 px, random weights (latency only)", False),
    ):
        rep = r[key]
        head = ["backend", "batch", "p50 ms", "× ORT fp32"]
        t = Table(name, *head, *(["top-1 agreement with eager", "interval"] if agree else []))
        reasons: list[str] = []
        for row in rep["rows"]:
            if row["backend"] == "eager" and row["batch"] != 1:
                continue
            if row["status"] != "✅":
                if row["reason"] not in reasons:
                    reasons.append(row["reason"])
                cells = [f"did not run [{reasons.index(row['reason']) + 1}]", ""]
                t.add(f"`{row['backend']}`", row["batch"], *cells, *(["", ""] if agree else []))
                continue
            ratio = rep["ratio_vs_ort_fp32"][str(row["batch"])].get(row["backend"])
            extra = (
                [
                    f"**{pct(row['agreement'])}**",
                    f"{pct(row['agreement_ci95'][0])}–{pct(row['agreement_ci95'][1])}",
                ]
                if agree
                else []
            )
            t.add(f"`{row['backend']}`", row["batch"], fmt(row["p50_ms"]), fmt(ratio, 3), *extra)
        lines += [f"**{title}**, {r['threads']} threads:", "", *t.lines(out), ""]
        lines += [f"[{i}] {why}" for i, why in enumerate(reasons, 1)] + ([""] if reasons else [])
        if agree:
            fastest = ", ".join(
                f"batch {f['batch']}: `{f['backend']}`" for f in rep["fastest"] or []
            )
            lines += [
                f"Agreement on {rep['agreement_images']} crops of "
                f"{', '.join(r['eval_crops'])}; int8 calibrated on crops of "
                f"{', '.join(r['calib_crops'])}. The fastest backend within agreement "
                f"{pct(r['floor'], 0)} (`zoo bench --min-agreement`): {fastest or 'none'}.",
                "",
            ]
    return lines


def spread(counts: dict[str, int], unit: str) -> str:
    """ "20 per class (digit_0 … digit_9)", or every count when they differ."""
    values = set(counts.values())
    names = list(counts)
    if len(values) == 1:
        span = f"{names[0]} … {names[-1]}" if len(names) > 2 else ", ".join(names)
        return f"{values.pop()} per {unit} ({span})"
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def serve_load(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    ceil = ", ".join(f"bs {k}: {fmt(v, 1)}" for k, v in r["ort_ceiling_samples_per_s"].items())
    t = Table(name, "concurrency", "RPS", "p50", "p90", "p99", "errors")
    for w in r["batching_on"]:
        t.add(
            w["concurrency"],
            fmt(w["rps"], 1),
            f"{fmt(w['p50_ms'], 1)} ms",
            f"{fmt(w['p90_ms'], 1)} ms",
            f"{fmt(w['p99_ms'], 1)} ms",
            pct(w["error_pct"] / 100, 2),
        )
    off, s, ra = r["batching_off_c32"], r["soak_c64"], r["ratios"]
    t2 = Table(name, "check", "figure")
    t2.add(
        "`--max-batch 1` at c=32",
        f"{fmt(off['rps'], 1)} RPS, p50 {fmt(off['p50_ms'], 1)} ms, p99 {fmt(off['p99_ms'], 1)} ms",
    )
    t2.add("batching on vs off at c=32", f"**{fmt(ra['batching_on_vs_off_c32'])}×**")
    t2.add(
        "server peak vs in-process ORT ceiling",
        f"{fmt(ra['server_peak_rps'], 1)} / {fmt(ra['ort_best_samples_per_s'], 1)} = **{fmt(ra['server_peak_vs_ort_ceiling'])}**",
    )
    t2.add(
        f"soak, {fmt(s['seconds'], 0)} s at c=64",
        f"{fmt(s['n'], 0)} requests, {fmt(s['errors_5xx'], 0)} answers 5xx, {fmt(s.get('transport_errors', 0), 0)} connection errors, RSS {fmt(s['rss_mb_start'], 0)} → {fmt(s['rss_mb_mid'], 0)} → {fmt(s['rss_mb_end'], 0)} MB, health p50 {fmt(s['health_p50_ms'], 1)} ms / p99 {fmt(s['health_p99_ms'], 1)} ms over {fmt(s['health_probes'], 0)} probes, exit code after SIGTERM {r['batching_on_exit_code']}",
    )
    return [
        f"In-process ORT ceiling (samples/s by batch size): {ceil}.",
        "",
        "Batching on (`--max-batch 32`, no added delay):",
        "",
        *t.lines(out),
        "",
        *t2.lines(out),
        "",
    ]


def serve_peers(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    servers = {"zoo": "zoo serve", "litserve": f"LitServe {r['litserve_version']}"}
    t = Table(
        name,
        "requests",
        "c",
        "server",
        "RPS (of windows)",
        "converged",
        "p50",
        "p99",
        "zoo / LitServe",
    )
    for kind in ("images", "tensors"):
        for row in r[kind]:
            for key, shown in servers.items():
                w = row[key]
                of = "median" if w.get("rps_of") == "median" else "last"  # files before the fix
                t.add(
                    kind,
                    row["concurrency"],
                    shown,
                    f"{fmt(w['rps'], 1)} ({of} of {', '.join(fmt(v, 1) for v in w['rps_windows'])})",
                    fmt(w.get("converged")) if "converged" in w else "not recorded",
                    f"{fmt(w['p50_ms'], 1)} ms",
                    f"{fmt(w['p99_ms'], 1)} ms",
                    f"**{fmt(row['rps_ratio'])}×**" if key == "zoo" else "",
                )
    th = Table(name, "c", "default threads: RPS, p99", "`--threads 1`: RPS, p99", "ratio")
    for row in r["zoo_threads"]:
        a, b = row["zoo"], row["zoo_threads_1"]
        th.add(
            row["concurrency"],
            f"{fmt(a['rps'], 1)}, {fmt(a['p99_ms'], 1)} ms",
            f"{fmt(b['rps'], 1)}, {fmt(b['p99_ms'], 1)} ms",
            f"{fmt(row['rps_ratio'])}×",
        )
    c, idle = r["ceiling"], r["idle_cpu_per_s"]
    ce = Table(name, "turn", "in-process ceiling (img/s)", "zoo serve at c=32 (RPS)")
    for i, (a, b) in enumerate(zip(c["images_per_s"], c["zoo_rps_c32"], strict=True)):
        ce.add(i + 1, fmt(a, 1), fmt(b, 1))
    ce.add("median ratio", "", f"**{fmt(c['ratio'])}**")
    if "ratio_vs_best" in c:
        ce.add(
            "the sweep's figure for this setting",
            fmt(c["sweep_images_per_s"], 1),
            "",
        )
        ce.add(
            "median RPS vs the best ceiling (turns or sweep)",
            fmt(c["best_images_per_s"], 1),
            f"**{fmt(c['ratio_vs_best'])}**",
        )
    given = [f"- {k}: {v}." for k, v in r.get("peers_given", {}).items()]
    return [
        *(["What each side was given:", "", *given, ""] if given else []),
        *t.lines(out),
        "",
        f"Both answered the cat photograph with the same top-1 label "
        f"({r['top1']['zoo']}). Idle, LitServe's processes used {fmt(idle['litserve'])} CPU "
        f"seconds per second (its workers poll their queues) and zoo's {fmt(idle['zoo'])}: "
        "that is why the server not being measured is paused.",
        "",
        f"The server against the in-process ceiling (setting `{c['setting']}`, the fastest of "
        "the sweep in the raw results), measured in turns:",
        "",
        *ce.lines(out),
        "",
        "zoo's default ORT threads (all usable CPUs) against one:",
        "",
        *th.lines(out),
        "",
    ]


def gpu_bench(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    tr = r["trainer"]
    ceiling = tr["synthetic_ceiling_img_per_s"]
    t = Table(name, "run", "img/s", "× ceiling", "data-wait share", "whole process (s)")
    t.add("same loop on synthetic GPU tensors (no data loading)", fmt(ceiling, 0), "1", "", "")
    labels = {
        "on": "`zoo finetune`, image cache (crops in the workers, jitter on the GPU)",
        "on_gpu_resample": "`zoo finetune`, image cache, crops resampled on the GPU (roi_align)",
        "off": "`zoo finetune`, no cache (PIL decode + augmentation in the workers)",
    }
    for k, ips in tr["img_per_s"].items():
        t.add(
            labels.get(k, k),
            fmt(ips, 0),
            f"**{fmt(ips / ceiling, 3)}**" if k == "on" else fmt(ips / ceiling, 3),
            pct(tr["data_wait"][k]),
            fmt(tr["whole_process_s"][k], 1),
        )
    lines = [
        f"Device: {r['device']}, torch {r['torch']}. Trainer: {tr['model']}, batch {tr['batch']}, "
        f"bf16 autocast, channels_last, {fmt(tr['train_images'], 0)} training images "
        f"({tr['data']}) at {tr['image_size']} px, {tr['workers']} loader workers, last of "
        f"{tr['epochs']} epochs. Image cache built first by `{tr['cache_build_command']}` in "
        f"{fmt(tr['cache_build_s'], 1)} s (not in the runs' figures).",
        "",
        *t.lines(out),
        "",
    ]
    tf = r.get("tf32") or {}
    lines += [
        f"TF32 for the latency and parity figures: {tf.get('mode', 'unknown')} (CUDA matmul "
        f"{tf.get('cuda_matmul', '?')}, cuDNN conv {tf.get('cudnn_conv', '?')})"
        + (f"; {tf['note']}" if tf.get("note") else "")
        + ".",
        "",
    ]
    lat = Table(name, "batch", "eager p50", "compiled p50", "speed-up", "compile time")
    for x in r.get("latency", []):
        lat.add(
            x["batch"],
            f"{fmt(x['eager_p50_ms'])} ms",
            f"{fmt(x['compiled_p50_ms'])} ms",
            f"{fmt(x['speedup'])}×",
            f"{fmt(x['compile_s'], 1)} s",
        )
    par = Table(
        name,
        "CUDA path vs CPU eager (real MobileNetV2 weights, bundled photos)",
        "max abs difference",
        "top-1 agrees",
    )
    for k, v in r.get("parity", {}).items():
        par.add(k, fmt(v["max_abs"], 4), fmt(v["top1_agree"]))
    return [
        *lines,
        "Inference latency, resnet18 fp32, eager vs `torch.compile`:",
        "",
        *lat.lines(out),
        "",
        *par.lines(out),
        "",
    ]


def loader_cache(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    t = Table(name, "loader workers", "PIL path (img/s)", "image cache (img/s)", "cache / PIL")
    for w, row in r["by_workers"].items():
        ratio = row["ratio"]
        cell = f"**{fmt(ratio)}×**" if int(w) == r["auto_workers"] else f"{fmt(ratio)}×"
        t.add(
            f"{w} (the trainer's default here)" if int(w) == r["auto_workers"] else w,
            fmt(row["median_img_per_s"]["pil"], 1),
            fmt(row["median_img_per_s"]["cache"], 1),
            cell,
        )
    lines = [
        f"{r['data']}; batches of {r['batch']}, {r['images_per_pass']} images per timed pass, "
        f"medians of {r['rounds']} alternating passes. Cache built first in "
        f"{fmt(r['cache_build_s'], 1)} s for {fmt(r['cache_build_images'], 0)} images.",
        "",
        *t.lines(out),
        "",
    ]
    if r.get("trainer"):
        tr = Table(
            name,
            "`--image-cache`",
            "run",
            "workers",
            "data-wait share",
            "img/s",
            "epoch (s)",
            "whole process (s)",
            "val acc",
        )
        for key, row in r["trainer"].items():
            tr.add(
                row.get("mode", key),
                row.get("phase", "not recorded"),  # files before the cold/warm runs
                fmt(row.get("workers")),
                pct(row["data_wait"]),
                fmt(row["img_per_s"], 1),
                fmt(row.get("epoch_s"), 1),
                fmt(row["whole_run_s"], 1),
                fmt(row["val_acc"], 4),
            )
        if r.get("epoch_speedup_warm") is not None:
            tr.add(
                "**warm epoch, off / on**",
                "",
                "",
                "",
                "",
                f"**{fmt(r['epoch_speedup_warm'])}×**",
                "",
                "",
            )
        lines += [f"`{r['trainer_command']}`:", "", *tr.lines(out), ""]
    return lines


def cache_accuracy(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    t = Table(
        name,
        "task",
        "`--image-cache on` (per seed)",
        "`off` (per seed)",
        "gap of the means (points)",
        "t interval of the gap (points)",
        "verdict",
        "largest seed spread (points)",
    )
    for task, x in r["tasks"].items():
        ci = x.get("gap_interval_points") or {}
        t.add(
            f"{task}: `{x['model']} {x['options']}`",
            ", ".join(fmt(v, 4) for v in x["val_acc"]["on"]),
            ", ".join(fmt(v, 4) for v in x["val_acc"]["off"]),
            fmt(x["gap_points"]),
            f"{fmt(ci['low'])} to {fmt(ci['high'])}" if ci.get("low") is not None else "none",
            x.get("verdict", "cannot detect an effect of this size (too few seeds)"),
            fmt(x["seed_spread_points"]),
        )
    return [f"Seeds {', '.join(str(s) for s in r['seeds'])}.", "", *t.lines(out), ""]


def cli_startup(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    t = Table(name, "command", "median wall clock (s)", "× typer + rich", "peak RSS (MiB, max)")
    for cmd, row in r["summary"].items():
        t.add(
            f"`{cmd}`" if cmd.startswith("zoo") else "`python -c 'import typer, rich'`",
            fmt(row["median_s"], 3),
            fmt(row["ratio_vs_typer_rich"]),
            fmt(row["peak_rss_mib_max"], 1),
        )
    compiled = (
        " zoo's packages byte-compiled first, as `pip install` does (with PYTHONDONTWRITEBYTECODE"
        " set, an edited module would otherwise be compiled again at every start)."
        if r.get("byte_compiled")
        else ""
    )
    return [
        f"{r['rounds']} rounds, the order of the commands alternating.{compiled}",
        "",
        *t.lines(out),
        "",
    ]


def quickstart(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    s = r["summary"]
    t = Table(name, "measure", "seconds")
    t.add("**wall clock, median of rounds**", f"**{fmt(s['median_wall_s'], 1)}**")
    t.add(
        "wall clock, first round (the file cache cold only if nothing ran before)",
        fmt(s["first_round_wall_s"], 1),
    )
    t.add("wall clock, slowest round", fmt(s["max_wall_s"], 1))
    t.add("CPU time of every process, median", fmt(s["median_cpu_s"], 1))
    rounds = ", ".join(fmt(w, 1) for w in r["samples"]["wall_s"])
    return [f"{r['rounds']} rounds ({rounds} s), each into an empty folder.", "", *t.lines(out), ""]


def predict_throughput(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    s, st, rs = r["summary"], r["setup"], r["resume"]
    t = Table(name, "measure", "figure")
    t.add(
        "`zoo predict DIR --out x.parquet`, the whole process (median over rounds)",
        f"{fmt(s['cli_images_per_s'], 1)} images/s",
    )
    t.add(
        f"in-process ORT on preprocessed tensors, best batch ({s['ort_best_batch']})",
        f"{fmt(s['ort_best_samples_per_s'], 1)} images/s",
    )
    t.add("**whole process / ORT ceiling**", f"**{fmt(s['ratio_cli_vs_ceiling'], 3)}**")
    if "ratio_big_list_vs_ceiling" in s:  # files from before 2026-12-02 lack these rows
        big = max(r["memory"], key=int)
        t.add(
            f"the same over the {fmt(int(big))}-input list (start-up spread thinner)",
            f"{fmt(s['cli_images_per_s_big_list'], 1)} images/s, "
            f"{fmt(s['ratio_big_list_vs_ceiling'], 3)} × ceiling",
        )
    t.add(
        "single-thread cost per image: decode + preprocess / inference",
        f"{pct(s['decode_share'])} / {pct(s['inference_share'])}",
    )
    if "shared_cores_bound" in s:
        t.add(
            "bound with decoding on the same cores (every core busy), × ceiling",
            fmt(s["shared_cores_bound"], 3),
        )
    m = Table(name, "inputs (a list file)", "peak RSS (MiB)", "wall clock (s)")
    for n, v in r["memory"].items():
        m.add(fmt(int(n)), fmt(v["peak_rss_mib"], 1), fmt(v["wall_s"], 1))
    m.add("**largest / smallest**", f"**{fmt(s['memory_ratio'], 3)}**", "")
    return [
        f"`{st['model']}`, {fmt(st['images'])} photographs, {st['rounds']} rounds (the order "
        "of the process and the in-process ceiling alternating).",
        "",
        *t.lines(out),
        "",
        *m.lines(out),
        "",
        f"Resume: the process SIGKILLed {rs['kills']} times at random moments"
        + (
            f" (each after that attempt had committed a chunk of its own: "
            f"{fmt(rs['each_kill_after_a_new_chunk'])}; chunks committed at each kill: "
            f"{', '.join(str(k['chunks_after']) for k in rs['killed'])})"
            if "killed" in rs
            else ""
        )
        + f", then run to the end: {fmt(rs['rows'])} rows for {fmt(rs['inputs'])} inputs, "
        f"each exactly once: {fmt(rs['each_input_once'])}.",
        "",
    ]


def tracking_overhead(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r, s = d["results"], d["results"]["setup"]
    t = Table(
        name,
        "clock",
        "untracked (s, median)",
        "`--track mlflow` (s, median)",
        "tracked / untracked (per round)",
        "median ratio",
    )
    for clock, label in (("wall", "wall clock"), ("cpu", "CPU time")):
        c = r[clock]
        t.add(
            label,
            fmt(c["median_s"]["untracked"]),
            fmt(c["median_s"]["tracked"]),
            ", ".join(fmt(x, 4) for x in c["ratio_per_round"]),
            f"**{fmt(c['ratio'], 4)}**",
        )
    w = r["warmup_1_epoch_s"]
    t.add(
        "warm-up run of one epoch (s, not compared)", fmt(w["untracked"]), fmt(w["tracked"]), "", ""
    )
    return [
        f"`{s['model']}` on {s['data']}, {s['epochs']} epochs, batch {s['batch']}, "
        f"{s['workers']} loader worker(s), {s['device']}; {s['rounds']} rounds, the order "
        f"alternating. Server: {s['server']}. Every epoch of every tracked run read back from "
        f"MLflow: {fmt(r['all_epochs_logged'])}. Command: `{s['zoo_command']}`.",
        "",
        *t.lines(out),
        "",
    ]


def tune_cost(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    t = Table(
        name,
        "task",
        "seed",
        "epochs: ASHA (trials stopped)",
        "epochs: FIFO",
        "ASHA / FIFO epochs",
        "best val acc: ASHA",
        "best drawn trial: ASHA",
        "best val acc: FIFO",
        "zoo's defaults",
        "baseline trial: ASHA (its status), FIFO (= the defaults' run?)",
        "images decoded: ASHA, FIFO",
        "wall clock: ASHA, FIFO (s)",
    )
    for task, x in r["tasks"].items():
        for run in x["runs"]:
            a, f = run["asha"], run["fifo"]
            same = "yes" if run["fifo_baseline_is_default"] else "**no**"
            t.add(
                task,
                run["seed"],
                f"{fmt(a['epochs'])} ({fmt(a['stopped'])})",
                fmt(f["epochs"]),
                fmt(run["epoch_share"], 3),
                fmt(a["best_val_acc"], 4),
                fmt(a.get("best_drawn_val_acc"), 4),  # recorded since the baseline's bench fix
                fmt(f["best_val_acc"], 4),
                fmt(run["default_val_acc"], 4),
                f"{fmt(a['baseline_val_acc'], 4)} ({a['baseline_status']}), "
                f"{fmt(f['baseline_val_acc'], 4)} ({same})",
                f"{fmt(a['images_decoded'])}, {fmt(f['images_decoded'])}",
                f"{fmt(a['wall_s'], 1)}, {fmt(f['wall_s'], 1)}",
            )
        t.add(
            f"**{task}: mean over seeds**",
            "",
            "",
            "",
            f"**{fmt(x['epoch_share_mean'], 3)}**",
            f"**{fmt(x['asha_best_mean'], 4)}**",
            f"**{fmt(x.get('asha_best_drawn_mean'), 4)}**",
            fmt(x["fifo_best_mean"], 4),
            f"**{fmt(x['default_mean'], 4)}**",
            "",
            "",
            "",
        )
    tasks = "; ".join(
        f"{task}: `zoo tune {x['model']} {x['options']}`, {x['trials']} trials of at most "
        f"{x['max_epochs']} epochs, {fmt(x['images'])} images"
        for task, x in r["tasks"].items()
    )
    smoke = " A smoke run (`--smoke`): not a measurement." if r.get("smoke") else ""
    return [
        f"Search seeds {', '.join(str(s) for s in r['seeds'])}. {tasks}.{smoke}",
        "",
        *t.lines(out),
        "",
    ]


def ood(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r, s = d["results"], d["results"]["setup"]
    kinds = list(r["fpr_at_95_tpr_by_score"])
    labels = {
        "digits_vs_photos": "digits model, photographs outside",
        "photos_vs_digits": "photos model, digits outside",
    }
    head = ["test accuracy", "ECE before → after", "test images accepted", "outside rejected"]
    scores = [f"`{k}`: AUROC; FPR at TPR95" for k in kinds]
    t = Table(name, "model, outside images (mean over seeds)", *head, *scores)
    for key, m in r["summary"].items():
        t.add(
            labels.get(key, key),
            fmt(m["acc"], 4),
            f"{fmt(m['ece_before'], 4)} → {fmt(m['ece_after'], 4)}",
            pct(m["accepted_in"]),
            pct(m["rejected_out"]),
            *(f"{fmt(m[k]['auroc'], 3)}; {fmt(m[k]['fpr_at_95_tpr'], 3)}" for k in kinds),
        )
    per = Table(
        name,
        "run",
        "seed",
        "temperature",
        "rule: score, threshold",
        "accepted of the test images",
        "rejected of the outside images",
    )
    for key, rows in r["runs"].items():
        for x in rows:
            per.add(
                labels.get(key, key),
                x["seed"],
                fmt(x["temperature"], 3),
                f"`{x['rule']['score']}`, {fmt(x['rule']['threshold'], 3)}",
                f"{pct(x['accepted_in'])} of {fmt(x['n_in'])}",
                f"{pct(x['rejected_out'])} of {fmt(x['n_out'])}",
            )
    default = "the same" if r["default_is_best"] else "**not the best**"
    split = ", ".join(f"{k} {pct(v, 0)}" for k, v in s["split"].items())
    sweep_lines: list[str] = []
    if sweep := r.get("knn_k_sweep"):
        names = list(sweep)
        cols = [f"{labels.get(n, n)}: test accepted; outside rejected" for n in names]
        ks = Table(name, "kNN score's k (val threshold for 95%, mean over seeds)", *cols)
        for k in sweep[names[0]]:
            ks.add(
                f"`k = {k}`{' (zoo: `KNN_K`)' if str(s['knn_k']) == k else ''}",
                *(
                    f"{pct(sweep[n][k]['accepted_in'])}; {pct(sweep[n][k]['rejected_out'])}"
                    for n in names
                ),
            )
        sweep_lines = ["", *ks.lines(out)]
    return [
        f"`{s['command']}`; seeds {', '.join(str(x) for x in s['seeds'])}; "
        f"{s['photos_per_class']} photographs per class; split per class: {split}. FPR at TPR95: "
        "the share of outside images accepted at the threshold that keeps 95% of the test "
        "images.",
        "",
        *t.lines(out),
        "",
        f"Best score kind (lowest mean FPR at TPR95 over every run): `{r['best_score']}`; zoo's "
        f"default `{s['default_score']}`: {default}. ECE after / before, mean over runs: "
        f"{fmt(r['ece_after_over_before'], 3)}.",
        "",
        *per.lines(out),
        *sweep_lines,
        "",
    ]


def enroll(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r, s = d["results"], d["results"]["setup"]
    labels = {"digits": "digits: a left-out digit", "faces": "photos model: `face` (LFW)"}

    def interval(ci: dict[str, Any], digits: int) -> str:
        if ci.get("low") is None:
            return fmt(ci["mean"], digits)
        return f"{fmt(ci['mean'], digits)} ({fmt(ci['low'], digits)} to {fmt(ci['high'], digits)})"

    t = Table(
        name,
        "model: new class (mean over seeds)",
        "held-out recall (95% t interval)",
        "old classes' top-1 before → after",
        "change (95% t interval)",
        "held-out accepted: rule refitted / rule before",
        "non-faces answered `face`",
    )
    for key, m in r["summary"].items():
        refit, before = m.get("rule_refit") or {}, m.get("rule_before") or {}
        t.add(
            labels.get(key, key),
            interval(m["recall"], 3),
            f"{fmt(m['old_acc_before'], 4)} → {fmt(m['old_acc'], 4)}",
            interval(m["old_acc_change"], 4),
            f"{pct(refit.get('accepted_held_out'))} / {pct(before.get('accepted_held_out'))}",
            pct(m.get("outside_answered_new")),
        )
    names = {
        "plain_imprint": "plain imprint (Qi et al.)",
        "centred_imprint": "centred imprint",
        "centred_imprint_then_fit": "centred imprint, then the row fitted on the five images",
        "then_fit_with_views": "… fitted on them and 4 augmented views of each",
        "then_fit_with_views_bias_capped": "… and its bias capped at 1 point of val top-1 (zoo enroll)",
    }
    first = next(iter(r["summary"].values()))["ablation"]
    names = {k: v for k, v in names.items() if k in first}  # older files: three recipes
    ab = Table(
        name, "recipe (same embeddings)", *(f"{k}: recall; old top-1 change" for k in r["summary"])
    )
    for key, label in names.items():
        ab.add(
            label,
            *(
                f"{fmt(m['ablation'][key]['recall'], 4)}; {fmt(m['ablation'][key]['old_acc_change'], 4)}"
                for m in r["summary"].values()
            ),
        )
    per = Table(
        name, "run", "seed", "new class", "held-out images", "recall", "old top-1 before → after"
    )
    for key, rows in r["runs"].items():
        for x in rows:
            per.add(
                key,
                x["seed"],
                f"`{x['new_class']}`",
                fmt(x["n_held_out"]),
                fmt(x["recall"], 4),
                f"{fmt(x['old_acc_before'], 4)} → {fmt(x['old_acc'], 4)}",
            )
    return [
        f"`{s['command']}`; {s['model']}, {s['epochs']} epochs; seeds "
        f"{', '.join(str(x) for x in s['seeds'])} (left-out digits "
        f"{', '.join(str(x) for x in s['new_digits'])}); {s['shots']} images enrol the class. "
        f"Faces: {s['face_model']}, {s['face_epochs']} epochs on {s['photos_per_class']} "
        "photographs per class.",
        "",
        *t.lines(out),
        "",
        *ab.lines(out),
        "",
        *per.lines(out),
        "",
    ]


def index_scale(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r, st = d["results"], d["results"]["setup"]
    t = Table(
        name, "images", "`zoo index`: ms per image", "its peak RSS (MiB)",
        "`zoo similar`: wall (s)", "its peak RSS (MiB)", "the index's rows (MiB)",
    )  # fmt: skip
    for n, v in r["by_size"].items():
        t.add(
            fmt(int(n)), fmt(v["index_ms_per_image"], 1), fmt(v["index_peak_rss_mib"], 1),
            fmt(v["query_wall_s"], 2), fmt(v["query_peak_rss_mib"], 1), fmt(v["index_rows_mib"], 1),
        )  # fmt: skip
    b = Table(name, "rows", "queries per search", "numpy (ms)", "FAISS (ms)", "FAISS speed-up")
    for x in r["backends"]:
        b.add(
            fmt(x["rows"]), fmt(x["queries"]), fmt(x["numpy_ms"], 2),
            fmt(x.get("faiss_ms"), 2), fmt(x.get("faiss_speedup"), 2),
        )  # fmt: skip
    return [
        f"`{st['model']}`; images: {st['images']}; `zoo similar` with {st['query_images']} "
        f"images; the backend table's rows beyond the real index: {st['backend_rows_beyond_real']}.",
        "",
        *t.lines(out),
        "",
        *b.lines(out),
        "",
    ]


def distill(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r, st = d["results"], d["results"]["setup"]
    t = Table(
        name, "budget", "student", "val accuracy (mean over seeds)",
        "gain over alone (95% t interval)",
    )  # fmt: skip
    for budget, fig in r["budgets"].items():
        epochs = f"{budget[1:]} epochs" + (" (headline)" if budget == st["headline_budget"] else "")
        t.add(epochs, f"`{st['student']}` alone", fmt(fig["mean"]["plain"], 4), "")
        for arm, kd in st["kd_arms"].items():
            ci = fig["kd_gain_interval"][arm]
            t.add(
                epochs,
                f"`{st['student']}` distilled, T {fmt(kd['temperature'], 1)}, "
                f"α {fmt(kd['alpha'], 2)}",
                fmt(fig["mean"][arm], 4),
                f"{fmt(ci['mean'], 4)} ({fmt(ci['low'], 4)} to {fmt(ci['high'], 4)})",
            )
    te, ss, lat = r["teacher"], r["student_size"], r["latency"]
    med = lat["median_p50_ms"]
    return [
        f"Teacher `{st['teacher']}` ({st['teacher_epochs']} epochs, val accuracy "
        f"{fmt(te['val_acc'], 4)}, {fmt(te['params'])} parameters); student `{st['student']}` "
        f"({fmt(ss['params'])} parameters); training views "
        f"{'random' if st['augment'] else 'fixed (--no-augment)'}, teacher logits "
        f"{st['teacher_logits']}; seeds {st['seeds']}; images {st['images']}. "
        f"Verdict: {r['verdict']}. ORT CPU latency at batch 1 (median of {lat['rounds']} "
        f"alternating windows): teacher {fmt(med['teacher'], 3)} ms, student "
        f"{fmt(med['student'], 3)} ms ({fmt(lat['student_over_teacher'], 3)}×).",
        "",
        *t.lines(out),
        "",
    ]


def distill_photos(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r, st = d["results"], d["results"]["setup"]
    t = Table(
        name, "student", "arm", "val accuracy (mean over seeds)",
        "gain over alone (95% t interval)", "teacher on the student's views scaled up",
        "student/teacher latency",
    )  # fmt: skip
    for s in r["students"].values():
        who = f"`{s['student']}` at {s['image_size']} px, {s['epochs']} epochs, weights: {s['weights']}"
        fig, views = s["results"], s["teacher_on_views"]
        t.add(who, "alone", fmt(fig["mean"]["plain"], 4), "", fmt(views["student"], 4),
              fmt(s["latency"]["student_over_teacher"], 3))  # fmt: skip
        for arm, kd in st["kd_arms"].items():
            ci = fig["kd_gain_interval"][arm]
            t.add(
                who,
                f"distilled, T {fmt(kd['temperature'], 1)}, α {fmt(kd['alpha'], 2)}",
                fmt(fig["mean"][arm], 4),
                f"{fmt(ci['mean'], 4)} ({fmt(ci['low'], 4)} to {fmt(ci['high'], 4)})",
                "",
                "",
            )
    te = r["teacher"]
    verdicts = "; ".join(f"`{s['student']}`: {s['verdict']}" for s in r["students"].values())
    return [
        f"Task: {st['task']}; images {st['images']}; seeds {st['seeds']}. Teacher "
        f"`{st['teacher']}` ({st['teacher_epochs']} epochs at {st['teacher_image_size']} px): "
        f"val accuracy {fmt(te['val_acc'], 4)} on its own views, calibration temperature "
        f"{fmt(te['calibration_temperature'], 3)}. Verdicts: {verdicts}.",
        "",
        *t.lines(out),
        "",
    ]


def qat(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    t = Table(
        name, "model", "seed", "fp32 acc", "int8 weights (ort), bits", "int8 acc (ort)",
        "drop (ort), points", "int8 acc (ort) at the other bits", "int8 acc (nncf)",
        "drop (nncf), points",
    )  # fmt: skip
    labels = {
        "qat": "`--qat`",
        "qat_w8": "`--qat --qat-weights 8`",
        "control": "control (no rounding)",
    }
    s = r["start"]
    bits = r.get("cpu_int8_weight_bits")  # None: a file from before the bits were recorded
    t.add("the starting model (post-training int8)", "", fmt(s["fp32"], 4),
          fmt(s.get("weight_bits"), 0), fmt(s["int8_ort"], 4), fmt(s["drop_ort_points"], 2),
          fmt(s.get("int8_ort_other"), 4), fmt(s["int8_nncf"], 4),
          fmt(s["drop_nncf_points"], 2))  # fmt: skip
    for row in r["rows"]:
        t.add(labels[row["arm"]], row["seed"], fmt(row["fp32"], 4),
              fmt(row.get("weight_bits"), 0), fmt(row["int8_ort"], 4),
              fmt(row["drop_ort_points"], 2), fmt(row.get("int8_ort_other"), 4),
              fmt(row["int8_nncf"], 4), fmt(row["drop_nncf_points"], 2))  # fmt: skip
    ci = r["qat_minus_control_drop_ort_points"]
    defaults = ", ".join(f"{k} {v}" for k, v in r["qat_defaults"].items())
    w8_kept = any(row["arm"] == "qat_w8" and row.get("weight_bits") == 8 for row in r["rows"])
    where = (
        "this CPU has no VNNI: `zoo quantize` gives onnxruntime's int8 weights 7 bits "
        "(`reduce_range`), and `--qat` trains for them; `--qat --qat-weights 8` is a model "
        "trained for a VNNI CPU's 8-bit weights, "
        + (
            "which zoo quantize kept here when this was measured (since then it gives them "
            "this CPU's 7 bits)"
            if w8_kept
            else "quantized here at this CPU's 7 bits, as zoo quantize does"
        )
        if bits == 7
        else "this CPU has VNNI: onnxruntime's int8 weights have all their bits"
        if bits is not None
        else "measured before the bench recorded the int8 weights' bits: they had all of them "
        f"(no `reduce_range`), on a CPU with {int8_isa(d)}"
    )
    return [
        f"{r['model']}; {r['n_val']} validation images, {r['n_calibration']} calibration images; "
        f"`--qat` defaults: {defaults}; {where}. The int8 (ort) drop of `--qat` minus the "
        f"control's, paired by seed: {fmt(ci['mean'], 2)} points (95% t interval "
        f"{fmt(ci['low'], 2)} to {fmt(ci['high'], 2)}).",
        "",
        *t.lines(out),
        "",
    ]


def qat_photos(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    t = Table(
        name, "arm", "seed", "int8 vs ImageNet fp32", "int8 vs its own fp32",
        "its fp32 vs ImageNet fp32", "gain over post-training, points", "int8/fp32 latency",
    )  # fmt: skip
    p = r["post_training"]
    t.add("post-training int8", "", fmt(p["agreement"], 4), "", "", "",
          fmt(p["latency_ratio"], 3))  # fmt: skip
    for row in r["rows"]:
        t.add(f"`{row['arm']}`", row["seed"], fmt(row["agreement"], 4),
              fmt(row["agreement_own_fp32"], 4), fmt(row["fp32_agreement"], 4),
              fmt(row["gain_points"], 2), fmt(row["latency_ratio"], 3))  # fmt: skip
    arms = "; ".join(
        f"`{arm}` ({' '.join(a['settings']) or 'no options'}): gain {fmt(a['gain_points']['mean'], 2)} "
        f"points (95% t interval {fmt(a['gain_points']['low'], 2)} to "
        f"{fmt(a['gain_points']['high'], 2)})"
        for arm, a in r["arms"].items()
    )
    held = sum(r["held_out_crops"].values())
    train = sum(r["training_crops"].values())
    return [
        f"{r['model']}; {held} held-out crops of {', '.join(r['held_out_crops'])}; {train} "
        f"training and calibration crops of {', '.join(r['training_crops'])}. By arm: {arms}.",
        "",
        *t.lines(out),
        "",
    ]


def predict_split(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r = d["results"]
    st = r["setup"]
    t = Table(name, "decoding threads", "ORT threads", "images/s (median)", "rounds", "× ceiling")
    for row in r["splits"]:
        label = f"{row['decode_threads']}" + (" (today's default)" if row["default"] else "")
        t.add(
            label,
            row["ort_threads"],
            fmt(row["images_per_s"], 1),
            ", ".join(fmt(x, 1) for x in row["rounds"]),
            fmt(row["vs_ceiling"], 3),
        )
    b = r["best"]
    return [
        f"`{st['model']}`, {fmt(st['images'])} photographs, {st['cpus']} CPUs, {st['rounds']} "
        f"rounds (the splits' order alternating), one warm-up run not kept; ceiling: in-process "
        f"ORT on preprocessed tensors with every core, {fmt(r['ort_ceiling_best_samples_per_s'], 1)} "
        "images/s at its best batch.",
        "",
        *t.lines(out),
        "",
        f"Best: {b['decode_threads']} decoding and {b['ort_threads']} ORT threads, "
        f"{fmt(r['best_vs_default'], 3)}× the default.",
        "",
    ]


def serve_multi(name: str, d: dict[str, Any], out: Doc) -> list[str]:
    r, st = d["results"], d["results"]["setup"]
    t = Table(
        name,
        "scenario",
        "RPS total (median of windows)",
        "converged",
        "A: RPS, p99 ms",
        "B: RPS, p99 ms",
        "client's CPU (cores)",
    )
    rows = [("one server, a worker process per model", r["combined"]["one_server"]),
            ("one server, `--one-process`", r["combined"]["one_process"]),
            ("two servers, a model each", r["combined"]["two_servers"]),
            ("B alone (worker per model)", r["isolation"]["b_alone"]),
            ("B with A flooded (worker per model)", r["isolation"]["b_with_a_flooded"]),
            ("B alone, A's CPUs busy with plain matrix work (worker per model)",
             r["isolation"]["b_alone_a_cpus_busy"]),
            ("B alone (`--one-process`)", r["isolation"]["b_alone_one_process"]),
            ("B with A flooded (`--one-process`)", r["isolation"]["b_one_process_a_flooded"]),
            # the reference: a server per model, on the same cores
            ("B alone, its own server", r["isolation"]["b_alone_own_process"]),
            ("B in its own server, A flooded in another", r["isolation"]["b_own_process_a_flooded"])]  # fmt: skip
    for label, m in rows:
        cells = [
            f"{fmt(m[k]['rps'], 1)}, {fmt(m[k]['p99_ms'], 1)}" if k in m else "" for k in ("a", "b")
        ]
        client = fmt(m["client_cores"], 2) if "client_cores" in m else "not recorded"
        t.add(label, fmt(m["rps_total"], 1), "yes" if m["converged"] else "**no**", *cells, client)
    q = r["ratios"]
    return [
        f"{st['one_server']}; {st['one_process']}; against {st['two_servers']}. Models: "
        f"{st['models']}. Client: {st['client']}. 5xx in the last windows: "
        f"{r['errors_5xx_last_windows']}. Combined RPS against the two servers: "
        f"{fmt(q['combined_rps'], 2)}× with a worker per model, "
        f"{fmt(q['combined_rps_one_process'], 2)}× in one process. With A flooded, B's p99 "
        f"grows {fmt(q['b_p99_flooded_vs_alone'], 2)}× with a worker per model, "
        f"{fmt(q['b_p99_flooded_vs_alone_one_process'], 2)}× in one process, and "
        f"{fmt(q['b_p99_flooded_vs_alone_own_processes'], 2)}× when each model has a server "
        "of its own on the same cores (the reference). Busy CPUs alone, with A idle and its "
        f"CPUs {r['a_cpus']} kept busy by plain matrix work, make B's p99 "
        f"{fmt(q['b_p99_a_cpus_busy_vs_alone'], 2)}× what it is alone: the machine's share, "
        "which no server can give back; A's flood costs B "
        f"{fmt(q['b_p99_flooded_vs_a_cpus_busy'], 2)}× beyond that. The load generator runs on the same "
        f"{r['cpus']} CPUs as the servers: the last column is what it took of them.",
        "",
        *t.lines(out),
        "",
    ]


RENDERERS: dict[str, Callable[[str, dict[str, Any], Doc], list[str]]] = {
    "trainer_overhead": trainer_overhead,
    "feature_cache": feature_cache,
    "imbalance": imbalance,
    "deploy_bench": deploy_bench,
    "serve_load": serve_load,
    "serve_peers": serve_peers,
    "gpu_bench": gpu_bench,
    "loader_cache": loader_cache,
    "cache_accuracy": cache_accuracy,
    "cli_startup": cli_startup,
    "quickstart": quickstart,
    "predict_throughput": predict_throughput,
    "predict_split": predict_split,
    "openvino_bench": openvino_bench,
    "quantize_defaults": quantize_defaults,
    "tracking_overhead": tracking_overhead,
    "tune_cost": tune_cost,
    "ood": ood,
    "index_scale": index_scale,
    "enroll": enroll,
    "distill": distill,
    "distill_photos": distill_photos,
    "qat": qat,
    "qat_photos": qat_photos,
    "serve_multi": serve_multi,
}


def busy(d: dict[str, Any]) -> bool:
    """Recorded as busy (others kept the CPUs busy at its start, or ``--allow-busy``); for
    files from before that flag: more runnable work than CPUs (1-minute load average)."""
    p = d["provenance"]
    if "busy" in p:
        return bool(p["busy"])
    load, cpus = p.get("load_avg_before"), p["machine"].get("logical_cpus")
    return bool(load and cpus and load[0] > cpus)


def int8_isa(d: dict[str, Any]) -> str:
    """The class of integer dot products a result file's CPU had, which int8 and OpenVINO
    figures depend on: ``AMX``, ``AVX-512 VNNI``, ``AVX-VNNI``, ``AVX2, no VNNI`` or
    ``no AVX2`` (``flags not recorded`` for older files)."""
    flags = d["provenance"]["machine"].get("cpu_flags")
    if flags is None:
        return "flags not recorded"
    for flag, name in (
        ("amx_int8", "AMX"),
        ("avx512_vnni", "AVX-512 VNNI"),
        ("avx_vnni", "AVX-VNNI"),
        ("avx2", "AVX2, no VNNI"),
    ):
        if flag in flags:
            return name
    return "no AVX2"


def machine_label(d: dict[str, Any], *, isa: bool = False) -> str:
    """``16 CPUs, NVIDIA H200`` / ``2 CPUs`` (with ``isa``: ``2 CPUs, AVX2, no VNNI``): the
    machine a result file was measured on."""
    m = d["provenance"]["machine"]
    gpus = m.get("gpus") or []
    return ", ".join([f"{m.get('logical_cpus', '?')} CPUs", *gpus[:1], *[int8_isa(d)][:isa]])


def summary(
    results: dict[str, dict[str, Any]],
    marks: dict[str, Staleness],
    out: Doc,
    missing: list[str] | None = None,
) -> list[str]:
    """One row per goal (each file's ``results.headlines``): the commit and date it was
    measured at, the CPU flags an ISA-dependent figure relied on, and the staleness mark;
    then the benchmarks the template shows that have no result file yet (``missing``)."""
    ops = {"<=": "≤", ">=": "≥", "<": "<"}
    t = Table("", "goal", "target", "measured", "met?", "measured at", "raw")
    per_bench = Counter(d["bench"] for d in results.values())
    isas: dict[str, set[str]] = {}
    for d in results.values():
        isas.setdefault(d["bench"], set()).add(int8_isa(d))
    for name, d in results.items():
        mark = marks[name]
        # a bench measured on several machines (2 cores here, 16 on the GPU machine; CPUs with
        # and without VNNI for the int8 figures): say which
        where = (
            f" ({machine_label(d, isa=len(isas[d['bench']]) > 1)})"
            if per_bench[d["bench"]] > 1
            else ""
        )
        if mark.commits_since:
            out.computed.setdefault(name, set()).add(str(mark.commits_since))
        for h in d["results"].get("headlines", []):
            verdict = "—" if h["met"] is None else ("yes" if h["met"] else "**no**")
            if mark.stale:
                verdict += f" (**{mark.mark()}**)"
            if d.get("stale"):
                verdict += " (flagged stale by hand)"
            elif busy(d):
                p = d["provenance"]
                verdict += (
                    f" (provisional: load {p['load_avg_before'][0]} on "
                    f"{p['machine']['logical_cpus']} CPUs)"
                )
            value = dig(d, h["key"])
            shown = fmt(value, 0) if isinstance(value, int) or value is None else short(value)
            goal = f"{ops[h['goal']['op']]} {h['goal']['target']:g}"
            at = f"`{(mark.commit or 'unknown')[:7]}`, {mark.date}{isa_note(h, d)}"
            t.add(
                h["what"] + where,
                goal,
                shown,
                verdict,
                at,
                f"[{name}](bench/{name}.json)",
                source=name,
            )
    if not missing:
        return t.lines(out)
    names = ", ".join(f"`{b}`" for b in missing)
    return [*t.lines(out), "", f"Not measured yet (no result file, so no goal rows): {names}."]


def not_measured(bench: str) -> str:
    """The section of a benchmark the template shows but docs/bench has no file of (yet)."""
    return (
        f"Not measured yet: `docs/bench/{bench}.json` does not exist. "
        f"`bench/run_all.sh --only {bench}` measures it and regenerates this page."
    )


# ---------------------------------------------------------------------------- generation
def load_results(folder: Path = BENCH_DIR) -> dict[str, dict[str, Any]]:
    """Every ``*.json`` result file by stem, checked for the fields the docs need."""
    results = {}
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        missing = [k for k in REQUIRED if k not in doc]
        if missing:
            raise ValueError(
                f"{path}: missing {', '.join(missing)} (write it with bench/provenance.py)"
            )
        if doc["bench"] not in RENDERERS:
            raise ValueError(f"{path}: no renderer for bench {doc['bench']!r} in {__file__}")
        results[path.stem] = doc
    return results


def marks_of(results: dict[str, dict[str, Any]], root: Path = ROOT) -> dict[str, Staleness]:
    return {name: mark_of(d, root) for name, d in results.items()}


def generate(
    template: str,
    results: dict[str, dict[str, Any]],
    marks: dict[str, Staleness] | None = None,
) -> Doc:
    """The doc from the template and the result files; ``marks`` (computed from git when not
    given) say which figures are stale."""
    marks = marks_of(results) if marks is None else marks
    out = Doc("")
    shown: set[str] = set()
    measured = {d["bench"] for d in results.values()}
    missing = [b for b in PLACEHOLDER.findall(template) if b[1] and b[1] not in measured]

    def expand(m: re.Match[str]) -> str:
        if m.group(1) == "summary":
            return "\n".join(summary(results, marks, out, [b[1] for b in missing]))
        bench = m.group(2)
        names = [n for n, d in results.items() if d["bench"] == bench]
        if bench not in RENDERERS:
            raise ValueError(
                f"the template shows {{{{bench {bench}}}}} but {__file__} has no renderer for it"
            )
        if not names:
            return not_measured(bench)
        parts = []
        for n in names:
            shown.add(n)
            d = results[n]
            parts += [
                provenance_line(n, d),
                "",
                *stale_line(d, marks[n]),
                *RENDERERS[bench](n, d, out),
            ]
        return "\n".join(parts).rstrip("\n")

    text = PLACEHOLDER.sub(expand, template)
    unshown = sorted(set(results) - shown)
    if unshown:
        raise ValueError(f"result files not shown by the template: {', '.join(unshown)}")
    out.text = text if text.endswith("\n") else text + "\n"
    return out


def json_numbers(node: Any) -> tuple[list[float], set[str]]:
    """Every number in a JSON document, and every number-looking token in its strings."""
    nums: list[float] = []
    tokens: set[str] = set()
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, bool):
            continue
        if isinstance(x, int | float):
            nums.append(float(x))
        elif isinstance(x, str):
            tokens.update(m.group(1).replace(",", "") for m in NUMBER.finditer(x))
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return nums, tokens


def traces(token: str, percent: bool, nums: list[float], tokens: set[str]) -> bool:
    """Does ``token`` (as shown, e.g. "1,438", "0.983", "77.5" with %) come from the JSON?"""
    plain = token.replace(",", "")
    if plain in tokens:
        return True
    decimals = len(plain.split(".")[1]) if "." in plain else 0
    shown = float(plain)
    # a whole number is shown only for a whole value; a decimal is the value rounded
    half = 0.5 * 10**-decimals + 1e-9 if decimals else 1e-9
    for v in nums:
        candidates = (100 * v, v) if percent else (v,)
        if any(math.isfinite(c) and abs(c - shown) <= half for c in candidates):
            return True
    return False


def check_doc(
    committed: str,
    template: str,
    results: dict[str, dict[str, Any]],
    marks: dict[str, Staleness] | None = None,
) -> list[str]:
    """Every way the published doc can drift from its raw results, as readable problems."""
    marks = marks_of(results) if marks is None else marks
    problems = []
    for line in template.splitlines():
        if line.lstrip().startswith("|") and NUMBER.search(strip_code(line)):
            problems.append(
                f"template has a table row with a number (tables are generated): {line!r}"
            )
        elif not line.lstrip().startswith("|") and FIGURE.search(strip_code(line)):
            problems.append(
                f"template prose has a measured-looking figure (put it in a JSON): {line!r}"
            )
    try:
        doc = generate(template, results, marks)
    except ValueError as exc:
        return [*problems, str(exc)]
    if committed != doc.text:
        problems.append(
            "docs/benchmarks.md differs from the generator's output (a figure's staleness "
            "changes with every commit that touches its measured code): run "
            "python scripts/make_benchmarks_doc.py"
        )
    sources = dict(doc.rows)
    for line in committed.splitlines():
        if not line.lstrip().startswith("|"):
            continue
        numbers = list(NUMBER.finditer(strip_code(line)))
        if not numbers:
            continue
        if not sources.get(line):
            problems.append(f"table row with numbers that the generator did not write: {line!r}")
            continue
        nums, tokens = json_numbers(results[sources[line]])
        tokens |= doc.computed.get(sources[line], set())
        for m in numbers:
            if not traces(m.group(1), m.group(2) == "%", nums, tokens):
                problems.append(
                    f"{m.group(0)!r} in {line!r} is not a value in docs/bench/{sources[line]}.json"
                )
    return problems


def strip_code(line: str) -> str:
    """Text outside `code spans` and links' targets: commands and paths are not figures."""
    line = re.sub(r"`[^`]*`", "", line)
    return re.sub(r"\]\([^)]*\)", "]", line)


# ---------------------------------------------------------------------------- quality.md
def quality_table(data: dict[str, Any], root: Path = ROOT) -> list[str]:
    """docs/quality.md's staleness section: each mutation score with the commit it was
    measured at and the commits since that touched the mutated files or their tests, then
    the modules never mutation-tested."""
    t = Table("", "module", "mutated", "mutants", "score", "measured at", "since")
    for m in data["modules"]:
        mark = staleness(
            root, commit=m["commit"], date=m["date"], paths=(*m["mutated"], *m["tests"])
        )
        t.add(
            m["module"],
            ", ".join(f"`{x}`" for x in m["mutated"]),
            m["mutants"],
            f"{m['score_pct']:.1f} %",
            f"`{m['commit']}`, {m['date']}",
            f"**{mark.mark()}**" if mark.stale else mark.mark(),
        )
    never = Table("", "never mutation-tested", "files")
    for x in data["never_run"]:
        never.add(x["what"], ", ".join(f"`{p}`" for p in x["paths"]))
    out = Doc("")
    return [
        QUALITY_MARKS[0],
        "<!-- generated by scripts/make_benchmarks_doc.py from docs/quality.json -->",
        "",
        f"Staleness of the scores ({data['tool']}): a commit that touched a mutated file or "
        "its selected tests since the measured one (uncommitted changes count as one) makes "
        "the score stale until `scripts/mutation.sh` runs again.",
        "",
        *t.lines(out),
        "",
        *never.lines(out),
        "",
        QUALITY_MARKS[1],
    ]


def with_quality_section(text: str, data: dict[str, Any], root: Path = ROOT) -> str:
    """``text`` (docs/quality.md) with its staleness section regenerated."""
    begin, end = QUALITY_MARKS
    if begin not in text or end not in text:
        raise ValueError(f"{QUALITY} lacks the lines {begin} and {end}")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    return head + "\n".join(quality_table(data, root)) + tail


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--check", action="store_true", help="exit 1 when docs/benchmarks.md is out of date"
    )
    args = p.parse_args()
    results = load_results()
    template = TEMPLATE.read_text()
    quality = QUALITY.read_text()
    new_quality = with_quality_section(quality, json.loads(QUALITY_DATA.read_text()))
    if not has_history(ROOT):
        print("warning: no git history here: every figure reads 'stale?'", file=sys.stderr)
    if args.check:
        problems = check_doc(OUTPUT.read_text(), template, results)
        if quality != new_quality:
            problems.append("docs/quality.md's staleness section is out of date")
        for pr in problems:
            print(pr, file=sys.stderr)
        return 1 if problems else 0
    OUTPUT.write_text(generate(template, results).text)
    QUALITY.write_text(new_quality)
    print(
        f"wrote {OUTPUT.relative_to(ROOT)} from {len(results)} result file(s) and "
        f"{QUALITY.relative_to(ROOT)}'s staleness section"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
