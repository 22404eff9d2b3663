"""Freeze/unfreeze strategies, frozen BatchNorm, and transfer learning that is real."""

from __future__ import annotations

import json
import os
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
    import shutil

    data = shutil.copytree(small_digits, tmp_path / "digits")  # one image's date changes below
    common = [
        "mobilenet_v2",
        "--data",
        str(data),
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
    env = {"ZOO_CACHE": str(tmp_path / "cache")}
    a = run_zoo("finetune", *common, "--name", "plain", env=env)
    b = run_zoo("finetune", *common, "--name", "cached", "--cache-features", env=env)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    acc = [
        json.loads((tmp_path / n / "report.json").read_text())["best"]["val/acc"]
        for n in ("plain", "cached")
    ]
    assert abs(acc[0] - acc[1]) <= 0.05, acc
    assert "computed into the feature cache" in b.stderr, b.stderr
    # another run (a tune trial with another lr, seed or head) reads them from disk: same numbers
    c = run_zoo("finetune", *common, "--name", "again", "--cache-features", env=env)
    assert c.returncode == 0 and "read from the feature cache" in c.stderr, c.stderr
    rows = [(tmp_path / n / "metrics.jsonl").read_text() for n in ("cached", "again")]
    strip = [
        [
            {
                k: v
                for k, v in json.loads(r).items()
                if k not in ("epoch_s", "img_per_s", "data_wait")
            }
            for r in x.splitlines()
        ]
        for x in rows
    ]
    assert strip[0] == strip[1]
    # an edited image is a new key: computed again
    first = next(data.rglob("*.png"))
    os.utime(first, ns=(first.stat().st_atime_ns, first.stat().st_mtime_ns + 10**9))
    d = run_zoo(
        "finetune", *common, "--name", "edited", "--cache-features", "--epochs", "1", env=env
    )
    assert d.returncode == 0 and "computed into the feature cache" in d.stderr, d.stderr
    kept = list((tmp_path / "cache" / "features").glob("*.safetensors"))
    assert len(kept) == 3  # train and val, then the edited image's split again
    listed = json.loads(run_zoo("cache", "ls", "--json", env=env).stdout)
    assert listed["features_bytes"] == sum(f.stat().st_size for f in kept)
    assert run_zoo("cache", "clear", env=env).returncode == 0
    assert not (tmp_path / "cache" / "features").exists()


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
