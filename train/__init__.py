"""Compact transfer learning on an image folder (``zoo finetune``)."""

from zoo.train.config import TrainConfig
from zoo.train.trainer import Trainer, fit

__all__ = ["TrainConfig", "Trainer", "fit"]
