"""``--resume``: a changed configuration is refused, ``--extend N`` adds epochs. (Resuming
after a kill is proven at every write in test_crash_consistency.py and, under DDP, in
test_distributed.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_zoo


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
