"""The three architectures the field guide documents, exactly as documented.

- ``mlp`` (the guides' ``MyNet``/``SimpleNet``): 784 → 256 → ReLU → 10 on flattened 28×28.
- ``simple_cnn``: 3 × (Conv3×3 pad 1 → ReLU → MaxPool2) with 32/64/128 channels, then
  Flatten → Linear(128·4·4, 256) → ReLU → Dropout(0.5) → Linear(256, n), on 3×32×32.
- ``crnn`` (a CNN despite its name): 2 × (Conv3×3 → BatchNorm → ReLU → MaxPool2) with
  32/64 channels, then Linear(64·8·8, 512) → ReLU → Dropout(0.5) → Linear(512, n); Kaiming
  init for conv, Xavier for linear, on 3×32×32.

No softmax in any head: ``CrossEntropyLoss`` takes raw logits.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.metadata import ModelInfo
from zoo.registry import register_model

_CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR_STD = (0.2470, 0.2435, 0.2616)
_SOURCE = "PyTorch practice guides digested in FIELD_GUIDE.md"


class MLP(nn.Module):
    def __init__(self, num_classes: int = 10, in_features: int = 784, hidden: int = 256) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.ReLU()
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, 1, 28, 28) or (B, 784) -> (B, 784) -> (B, num_classes)
        return self.head(self.act(self.fc1(x.flatten(1))))


def _conv_block(cin: int, cout: int, batchnorm: bool) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel_size=3, padding=1)]
    if batchnorm:
        layers.append(nn.BatchNorm2d(cout))
    layers += [nn.ReLU(), nn.MaxPool2d(2)]
    return layers


class SimpleCNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_conv_block(3, 32, False), *_conv_block(32, 64, False), *_conv_block(64, 128, False)
        )
        # 32 -> 16 -> 8 -> 4 after three pools: (B, 128, 4, 4)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(128 * 4 * 4, 256),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(256, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class CRNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(*_conv_block(3, 32, True), *_conv_block(32, 64, True))
        # 32 -> 16 -> 8 after two pools: (B, 64, 8, 8)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 8 * 8, 512),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(512, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)  # type: ignore[arg-type]
            elif isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


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
        has_batchnorm=True,
    )
)
def crnn(num_classes: int = 10, **kw: object) -> nn.Module:
    return CRNN(num_classes=num_classes)
