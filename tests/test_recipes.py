"""timm's recipes in the trainer (``--auto-augment``, ``--random-erasing``, ``--mixup``,
``--cutmix``, ``--ema``, ``--layer-decay``): end to end on real photographs with the real
ImageNet MobileNetV2, and the pieces on plain tensors. Their bitwise resume under DDP is in
``test_distributed.py`` (the killed 2-process run trains with them)."""

from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import read_safetensors, run_zoo
from zoo.errors import InputError
from zoo.train.config import TrainConfig
from zoo.train.ema import better, shipped_weights
from zoo.train.recipes import (
    BatchRecipe,
    apply_policy,
    batch_recipe,
    batch_seed,
    check_recipes,
    policy,
)
from zoo.train.rng import seeded
from zoo.train.strategy import layer_groups, param_groups, split_head

RECIPES = [
    *("--auto-augment", "randaugment", "--random-erasing", "0.25", "--mixup", "0.2"),
    *("--cutmix", "1.0", "--ema", "--ema-decay", "0.8", "--layer-decay", "0.75"),
]


@pytest.mark.slow
def test_every_recipe_fine_tunes_the_real_mobilenet_and_is_recorded(
    mobilenet_weights: Path, tmp_path: Path
) -> None:
    data = tmp_path / "photos"
    assert run_zoo("example", "photos", str(data), "--per-class", "6").returncode == 0
    r = run_zoo(
        *("finetune", "mobilenet_v2", "--data", str(data), "--epochs", "1", "-b", "8"),
        *("--strategy", "full", "--lr", "0.01"),  # the EMA scores better: 4 of 7 vs 3 of 7
        *("--image-cache", "off", "--num-workers", "0", "--no-progress", "--name", "r"),
        *("--runs", str(tmp_path / "runs"), *RECIPES),
        env={"ZOO_FINETUNE_REPORT": "0"},
    )
    assert r.returncode == 0, r.stderr
    run = tmp_path / "runs" / "r"
    cfg = json.loads((run / "config.json").read_text())
    assert (cfg["auto_augment"], cfg["mixup"], cfg["cutmix"]) == ("randaugment", 0.2, 1.0)
    assert (cfg["random_erasing"], cfg["ema"], cfg["layer_decay"]) == (0.25, True, 0.75)
    model_cfg = json.loads((run / "model" / "config.json").read_text())
    assert model_cfg["train"]["recipes"] == {
        "auto_augment": "rand-m9-mstd0.5-inc1",
        "random_erasing": 0.25,
        "mixup": 0.2,
        "cutmix": 1.0,
        "ema_decay": 0.8,
        "layer_decay": 0.75,
    }
    last = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    # layer-wise LR decay: MobileNetV2's 19 feature blocks, each 0.75 of the next, under the head
    groups = last["optimizer"]["param_groups"]
    assert [g["name"] for g in groups] == [f"backbone_layer{i}" for i in range(19)] + ["head"]
    lrs = [g["initial_lr"] for g in groups]
    assert lrs[-1] == pytest.approx(1e-2) and lrs[-2] == pytest.approx(1e-3)
    backbone = lrs[:-1]
    assert all(a / b == pytest.approx(0.75) for a, b in itertools.pairwise(backbone))
    # the EMA is validated every epoch, and the shipped weights are the better of the two
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["shipped"] == better(row["val/acc"], row["ema/val/acc"])
    report = json.loads((run / "report.json").read_text())
    assert report["best"]["weights"] == rows[0]["shipped"] == "ema"
    assert report["best"]["val/acc"] == rows[0]["ema/val/acc"] > rows[0]["val/acc"]
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    shipped = read_safetensors(run / "model" / "model.safetensors")
    assert all(torch.equal(shipped[k], best["ema"][k]) for k in shipped)  # the average ships
    assert not torch.equal(best["ema"]["classifier.1.weight"], best["model"]["classifier.1.weight"])


def test_the_weights_shipped_are_the_ones_the_row_names() -> None:
    ckpt: dict[str, Any] = {"model": {"w": torch.zeros(1)}, "ema": {"w": torch.ones(1)}}
    assert shipped_weights({**ckpt, "history": [{"shipped": "ema"}]}) is ckpt["ema"]
    assert shipped_weights({**ckpt, "history": [{"shipped": "model"}]}) is ckpt["model"]
    assert shipped_weights({**ckpt, "history": [{}]}) is ckpt["model"]  # no --ema
    assert (better(0.5, 0.6), better(0.5, 0.5), better(0.5, None)) == ("ema", "model", "model")


def test_seeded_draws_depend_on_the_seed_alone_and_leave_the_rest_untouched() -> None:
    def draws() -> tuple[float, float, float]:
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    outside = draws()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    with seeded(7):
        first = draws()
    assert draws() == outside  # every global generator restored
    with seeded(7):
        assert draws() == first
    with seeded(8):
        assert draws() != first


def _cfg(**kw: Any) -> TrainConfig:
    return TrainConfig(model="mlp", data="d", **kw)


def test_a_batch_recipe_is_a_function_of_its_seed() -> None:
    recipe = batch_recipe(_cfg(random_erasing=1.0, mixup=0.4, cutmix=1.0), 4, torch.device("cpu"))
    assert isinstance(recipe, BatchRecipe)
    x, y = torch.randn(8, 3, 16, 16), torch.arange(8) % 4

    def run(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return recipe(x.clone(), y.clone(), seed)

    (a, ya), (b, yb), (c, _) = run(3), run(3), run(4)
    assert torch.equal(a, b) and torch.equal(ya, yb) and not torch.equal(a, c)
    assert ya.shape == (8, 4) and torch.allclose(ya.sum(1), torch.ones(8))  # soft targets
    assert not torch.equal(a, x)
    assert batch_seed(0, 5, 0) != batch_seed(0, 5, 1) != batch_seed(0, 6, 0)  # per step, rank
    assert batch_recipe(_cfg(), 4, torch.device("cpu")) is None
    smoothed = batch_recipe(_cfg(mixup=0.4, label_smoothing=0.1), 4, torch.device("cpu"))
    assert smoothed is not None and float(smoothed(x, y, 0)[1].min()) > 0  # smoothing in targets


@pytest.mark.parametrize("channels", [1, 3])
def test_a_policy_keeps_the_crop_shape_and_draws_from_its_seed(channels: int) -> None:
    crop = torch.randint(0, 256, (channels, 24, 24), dtype=torch.uint8)
    aa = policy("trivialaugment", 24, (0.5,) * channels, "bilinear")
    outs = []
    for seed in (1, 1, *range(2, 12)):
        with seeded(seed):
            outs.append(apply_policy(aa, crop))
    assert all(o.shape == crop.shape and o.dtype == torch.uint8 for o in outs)
    assert torch.equal(outs[0], outs[1])
    assert any(not torch.equal(outs[0], o) for o in outs[2:])


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"mixup": 0.2, "cache_features": True}, "--cache-features computes"),
        ({"auto_augment": "randaugment", "augment": False}, "--no-augment"),
        ({"cutmix": 1.0, "multi_label": True}, "--multi-label"),
        ({"mixup": 0.2, "batch_size": 7}, "use 8"),
        ({"ema_decay": 0.99}, "add --ema"),
        ({"auto_augment": "rand-m9-q7"}, "not a timm policy"),
    ],
)
def test_combinations_a_recipe_cannot_honour_are_refused(kw: dict[str, Any], says: str) -> None:
    with pytest.raises(InputError, match=None) as exc:
        check_recipes(_cfg(**kw), pretrained=True, strategy="full")
    assert says in str(exc.value)


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"random_erasing": 1.5}, "--random-erasing 1.5 is out of range: it must be in [0, 1]"),
        (
            {"mixup": -1.0},
            "--mixup -1.0 is out of range: it must be finite and ≥ 0 (usually 0.2-0.8; 0 is off).",
        ),
        (
            {"ema_decay": 1.0},
            "--ema-decay 1.0 is out of range: it must be in (0, 1) (usually 0.9998).",
        ),
        ({"cutmix": float("inf")}, "--cutmix inf is out of range: it must be finite and ≥ 0"),
        ({"layer_decay": 0.0}, "--layer-decay 0.0 is out of range: it must be in (0, 1]"),
        (
            {"lr": 0.0},
            "--lr 0.0 is out of range: it must be finite and above 0 (usually 1e-3 with AdamW",
        ),
        ({"weight_decay": -0.1}, "--weight-decay -0.1 is out of range: it must be finite and ≥ 0"),
        ({"label_smoothing": 1.0}, "--label-smoothing 1.0 is out of range: it must be in [0, 1)"),
        ({"val_fraction": 0.0}, "--val-fraction 0.0 is out of range: it must be in (0, 1)"),
        ({"momentum": float("nan")}, "--momentum nan is out of range"),
        ({"epochs": 0}, "--epochs 0 is out of range: it must be a whole number ≥ 1."),
        ({"epochs": 2.5}, "--epochs 2.5 is out of range: it must be a whole number ≥ 1."),
        ({"epochs": 10**400}, "--epochs 1000"),  # beyond any float: refused, no OverflowError
        ({"lr": "fast"}, "--lr 'fast' is out of range"),
        ({"batch_size": True}, "--batch-size True is out of range"),
    ],
)
def test_numbers_out_of_range_are_usage_errors_naming_the_range(
    kw: dict[str, Any], says: str
) -> None:
    from zoo.errors import UsageError
    from zoo.train.config import check_bounds
    from zoo.train.resolve import resolve_config

    with pytest.raises(UsageError) as exc:
        check_bounds(_cfg(**kw))
    assert says in str(exc.value) and exc.value.param_hint == says.split()[0]
    with pytest.raises(UsageError, match=re.escape(says)):  # before any work: no such model
        resolve_config(replace(_cfg(**kw), model="no-such-model"))
    check_bounds(_cfg())  # the defaults hold


def test_layer_decay_needs_a_pretrained_backbone_that_trains() -> None:
    cfg = _cfg(layer_decay=0.75)
    with pytest.raises(InputError, match="random weights"):
        check_recipes(cfg, pretrained=False, strategy="full")
    with pytest.raises(InputError, match="--strategy linear"):
        check_recipes(cfg, pretrained=True, strategy="linear")
    check_recipes(cfg, pretrained=True, strategy="gradual")


def test_layers_of_a_torchvision_and_a_timm_model_input_first() -> None:
    import timm
    from torchvision.models import resnet18

    tv = resnet18(num_classes=3)
    layers = layer_groups(tv, split_head(tv, "fc"))
    names = {id(p): n for n, p in tv.named_parameters()}
    first = [names[id(p)].split(".")[0] for p in layers[0]]
    assert set(first) == {"conv1", "bn1"}  # the stem is one layer
    blocks = [{".".join(names[id(p)].split(".")[:2]) for p in layer} for layer in layers[1:]]
    assert blocks == [{f"layer{i}.{j}"} for i in range(1, 5) for j in range(2)]
    tm = timm.create_model("resnet18", pretrained=False, num_classes=3)
    assert [len(x) for x in layer_groups(tm, split_head(tm, "fc"))] == [len(x) for x in layers]
    groups = param_groups(
        split_head(tv, "fc"), "gradual", 1.0, 0.1, 0.0, layers=layers, layer_decay=0.5
    )
    assert [g["lr"] for g in groups] == [0.1 * 0.5**k for k in range(8, -1, -1)] + [1.0]
    covered = sum(len(g["params"]) for g in groups)  # type: ignore[arg-type]
    assert covered == len(list(tv.parameters()))


def test_no_policy_posterizes_to_zero_bits() -> None:
    """timm's RandAugment posterizes to 0 bits at the ends of its magnitude range, which
    Pillow 13 refuses mid-training: each policy's posterize keeps at least one bit."""
    from timm.data.auto_augment import _posterize_increasing_level_to_arg as timm_level

    from zoo.train.recipes import _ops

    assert timm_level(10, {}) == (0,)  # what timm alone gives
    for name in ("randaugment", "trivialaugment", "rand-m9-n2", "augmix-m10", "v0"):
        ops = [o for o in _ops(policy(name, 32, (0.5,) * 3, "bilinear")) if "Posterize" in o.name]
        assert ops, name
        assert all(o.level_fn(m, o.hparams) >= (1,) for o in ops for m in (0, 5, 10)), name


def test_out_of_range_rates_are_usage_errors(tmp_path: Path) -> None:
    r = run_zoo("finetune", "mlp", "--data", str(tmp_path), "--ema-decay", "1", cwd=tmp_path)
    assert r.returncode == 2 and "--ema-decay" in r.stderr and "(0, 1)" in r.stderr
    assert not list(tmp_path.iterdir())
    r = run_zoo(
        "finetune", "mlp", "--data", str(tmp_path), "--auto-augment", "rand-q7", cwd=tmp_path
    )
    assert r.returncode == 2 and "not a timm policy" in r.stderr


def test_mixed_targets_are_not_smoothed_twice() -> None:
    """timm's Mixup smooths the targets it mixes; the loss then must not smooth them again."""
    from zoo.train.optim import build_loss

    cpu = torch.device("cpu")
    mixing = build_loss(_cfg(mixup=0.2, label_smoothing=0.1), [0, 1], 2, cpu)
    plain = build_loss(_cfg(label_smoothing=0.1), [0, 1], 2, cpu)
    assert (mixing.label_smoothing, plain.label_smoothing) == (0.0, 0.1)  # type: ignore[union-attr]
