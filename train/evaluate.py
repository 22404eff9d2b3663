"""Validation/evaluation passes: eval mode + inference mode, predictions gathered across
ranks without the duplicates that sampler padding would add."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

Forward = Callable[[torch.Tensor], torch.Tensor]


def collect_logits(
    forward: Forward, batches: Iterable[Any], device: torch.device, *, channels_last: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, targets, indices) on CPU for every sample the batches hold."""
    logits, targets, indices = [], [], []
    with torch.inference_mode():
        for x, y, idx in batches:
            x = x.to(device, non_blocking=True)
            if channels_last and x.ndim == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            logits.append(forward(x).float().cpu())
            targets.append(torch.as_tensor(y))
            indices.append(torch.as_tensor(idx))
    if not logits:
        return torch.zeros(0, 0), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.cat(logits), torch.cat(targets), torch.cat(indices)


def gather_by_index(
    logits: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Under DDP every rank holds a disjoint shard; gather and order by sample index."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (logits, targets, indices))
        logits = torch.cat([p[0] for p in parts if p[0].numel()])
        targets = torch.cat([p[1] for p in parts if p[1].numel()])
        indices = torch.cat([p[2] for p in parts if p[2].numel()])
    order = indices.argsort()
    uniq = torch.unique_consecutive(indices[order])
    if len(uniq) != len(order):
        raise RuntimeError("duplicate samples in an evaluation pass (sharding bug)")
    return logits[order], targets[order]


def evaluate_model(
    model: nn.Module, batches: Iterable[Any], device: torch.device, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    was_training = model.training
    model.eval()
    try:
        return gather_by_index(*collect_logits(model, batches, device, **kw))
    finally:
        model.train(was_training)
