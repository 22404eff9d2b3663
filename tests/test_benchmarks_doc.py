"""docs/benchmarks.md is exactly what scripts/make_benchmarks_doc.py makes of docs/bench/*.json,
every number in its tables is a value of the row's own raw file, and the pieces the bench
scripts share (provenance, the hand-written loop's split, the int8 samples) do what the docs say.

Fast (no benchmark runs): the gate tests break the doc, the template, a renderer or a result
file on purpose and check that each break is caught."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT

sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "scripts")]

import make_benchmarks_doc as gen  # noqa: E402
import provenance  # noqa: E402
import staleness  # noqa: E402

needs_history = pytest.mark.skipif(
    not staleness.has_history(ROOT), reason="no git history in this copy: staleness reads 'stale?'"
)


@pytest.fixture(scope="module")
def results() -> dict:
    return gen.load_results()


@pytest.fixture(scope="module")
def template() -> str:
    return gen.TEMPLATE.read_text()


@pytest.fixture(scope="module")
def marks(results: dict) -> dict:
    """The staleness of each file, computed once from git (about a second)."""
    return gen.marks_of(results)


@needs_history
def test_committed_doc_is_generated_from_the_raw_files(
    results: dict, template: str, marks: dict
) -> None:
    committed = gen.OUTPUT.read_text()
    assert gen.check_doc(committed, template, results, marks) == []
    assert committed == gen.generate(template, results, marks).text


def test_every_raw_file_names_its_commit_versions_and_machine(results: dict) -> None:
    assert results, "docs/bench/ holds no result file"
    for name, doc in results.items():
        p = doc["provenance"]
        assert p["git"]["commit"] and len(p["git"]["commit"]) == 40, name
        assert p["versions"]["torch"], name
        assert p["machine"]["logical_cpus"], name
        assert p["date"][:4].isdigit(), name
        assert doc["results"]["headlines"], f"{name}: no goal rows for the summary"
        for h in doc["results"]["headlines"]:
            assert gen.dig(doc, h["key"]) == h["value"], f"{name}: headline {h['key']} drifted"


def test_a_hand_edited_figure_is_caught(results: dict, template: str, marks: dict) -> None:
    doc = gen.generate(template, results, marks).text
    row = next(
        line
        for line in doc.splitlines()
        if line.startswith("| ") and "**" in line and "\\" not in line  # (repr doubles it)
    )
    number = next(m for m in gen.NUMBER.finditer(gen.strip_code(row)))
    edited = row.replace(number.group(1), number.group(1) + "1", 1)
    problems = gen.check_doc(doc.replace(row, edited), template, results, marks)
    assert any("differs from the generator" in p for p in problems)
    assert any("did not write" in p and edited in p for p in problems)


def test_numbers_in_the_template_are_refused(results: dict, template: str, marks: dict) -> None:
    doc = gen.generate(template, results, marks).text
    for addition, expect in (
        ("| trainer | 1.01 |", "template has a table row with a number"),
        ("The trainer is 1.01× the hand-written loop.", "measured-looking figure"),
        ("It took 12 s.", "measured-looking figure"),
        ("Agreement was 98%.", "measured-looking figure"),
    ):
        problems = gen.check_doc(doc, template + "\n" + addition + "\n", results, marks)
        assert any(expect in p for p in problems), addition
    # prose numbers that are not figures stay allowed: issue numbers, model names, commands
    harmless = "See issue 10 and ResNet-18 on 2 cores: `zoo finetune -b 64 --epochs 12`."
    assert gen.FIGURE.search(gen.strip_code(harmless)) is None


def test_a_renderer_inventing_a_number_is_caught(
    results: dict, template: str, marks: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = gen.RENDERERS["gpu_bench"]

    def lying(name: str, d: dict, out: gen.Doc) -> list[str]:
        t = gen.Table(name, "what", "value")
        t.add("a figure no file holds", "123.456")
        return [*real(name, d, out), *t.lines(out)]

    monkeypatch.setitem(gen.RENDERERS, "gpu_bench", lying)
    doc = gen.generate(
        template, results, marks
    ).text  # the doc agrees with the (lying) generator ...
    problems = gen.check_doc(doc, template, results, marks)
    assert problems and all("'123.456'" in p for p in problems)  # ... but not with the file


def test_traces_rounding_and_percentages() -> None:
    nums, tokens = gen.json_numbers({"a": 0.98263, "b": [1438, 0.775], "c": "batch 64", "d": True})
    assert gen.traces("0.983", False, nums, tokens)
    assert gen.traces("1,438", False, nums, tokens)
    assert gen.traces("77.5", True, nums, tokens)
    assert gen.traces("64", False, nums, tokens)  # copied from a string of the same file
    assert not gen.traces("0.984", False, nums, tokens)
    assert not gen.traces("77.6", True, nums, tokens)
    assert not gen.traces("1", False, nums, tokens)  # a bool is not the number 1


def test_a_goal_without_a_value_reads_a_dash(results: dict, template: str, marks: dict) -> None:
    """A run too short for its figure (one seed: no interval) still renders: the goals row
    shows a dash and says the goal is not met, instead of the generator crashing."""
    doc = copy.deepcopy(results["distill_photos"])
    h = doc["results"]["headlines"][0]
    *path, last = h["key"].split(".")
    parent = doc["results"]
    for k in path:
        parent = parent[k]
    parent[last] = h["value"] = None
    h["met"] = None
    text = gen.generate(template, dict(results, distill_photos=doc), marks).text
    row = next(line for line in text.splitlines() if line.startswith(f"| {h['what']}"))
    assert "| — |" in row and "| yes |" not in row


def test_unshown_or_incomplete_result_files_are_refused(
    results: dict, template: str, marks: dict, tmp_path: Path
) -> None:
    extra = dict(results, other_gpu=results["gpu_bench_h200"])
    both = dict(marks, other_gpu=marks["gpu_bench_h200"])
    assert gen.generate(template, extra, both).text  # same bench name: shown in one section
    no_section = template.replace("{{bench gpu_bench}}", "")
    with pytest.raises(ValueError, match="not shown by the template: gpu_bench_h200"):
        gen.generate(no_section, results, marks)
    (tmp_path / "x.json").write_text(json.dumps({"bench": "gpu_bench", "results": {}}))
    with pytest.raises(ValueError, match="missing schema, command, provenance, stale"):
        gen.load_results(tmp_path)


def test_a_benchmark_without_a_result_file_reads_not_measured_yet(
    results: dict, template: str, marks: dict
) -> None:
    """A script whose JSON does not exist yet: its section and the summary say so, and the
    doc still passes every check."""
    without = {n: d for n, d in results.items() if d["bench"] != "cli_startup"}
    text = gen.generate(template, without, marks).text
    section = text.split("## CLI start-up", 1)[1].split("\n## ", 1)[0]
    assert "Not measured yet: `docs/bench/cli_startup.json` does not exist" in section
    assert "| " not in section and "Measured " not in section
    head = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "Not measured yet (no result file, so no goal rows):" in head and "`cli_startup`" in head
    assert "[cli_startup](" not in text
    assert gen.check_doc(text, template, without, marks) == []
    with pytest.raises(ValueError, match="no renderer"):
        gen.generate(template + "\n{{bench no_such_bench}}\n", results, marks)


def _fake(results: dict, bench: str, body: dict) -> dict:
    """A result file of ``bench`` with ``body`` as its results (another file's provenance)."""
    doc = json.loads(json.dumps(results["cli_startup"]))
    doc.update(bench=bench, command=f"python bench/{bench}.py", results=body)
    return doc


def _tune_run(seed: int, share: float) -> dict:
    search = {"stopped": 0, "best_trial": "trial-001", "best_params": {"lr": 0.003}}
    return {
        "seed": seed,
        "asha": {**search, "epochs": 23, "stopped": 5, "best_val_acc": 0.9652,
                 "best_drawn_val_acc": 0.9652, "baseline_val_acc": 0.9109,
                 "baseline_status": "stopped",
                 "images_decoded": 1797, "wall_s": 61.3},
        "fifo": {**search, "epochs": 48, "best_val_acc": 0.9708, "baseline_val_acc": 0.9387,
                 "baseline_status": "done", "images_decoded": 1797, "wall_s": 118.6},
        "default_val_acc": 0.9387,
        "fifo_baseline_is_default": seed != 1,
        "epoch_share": share,
    }  # fmt: skip


def _ood_run(seed: int) -> dict:
    scores = {
        "msp": {"score": "msp", "auroc": 0.853455, "fpr_at_95_tpr": 0.652381},
        "energy": {"score": "energy", "auroc": 0.933187, "fpr_at_95_tpr": 0.319048},
    }
    return {
        "seed": seed, "acc": 0.9220055710306406, "ece_before": 0.099028, "ece_after": 0.031734,
        "temperature": 0.37114230716499885, "scores": scores,
        "rule": {"score": "energy", "threshold": 4.019289061682255, "acceptance": 0.95},
        "accepted_in": 0.9220055710306406, "rejected_out": 0.7380952380952381, "n_in": 359,
        "n_out": 210,
    }  # fmt: skip


def test_the_new_benchmarks_render_from_their_files(
    results: dict, template: str, marks: dict
) -> None:
    """tracking_overhead, tune_cost and ood files in the shape their scripts write: every
    figure of their sections and summary rows traces to the file."""
    h = provenance.headline
    clock = {
        "runs_s": {"untracked": [33.1, 32.8, 33.5], "tracked": [33.6, 33.2, 33.9]},
        "median_s": {"untracked": 33.1, "tracked": 33.6},
        "ratio_per_round": [1.0151, 1.0122, 1.0119],
        "ratio": 1.0122,
    }
    tracking = {
        "setup": {"model": "simple_cnn", "data": "sklearn digits (1,797 images)", "epochs": 6,
                  "rounds": 3, "batch": 64, "workers": 1, "device": "cpu",
                  "server": "mlflow server, SQLite store", "zoo_command": "zoo finetune MODEL"},
        "warmup_1_epoch_s": {"untracked": 14.1, "tracked": 17.9},
        "all_epochs_logged": True,
        "wall": clock,
        "cpu": {**clock, "ratio": 1.0087},
        "headlines": [h("tracking overhead, whole run", "wall.ratio", 1.0122, "<=", 1.02)],
    }  # fmt: skip
    runs = [_tune_run(s, x) for s, x in ((0, 0.479), (1, 0.5), (2, 0.438))]
    task = {"model": "simple_cnn", "options": "-b 64", "trials": 8, "max_epochs": 6,
            "images": 1797, "runs": runs, "epoch_share_mean": 0.472, "asha_best_mean": 0.9652,
            "asha_best_drawn_mean": 0.9652, "fifo_best_mean": 0.9708,
            "default_mean": 0.9387}  # fmt: skip
    tune = {
        "seeds": [0, 1, 2], "smoke": False, "tasks": {"digits": task},
        "worst_epoch_share": 0.472, "worst_margin_over_defaults": 0.0265,
        "headlines": [h("zoo tune: epochs, worst task", "worst_epoch_share", 0.472, "<=", 0.5)],
    }  # fmt: skip
    mean = {"acc": 0.922, "ece_before": 0.099, "ece_after": 0.0317, "accepted_in": 0.922,
            "rejected_out": 0.7381, "msp": {"auroc": 0.8535, "fpr_at_95_tpr": 0.6524},
            "energy": {"auroc": 0.9332, "fpr_at_95_tpr": 0.319}}  # fmt: skip
    ood = {
        "setup": {"model": "simple_cnn", "epochs": 6, "seeds": [0], "photos_per_class": 150,
                  "split": {"train": 0.6, "val": 0.2, "test": 0.2}, "default_score": "energy",
                  "command": "zoo finetune simple_cnn --data IN --reject auto"},
        "runs": {"digits_vs_photos": [_ood_run(0)], "photos_vs_digits": [_ood_run(0)]},
        "summary": {"digits_vs_photos": mean, "photos_vs_digits": mean},
        "fpr_at_95_tpr_by_score": {"msp": 0.6524, "energy": 0.319},
        "best_score": "energy", "default_is_best": True, "ece_after_over_before": 0.3205,
        "headlines": [h("ECE after / before", "ece_after_over_before", 0.3205, "<=", 0.5)],
    }  # fmt: skip
    files = {"tracking_overhead": tracking, "tune_cost": tune, "ood": ood}
    extra = dict(results, **{b: _fake(results, b, body) for b, body in files.items()})
    both = dict(marks, **dict.fromkeys(files, marks["cli_startup"]))
    text = gen.generate(template, extra, both).text
    assert gen.check_doc(text, template, extra, both) == []
    assert "Not measured yet" not in text
    for bench in files:
        assert f"[{bench}](bench/{bench}.json)" in text  # its goal rows in the summary
    assert "| wall clock | 33.10 | 33.60 | 1.0151, 1.0122, 1.0119 | **1.0122** |" in text
    assert "| digits | 2 | 23 (5) | 48 | 0.438 | 0.9652 | 0.9652 | 0.9708 | 0.9387 |" in text
    assert "| 0.9387 | 0.9109 (stopped), 0.9387 (yes) | 1,797, 1,797 |" in text
    assert "| 0.9109 (stopped), 0.9387 (**no**) |" in text  # seed 1: the run differed
    assert "| **digits: mean over seeds** |  |  |  | **0.472** | **0.9652** | **0.9652** |" in text
    assert (
        "| digits model, photographs outside | 0.9220 | 0.0990 → 0.0317 | 92.2% | 73.8% |" in text
    )
    assert "`energy`, 4.019 | 92.2% of 359 | 73.8% of 210 |" in text


# ---------------------------------------------------------------------------- provenance
@pytest.fixture(autouse=True)
def _bench_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Recording points this process's children at its listing (PYTHONPATH and two
    variables): put back after each test."""
    for name in ("ZOO_BENCH_LOADED", "ZOO_BENCH_ROOT", "PYTHONPATH"):
        monkeypatch.setenv(name, os.environ.get(name, ""))


def test_recording_writes_provenance_from_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ZOO_BENCH_BUSY", raising=False)
    rec = provenance.Recording("unit", argv=[str(ROOT / "bench" / "x.py"), "--flag"])
    # a process the run starts lists the sources it imported (bench/loaded/sitecustomize.py)
    subprocess.run([sys.executable, "-c", "import zoo.errors"], check=True)
    children = [set(f.read_text().split()) for f in rec.loaded.glob("*.txt")]
    assert len(children) == 1 and "zoo/errors.py" in children[0], children
    value = provenance.headline("x vs y", "ratio", 1.02, "<=", 1.05)
    path = rec.write({"ratio": 1.02, "headlines": [value]}, tmp_path / "unit.json")
    doc = json.loads(path.read_text())
    assert set(gen.REQUIRED) <= set(doc) and doc["bench"] == "unit"
    assert doc["command"] == "python bench/x.py --flag"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    commit = head.stdout.strip() or None  # None: not a git checkout (and no ZOO_BENCH_COMMIT)
    measured = doc["provenance"]["measured"]
    paths = tuple(measured["paths"])
    assert measured["from"] == "imported" and "zoo/errors.py" in paths
    assert not set(paths) & set(provenance.RECORDER) and not rec.loaded.exists()
    assert all(provenance.is_source(x) and x.split("/")[0] in provenance.SOURCE_DIRS for x in paths)
    assert measured["sha256"] == provenance.source_digest(paths)
    if commit:  # dirty: anything under the declared folders ("unit" is not in MEASURED: all)
        status = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=all",
                "--",
                *provenance.SOURCE_DIRS,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert doc["provenance"]["git"]["dirty"] == bool(status.stdout.strip())
    assert doc["provenance"]["git"]["commit"] == (commit or provenance.git_state()["commit"])
    m = doc["provenance"]["machine"]
    assert m["logical_cpus"] >= 1 and m["affinity"] and m["cpu_model"]
    flags = Path("/proc/cpuinfo").read_text().split()
    assert m["cpu_flags"] == sorted({f for f in flags if provenance.ISA_FLAG.match(f)})
    assert len(m["hostname_hash"]) == 12 and m["hostname_hash"] == provenance.machine_hash()
    busy = doc["provenance"]["cpu_busy_before"]
    assert 0 <= busy <= 1 and doc["provenance"]["busy"] == (busy > provenance.BUSY_SHARE)
    assert doc["provenance"]["versions"]["onnxruntime"]
    assert len(doc["provenance"]["source_sha256"]) == 64
    assert doc["results"]["headlines"][0]["met"] is True
    provenance.mark_stale(path, "code changed")
    assert json.loads(path.read_text())["stale"] == {
        "measured_on": doc["provenance"]["git"]["commit"],
        "reason": "code changed",
    }


def test_git_state_without_a_checkout_uses_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provenance, "git", lambda *a, **kw: None)
    monkeypatch.delenv("ZOO_BENCH_COMMIT", raising=False)
    assert provenance.git_state()["commit"] is None
    monkeypatch.setenv("ZOO_BENCH_COMMIT", "a" * 40)
    monkeypatch.setenv("ZOO_BENCH_DIRTY", "0")
    state = provenance.git_state()
    assert state["commit"] == "a" * 40 and state["dirty"] is False


def test_headline_verdicts() -> None:
    assert provenance.headline("r", "k", 1.05, "<=", 1.05)["met"] is True
    assert provenance.headline("r", "k", 1.06, "<=", 1.05)["met"] is False
    assert provenance.headline("r", "k", 0.97, ">=", 0.98)["met"] is False
    assert provenance.headline("r", "k", None, ">=", 0.98)["met"] is None


# ---------------------------------------------------------------------------- bench pieces
def test_fit_separates_fixed_and_per_epoch_parts() -> None:
    from trainer_overhead import fit_line

    a, b = fit_line({2: 3.0 + 2 * 1.5, 12: 3.0 + 12 * 1.5})
    assert a == pytest.approx(3.0) and b == pytest.approx(1.5)
    points = {1: 4.0, 2: 6.1, 4: 9.9}  # least squares over three counts
    b_ref, a_ref = np.polyfit(list(points), list(points.values()), 1)
    assert fit_line(points) == (pytest.approx(a_ref), pytest.approx(b_ref))


def test_hand_loop_splits_like_zoo(small_digits: Path) -> None:
    """Both tools must see the same number of train/val images of each class."""
    from hand_train import split

    from zoo.train.data import scan

    classes, hand = split(small_digits, 0.2, 0)
    zoo = scan(small_digits, val_fraction=0.2, seed=0)
    for part in ("train", "val"):
        hand_counts = {c: sum(1 for _, y in hand[part] if classes[y] == c) for c in classes}
        zoo_counts = {c: sum(1 for _, y in zoo.files[part] if y == c) for c in classes}
        assert hand_counts == zoo_counts, part


def test_int8_samples_are_stratified_and_disjoint(small_digits: Path, tmp_path: Path) -> None:
    from deploy_bench import CALIB_PHOTOS, EVAL_PHOTOS, sample_per_class, stratified_split, used

    data = stratified_split(small_digits, tmp_path / "split", 10, seed=0)
    ev = sample_per_class(data / "val", tmp_path / "eval", 5, seed=1)
    ca = sample_per_class(data / "train", tmp_path / "calib", 4, seed=2)
    assert set(ev.values()) == {5} and len(ev) == 10  # every class, the same count
    assert set(ca.values()) == {4} and len(ca) == 10
    files = {
        p: {f.relative_to(p) for f in p.rglob("*.png")}
        for p in (tmp_path / "eval", tmp_path / "calib")
    }
    assert not files[tmp_path / "eval"] & files[tmp_path / "calib"]
    assert used(tmp_path / "eval", 200) == 50 and used(tmp_path / "calib", 40) == 40
    assert not set(EVAL_PHOTOS) & set(CALIB_PHOTOS)


def test_wilson_interval() -> None:
    from zoo.deploy.quantize.verdict import wilson

    low, high = wilson(0.775, 120)
    assert low == pytest.approx(0.692, abs=1e-3) and high == pytest.approx(0.841, abs=1e-3)
    assert wilson(1.0, 200) == [pytest.approx(0.9812, abs=1e-4), 1.0]


def test_tf32_is_set_explicitly() -> None:
    code = (
        "import sys; sys.path.insert(0, 'bench'); from hand_train import set_tf32; "
        "import json; print(json.dumps([set_tf32('default'), set_tf32('off'), set_tf32('on')]))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    default, off, on = json.loads(r.stdout)
    assert off == {"mode": "off", "cuda_matmul": "ieee", "cudnn_conv": "ieee"}
    assert on == {"mode": "on", "cuda_matmul": "tf32", "cudnn_conv": "tf32"}
    assert default["cudnn_conv"] == "tf32"  # torch's default: why the GPU script must set it


def test_allow_busy_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provenance, "cpu_busy_share", lambda seconds=1.0: 0.1)
    monkeypatch.setenv("ZOO_BENCH_BUSY", "1")  # bench/run_all.sh --allow-busy on a loaded machine
    assert provenance.Recording("unit").busy is True
    monkeypatch.setenv("ZOO_BENCH_BUSY", "0")
    assert provenance.Recording("unit").busy is False
    monkeypatch.setattr(provenance, "cpu_busy_share", lambda seconds=1.0: 0.9)
    assert provenance.Recording("unit").busy is True


def test_every_result_file_has_a_command_that_measures_it_again(results: dict) -> None:
    """The doc tells a reader that ``bench/run_all.sh --only NAME`` re-measures a figure (or, for
    the GPU machine's, ``bench/run_gpu_checks.sh``): each result file's bench must be there."""
    suite = (ROOT / "bench" / "run_all.sh").read_text()
    listed = set(re.findall(r'^\s*"(\w+)\|(?:timing|accuracy)\|', suite, re.M))
    gpu = set(
        re.findall(r"python3 bench/(\w+)\.py", (ROOT / "bench/run_gpu_checks.sh").read_text())
    )
    assert "trainer_overhead" in listed and "gpu_bench" in gpu  # the patterns read the scripts
    missing = {d["bench"] for d in results.values()} - listed - gpu
    assert not missing, f"no runner script measures {sorted(missing)}: add a row to run_all.sh"
    assert all((ROOT / "bench" / f"{name}.py").exists() for name in listed | gpu)


# ---------------------------------------------------------------------------- staleness
@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A small git repository: ``measured`` is the commit a figure measured; then one commit
    touches the measured folder ``deploy/``, one touches only ``docs/``."""
    root = tmp_path_factory.mktemp("repo")
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(root),
    }

    def git(*args: str) -> str:
        r = subprocess.run(
            ["git", *args], cwd=root, env=env, capture_output=True, text=True, check=True
        )
        return r.stdout.strip()

    def commit(path: str, text: str) -> str:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
        git("add", "-A")
        git("commit", "-q", "-m", path)
        return git("rev-parse", "HEAD")

    git("init", "-q")
    commit("deploy/runtimes/loader.py", "x = 1\n")
    measured = commit("zoo/core.py", "y = 1\n")
    files = provenance.tree_sources(("deploy", "zoo"), root)
    digest = provenance.digest(files, ("deploy", "zoo"))
    commit("deploy/runtimes/loader.py", "x = 2\n")
    commit("docs/notes.md", "not measured\n")
    return {"root": root, "measured": measured, "digest": digest}


def test_staleness_counts_the_commits_that_touched_the_measured_paths(history: dict) -> None:
    root, measured = history["root"], history["measured"]

    def mark(paths: tuple[str, ...], **kw: object) -> staleness.Staleness:
        return staleness.staleness(root, commit=measured, date="2026-11-30", paths=paths, **kw)

    assert mark(("deploy", "zoo")).commits_since == 1  # the docs/ commit does not count
    assert mark(("deploy", "zoo")).mark() == "stale: 1 commit touched the measured code since"
    assert mark(("zoo",)).mark() == "current"
    # an untracked module under a measured path counts as one more (the commit to be made)
    (root / "zoo" / "extra.py").write_text("z = 1\n")
    try:
        assert mark(("zoo",)).mark() == "stale: 1 commit touched the measured code since"
        assert mark(("deploy", "zoo")).commits_since == 2
    finally:
        (root / "zoo" / "extra.py").unlink()
    unknown = staleness.staleness(root, commit="f" * 40, date="2026-11-30", paths=("zoo",))
    assert unknown.commits_since is None and unknown.mark().startswith("stale? commit `fffffff`")
    # a file's commit label is checked against that commit's sources
    label = mark(("zoo",), label=(("deploy", "zoo"), history["digest"]))
    assert label.label_true is True
    wrong = staleness.staleness(
        root,
        commit=provenance.git("rev-parse", "HEAD", root=root).decode().strip(),
        date="2026-11-30",
        paths=("zoo",),
        label=(("deploy", "zoo"), history["digest"]),
    )
    assert wrong.label_true is False and "not that commit's" in wrong.mark()


def test_a_figure_that_lists_its_files_stays_current_when_others_change(history: dict) -> None:
    """A run records the files its processes imported: a commit to another file of the same
    folder leaves it current, one to a listed file makes it stale."""
    root, measured = history["root"], history["measured"]
    kw = {"commit": measured, "date": "2026-11-30"}
    assert staleness.staleness(root, paths=("zoo/core.py",), **kw).mark() == "current"
    assert staleness.staleness(root, paths=("deploy/runtimes/loader.py",), **kw).commits_since == 1
    assert staleness.staleness(root, paths=("deploy/other.py",), **kw).mark() == "current"


def test_a_matching_digest_makes_a_figure_current(history: dict) -> None:
    root, measured = history["root"], history["measured"]
    now = provenance.digest(provenance.tree_sources(("deploy",), root), ("deploy",))
    kw = {"commit": measured, "date": "2026-11-30", "paths": ("deploy",)}
    assert staleness.staleness(root, **kw).commits_since == 1
    assert staleness.staleness(root, measured_sha256=now, **kw).mark() == "current"


def test_the_doc_marks_a_stale_figure_in_its_summary_row(
    results: dict, template: str, history: dict
) -> None:
    """A result file whose commit is older than a commit touching its measured paths: the
    summary row and the section say so, with the commit, the date and the count."""
    doc = json.loads(json.dumps(results["trainer_overhead"]))
    doc["provenance"]["git"]["commit"] = history["measured"]
    doc["provenance"]["measured"] = {"paths": ["deploy", "zoo"], "sha256": "0" * 64}
    marks = {n: gen.mark_of(d, history["root"]) for n, d in results.items()}
    marks["trainer_overhead"] = gen.mark_of(doc, history["root"])
    text = gen.generate(template, dict(results, trainer_overhead=doc), marks).text
    row = next(line for line in text.splitlines() if "[trainer_overhead](" in line)
    assert "(**stale: 1 commit touched the measured code since" in row
    assert "not that commit's" in row  # its source_sha256 is the real tree's, not this repo's
    assert f"`{history['measured'][:7]}`, {doc['provenance']['date'][:10]}" in row
    assert "> **Stale: 1 commit touched the measured code since" in text
    # the count is the generator's, not a value of the file, and still traces
    problems = gen.check_doc(text, template, dict(results, trainer_overhead=doc), marks)
    assert problems == []


def test_isa_dependent_figures_name_the_flags() -> None:
    d = {"provenance": {"machine": {"cpu_flags": ["avx2", "avx512_vnni", "avx512f"]}}}
    h = {"what": "static int8 vs ORT fp32 latency"}
    assert (
        gen.isa_note(h, d) == "; ISA: avx2, avx512_vnni (of avx2, avx512_vnni, avx_vnni, amx_int8)"
    )
    assert gen.isa_note({"what": "loader img/s"}, d) == ""
    assert "not recorded" in gen.isa_note(h, {"provenance": {"machine": {}}})


def test_quality_section_marks_stale_scores(history: dict) -> None:
    data = {
        "tool": "mutmut",
        "modules": [
            {
                "module": "runtime",
                "mutated": ["deploy/runtimes/loader.py"],
                "tests": [],
                "commit": history["measured"][:7],
                "date": "2026-11-30",
                "mutants": 10,
                "score_pct": 90.0,
            },
            {
                "module": "core",
                "mutated": ["zoo/core.py"],
                "tests": [],
                "commit": history["measured"][:7],
                "date": "2026-11-30",
                "mutants": 5,
                "score_pct": 100.0,
            },
        ],
        "never_run": [{"what": "the notes", "paths": ["docs/notes.md"]}],
    }
    begin, end = gen.QUALITY_MARKS
    text = gen.with_quality_section(f"# Q\n{begin}\nold\n{end}\nrest\n", data, history["root"])
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert "**stale: " in rows["| runtime"] and "current" in rows["| core"]
    assert text.startswith("# Q\n") and text.endswith("rest\n") and "old" not in text
    with pytest.raises(ValueError, match="staleness:begin"):
        gen.with_quality_section("# no marks\n", data, history["root"])


@needs_history
def test_quality_md_staleness_section_is_current() -> None:
    data = json.loads(gen.QUALITY_DATA.read_text())
    assert gen.QUALITY.read_text() == gen.with_quality_section(gen.QUALITY.read_text(), data)


# ---------------------------------------------------------------------------- README
def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lstrip("#").strip().lower())
    return text.replace(" ", "-")


def test_readme_figures_point_at_the_generated_doc() -> None:
    """The README states no benchmark figure of its own: it links to sections of the generated
    doc (each link must land on a heading there), and speed comparisons carry no number."""
    readme = (ROOT / "README.md").read_text()
    doc = gen.OUTPUT.read_text()
    anchors = {_anchor(line) for line in doc.splitlines() if line.startswith("#")}
    links = re.findall(r"docs/benchmarks\.md#([\w\-]+)", readme)
    assert links, "the README links to no section of docs/benchmarks.md"
    assert set(links) <= anchors, set(links) - anchors
    for line in readme.splitlines():
        if re.search(r"LitServe|as fast|faster than|slower than", line):
            assert not gen.FIGURE.search(gen.strip_code(line)), line
            assert "twice" not in line, line


def test_t_interval_of_paired_seed_differences() -> None:
    from common import t_interval

    ci = t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1, t(0.975, 2) = 4.303
    assert ci["mean"] == 2.0 and ci["n"] == 3
    assert ci["low"] == pytest.approx(2 - 4.3027 / 3**0.5, abs=1e-3)
    assert ci["high"] == pytest.approx(2 + 4.3027 / 3**0.5, abs=1e-3)
    assert t_interval([0.3])["low"] is None  # one seed: no interval, never a verdict


def test_int8_figures_of_two_instruction_sets_are_told_apart() -> None:
    """The same bench measured on a VNNI machine and on an AVX2-only one (run_all.sh writes
    the latter to <bench>_avx2.json): the summary names each row's instruction set."""
    vnni = {"provenance": {"machine": {"logical_cpus": 2, "cpu_flags": ["avx2", "avx512_vnni"]}}}
    avx2 = {"provenance": {"machine": {"logical_cpus": 2, "cpu_flags": ["avx2", "fma"]}}}
    assert gen.int8_isa(vnni) == "AVX-512 VNNI" and gen.int8_isa(avx2) == "AVX2, no VNNI"
    assert gen.machine_label(avx2) == "2 CPUs"
    assert gen.machine_label(avx2, isa=True) == "2 CPUs, AVX2, no VNNI"
    assert gen.int8_isa({"provenance": {"machine": {}}}) == "flags not recorded"
    # what run_all.sh would run here: the int8 benches to <name>_avx2.json on this CPU only if
    # it has AVX2 and no VNNI; the others to their own files
    from zoo.system import int8_weight_bits

    plan = subprocess.run(
        ["bash", str(ROOT / "bench" / "run_all.sh"), "--dry-run", "--only", "qat_photos,cli_startup"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    avx2_only = int8_weight_bits() == 7
    assert (
        "qat_photos.py --seeds 0,1,2 --out docs/bench/qat_photos_avx2.json" in plan
    ) == avx2_only
    assert "cli_startup.py --rounds 20\n" in plan  # not ISA-dependent: its own file


def test_quantize_defaults_keeps_its_fp32_sentence_with_and_without_dynamic_rows() -> None:
    """The note under the settings table names fp32's accuracy either way, and says what the
    ``dynamic`` rows are only where the file has them."""
    d = json.loads((ROOT / "docs" / "bench" / "quantize_defaults_avx2.json").read_text())
    static = copy.deepcopy(d)
    static["results"]["rows"] = [r for r in d["results"]["rows"] if r.get("mode") != "dynamic"]
    dynamic = copy.deepcopy(static)
    dynamic["results"]["rows"].append({**static["results"]["rows"][0], "config": "dynamic",
                                       "mode": "dynamic", "n_calibration": 0})  # fmt: skip
    for doc, says in ((static, False), (dynamic, True)):
        text = "\n".join(gen.quantize_defaults("quantize_defaults_avx2", doc, gen.Doc("")))
        assert "fp32 accuracy " in text and "validation images; CPU flags: " in text
        assert ("`dynamic` rows are" in text) is says
        assert ("| `dynamic` | at run time |" in text) is says


def test_qat_says_whether_an_8_bit_model_kept_its_bits_here() -> None:
    """The ``--qat-weights 8`` arm on a CPU without VNNI: the text follows the bits its rows
    were quantized at (kept 8 when measured before zoo quantize gave them 7, else 7)."""
    d = json.loads((ROOT / "docs" / "bench" / "qat_avx2.json").read_text())
    for bits, says in ((8, "kept here when this was measured"), (7, "at this CPU's 7 bits")):
        doc = copy.deepcopy(d)
        for row in doc["results"]["rows"]:
            if row["arm"] == "qat_w8":
                row["weight_bits"] = bits
        assert says in "\n".join(gen.qat("qat_avx2", doc, gen.Doc("")))


def test_feature_cache_says_whether_its_cached_runs_computed_their_features() -> None:
    """A file measured before every cached run computed its features says its cached figures
    are a re-run's; one with the ``again`` runs shows them apart, as no goal."""
    d = json.loads((ROOT / "docs" / "bench" / "feature_cache.json").read_text())
    old = copy.deepcopy(d)
    for key in ("again", "again_speedup"):
        old["results"].pop(key, None)
    new = copy.deepcopy(old)
    new["results"]["again"] = {"seconds": 7.7, "cpu_s": 9.2, "val_acc": 0.9}
    new["results"]["again_speedup"] = 4.3
    for doc, measured_apart in ((old, False), (new, True)):
        text = "\n".join(gen.feature_cache("feature_cache", doc, gen.Doc("")))
        assert ("so the cached figures are those of a re-run" in text) is not measured_apart
        assert ("Every cached run computes its features" in text) is measured_apart
        assert ("| plain vs again | 4.30× faster |" in text) is measured_apart
