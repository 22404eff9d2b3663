"""The teacher's logits, computed once per image and kept (``zoo distill`` with deterministic
training views): a safetensors file per (teacher weights, teacher eval transform) under
``$ZOO_CACHE/teacher_logits``, one tensor per image keyed by the sha256 of the image file.

The key names what the logits are a function of: the image's bytes, the teacher's weights and
the view the teacher judged (its eval preprocessing, and the decoder's version). A renamed or copied image hits; an edited
one, another teacher or another transform misses. A write replaces the file atomically
(:func:`zoo.durable.write_with`, no fault point: a cache, not part of a run); a file that does
not read is computed again, never trusted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from zoo import durable
from zoo.images import DECODE_VERSION
from zoo.preprocessing import Preprocessing
from zoo.system import cache_home
from zoo.weights import sha256_file

Logits = Callable[[list[Path]], torch.Tensor]  # images → (N, classes) teacher logits


def image_digest(path: Path) -> str:
    """The sha256 of an image file's bytes: its key in the cache."""
    return sha256_file(path)


def store_path(teacher_sha256: str, pre: Preprocessing, root: Path | None = None) -> Path:
    """The cache file of one teacher (its weights' sha256) judging one eval transform."""
    judged = {**pre.to_dict(), "decode": DECODE_VERSION}
    view = hashlib.sha256(json.dumps(judged, sort_keys=True).encode()).hexdigest()
    name = f"{teacher_sha256[:16]}-{view[:16]}.safetensors"
    return (root or cache_home() / "teacher_logits") / name


def _read(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except (OSError, SafetensorError):  # missing or torn: recomputed
        return {}


def teacher_logits(
    images: Sequence[Path], store: Path, compute: Logits, *, batch: int = 256
) -> tuple[torch.Tensor, int]:
    """The teacher's logits of every image, in order: read from ``store`` where it holds them,
    the rest computed by ``compute`` (in batches of ``batch``) and added to it.

    Returns:
        ``(logits (N, classes) float32 on the CPU, how many were computed now)``.
    """
    digests = [image_digest(p) for p in images]
    known = _read(store)
    todo = sorted({d: p for d, p in zip(digests, images, strict=True) if d not in known}.items())
    for start in range(0, len(todo), batch):
        chunk = todo[start : start + batch]
        out = compute([p for _, p in chunk]).detach().float().cpu()
        known.update({d: row.clone() for (d, _), row in zip(chunk, out, strict=True)})
    if todo:
        data = save(known)
        durable.write_with(store, lambda f: f.write(data), label=None)
    return torch.stack([known[d] for d in digests]), len(todo)


__all__ = ["image_digest", "store_path", "teacher_logits"]
