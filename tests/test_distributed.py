"""Real torchrun (torch.distributed.run) processes on CPU with gloo."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ZOO, run_zoo

pytestmark = pytest.mark.dist
COMMON = ["--epochs", "2", "--num-workers", "0", "--no-progress", "--seed", "3", "--lr", "0.003"]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _kill_tree(pid: int) -> None:
    for p in _descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def _last(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]


@pytest.mark.slow
def test_two_processes_match_one_process_at_the_same_global_batch(
    small_digits: Path, tmp_path: Path
) -> None:
    # mlp: no BatchNorm, no dropout; 240 train images = 5 global batches of 48 exactly
    one = run_zoo(
        "finetune",
        "mlp",
        "--data",
        str(small_digits),
        "--batch-size",
        "48",
        *COMMON,
        "--runs",
        str(tmp_path),
        "--name",
        "single",
    )
    two = run_zoo(
        "finetune",
        "mlp",
        "--data",
        str(small_digits),
        "--batch-size",
        "24",
        "--nproc",
        "2",
        *COMMON,
        "--runs",
        str(tmp_path),
        "--name",
        "ddp",
    )
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert "48 global" in two.stderr and "gloo" in two.stderr
    a, b = _last(tmp_path / "single"), _last(tmp_path / "ddp")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)  # float sum order only
    # only rank 0 wrote: one run folder, one metrics line per epoch
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp", "single"]
    assert len((tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()) == 2
    assert two.stdout.strip().splitlines() == [str(tmp_path / "ddp")]
    # evaluation gathered every val sample exactly once
    report = json.loads((tmp_path / "ddp" / "report.json").read_text())
    assert sum(r["support"] for r in report["per_class"]) == 60


@pytest.mark.slow
def test_two_process_run_killed_and_resumed_finishes(small_digits: Path, tmp_path: Path) -> None:
    args = [
        "finetune",
        "crnn",
        "--data",
        str(small_digits),
        "--batch-size",
        "8",
        "--epochs",
        "4",
        "--save-every-steps",
        "4",
        "--num-workers",
        "0",
        "--no-progress",
        "--runs",
        str(tmp_path),
        "--name",
        "k",
        "--nproc",
        "2",
    ]
    proc = subprocess.Popen(
        [ZOO, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    ckpt = tmp_path / "k" / "checkpoints" / "last.pt"
    deadline = time.time() + 180
    while not ckpt.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    _kill_tree(proc.pid)  # the launcher and both workers, wherever their sessions are
    proc.wait()
    assert not (tmp_path / "k" / "model").exists(), "killed before the end"
    resumed = run_zoo("finetune", "--resume", str(tmp_path / "k"), "--nproc", "2", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "k" / "model" / "model.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["k"]
    epochs = [
        json.loads(x)["epoch"] for x in (tmp_path / "k" / "metrics.jsonl").read_text().splitlines()
    ]
    assert epochs == sorted(set(epochs)) and epochs[-1] == 4
    # and back into a single process
    more = run_zoo("finetune", "--resume", str(tmp_path / "k"), "--extend", "1", "--no-progress")
    assert more.returncode == 0, more.stderr
