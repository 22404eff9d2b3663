"""The registry itself: every entry is checked (shape, NaN, determinism, params, GFLOPs)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import zoo
from zoo.errors import (
    DuplicateModelError,
    InputError,
    StateDictMismatchError,
    UnknownModelError,
)
from zoo.metadata import ModelInfo
from zoo.profile import count_gflops, count_params
from zoo.registry import register_model

EXPECTED_PARAMS = {
    "mlp.scratch": 203_530,
    "simple_cnn.scratch": 620_362,
    "crnn.scratch": 2_122_378,
    "resnet18.tv_in1k": 11_689_512,
    "resnet34.tv_in1k": 21_797_672,
    "resnet50.tv_in1k": 25_557_032,
    "resnet18.a1_in1k": 11_689_512,
    "resnet34.a1_in1k": 21_797_672,
    "resnet50.a1_in1k": 25_557_032,
    "mobilenet_v2.tv_in1k": 3_504_872,
    "mobilenet_v2_s16.tv_in1k": 542_528,  # headless: the backbone alone
}


def test_every_documented_entry_is_registered() -> None:
    assert set(EXPECTED_PARAMS) <= set(zoo.list_models())


@pytest.mark.parametrize("name", zoo.list_models())
def test_entry_builds_and_behaves(name: str) -> None:
    info = zoo.model_info(name)
    if info.headless:  # a backbone: built with a class count, its head counted apart
        model = zoo.create_model(name, weights="none", num_classes=7)
        head = model.get_submodule(info.classifier)
        assert count_params(model) - count_params(head) == info.params == EXPECTED_PARAMS[name]
        assert model.zoo_info.parent == name and model.zoo_info.num_classes == 7
    else:
        model = zoo.create_model(name, weights="none")
        assert count_params(model) == info.params == EXPECTED_PARAMS[name]
        # the built model carries its entry's metadata (only the weight source says "random")
        assert model.zoo_info.name == name
        assert replace(model.zoo_info, weights=info.weights) == info
    assert not model.training
    torch.manual_seed(0)
    x = torch.randn(2, *info.input_size)
    with torch.no_grad():
        y1, y2 = model(x), model(x)
    assert y1.shape == (2, info.num_classes or 7)
    assert torch.isfinite(y1).all()
    assert torch.equal(y1, y2), "eval mode must be deterministic"
    assert math.isclose(count_gflops(model, info.input_size), info.gflops, rel_tol=0.01)


@pytest.mark.parametrize("name", zoo.list_models())
def test_metadata_is_complete(name: str) -> None:
    info = zoo.model_info(name)
    assert len(info.mean) == len(info.std) == info.input_size[0]
    assert info.classifier, "every entry declares its classifier head"
    assert info.license
    if info.weights.kind != "none" and not info.headless:
        assert info.label_names is not None and len(info.label_names) == info.num_classes
    if info.weights.kind == "hub":
        assert not info.weights.pinned and "not pinned" in info.description


def test_bare_arch_means_default_tag() -> None:
    assert zoo.model_info("resnet18").name == "resnet18.tv_in1k"
    assert zoo.list_models("resnet1*") == ["resnet18.a1_in1k", "resnet18.tv_in1k"]


def test_unknown_name_suggests() -> None:
    with pytest.raises(UnknownModelError, match="Did you mean 'resnet18'"):
        zoo.create_model("resnt18")
    with pytest.raises(KeyError):  # also a builtin KeyError
        zoo.model_info("nope")


def test_duplicate_registration_raises() -> None:
    info = zoo.model_info("mlp")
    with pytest.raises(DuplicateModelError):
        register_model(info)(lambda num_classes=10: torch.nn.Linear(1, 1))
    assert isinstance(DuplicateModelError("x"), ValueError)


def test_fresh_name_registers() -> None:
    info = ModelInfo(
        arch="tiny_test_net",
        tag="scratch",
        input_size=(4,),
        num_classes=2,
        params=10,
        gflops=0.0,
        mean=(0.0,) * 4,
        std=(1.0,) * 4,
        classifier="0",
    )
    register_model(info)(lambda num_classes=2: torch.nn.Sequential(torch.nn.Linear(4, num_classes)))
    assert "tiny_test_net.scratch" in zoo.list_models("tiny_*")


def test_head_reinit_and_strict_load(mobilenet_weights) -> None:
    model = zoo.create_model("mobilenet_v2", num_classes=5)
    report = model.zoo_load_report
    assert report.reinitialised == ["classifier.1.weight", "classifier.1.bias"]
    assert not report.missing and not report.unexpected
    assert model.zoo_info.num_classes == 5 and model.zoo_info.label_names is None
    ref = zoo.create_model("mobilenet_v2")
    assert torch.equal(model.features[0][0].weight, ref.features[0][0].weight)


def test_cut_backbone_loads_its_blocks_of_the_real_weights(mobilenet_weights, tmp_path) -> None:
    """mobilenet_v2_s16: MobileNetV2's first 14 blocks, from the whole network's weights file
    (the rest named as left out), with a fresh head; without a class count it says what to
    do instead of building a model with no head."""
    model = zoo.create_model("mobilenet_v2_s16", num_classes=3)
    report = model.zoo_load_report
    ref = zoo.create_model("mobilenet_v2")
    assert len(model.features) == 14 and model.classifier[1].in_features == 96
    for key, tensor in model.features.state_dict().items():
        assert torch.equal(tensor, ref.features.state_dict()[key]), key
    assert report.unused and {k.split(".")[1] for k in report.unused} == {
        str(i) for i in range(14, 19)
    }
    assert report.reinitialised == ["classifier.1.weight", "classifier.1.bias"]
    assert not report.missing and not report.unexpected
    info = model.zoo_info
    assert info.num_classes == 3 and info.parent == "mobilenet_v2_s16.tv_in1k"
    assert info.params == count_params(model)
    with pytest.raises(InputError, match="pretrained backbone without a classifier head"):
        zoo.create_model("mobilenet_v2_s16")
    # a head of ImageNet's 1000 classes is fresh too: the file's bias has that shape
    wide = zoo.create_model("mobilenet_v2_s16", num_classes=1000)
    assert wide.zoo_load_report.reinitialised == ["classifier.1.weight", "classifier.1.bias"]
    assert not wide.classifier[1].bias.any()
    # the user's own weights for it (a trained head included) load as they are
    from safetensors.torch import save_file

    save_file(model.state_dict(), tmp_path / "s16.safetensors")
    mine = zoo.create_model(
        "mobilenet_v2_s16", num_classes=3, weights=str(tmp_path / "s16.safetensors")
    )
    assert mine.zoo_load_report.reinitialised == [] and mine.zoo_load_report.unused == []
    assert torch.equal(mine.classifier[1].weight, model.classifier[1].weight)


def test_mismatch_outside_head_is_an_error(mobilenet_weights, tmp_path) -> None:
    from safetensors.torch import save_file

    sd = zoo.create_model("mobilenet_v2", weights="none").state_dict()
    sd.pop("features.0.0.weight")
    sd["extra.weight"] = torch.zeros(1)
    save_file(sd, tmp_path / "w.safetensors")
    with pytest.raises(
        StateDictMismatchError, match=r"missing from the weights: features\.0\.0\.weight"
    ):
        zoo.create_model("mobilenet_v2", weights=str(tmp_path / "w.safetensors"))


def test_timm_entry_from_pretrained_cfg() -> None:
    info = zoo.model_info("timm:resnet18.a1_in1k")
    assert info.params == 11_689_512
    assert info.crop_pct == 0.95 and info.interpolation == "bicubic"
    assert info.weights.repo_id == "timm/resnet18.a1_in1k"
    model = zoo.create_model("timm:resnet18.a1_in1k", weights="none", num_classes=3)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)
    with pytest.raises(UnknownModelError):
        zoo.model_info("timm:resnet18x_bogus")


def test_hub_weights_offline_error_names_repo() -> None:
    from zoo.errors import WeightsNotFoundError

    with pytest.raises(WeightsNotFoundError, match=r"hf:timm/resnet18.a1_in1k@main.*zoo pull"):
        zoo.create_model("resnet18.a1_in1k")


def test_imagenet_class_names_are_torchvisions() -> None:
    """The static copy (read without importing torchvision) is torchvision's list, in order."""
    import torchvision

    from zoo.archs.torchvision_models import imagenet_categories

    meta = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.meta["categories"]
    assert imagenet_categories() == tuple(meta)
    assert zoo.model_info("resnet50.a1_in1k").label_names == tuple(meta)
