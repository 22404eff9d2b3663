"""Penultimate-layer embeddings of a PyTorch model: what its declared classifier module
receives (the same tensor the feature cache trains the head on). Here in the core because
both sides use it: ``zoo predict --embeddings`` (:mod:`zoo.deploy.predict.embeddings`, which
also finds the same tensor in an ONNX graph) and ``zoo enroll`` (:mod:`zoo.train.enroll`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from zoo.errors import InputError


def torch_features(net: Any, head: str | None) -> Callable[[Any], tuple[Any, np.ndarray]]:
    """``x → (logits, features)`` for a PyTorch model whose classifier module is ``head``: a
    pre-forward hook on that module keeps its input.

    Raises:
        InputError: the model declares no classifier module.
    """
    if head is None:
        raise InputError(
            "This model declares no classifier layer, so it has no embeddings to give: drop "
            "--embeddings."
        )
    last: dict[str, Any] = {}  # the latest call's features only: nothing accumulates
    net.get_submodule(head).register_forward_pre_hook(lambda _m, args: last.update(x=args[0]))

    def run(x: Any) -> tuple[Any, np.ndarray]:
        logits = net(x)
        return logits, flat(last.pop("x").float().cpu().numpy())

    return run


def flat(features: np.ndarray) -> np.ndarray:
    """``(N, ...)`` → ``(N, D)`` float32."""
    return np.ascontiguousarray(features.reshape(len(features), -1), dtype=np.float32)


__all__ = ["flat", "torch_features"]
