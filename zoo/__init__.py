"""zoo: a PyTorch model zoo and deployment toolkit."""

from zoo.errors import ZooError
from zoo.factory import create_model, create_model_with_report
from zoo.loading import LoadReport
from zoo.metadata import ModelInfo, WeightSource
from zoo.registry import list_models, model_info, register_model

__all__ = [
    "LoadReport",
    "ModelInfo",
    "WeightSource",
    "ZooError",
    "create_model",
    "create_model_with_report",
    "list_models",
    "model_info",
    "register_model",
]
