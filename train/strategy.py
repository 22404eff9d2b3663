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
from typing import Any

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


def layer_groups(model: nn.Module, groups: ParamGroups) -> list[list[nn.Parameter]]:
    """The backbone's parameters by depth, input first, for ``--layer-decay``.

    timm models by their own ``group_matcher`` (the layers timm's layer decay uses; a name it
    does not match goes to its last group, so every parameter is placed); other
    models by their top-level modules: each child of a top-level ``Sequential``/``ModuleList``
    is a layer (ResNet's blocks, MobileNetV2's ``features.N``), and consecutive other
    top-level modules are one (ResNet's ``conv1`` + ``bn1`` stem). Written here because
    timm's ``param_groups_layer_decay`` needs a ``group_matcher`` torchvision models lack.
    """
    backbone = {id(p) for p in groups.backbone_early + groups.backbone_late}
    params = dict(model.named_parameters())
    if hasattr(model, "group_matcher"):
        from timm.models import group_parameters

        matcher: Any = model.group_matcher  # timm's models' own layer grouping
        names = group_parameters(model, matcher(coarse=False)).values()
    else:
        layer_of: dict[str, int] = {}
        layer, merging = -1, False
        for name, child in model.named_children():
            if isinstance(child, nn.Sequential | nn.ModuleList):
                for sub, _ in child.named_children():
                    layer += 1
                    layer_of[f"{name}.{sub}"] = layer
                merging = False
            else:
                layer += 0 if merging else 1
                layer_of[name], merging = layer, True
        by_layer: dict[int, list[str]] = {}
        for n in params:
            parts = n.split(".")
            key = ".".join(parts[:2]) if ".".join(parts[:2]) in layer_of else parts[0]
            by_layer.setdefault(layer_of.get(key, 0), []).append(n)
        names = [by_layer[k] for k in sorted(by_layer)]
    layers = [[params[n] for n in group if id(params[n]) in backbone] for group in names]
    return [layer for layer in layers if layer]


def param_groups(
    groups: ParamGroups,
    strategy: str,
    lr: float,
    backbone_mult: float,
    weight_decay: float,
    *,
    layers: list[list[nn.Parameter]] | None = None,
    layer_decay: float = 1.0,
) -> list[dict[str, object]]:
    """The optimizer's parameter groups. ``layers`` (:func:`layer_groups`): the backbone one
    group per layer, layer ``i`` of ``L`` at ``lr × backbone_mult × layer_decay^(L-1-i)``
    (the early/late split of ``gradual`` is then these groups)."""

    def g(params: list[nn.Parameter], scale: float, name: str) -> dict[str, object]:
        return {"params": params, "lr": lr * scale, "name": name, "weight_decay": weight_decay}

    if strategy == "linear":
        return [g(groups.head, 1.0, "head")]
    if layers is not None:
        depth = len(layers)
        return [
            *(
                g(p, backbone_mult * layer_decay ** (depth - 1 - i), f"backbone_layer{i}")
                for i, p in enumerate(layers)
            ),
            g(groups.head, 1.0, "head"),
        ]
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
