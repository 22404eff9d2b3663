"""Registry entries of the three architectures the field guide documents (modules in
:mod:`zoo.archs.field_guide_nets`, imported when a model is built)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo.metadata import ModelInfo
from zoo.registry import register_model

if TYPE_CHECKING:
    from torch import nn

_CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR_STD = (0.2470, 0.2435, 0.2616)
_SOURCE = "PyTorch practice guides digested in FIELD_GUIDE.md"


@register_model(
    ModelInfo(
        arch="mlp",
        tag="scratch",
        input_size=(1, 28, 28),
        num_classes=10,
        params=203_530,
        gflops=0.000203,
        mean=(0.1307,),
        std=(0.3081,),
        crop_pct=1.0,
        source=_SOURCE,
        description="Two-layer MLP (784 → 256 → ReLU → 10) on flattened 28×28 grayscale images.",
        classifier="head",
    )
)
def mlp(num_classes: int = 10, **kw: object) -> nn.Module:
    from zoo.archs.field_guide_nets import MLP

    return MLP(num_classes=num_classes, **kw)  # type: ignore[arg-type]


@register_model(
    ModelInfo(
        arch="simple_cnn",
        tag="scratch",
        input_size=(3, 32, 32),
        num_classes=10,
        params=620_362,
        gflops=0.01085,
        mean=_CIFAR_MEAN,
        std=_CIFAR_STD,
        crop_pct=1.0,
        source=_SOURCE,
        description="Three conv blocks (32/64/128) and a dropout MLP head, for 32×32 images.",
        classifier="classifier.4",
    )
)
def simple_cnn(num_classes: int = 10, **kw: object) -> nn.Module:
    from zoo.archs.field_guide_nets import SimpleCNN

    return SimpleCNN(num_classes=num_classes)


@register_model(
    ModelInfo(
        arch="crnn",
        tag="scratch",
        input_size=(3, 32, 32),
        num_classes=10,
        params=2_122_378,
        gflops=0.00771,
        mean=_CIFAR_MEAN,
        std=_CIFAR_STD,
        crop_pct=1.0,
        source=_SOURCE,
        description=(
            "Two conv+BatchNorm blocks (32/64) and a dropout MLP head, Kaiming/Xavier "
            "initialised, for 32×32 images (a CNN despite the guides' name)."
        ),
        classifier="classifier.4",
    )
)
def crnn(num_classes: int = 10, **kw: object) -> nn.Module:
    from zoo.archs.field_guide_nets import CRNN

    return CRNN(num_classes=num_classes)
