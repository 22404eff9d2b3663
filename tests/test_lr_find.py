"""``zoo lr-find``: the rule on plain curves, the sweep on the run's parts (which it must not
touch), and the whole command twice on real digits (the same suggestion both times)."""

from __future__ import annotations

import json
import math
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.conftest import zoo_here
from zoo.train import lr_find
from zoo.train.config import TrainConfig
from zoo.train.resolve import resolve_config


def test_schedule_is_geometric_from_start_to_end() -> None:
    lrs = lr_find.lr_schedule(1e-6, 1.0, 7)
    assert lrs[0] == pytest.approx(1e-6) and lrs[-1] == pytest.approx(1.0)
    ratios = [b / a for a, b in pairwise(lrs)]
    assert ratios == pytest.approx([10.0] * 6)
    for bad in ((0.0, 1.0, 5), (1.0, 1.0, 5), (1e-3, 1.0, 1)):
        with pytest.raises(ValueError):
            lr_find.lr_schedule(*bad)


def test_smoothing_is_a_bias_corrected_moving_average() -> None:
    assert lr_find.smooth([3.0, 3.0, 3.0]) == pytest.approx([3.0, 3.0, 3.0])  # no pull to 0
    s = lr_find.smooth([0.0, 10.0], beta=0.5)
    assert s == pytest.approx([0.0, (0.5 * 0 * 0.5 + 0.5 * 10) / (1 - 0.25)])


def test_average_keeps_the_steps_every_sweep_reached() -> None:
    assert lr_find.average([[1.0, 2.0, 3.0], [3.0, 4.0]]) == [2.0, 3.0]


def test_suggestion_is_a_tenth_of_the_lr_at_the_lowest_loss() -> None:
    lrs = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    assert lr_find.suggest(lrs, [2.0, 1.5, 0.5, 0.9, 9.0]) == pytest.approx(1e-3)
    assert lr_find.suggest(lrs, [2.0, 0.5, 0.5, 0.9, 9.0]) == pytest.approx(1e-4)  # first tie


def test_divergence_is_four_times_the_best_or_not_finite() -> None:
    assert not lr_find.diverged([1.0, 0.5, 2.0])
    assert lr_find.diverged([1.0, 0.5, 2.01])
    assert lr_find.diverged([1.0, math.nan])


def _parts(small_digits: Path):
    from zoo.train.build import build_run

    cfg = TrainConfig(model="simple_cnn", data=str(small_digits), weights="none", num_workers=0,
                      batch_size=16, augment=False)  # fmt: skip
    return build_run(resolve_config(cfg))


def test_a_sweep_leaves_the_run_untouched_and_repeats_exactly(small_digits: Path) -> None:
    parts = _parts(small_digits)
    rng = torch.get_rng_state()
    before = {k: v.clone() for k, v in parts.model.state_dict().items()}
    opt_before = parts.optimizer.state_dict()
    lrs = lr_find.lr_schedule(1e-4, 1.0, 12)
    first = lr_find._sweep(parts, lrs, 0)
    assert 2 <= len(first) <= 12 and all(math.isfinite(v) for v in first[:-1])
    assert lr_find._sweep(parts, lrs, 0) == first  # seeded: the same losses again
    assert lr_find._sweep(parts, lrs, 1) != first  # another sweep sees another order
    after = parts.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert parts.optimizer.state_dict() == opt_before and not parts.optimizer.state
    assert torch.equal(torch.get_rng_state(), rng)  # the run's random stream goes on as if


def test_lr_find_twice_gives_the_same_suggestion(four_digits: Path, tmp_path: Path) -> None:
    args = ["lr-find", "simple_cnn", "--data", str(four_digits), "--steps", "25", "--sweeps",
            "2", "-b", "16", "--no-augment", "--num-workers", "0", "--start", "1e-5"]  # fmt: skip
    r = zoo_here(*args, "--plot", str(tmp_path / "lr1.png"), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)
    assert a["rule"] == lr_find.RULE and len(a["sweeps"]) == 2
    assert a["suggested"] == pytest.approx(lr_find.suggest(a["lrs"], a["loss"]))
    r = zoo_here(*args, "--plot", str(tmp_path / "lr2.png"), cwd=tmp_path)  # and again
    assert r.returncode == 0 and f"suggested lr: {a['suggested']:.3g}" in r.stdout
    # the plot is drawn from the whole averaged curve: equal bytes, the same curve
    assert (tmp_path / "lr1.png").read_bytes() == (tmp_path / "lr2.png").read_bytes()
    assert Image.open(tmp_path / "lr1.png").size == (700, 420)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lr1.png", "lr2.png"]  # no run folder


def test_lr_find_refuses_bad_ranges(four_digits: Path) -> None:
    r = zoo_here(
        "lr-find", "simple_cnn", "--data", str(four_digits), "--start", "1", "--end", "0.1"
    )
    assert r.returncode == 2 and "must be above 0 and below --end 0.1" in r.stderr
    r = zoo_here("lr-find", "simple_cnn", "--data", str(four_digits), "--start", "0")
    assert r.returncode == 2 and "--start 0 must be above 0" in r.stderr


def test_finetune_lr_auto_trains_with_the_suggestion_and_records_it(
    four_digits: Path, tmp_path: Path
) -> None:
    r = zoo_here("finetune", "mlp", "--data", str(four_digits), "--lr", "auto", "--epochs", "1",
                 "--runs", str(tmp_path), "--name", "auto", "--num-workers", "0")  # fmt: skip
    assert r.returncode == 0, r.stderr
    run = tmp_path / "auto"
    found = json.loads((run / "lr_find.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert config["lr"] == found["suggested"] and found["rule"] == lr_find.RULE
    assert found["suggested"] == pytest.approx(lr_find.suggest(found["lrs"], found["loss"]))
    assert f"lr auto: {found['suggested']:.3g}" in r.stderr + r.stdout
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["lr"] <= found["suggested"]  # the schedule starts from the suggestion


def test_lr_auto_dry_run_runs_no_range_test(four_digits: Path, tmp_path: Path) -> None:
    r = zoo_here("finetune", "mlp", "--data", str(four_digits), "--lr", "auto", "--dry-run",
                 "--runs", str(tmp_path), "--num-workers", "0")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "--lr auto would run the LR range test first" in r.stderr and "lr auto:" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_lr_auto_with_nproc_is_a_usage_error(four_digits: Path) -> None:
    r = zoo_here("finetune", "mlp", "--data", str(four_digits), "--lr", "auto", "--nproc", "2")
    assert r.returncode == 2 and "run `zoo lr-find` first" in r.stderr, r.stderr


def test_a_curve_that_ends_at_once_is_refused(small_digits: Path) -> None:
    from zoo.errors import TrainingError

    cfg = TrainConfig(model="mlp", data=str(small_digits), weights="none", num_workers=0)
    with pytest.raises(TrainingError, match="lower --start"):
        lr_find.find_lr(cfg, start=1e30, end=1e33, steps=10, sweeps=1)


def test_lr_auto_is_for_a_new_single_process_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from zoo.errors import InputError

    with pytest.raises(InputError, match=r"resolved by zoo\.train\.fit"):
        resolve_config(TrainConfig(model="mlp", data="d", lr="auto"))
    with pytest.raises(InputError, match="a resumed run keeps its own LR"):
        lr_find.auto_lr(TrainConfig(model="mlp", data="d", lr="auto", resume="runs/x"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InputError, match="run `zoo lr-find` first"):
        lr_find.auto_lr(TrainConfig(model="mlp", data="d", lr="auto"))


@pytest.mark.parametrize("value", ["fast", "-1", "0", "inf"])
def test_a_bad_lr_is_a_usage_error(value: str, tmp_path: Path) -> None:
    r = zoo_here("finetune", "mlp", "--data", str(tmp_path), "--lr", value)
    assert r.returncode == 2 and "--lr" in r.stderr, r.stderr
