"""Real torchrun (torch.distributed.run) processes on CPU with gloo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests import crash
from tests.conftest import run_zoo, zoo_here

pytestmark = pytest.mark.dist
COMMON = ["--epochs", "2", "--num-workers", "0", "--no-progress", "--seed", "3", "--lr", "0.003"]


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
def test_two_process_run_killed_at_four_writes_then_resumed_equals_the_uninterrupted_one(
    four_digits: Path, tmp_path: Path
) -> None:
    """Rank 0 SIGKILLs itself (ZOO_FAULT_KILL_AT) and torchrun takes rank 1 down with it, four
    times in a row, each resume killed in turn: after a mid-epoch step save (both ranks resume
    mid-epoch), after the step save on epoch 2's last step (rank 1 validates right after
    resuming), after epoch 2's last.pt records its new best and before best.pt (the issue's
    window), and inside the model folder's swap (rank 1 waiting at the final barrier). The
    2-process resume must equal an uninterrupted 2-process run bitwise (crnn: BatchNorm
    statistics and dropout RNG on both ranks; per-rank running loss sums; timm's recipes
    drawing per image and per step, and the EMA). A chained subset of
    the boundaries, because each torchrun launch costs seconds of start-up:
    test_crash_consistency walks every boundary in one process, and DDP adds no write of its
    own (only rank 0 writes)."""
    args = [
        *("finetune", "crnn", "--data", str(four_digits), "--batch-size", "8", "--epochs", "2"),
        *("--save-every-steps", "4", "--num-workers", "0", "--no-progress", "--name", "k"),
        *("--nproc", "2"),
        # timm's recipes, each rank seeded apart: TrivialAugment, Random Erasing, Mixup/CutMix,
        # EMA (a policy draws from Python's and NumPy's generators, the batch ops per step)
        *("--auto-augment", "trivialaugment", "--random-erasing", "0.5", "--mixup", "0.4"),
        *("--cutmix", "1.0", "--ema", "--ema-decay", "0.9"),
    ]
    trace = tmp_path / "trace"
    ref = run_zoo(*args, "--runs", str(tmp_path / "ref"), env={"ZOO_FAULT_TRACE": str(trace)})
    assert ref.returncode == 0, ref.stderr
    labels = crash.trace(trace)
    step_save = labels.index("checkpoints/last.pt") + 1
    commit = max(n for n, x in enumerate(labels, 1) if x == "checkpoints/best.pt") - 1
    last_step = commit - 2  # step 12, then the epoch's TensorBoard scalars, then its commit
    model = labels.index("model") + 1
    assert labels[last_step - 1 : commit] == [
        *("checkpoints/last.pt", "tensorboard", "checkpoints/last.pt"),
    ]
    assert step_save < labels.index("metrics.jsonl") < last_step  # and epoch 2 improved
    run, done = tmp_path / "run" / "k", 0
    resume = ["finetune", "--resume", str(run), "--nproc", "2", "--no-progress"]
    for n, side in ((step_save, ""), (last_step, ""), (commit, ""), (model, ":inside")):
        attempt = tmp_path / f"trace{n}"
        env = {"ZOO_FAULT_KILL_AT": f"{n - done}{side}", "ZOO_FAULT_TRACE": str(attempt)}
        killed = run_zoo(*(resume if done else [*args, "--runs", str(tmp_path / "run")]), env=env)
        assert killed.returncode != 0 and not (run / "model").exists(), killed.stderr
        # each attempt (its recovery included) wrote what the uninterrupted run wrote next
        reached = n - 1 if side else n
        assert crash.trace(attempt) == labels[done:reached]
        done = reached
    resumed = run_zoo(*resume)
    assert resumed.returncode == 0, resumed.stderr
    crash.assert_same_run(tmp_path / "ref" / "k", run)
    # and back into a single process
    more = zoo_here("finetune", "--resume", str(run), "--extend", "1", "--no-progress")
    assert more.returncode == 0, more.stderr
    epochs = [json.loads(x)["epoch"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3]
