"""Compact transfer learning on an image folder (``zoo finetune``)."""

from train.config import TrainConfig
from train.trainer import Trainer, fit

__all__ = ["TrainConfig", "Trainer", "fit"]
