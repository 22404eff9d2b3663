"""``zoo runs ls`` and ``zoo runs compare`` on real run folders (no tracking server): runs that
finished, one stopped with Ctrl-C (SIGINT) after its first epoch, one that failed before it."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import ZOO, zoo_here

pytestmark = pytest.mark.slow

COMMON = ("--epochs", "2", "--no-progress", "--num-workers", "0")


@pytest.fixture(scope="module")
def runs(four_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``runs/``: ``a`` and ``b`` done (b: SGD at another LR), ``stopped`` interrupted after
    epoch 1, ``bad`` failed at its first step (a non-finite loss, no rollback allowed)."""
    root = tmp_path_factory.mktemp("runs")
    data = ("finetune", "mlp", "--data", str(four_digits))
    for name, extra in (("a", ()), ("b", ("--optimizer", "sgd", "--lr", "0.05"))):
        r = zoo_here(*data, *COMMON, "--name", name, *extra, cwd=root)
        assert r.returncode == 0, r.stderr
    bad = zoo_here(*data, *COMMON, "--name", "bad", "--lr", "1e30", "--max-nonfinite", "1",
                   "--max-rollbacks", "0", cwd=root)  # fmt: skip
    assert bad.returncode == 1 and "Loss is not finite" in bad.stderr
    # 5000 planned epochs: on a loaded machine this process may read "epoch 1" only after the
    # run went on for a while (with 50, a CI run under load finished them all and exited 0)
    # SIGINT at its default, as in a terminal: a suite started in the background (`cmd &`,
    # nohup, some CI runners) hands every child SIGINT ignored, and Python then never turns
    # Ctrl-C into KeyboardInterrupt (the 300 s waits seen in CI runs)
    proc = subprocess.Popen(
        [ZOO, *data, "--epochs", "5000", "--no-progress", "--num-workers", "0", "--name", "stopped"],
        cwd=root, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("epoch 1/5000"):
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            break
    # drain stderr aside and wait for the process itself: a read to EOF would also wait for
    # anything that inherited the pipe, and an undrained pipe could stall the run's last lines
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    # Ctrl-C again every 15 s, as a user would, should the first one land before the
    # handler of the training loop is in place
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        pytest.fail("the interrupted run ignored Ctrl-C for 300 s")
    assert proc.returncode == 130
    return root / "runs"


def test_ls_lists_every_run_with_its_state(runs: Path) -> None:
    r = zoo_here("runs", "ls", cwd=runs.parent)  # default: ./runs
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert set(lines) == {"a", "b", "bad", "stopped"}
    assert lines["a"].endswith("done") and lines["b"].endswith("done")
    assert lines["stopped"].endswith("interrupted") and lines["bad"].endswith("failed")
    report = json.loads((runs / "a" / "report.json").read_text())
    assert (
        f"val/acc {report['best']['val/acc']:.4f} (epoch {report['best']['epoch']})" in lines["a"]
    )
    assert "mlp" in lines["a"] and "digits" in lines["a"] and "epochs 2/2" in lines["a"]

    j = zoo_here("runs", "ls", str(runs), "--json")
    assert j.returncode == 0, j.stderr
    by_name = {Path(d["run"]).name: d for d in json.loads(j.stdout)}
    assert by_name["a"]["best"]["val/acc"] == report["best"]["val/acc"]
    assert by_name["a"]["seconds"] == report["timing"]["total_s"]
    stopped = by_name["stopped"]
    rows = [json.loads(x) for x in (runs / "stopped" / "metrics.jsonl").read_text().splitlines()]
    best = max(rows, key=lambda row: row["val/acc"])  # the first of the best
    assert stopped["epochs"] == len(rows) >= 1 and stopped["epochs_planned"] == 5000
    assert stopped["best_epoch"] == best["epoch"]
    assert stopped["best"]["val/acc"] == best["val/acc"]
    assert by_name["bad"]["epochs"] == 0 and by_name["bad"]["best_epoch"] is None
    # one run folder is a listing of itself
    one = zoo_here("runs", "ls", str(runs / "a"), "--json")
    assert [Path(d["run"]).name for d in json.loads(one.stdout)] == ["a"]


def test_compare_shows_what_differs_and_the_best_metrics(runs: Path, tmp_path: Path) -> None:
    j = zoo_here("runs", "compare", str(runs / "a"), str(runs / "b"), str(runs / "stopped"),
                 "--json")  # fmt: skip
    assert j.returncode == 0, j.stderr
    d = json.loads(j.stdout)
    diff = d["differences"]
    assert diff["optimizer"] == ["adamw", "sgd", "adamw"]
    assert diff["lr"][1] == 0.05 and diff["epochs"] == [2, 2, 5000]
    assert not {"name", "run_dir", "num_workers", "resume", "progress"} & set(diff)
    reports = [json.loads((runs / n / "report.json").read_text()) for n in ("a", "b")]
    assert [r["best"]["val/loss"] for r in d["runs"][:2]] == [
        r["best"]["val/loss"] for r in reports
    ]

    t = zoo_here(
        "runs", "compare", str(runs / "a"), str(runs / "b"), "--plot", str(tmp_path / "c.png")
    )
    assert t.returncode == 0, t.stderr
    lines = t.stdout.splitlines()
    assert lines[0].split() == ["a", "b"]
    optimizer = next(line for line in lines if line.split()[0] == "optimizer")
    assert optimizer.split() == ["optimizer", "adamw", "sgd"]
    acc = next(line for line in lines if line.split()[0] == "val/acc")
    assert acc.split()[1:] == [f"{r['best']['val/acc']:.4f}" for r in reports]
    # the curves: one colour a run (matplotlib's blue, then orange), in both panels
    im = Image.open(tmp_path / "c.png").convert("RGB")
    assert im.size == (1000, 400)
    for colour in ((31, 119, 180), (255, 127, 14)):
        for panel in ((110, 40, 480, 340), (610, 40, 980, 340)):
            pixels = {tuple(p) for p in np.asarray(im.crop(panel)).reshape(-1, 3).tolist()}
            assert colour in pixels, (colour, panel)


def test_bad_input_names_what_to_do(runs: Path, tmp_path: Path) -> None:
    one = zoo_here("runs", "compare", str(runs / "a"))
    assert one.returncode == 2 and "two runs or more" in one.stderr
    not_run = zoo_here("runs", "compare", str(runs / "a"), str(tmp_path))
    assert not_run.returncode == 1 and "is not a zoo run folder" in not_run.stderr
    missing = zoo_here("runs", "ls", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "is not a folder" in missing.stderr
    empty = zoo_here("runs", "ls", str(tmp_path))
    assert empty.returncode == 0 and empty.stdout == "" and "no runs in" in empty.stderr
    untracked = zoo_here("runs", "sync", str(runs / "a"))
    assert untracked.returncode == 1 and "was not trained with --track mlflow" in untracked.stderr


def test_ls_and_compare_read_json_only(runs: Path) -> None:
    """Listing runs never imports torch (it reads the folders' JSON)."""
    code = (
        "import sys\nfrom zoo.cli.app import main\n"
        "for args in (['runs', 'ls', sys.argv[1]], ['runs', 'compare', sys.argv[2], sys.argv[3]]):\n"
        "    sys.argv = ['zoo', *args]\n"
        "    try:\n        main()\n    except SystemExit as e:\n        assert not e.code, e.code\n"
        "print('torch' in sys.modules)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(runs), str(runs / "a"), str(runs / "b")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "False"


def test_compare_and_sync_refuse_what_cannot_work(runs: Path, tmp_path: Path) -> None:
    """A run against itself, a plot that is no PNG (exit 2, before any work) and a sync of a
    folder that is no run (exit 1)."""
    same = zoo_here("runs", "compare", str(runs / "a"), str(runs / "a"))
    assert same.returncode == 2 and "given twice" in same.stderr
    jpg = zoo_here("runs", "compare", str(runs / "a"), str(runs / "b"), "--plot",
                   str(tmp_path / "c.jpg"))  # fmt: skip
    assert jpg.returncode == 2 and ".png" in jpg.stderr
    assert not (tmp_path / "c.jpg").exists()
    nope = zoo_here("runs", "sync", str(tmp_path / "nope"))
    assert nope.returncode == 1 and "is not a zoo run folder" in nope.stderr


def test_compare_keeps_long_values_apart(runs: Path) -> None:
    """Long values (a schedule's segments) end in an ellipsis and never run together."""
    from zoo.train.runs import CELL_WIDTH, Comparison, read_run

    pair = (read_run(runs / "a"), read_run(runs / "b"))
    long = [{"epochs": 3, "lr": 0.1, "name": "cosine"}] * 4
    lines = Comparison(pair, {"schedule_segments": (long, long[:2])}).lines()
    row = next(line for line in lines if "schedule_segments" in line)
    cells = [c for c in row.split("schedule_segments")[1].split("  ") if c]
    assert len(cells) == 2 and all(c.endswith("…") and len(c) <= CELL_WIDTH for c in cells), row


def test_wide_run_names_keep_the_columns_aligned(runs: Path) -> None:
    """A CJK character takes two terminal cells: the columns of ``compare`` and ``ls`` are
    sized in cells (with ``len()`` a Chinese run name pushed every cell after it out of line),
    and a name too wide is cut in cells, ending in an ellipsis."""
    from dataclasses import replace

    from rich.cells import cell_len

    from zoo.train.runs import CELL_WIDTH, Comparison, read_run

    a, b = read_run(runs / "a"), read_run(runs / "b")
    for name in ("数字", "数字分类实验" * 4):
        wide = replace(a, path=a.path.with_name(name))  # the name is the folder's
        lines = Comparison((wide, b), {"lr": (0.001, 0.05)}).lines()
        table = [line for line in lines if line.startswith("  ")]  # the head and the rows
        assert len(table) >= 3 and len({cell_len(line) for line in table}) == 1, lines
        head = lines[0].split()
        assert head[0] == name or (head[0].endswith("…") and cell_len(head[0]) <= CELL_WIDTH)
    listed = [replace(a, path=a.path.with_name(n)).line() for n in ("数字分类", "abcd")]
    assert cell_len(listed[0]) == cell_len(listed[1]), listed


def test_arch_is_the_models_not_the_name_of_the_folder_it_started_from(
    runs: Path, tmp_path: Path
) -> None:
    """A run started from ``runs/a/model`` listed its arch as ``model``."""
    from zoo.train.runs import read_run

    child = tmp_path / "child"
    shutil.copytree(runs / "a", child)
    cfg = json.loads((child / "config.json").read_text())
    for given in (str(runs / "a" / "model"), str(runs / "a")):
        (child / "config.json").write_text(json.dumps({**cfg, "model": given}))
        assert read_run(child).arch == "mlp"  # from its own model folder
        shutil.rmtree(child / "model", ignore_errors=True)  # still running: the parent's
        assert read_run(child).arch == "mlp"
    (child / "config.json").write_text(json.dumps({**cfg, "model": "resnet18"}))
    assert read_run(child).arch == "resnet18"  # a registry name, as given


def test_ls_lists_a_tune_searchs_trials_under_its_name(runs: Path, tmp_path: Path) -> None:
    """``zoo runs ls`` on the folder a ``zoo tune`` search is in lists the trials' run folders
    (``SEARCH/trial-000``), in the search folder's place; it goes one level down into a
    search folder (its ``tune.json``), never into another folder or a run's own."""
    from zoo.train.config import TrainConfig
    from zoo.train.tune.book import SearchBook, SearchSpec, TrialRecord

    root = tmp_path / "runs"
    shutil.copytree(runs / "a", root / "a")
    search = root / "tune-mlp-digits"  # as `zoo tune` lays it out: tune.json beside trial-*/
    trials = {n: TrialRecord(n, {"lr": lr}, "done") for n, lr in (("trial-000", 1e-3),
                                                                  ("trial-001", 0.05))}  # fmt: skip
    for name, src in zip(trials, ("a", "b"), strict=True):
        shutil.copytree(runs / src, search / name)
        cfg = json.loads((search / name / "config.json").read_text())
        (search / name / "config.json").write_text(
            json.dumps({**cfg, "runs_root": str(search), "name": name})
        )
    spec = SearchSpec(TrainConfig("mlp", "d"), {}, 2, "fifo", "val/acc", 1.0, 0.0, None, 0)
    SearchBook(search, spec, trials).write()
    shutil.copytree(runs / "b", tmp_path / "runs" / "other" / "b")  # no search: not listed

    r = zoo_here("runs", "ls", str(root))
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines()]
    assert names == ["a", "tune-mlp-digits/trial-000", "tune-mlp-digits/trial-001"]
    line_a, trial_0 = r.stdout.splitlines()[:2]
    assert trial_0.split()[1:] == line_a.split()[1:]  # the same run: the same columns
    j = zoo_here("runs", "ls", str(root), "--json")
    listed = json.loads(j.stdout)
    assert [d["run"] for d in listed] == [
        str(root / "a"), str(search / "trial-000"), str(search / "trial-001")
    ]  # fmt: skip
    assert [d["search"] for d in listed] == [None, str(search), str(search)]
    # the search folder itself lists its trials, as before
    inside = zoo_here("runs", "ls", str(search))
    assert [line.split()[0] for line in inside.stdout.splitlines()] == ["trial-000", "trial-001"]
    # without its tune.json the folder is no search, and is not descended into
    (search / "tune.json").unlink()
    assert [line.split()[0] for line in zoo_here("runs", "ls", str(root)).stdout.splitlines()] == [
        "a"
    ]
