"""The modules of the three architectures the field guide documents, exactly as documented.

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


def _dropout_head(features: int, hidden: int, num_classes: int) -> nn.Sequential:
    """Flatten → Linear → ReLU → Dropout(0.5) → Linear: the head both CNNs share."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(hidden, num_classes),
    )


class SimpleCNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            *_conv_block(3, 32, False), *_conv_block(32, 64, False), *_conv_block(64, 128, False)
        )
        # 32 -> 16 -> 8 -> 4 after three pools: (B, 128, 4, 4)
        self.classifier = _dropout_head(128 * 4 * 4, 256, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class CRNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(*_conv_block(3, 32, True), *_conv_block(32, 64, True))
        # 32 -> 16 -> 8 after two pools: (B, 64, 8, 8)
        self.classifier = _dropout_head(64 * 8 * 8, 512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)  # type: ignore[arg-type]
            elif isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
