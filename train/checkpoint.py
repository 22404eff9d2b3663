"""Resumable checkpoints: tensors and plain data only, written atomically.

``torch.save`` goes to a temporary file in the same folder, is flushed and fsynced, then
``os.replace``-d over the old one: a kill at any moment leaves the previous good checkpoint.
Loading uses ``torch.load(weights_only=True)``: nothing is unpickled.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from zoo.errors import CheckpointError


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(f"No checkpoint at {path}. Was the run started with this folder?")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle/zip errors: a broken or foreign file
        raise CheckpointError(f"Checkpoint {path} cannot be read safely: {exc}") from exc
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a zoo training checkpoint.")
    return state
