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
