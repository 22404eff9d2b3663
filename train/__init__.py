"""Compact transfer learning on an image folder (``zoo finetune``)."""

from zoo.train.build import RunParts, build_run
from zoo.train.config import TrainConfig
from zoo.train.finish import RunResult
from zoo.train.resolve import Resolved, resolve_config
from zoo.train.trainer import fit

__all__ = ["Resolved", "RunParts", "RunResult", "TrainConfig", "build_run", "fit", "resolve_config"]
