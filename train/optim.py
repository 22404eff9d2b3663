"""What a run minimises and how: the loss (raw logits in) and the optimizer over the
strategy's parameter groups; built once by :func:`zoo.train.build.build_run`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zoo.train.config import TrainConfig
from zoo.train.imbalance import class_weights
from zoo.train.recipes import mixes
from zoo.train.strategy import ParamGroups, layer_groups, param_groups


def build_loss(
    cfg: TrainConfig, labels: list[int], n_classes: int, device: torch.device
) -> nn.Module:
    """Raw logits in: softmax/sigmoid live inside the loss, never in the head."""
    if cfg.multi_label:
        return nn.BCEWithLogitsLoss()
    weight = None
    if cfg.class_weights == "auto":
        weight = torch.tensor(class_weights(labels, n_classes), dtype=torch.float32, device=device)
    # Mixed targets arrive soft, smoothed by timm's Mixup: the loss must not smooth them again.
    smoothing = 0.0 if mixes(cfg) else cfg.label_smoothing
    return nn.CrossEntropyLoss(weight=weight, label_smoothing=smoothing)


def build_optimizer(
    cfg: TrainConfig, model: nn.Module, groups: ParamGroups | None, *, pretrained: bool
) -> torch.optim.Optimizer:
    """AdamW or SGD (Nesterov) over the strategy's parameter groups (one group when the whole
    random-init model trains)."""
    lr, mult = cfg.lr, cfg.backbone_lr_mult
    assert isinstance(lr, int | float)  # resolved: a number, never None or 'auto'
    assert mult is not None  # resolved (zoo.train.resolve)
    if groups is None or (cfg.strategy == "full" and not pretrained):
        params: list[dict[str, Any]] = [
            {
                "params": list(model.parameters()),
                "lr": lr,
                "name": "all",
                "weight_decay": cfg.weight_decay,
            }
        ]
    else:
        params = param_groups(
            groups,
            cfg.strategy or "full",
            lr,
            mult,
            cfg.weight_decay,
            layers=layer_groups(model, groups) if cfg.layer_decay is not None else None,
            layer_decay=cfg.layer_decay or 1.0,
        )
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, nesterov=True)


__all__ = ["build_loss", "build_optimizer"]
