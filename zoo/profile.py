"""Parameter and FLOP counts measured on the real module."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def count_params(model: nn.Module, *, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def count_gflops(model: nn.Module, input_size: tuple[int, ...]) -> float:
    """GFLOPs of one forward pass at batch 1, torchvision's convention (1 multiply-add = 1).

    ``FlopCounterMode`` counts a multiply-add as two FLOPs, hence the division by 2.
    """
    was_training = model.training
    model.eval()
    try:
        counter = FlopCounterMode(display=False)
        device = next(model.parameters(), torch.zeros(0)).device  # where the model is
        with counter, torch.no_grad():
            model(torch.zeros(1, *input_size, device=device))
        return counter.get_total_flops() / 2 / 1e9
    finally:
        model.train(was_training)
