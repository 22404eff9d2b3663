"""Architecture families; importing this package registers every built-in entry."""

from zoo.archs import field_guide, torchvision_models

__all__ = ["field_guide", "torchvision_models"]
