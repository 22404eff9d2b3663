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
    base = dict(model="mobilenet_v2", num_workers=0, image_size=64, batch_size=32, progress=False)
    return TrainConfig(data=str(data), runs_root=str(tmp), **{**base, **kw})


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


def test_a_cut_network_trains_whole_at_the_heads_lr_unless_told(
    small_digits, tmp_path, mobilenet_weights
) -> None:
    """mobilenet_v2_s16 (cut short of the network its weights were trained as) defaults to
    --strategy full at backbone LR × 1, and each of the two alone keeps the other's default;
    what the user gives is kept, wherever resolve_config is called from (lr-find, tune)."""
    cut = {"model": "mobilenet_v2_s16"}

    def chosen(**kw) -> tuple[str | None, float | None]:
        cfg = resolve_config(_options(small_digits, tmp_path, **kw)).cfg
        return cfg.strategy, cfg.backbone_lr_mult

    assert chosen(**cut) == ("full", 1.0)
    assert chosen(backbone_lr_mult=0.1, **cut) == ("full", 0.1)  # no `explicit` needed
    assert chosen(strategy="gradual", **cut) == ("gradual", 1.0)
    assert chosen(strategy="full", **cut) == ("full", 1.0)
    assert chosen() == ("gradual", 0.1)  # the whole MobileNetV2: zoo's usual defaults
    assert chosen(weights="none", **cut) == ("full", 0.1)  # random init: not a cut network


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
    small_digits, tmp_path, mobilenet_weights, monkeypatch, capsys
) -> None:
    """In this process (``zoo finetune``'s start-up is not what is tested; ``zoo cache`` is
    the real command): the runs say on stderr where their features came from."""
    import shutil

    data = shutil.copytree(small_digits, tmp_path / "digits")  # one image's date changes below
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path / "cache"))
    env = {"ZOO_CACHE": str(tmp_path / "cache")}

    def finetune(name: str, **kw) -> str:
        options = dict(strategy="linear", epochs=3, augment=False, name=name)
        capsys.readouterr()
        assert fit(_options(data, tmp_path, **{**options, **kw})) == tmp_path / name
        return capsys.readouterr().err

    finetune("plain")
    b = finetune("cached", cache_features=True)
    acc = [
        json.loads((tmp_path / n / "report.json").read_text())["best"]["val/acc"]
        for n in ("plain", "cached")
    ]
    assert abs(acc[0] - acc[1]) <= 0.05, acc
    assert "computed into the feature cache" in b, b
    # another run (a tune trial with another lr, seed or head) reads them from disk: same numbers
    c = finetune("again", cache_features=True)
    assert "read from the feature cache" in c, c
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
    assert len(strip[0]) == 3 and strip[0] == strip[1]
    # an edited image is a new key: computed again
    first = next(data.rglob("*.png"))
    os.utime(first, ns=(first.stat().st_atime_ns, first.stat().st_mtime_ns + 10**9))
    d = finetune("edited", cache_features=True, epochs=1)
    assert "computed into the feature cache" in d, d
    kept = list((tmp_path / "cache" / "features").glob("*.safetensors"))
    assert len(kept) == 3  # train and val, then the edited image's split again
    listed = json.loads(run_zoo("cache", "ls", "--json", env=env).stdout)
    assert listed["features_bytes"] == sum(f.stat().st_size for f in kept)
    assert run_zoo("cache", "clear", env=env).returncode == 0
    assert not (tmp_path / "cache" / "features").exists()


@pytest.mark.slow
def test_pretrained_linear_probe_beats_random_init(digits_dir, tmp_path, mobilenet_weights) -> None:
    """Same architecture, same data, same epochs, steps and LR: ImageNet features must win
    clearly. One epoch of 44 steps at a head LR of 3e-3 (in this process: the CLI's start-up
    is not what is tested) leaves the probe near 0.89 on the 359 validation digits and the
    randomly initialised network at chance (0.1), as two epochs at 1e-3 did (0.86 and 0.1)."""
    common = dict(data=digits_dir, tmp=tmp_path, epochs=1, lr=3e-3, num_workers=1)
    pre = fit(_options(**common, strategy="linear", cache_features=True, name="pre"))
    rnd = fit(_options(**common, weights="none", name="rnd"))
    assert pre is not None and rnd is not None
    acc_pre = json.loads((pre / "report.json").read_text())["best"]["val/acc"]
    acc_rnd = json.loads((rnd / "report.json").read_text())["best"]["val/acc"]
    assert acc_pre > acc_rnd + 0.2, (acc_pre, acc_rnd)
    assert acc_pre > 0.8


def test_the_feature_pass_gives_the_plain_forwards_features_and_the_model_back_as_it_was() -> None:
    """The CPU feature pass runs channels-last (oneDNN's native layout); the features are the
    plain forward's, contiguous, and the model comes back contiguous (safetensors refuses to
    save any other layout) and in the mode it was in; a channels-last model stays so."""
    from torch import nn

    from zoo.train.features import extract_features

    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3),
    )  # fmt: skip
    seen: list[bool] = []  # the layout the conv ran in
    net[0].register_forward_pre_hook(
        lambda m, a: seen.append(m.weight.is_contiguous(memory_format=torch.channels_last))
    )
    xs = torch.rand(10, 3, 12, 12)
    idx = torch.arange(10)
    batches = [(xs[i : i + 4], idx[i : i + 4] % 3, idx[i : i + 4]) for i in range(0, 10, 4)]
    feats, targets, indices = extract_features(net, "5", batches, torch.device("cpu"))
    assert seen == [True] * 3  # every batch channels-last
    assert net.training  # put back in training mode
    assert all(p.is_contiguous() for p in net.parameters())
    net.eval()
    with torch.no_grad():
        want = net[:5](xs)
    assert torch.allclose(feats, want, atol=1e-5) and feats.shape == (10, 8)
    assert torch.equal(indices, torch.arange(10)) and torch.equal(targets, torch.arange(10) % 3)
    net.to(memory_format=torch.channels_last)  # a --channels-last run's model keeps its layout
    again, _, _ = extract_features(net, "5", batches, torch.device("cpu"))
    weight = net[0].weight
    assert not weight.is_contiguous() and weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(again, want, atol=1e-5)
    # a spatial head input (a conv head) comes out contiguous: safetensors saves only that
    spatial, _, _ = extract_features(net.to(memory_format=torch.contiguous_format), "2",
                                     batches, torch.device("cpu"))  # fmt: skip
    assert spatial.shape == (10, 8, 10, 10) and spatial.is_contiguous()
    # a 3-d conv (5-d weights, which channels-last refuses) runs as it is
    video = nn.Sequential(nn.Conv3d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 2 * 2 * 2, 2))
    clips = [(torch.rand(3, 1, 4, 4, 4), torch.zeros(3), torch.arange(3))]
    flat, _, _ = extract_features(video, "2", clips, torch.device("cpu"))
    assert flat.shape == (3, 16) and video[0].weight.is_contiguous()
