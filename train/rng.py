"""Every RNG state a run depends on, as tensors and plain data (``weights_only``-loadable)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_rng_state() -> dict[str, Any]:
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            n["keys"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextmanager
def seeded(seed: int, device: torch.device | None = None) -> Iterator[None]:
    """Run the block with Python's, NumPy's and torch's generators (the CPU one, and
    ``device``'s when it is a GPU) seeded with ``seed``; each is restored afterwards, so the
    block's draws depend on ``seed`` alone and change nothing outside it."""
    py, np_state = random.getstate(), np.random.get_state()
    gpu = [device] if device is not None and device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpu):
        # The CPU generator directly: torch.manual_seed also queues a CUDA seed, which costs a
        # captured stack trace per call (ms each, per image in a loader worker).
        torch.default_generator.manual_seed(seed)
        if gpu:
            torch.cuda.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(np_state)
