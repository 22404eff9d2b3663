"""``timm:<name>`` registry entries, built on demand from timm's own pretrained configs."""

from __future__ import annotations

import difflib
from functools import cache
from typing import Any

from torch import nn

from zoo.errors import UnknownModelError
from zoo.metadata import ModelInfo, WeightSource
from zoo.profile import count_gflops, count_params
from zoo.registry import Entry


@cache
def timm_entry(name: str) -> Entry:
    import timm
    from timm.models import get_pretrained_cfg

    model_name = name.removeprefix("timm:")
    arch, _, tag = model_name.partition(".")
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models(), n=3, cutoff=0.7)
        raise UnknownModelError(name, [f"timm:{c}" for c in close])
    cfg = get_pretrained_cfg(model_name, allow_unregistered=False) if tag else None
    if cfg is None:
        cfg = get_pretrained_cfg(arch)
    if cfg is None:
        raise UnknownModelError(name, [f"timm:{t}" for t in timm.list_pretrained(f"{arch}.*")[:3]])
    tag = cfg.tag or tag or "default"
    full = f"{arch}.{tag}"

    def builder(num_classes: int = cfg.num_classes, **kw: Any) -> nn.Module:
        return timm.create_model(full, pretrained=False, num_classes=num_classes, **kw)

    probe = builder()
    weights = (
        WeightSource(kind="hub", repo_id=cfg.hf_hub_id, filename="model.safetensors")
        if cfg.hf_hub_id
        else WeightSource()
    )
    info = ModelInfo(
        arch=f"timm:{arch}",
        tag=tag,
        input_size=tuple(cfg.input_size),
        num_classes=cfg.num_classes,
        params=count_params(probe),
        gflops=round(count_gflops(probe, tuple(cfg.input_size)), 4),
        mean=tuple(cfg.mean),
        std=tuple(cfg.std),
        interpolation=cfg.interpolation or "bicubic",
        crop_pct=cfg.crop_pct or 0.875,
        license=cfg.license or "unknown",
        paper=", ".join(cfg.paper_ids)
        if isinstance(cfg.paper_ids, list | tuple)
        else cfg.paper_ids,
        source=cfg.origin_url or cfg.hf_hub_id,
        description=f"timm model {full}; metadata from timm's pretrained config. Hub revision not pinned.",
        weights=weights,
        classifier=cfg.classifier if isinstance(cfg.classifier, str) else None,
    )
    return Entry(info, builder)
