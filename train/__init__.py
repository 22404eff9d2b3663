"""Compact transfer learning on an image folder (``zoo finetune``).

A run: :func:`resolve_config` → :func:`build_run` → the loop (:func:`fit`) → ``finish_run``.
The names below load on first use, so reading :class:`TrainConfig` (as the CLI does at
start-up) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zoo.train.build import RunParts, build_run
    from zoo.train.config import TrainConfig
    from zoo.train.finish import RunResult
    from zoo.train.resolve import Resolved, resolve_config
    from zoo.train.trainer import fit

_WHERE = {
    "TrainConfig": "config",
    "Resolved": "resolve",
    "resolve_config": "resolve",
    "RunParts": "build",
    "build_run": "build",
    "RunResult": "finish",
    "fit": "trainer",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'zoo.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"zoo.train.{_WHERE[name]}"), name)


__all__ = ["Resolved", "RunParts", "RunResult", "TrainConfig", "build_run", "fit", "resolve_config"]
