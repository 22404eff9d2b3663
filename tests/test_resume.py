"""``--resume``: a changed configuration is refused, ``--extend N`` adds epochs, each rank
gets its own running sums back. (Resuming
after a kill is proven at every write in test_crash_consistency.py and, under DDP, in
test_distributed.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.conftest import run_zoo
from zoo.train.resume import gather_epoch_stats, own_epoch_stats


def test_resume_refuses_changed_config_and_extend_adds_epochs(
    small_digits: Path, tmp_path: Path
) -> None:
    args = [
        "mlp",
        "--data",
        str(small_digits),
        "--epochs",
        "1",
        "--runs",
        str(tmp_path),
        "--name",
        "r",
        "--num-workers",
        "0",
        "--no-progress",
    ]
    assert run_zoo("finetune", *args).returncode == 0
    changed = run_zoo("finetune", "--resume", str(tmp_path / "r"), "--lr", "0.5")
    assert changed.returncode == 1 and "refuses a changed configuration" in changed.stderr
    assert "lr" in changed.stderr
    done = run_zoo("finetune", "--resume", str(tmp_path / "r"))
    assert done.returncode == 1 and "--extend" in done.stderr
    ext = run_zoo("finetune", "--resume", str(tmp_path / "r"), "--extend", "1", "--no-progress")
    assert ext.returncode == 0, ext.stderr
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["epochs"] == 2 and len(cfg["schedule_segments"]) == 2
    assert len((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()) == 2


def test_each_rank_resumes_its_own_running_sums() -> None:
    rows = [{"loss": 1.5, "correct": 3, "n": 8}, {"loss": 2.25, "correct": 5, "n": 8}]
    assert [own_epoch_stats(rows, r, 2) for r in (0, 1)] == rows
    # another world size: rank 0 carries the totals, the others start from zero
    assert own_epoch_stats(rows, 0, 1) == {"loss": 3.75, "correct": 8, "n": 16}
    assert own_epoch_stats(rows, 2, 3) == {"loss": 0.0, "correct": 0, "n": 0}
    assert own_epoch_stats(rows[0], 0, 1) == rows[0]  # a checkpoint from before per-rank sums
    assert gather_epoch_stats(rows[1], 1, torch.device("cpu")) == [rows[1]]


def test_a_run_in_training_refuses_a_second_resume(digits16: Path, tmp_path: Path) -> None:
    """Two ``--resume`` of one run both trained from the same checkpoint into the same
    files (each said "resumed"; the second then read the first's config): the process
    training a run holds its lock, a second one is refused before it reads or writes."""
    import fcntl
    import subprocess
    import sys
    import time

    from tests.conftest import zoo_ok
    from zoo.train.run_dir import LOCK_FILE

    run = tmp_path / "r"
    zoo_ok(
        "finetune", "simple_cnn", "--weights", "none", "--data", str(digits16), "--epochs", "1",
        "--runs", str(tmp_path), "--name", "r", "--num-workers", "0", "--no-progress",
        "--no-report",
    )  # fmt: skip
    before = {p.name: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    first = subprocess.Popen(
        [sys.executable, "-m", "zoo.cli.app", "finetune", "--resume", str(run), "--extend", "5000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # until the first holds the lock (a non-blocking flock of ours fails)
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            with open(run / LOCK_FILE, "a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(f, fcntl.LOCK_UN)
                except BlockingIOError:
                    break
            assert time.monotonic() < deadline, "the first resume never took the run's lock"
            time.sleep(0.2)
        second = run_zoo("finetune", "--resume", str(run), "--extend", "1", "--no-progress")
        assert second.returncode == 1 and "Traceback" not in second.stderr
        assert f"{run} is being trained by another process" in second.stderr
        assert "resumed" not in second.stderr
    finally:
        first.kill()
        first.wait()
    # the second wrote nothing: only the first (killed mid-run) may have
    after = {p.name: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    assert set(before) <= set(after)
    with open(run / LOCK_FILE, "a") as f:  # the OS dropped the first's lock at the kill
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
