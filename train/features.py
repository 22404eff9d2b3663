"""Feature cache for a frozen backbone: pooled features (the classifier head's input) are
computed once with the eval transform, and the head trains on the cached tensors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def head_module(model: nn.Module, head: str) -> nn.Module:
    return model.get_submodule(head)


def extract_features(
    model: nn.Module, head: str, batches: Iterable[Any], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features, targets, indices): whatever the head module receives, for every sample."""
    captured: list[torch.Tensor] = []
    hook = head_module(model, head).register_forward_pre_hook(
        lambda _m, args: captured.append(args[0].detach().float().cpu())
    )
    was_training = model.training
    model.eval()
    targets, indices = [], []
    try:
        with torch.inference_mode():
            for x, y, idx in batches:
                model(x.to(device))
                targets.append(torch.as_tensor(y))
                indices.append(torch.as_tensor(idx))
    finally:
        hook.remove()
        model.train(was_training)
    return torch.cat(captured), torch.cat(targets), torch.cat(indices)


class FeatureDataset(torch.utils.data.Dataset[tuple[torch.Tensor, Any, int]]):
    """Cached features in the (input, label, index) shape of :class:`ImageFolderDataset`."""

    def __init__(self, feats: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor) -> None:
        order = indices.argsort()
        self.feats, self.targets = feats[order], targets[order]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, Any, int]:
        i = key[0] if isinstance(key, tuple) else key
        target = self.targets[i]
        return self.feats[i], (target if target.ndim else int(target)), i
