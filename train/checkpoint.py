"""Resumable checkpoints: tensors and plain data only, written atomically.

``torch.save`` goes through :mod:`zoo.train.durable` (a temporary file in the same folder,
flushed and fsynced, then ``os.replace``-d over the old one): a kill at any moment leaves the
previous good checkpoint. Loading uses ``torch.load(weights_only=True)``: nothing is unpickled.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from zoo import durable
from zoo.errors import CheckpointError


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Atomically write ``state`` (tensors and plain data) to ``path``."""
    durable.write_with(
        path, lambda f: torch.save(state, f), label=f"{path.parent.name}/{path.name}"
    )


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` without unpickling anything.

    Raises:
        CheckpointError: no file, an unreadable file, or not a zoo training checkpoint.
    """
    if not path.exists():
        raise CheckpointError(f"No checkpoint at {path}. Was the run started with this folder?")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle/zip errors: a broken or foreign file
        raise CheckpointError(f"Checkpoint {path} cannot be read safely: {exc}") from exc
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path} is not a zoo training checkpoint.")
    return state
