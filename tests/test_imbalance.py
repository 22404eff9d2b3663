"""Class imbalance: scikit-learn's balanced weights in the loss, a balanced sampler that stays a
function of (seed, epoch), balanced accuracy as a metric and a monitor, and the hint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score
from sklearn.utils.class_weight import compute_class_weight

from tests.conftest import run_zoo, zoo_here
from zoo.errors import InputError
from zoo.train.check import CheckReport
from zoo.train.config import TrainConfig
from zoo.train.data import ResumableSampler
from zoo.train.imbalance import class_weights, imbalance_hint, sample_weights
from zoo.train.metrics import summarize
from zoo.train.resolve import resolve_config

LABELS = [0] * 90 + [1] * 10 + [3] * 30  # class 2 has no training image


def test_class_weights_are_scikit_learns_balanced_ones() -> None:
    got = class_weights(LABELS, 4)
    want = compute_class_weight("balanced", classes=np.array([0, 1, 3]), y=np.array(LABELS))
    assert got[0] == pytest.approx(want[0]) and got[1] == pytest.approx(want[1])
    assert got[3] == pytest.approx(want[2]) and got[2] == 1.0  # never a target
    assert got[1] == pytest.approx(130 / (3 * 10)) and got[1] > got[3] > got[0]
    assert sample_weights(LABELS, 4) == [got[y] for y in LABELS]


def test_balanced_accuracy_is_scikit_learns() -> None:
    g = torch.Generator().manual_seed(0)
    target = torch.tensor([0] * 40 + [1] * 5 + [2] * 15)  # class 3: predicted, never a target
    logits = torch.randn(len(target), 4, generator=g)
    logits[torch.arange(30), target[:30]] += 2.0  # some right, some wrong
    got = summarize(logits, target, ["a", "b", "c", "d"])
    pred = logits.argmax(1).numpy()
    with pytest.warns(UserWarning):  # sklearn: a predicted class absent from the targets
        want = balanced_accuracy_score(target.numpy(), pred)
    assert got["balanced_acc"] == pytest.approx(want)
    assert got["balanced_acc"] != pytest.approx(got["acc"])


def _sampler(epoch: int = 0, rank: int = 0, world: int = 1, **kw: object) -> ResumableSampler:
    labels = [0] * 900 + [1] * 100
    s = ResumableSampler(
        len(labels),
        shuffle=True,
        seed=7,
        batch_size=10,
        drop_last=False,
        rank=rank,
        world_size=world,
        weights=sample_weights(labels, 2),
        **kw,  # type: ignore[arg-type]
    )
    s.set_epoch(epoch)
    return s


def test_balanced_sampler_draws_every_class_equally_and_reproducibly() -> None:
    drawn = [i for i, _ in _sampler()]
    assert len(drawn) == 1000 and drawn == [i for i, _ in _sampler()]  # a function of the seed
    minority = sum(i >= 900 for i in drawn) / len(drawn)
    assert 0.44 < minority < 0.56, minority  # 10 % of the folder, half of the draws
    assert len(set(drawn)) < 1000  # with replacement: the minority repeats
    assert drawn != [i for i, _ in _sampler(epoch=1)]  # a new draw each epoch


def test_balanced_sampler_resumes_mid_epoch_and_shards_over_ranks() -> None:
    whole = [i for i, _ in _sampler(epoch=2)]
    later = _sampler(epoch=2)
    later.set_position(30)  # 30 batches of 10 done
    assert [i for i, _ in later] == whole[300:] and len(later) == 700
    ranks = [[i for i, _ in _sampler(epoch=2, rank=r, world=2)] for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == sorted(whole)
    assert ranks[0] == whole[0::2] and ranks[1] == whole[1::2]


def test_sampler_weights_must_match_the_samples() -> None:
    with pytest.raises(ValueError, match="3 sampling weights for 4 samples"):
        ResumableSampler(4, shuffle=True, seed=0, batch_size=2, drop_last=False, weights=[1.0] * 3)


def test_imbalance_options_are_refused_with_multi_label() -> None:
    base = {"model": "mlp", "data": "/d", "multi_label": True, "weights": "none"}
    for extra, match in (
        ({"class_weights": "auto"}, "single-label"),
        ({"sampler": "balanced"}, "single-label"),
        ({"monitor": "val/balanced_acc"}, "val/macro_f1"),
    ):
        with pytest.raises(InputError, match=match):
            resolve_config(TrainConfig(**base, **extra))  # type: ignore[arg-type]


def test_the_hint_names_the_options_until_one_acts() -> None:
    report = CheckReport(root="/d", imbalance={"train": 9.0})
    hint = imbalance_hint(report, "none", "shuffle")
    assert hint is not None and "9.0×" in hint
    assert "--class-weights auto" in hint and "--sampler balanced" in hint
    acting = imbalance_hint(report, "auto", "shuffle")
    assert acting is not None and acting.startswith("imbalance:") and "--sampler" not in acting
    both = imbalance_hint(report, "auto", "balanced")
    assert both is not None and "twice" in both
    assert imbalance_hint(CheckReport(root="/d", imbalance={"val": 9.0}), "none", "shuffle") is None


def test_the_hint_never_suggests_the_monitor_already_given() -> None:
    """``--monitor val/balanced_acc`` (or val/macro_f1, also every class equally) is named as
    in effect, not suggested again; val/acc or val/loss (or the default) still get it."""
    report = CheckReport(root="/d", imbalance={"train": 9.0})
    for monitor in ("val/balanced_acc", "val/macro_f1"):
        hint = imbalance_hint(report, "none", "shuffle", monitor)
        assert hint is not None and "9.0×" in hint
        assert f"--monitor {monitor} already picks the best epoch" in hint
        assert hint.count("--monitor") == 1 and "try --sampler balanced or --class-weights" in hint
    for monitor in (None, "val/acc", "val/loss"):
        hint = imbalance_hint(report, "none", "shuffle", monitor)
        assert hint is not None and "--monitor val/balanced_acc to pick the best epoch" in hint
    acting = imbalance_hint(report, "auto", "shuffle", "val/balanced_acc")
    assert acting is not None and "--monitor" not in acting and "--sampler" not in acting


def test_finetune_names_the_monitor_given_as_in_effect(small_digits: Path, tmp_path: Path) -> None:
    """``zoo finetune --monitor val/balanced_acc --dry-run`` on an imbalanced folder: the hint
    it prints names that monitor as in effect and suggests only the options not given."""
    data = tmp_path / "imbalanced"
    for d in range(4):
        (data / f"digit_{d}").mkdir(parents=True)
        for f in sorted((small_digits / f"digit_{d}").iterdir())[: 30 if d < 2 else 3]:
            (data / f"digit_{d}" / f.name).symlink_to(f)
    r = zoo_here("finetune", "mlp", "--data", str(data), "--runs", str(tmp_path / "runs"),
                 "--num-workers", "0", "--no-progress", "--val-fraction", "0.34", "--dry-run",
                 "--monitor", "val/balanced_acc")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "hint: class imbalance in train" in r.stderr
    assert "--monitor val/balanced_acc already picks the best epoch" in r.stderr
    assert "and --monitor val/balanced_acc to pick" not in r.stderr


def test_finetune_on_an_imbalanced_folder_with_both_options(
    small_digits: Path, tmp_path: Path
) -> None:
    """Real digits, classes 5–9 cut to 3 images each: the options run end to end, the best
    epoch is chosen by balanced accuracy, and the model folder records what ran."""
    data = tmp_path / "imbalanced"
    for d in range(10):
        (data / f"digit_{d}").mkdir(parents=True)
        files = sorted((small_digits / f"digit_{d}").iterdir())
        for f in files[: 30 if d < 5 else 3]:
            (data / f"digit_{d}" / f.name).symlink_to(f)
    common = ["mlp", "--data", str(data), "--epochs", "2", "--runs", str(tmp_path / "runs")]
    opts = ["--num-workers", "0", "--no-progress", "--val-fraction", "0.34"]
    r = run_zoo("finetune", *common, *opts, "--name", "plain", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "hint: class imbalance in train" in r.stderr and "--class-weights auto" in r.stderr
    r = run_zoo(
        "finetune",
        *common,
        *opts,
        "--name",
        "weighted",
        "--class-weights",
        "auto",
        "--sampler",
        "balanced",
        "--monitor",
        "val/balanced_acc",
    )
    assert r.returncode == 0, r.stderr
    assert "--class-weights auto and --sampler balanced act on it" in r.stderr
    assert "weigh rare classes twice" in r.stderr
    run = tmp_path / "runs" / "weighted"
    report = json.loads((run / "report.json").read_text())
    assert report["best"]["monitor"] == "val/balanced_acc"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    best = max(range(len(rows)), key=lambda i: (rows[i]["val/balanced_acc"], -i))
    assert report["best"]["epoch"] == best + 1
    assert report["best"]["val/balanced_acc"] == pytest.approx(rows[best]["val/balanced_acc"])
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["train"]["class_weights"] == "auto" and config["train"]["sampler"] == "balanced"


def test_the_options_reach_the_loss_and_the_sampler(small_digits: Path, tmp_path: Path) -> None:
    """build_run wires both options in: the loss carries the class weights, the sampler the
    per-sample draw weights of the training split; without them, neither."""
    from zoo.train.build import build_run

    data = tmp_path / "imbalanced"
    for d in range(3):
        (data / f"digit_{d}").mkdir(parents=True)
        for f in sorted((small_digits / f"digit_{d}").iterdir())[: 30 if d else 6]:
            (data / f"digit_{d}" / f.name).symlink_to(f)
    base = {"model": "mlp", "data": str(data), "weights": "none", "num_workers": 0}
    on = build_run(
        resolve_config(TrainConfig(**base, class_weights="auto", sampler="balanced"))  # type: ignore[arg-type]
    )
    labels = [int(y) for _, y in on.data.samples["train"]]
    assert on.loss_fn.weight is not None
    assert on.loss_fn.weight.tolist() == pytest.approx(class_weights(labels, 3))
    assert on.train_sampler.weights is not None
    assert on.train_sampler.weights.tolist() == pytest.approx(sample_weights(labels, 3))
    off = build_run(resolve_config(TrainConfig(**base)))  # type: ignore[arg-type]
    assert off.loss_fn.weight is None and off.train_sampler.weights is None
