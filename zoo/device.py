"""One device chosen at the entry point, and a helper that moves nested data to it."""

from __future__ import annotations

from typing import Any

import torch

from zoo.errors import BackendUnavailableError


def pick_device(name: str = "auto") -> torch.device:
    """``auto`` → CUDA when available, else CPU. Asking for CUDA without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailableError(
            f"Device {name!r} requested but CUDA is not available here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}). Use --device cpu."
        )
    return dev


def move_to(obj: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """Move tensors inside nested lists/tuples/dicts to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return {k: move_to(v, device, non_blocking=non_blocking) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        moved = [move_to(v, device, non_blocking=non_blocking) for v in obj]
        return type(obj)(moved) if not hasattr(obj, "_fields") else type(obj)(*moved)
    return obj
