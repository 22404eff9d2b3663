"""zoo: a PyTorch model zoo and deployment toolkit.

``import zoo`` is cheap: the public names below are loaded on first use (PEP 562), so the
CLI's help and listing never import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zoo.catalog import list_models, model_info
    from zoo.errors import ZooError
    from zoo.factory import create_model, create_model_with_report
    from zoo.loading import LoadReport
    from zoo.metadata import ModelInfo, WeightSource
    from zoo.ref import ModelRef
    from zoo.registry import register_model

_LAZY = {
    "LoadReport": "zoo.loading",
    "ModelInfo": "zoo.metadata",
    "ModelRef": "zoo.ref",
    "WeightSource": "zoo.metadata",
    "ZooError": "zoo.errors",
    "create_model": "zoo.factory",
    "create_model_with_report": "zoo.factory",
    "list_models": "zoo.catalog",
    "model_info": "zoo.catalog",
    "register_model": "zoo.registry",
}

__all__ = [
    "LoadReport",
    "ModelInfo",
    "ModelRef",
    "WeightSource",
    "ZooError",
    "create_model",
    "create_model_with_report",
    "list_models",
    "model_info",
    "register_model",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'zoo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
