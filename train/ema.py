"""``--ema``: an exponential moving average of the weights (timm's ``ModelEmaV3``, with its
warm-up, so a short fine-tune is not dominated by the pretrained start), updated after every
optimizer step, validated beside the model each epoch and shipped when it scores better.

The average lives in every checkpoint (``"ema"``), so a resume continues it bit for bit; an
epoch's metrics row says which weights were better (``"shipped"``), and :func:`shipped_weights`
reads the right ones from a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from zoo.train.features import head_module


@dataclass
class Ema:
    """The average of the whole model, and the part of it validation runs (its head, when
    ``--cache-features`` trains the head on cached features)."""

    averager: Any  # timm.utils.ModelEmaV3
    trained: nn.Module

    @classmethod
    def build(cls, model: nn.Module, decay: float, head: str | None) -> Ema:
        from timm.utils import ModelEmaV3

        averager = ModelEmaV3(model, decay=decay, use_warmup=True)
        averager.module.requires_grad_(False)
        trained = head_module(averager.module, head) if head else averager.module
        return cls(averager, trained)

    def update(self, model: nn.Module, step: int) -> None:
        self.averager.update(model, step=step)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.averager.module.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.averager.module.load_state_dict(state)


def better(model_metric: float, ema_metric: float | None) -> Literal["model", "ema"]:
    """Which weights an epoch ships: ``"ema"`` only when it scores strictly better."""
    return "ema" if ema_metric is not None and ema_metric > model_metric else "model"


def shipped_weights(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights a checkpoint's epoch shipped: the average when its last metrics row says
    so, the model's otherwise."""
    history = checkpoint.get("history") or [{}]
    if history[-1].get("shipped") == "ema":
        return checkpoint["ema"]
    return checkpoint["model"]
