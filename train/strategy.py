"""Transfer-learning strategies: which parameters train, at which learning rate, and when.

- ``linear``: feature extraction. The backbone is frozen (``requires_grad=False``) and its
  BatchNorm layers stay in eval mode, so running statistics never move; only the head is in
  the optimizer.
- ``full``: everything trains; the backbone at ``lr × backbone_lr_mult``.
- ``gradual`` (fastai's ``fine_tune``): ``freeze_epochs`` like ``linear``, then the backbone
  unfreezes with discriminative rates (early half lower than late half, both lower than the
  head). Every parameter group exists from step 0, so the optimizer's structure never
  changes and a resume across the unfreeze restores it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from zoo.errors import InputError


@dataclass
class ParamGroups:
    head: list[nn.Parameter]
    backbone_early: list[nn.Parameter]
    backbone_late: list[nn.Parameter]
    backbone_modules: list[nn.Module]


def split_head(model: nn.Module, head: str | None) -> ParamGroups:
    """Head = parameters under the module path ``head``; backbone = the rest, in order."""
    if head is None:
        raise InputError("This model declares no classifier head, so it can only train fully.")
    head_params: list[nn.Parameter] = []
    backbone: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        (head_params if name == head or name.startswith(head + ".") else backbone).append(p)
    if not head_params:
        raise InputError(f"Classifier head {head!r} has no parameters in this model.")
    half = len(backbone) // 2
    modules = [
        m
        for n, m in model.named_modules()
        if n and not (n == head or n.startswith(head + ".")) and not any(True for _ in m.children())
    ]
    return ParamGroups(head_params, backbone[:half], backbone[half:], modules)


def param_groups(
    groups: ParamGroups, strategy: str, lr: float, backbone_mult: float, weight_decay: float
) -> list[dict[str, object]]:
    def g(params: list[nn.Parameter], scale: float, name: str) -> dict[str, object]:
        return {"params": params, "lr": lr * scale, "name": name, "weight_decay": weight_decay}

    if strategy == "linear":
        return [g(groups.head, 1.0, "head")]
    if strategy == "full":
        return [
            g(groups.backbone_early + groups.backbone_late, backbone_mult, "backbone"),
            g(groups.head, 1.0, "head"),
        ]
    return [
        g(groups.backbone_early, backbone_mult / 10, "backbone_early"),
        g(groups.backbone_late, backbone_mult, "backbone_late"),
        g(groups.head, 1.0, "head"),
    ]


def set_backbone_frozen(groups: ParamGroups, frozen: bool) -> None:
    for p in groups.backbone_early + groups.backbone_late:
        p.requires_grad_(not frozen)


def train_mode(model: nn.Module, groups: ParamGroups | None, backbone_frozen: bool) -> None:
    """``model.train()``, except that a frozen backbone's BatchNorm layers stay in eval mode."""
    model.train()
    if groups is not None and backbone_frozen:
        for m in groups.backbone_modules:
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.eval()


def set_phase(groups: ParamGroups | None, strategy: str, freeze_epochs: int, epoch: int) -> bool:
    """Freeze or unfreeze the backbone for ``epoch`` (frozen throughout ``linear`` and for the
    first ``freeze_epochs`` of ``gradual``); returns whether it is frozen."""
    frozen = strategy == "linear" or (strategy == "gradual" and epoch < freeze_epochs)
    if groups is not None and strategy != "full":
        set_backbone_frozen(groups, frozen)
    return frozen
