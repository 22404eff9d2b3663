"""Kill a real ``zoo finetune`` with SIGKILL at an arbitrary step, resume it, and get the
bitwise-identical weights of an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ZOO, read_safetensors, run_zoo

# crnn: BatchNorm (running stats, drop_last) and Dropout (RNG) — both must resume exactly.
ARGS = [
    "crnn",
    "--epochs",
    "3",
    "--batch-size",
    "16",
    "--save-every-steps",
    "3",
    "--num-workers",
    "0",
    "--seed",
    "7",
    "--no-progress",
]


def _same_weights(a: Path, b: Path) -> None:
    ta, tb = read_safetensors(a), read_safetensors(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical(small_digits: Path, tmp_path: Path) -> None:
    ref = run_zoo(
        "finetune", *ARGS, "--data", str(small_digits), "--runs", str(tmp_path), "--name", "ref"
    )
    assert ref.returncode == 0, ref.stderr

    rng = random.Random()
    for attempt in range(5):
        name = f"killed{attempt}"
        run = tmp_path / name
        proc = subprocess.Popen(
            [
                ZOO,
                "finetune",
                *ARGS,
                "--data",
                str(small_digits),
                "--runs",
                str(tmp_path),
                "--name",
                name,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 120
        while not (run / "checkpoints" / "last.pt").exists() and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.5))  # an arbitrary step, possibly mid-write
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if not (run / "model").exists():
            break
    else:
        pytest.fail("the run always finished before it could be killed")
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)  # intact after the kill
    assert state["global_step"] > 0
    resumed = run_zoo("finetune", "--resume", str(run), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed" in resumed.stderr
    _same_weights(
        tmp_path / "ref" / "model" / "model.safetensors", run / "model" / "model.safetensors"
    )
    last_ref = torch.load(tmp_path / "ref" / "checkpoints" / "last.pt", weights_only=True)["model"]
    last_res = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(last_ref[k], last_res[k]) for k in last_ref)
    ref_metrics = (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()
    res_metrics = (run / "metrics.jsonl").read_text().splitlines()
    key = ("epoch", "train/loss", "val/acc")
    assert [{k: json.loads(x)[k] for k in key} for x in ref_metrics] == [
        {k: json.loads(x)[k] for k in key} for x in res_metrics
    ][-len(ref_metrics) :]


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
