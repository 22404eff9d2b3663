"""Freeze/unfreeze strategies, frozen BatchNorm, and transfer learning that is real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import read_safetensors, run_zoo
from zoo.factory import create_model
from zoo.train import TrainConfig, build_run, fit, resolve_config
from zoo.train.strategy import set_phase, train_mode


def _options(data: Path, tmp: Path, **kw) -> TrainConfig:
    return TrainConfig(
        model="mobilenet_v2",
        data=str(data),
        runs_root=str(tmp),
        num_workers=0,
        image_size=64,
        batch_size=32,
        progress=False,
        **kw,
    )


def test_linear_probe_keeps_backbone_and_bn_stats_frozen(
    small_digits, tmp_path, mobilenet_weights
) -> None:
    options = _options(small_digits, tmp_path, strategy="linear", epochs=1)
    run = fit(options)
    assert run is not None
    trained = read_safetensors(run / "model" / "model.safetensors")
    ref = create_model("mobilenet_v2").state_dict()
    for k, v in trained.items():
        if k.startswith("classifier.1"):
            assert v.shape[0] == 10
        else:  # weights *and* BatchNorm running stats untouched
            assert torch.equal(v, ref[k]), k
    assert len(build_run(resolve_config(options)).optimizer.param_groups) == 1


def test_frozen_bn_stays_in_eval_mode(small_digits, tmp_path, mobilenet_weights) -> None:
    parts = build_run(
        resolve_config(_options(small_digits, tmp_path, strategy="gradual", epochs=2))
    )
    assert set_phase(parts.groups, "gradual", 1, 0) is True
    train_mode(parts.model, parts.groups, True)
    bns = [m for m in parts.model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(m.training for m in bns)
    assert parts.model.classifier.training
    assert set_phase(parts.groups, "gradual", 1, 1) is False
    train_mode(parts.model, parts.groups, False)
    assert all(m.training for m in bns)


def test_gradual_creates_every_group_at_step_0(small_digits, tmp_path, mobilenet_weights) -> None:
    options = _options(small_digits, tmp_path, strategy="gradual", epochs=2, freeze_epochs=1)
    groups = build_run(resolve_config(options)).optimizer.param_groups
    names = [g["name"] for g in groups]
    assert names == ["backbone_early", "backbone_late", "head"]
    lrs = {g["name"]: g["initial_lr"] for g in groups}
    assert lrs["backbone_early"] < lrs["backbone_late"] < lrs["head"]
    run = fit(options)
    assert run is not None
    trained = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    ref = create_model("mobilenet_v2").state_dict()
    assert not torch.equal(trained["features.0.0.weight"], ref["features.0.0.weight"])  # unfrozen


def test_feature_cache_matches_plain_linear_probe(
    small_digits, tmp_path, mobilenet_weights
) -> None:
    common = [
        "mobilenet_v2",
        "--data",
        str(small_digits),
        "--strategy",
        "linear",
        "--epochs",
        "3",
        "--image-size",
        "64",
        "--no-augment",
        "--runs",
        str(tmp_path),
        "--num-workers",
        "0",
        "--no-progress",
    ]
    a = run_zoo("finetune", *common, "--name", "plain")
    b = run_zoo("finetune", *common, "--name", "cached", "--cache-features")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    acc = [
        json.loads((tmp_path / n / "report.json").read_text())["best"]["val/acc"]
        for n in ("plain", "cached")
    ]
    assert abs(acc[0] - acc[1]) <= 0.05, acc
    assert "features: cached" in b.stderr


@pytest.mark.slow
def test_pretrained_linear_probe_beats_random_init(digits_dir, tmp_path, mobilenet_weights) -> None:
    """Same architecture, same data, same epochs: ImageNet features must win clearly."""
    common = [
        "--data",
        str(digits_dir),
        "--epochs",
        "2",
        "--image-size",
        "64",
        "--runs",
        str(tmp_path),
        "--num-workers",
        "1",
        "--no-progress",
        "--batch-size",
        "64",
    ]
    pre = run_zoo(
        "finetune",
        "mobilenet_v2",
        "--strategy",
        "linear",
        "--cache-features",
        "--name",
        "pre",
        *common,
    )
    rnd = run_zoo("finetune", "mobilenet_v2", "--weights", "none", "--name", "rnd", *common)
    assert pre.returncode == 0 and rnd.returncode == 0, pre.stderr + rnd.stderr
    acc_pre = json.loads((tmp_path / "pre" / "report.json").read_text())["best"]["val/acc"]
    acc_rnd = json.loads((tmp_path / "rnd" / "report.json").read_text())["best"]["val/acc"]
    assert acc_pre > acc_rnd + 0.2, (acc_pre, acc_rnd)
    assert acc_pre > 0.8
