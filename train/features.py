"""Feature cache for a frozen backbone: pooled features (the classifier head's input) are
computed once with the eval transform, and the head trains on the cached tensors.

They are also kept on disk (``$ZOO_CACHE/features``, safetensors), keyed by everything that
makes them: the backbone's weights (the head's left out: a seed draws it), the images (path,
label, size, modification time, the decoder's version), the transform, the device type,
torch's version and how the pass runs (channels-last on a CPU). So the
linear-probe trials of a ``zoo tune`` search (and a re-run) compute them once. Hand-written:
the image cache keeps pixels, no library keeps a model's activations keyed this way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo import durable
from zoo.images import DECODE_VERSION
from zoo.system import cache_home

FEATURES_DIR = "features"
PASS_VERSION = 2
"""How :func:`extract_features` computes (part of the key: features of another way differ in
their last bits). 2: channels-last on a CPU."""


def head_module(model: nn.Module, head: str) -> nn.Module:
    return model.get_submodule(head)


def _channels_last_pass(model: nn.Module, device: torch.device) -> bool:
    """Whether the feature pass switches ``model`` to channels-last for itself: on a CPU
    (oneDNN's convolutions run channels-last natively: MobileNetV2's pass over 1,792 digits at
    64 px took 3.0 → 2.1 s on 2 cores), when its 4-d weights are plain contiguous (a
    ``--channels-last`` run's already are not) and it holds no 5-d tensor (a 3-d conv's, which
    ``Module.to(memory_format=channels_last)`` refuses)."""
    tensors = [*model.parameters(), *model.buffers()]
    return device.type == "cpu" and _plain(tensors) and not any(t.dim() == 5 for t in tensors)


def _plain(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether the 4-d ``tensors`` are all contiguous (not channels-last)."""
    return all(t.is_contiguous() for t in tensors if t.dim() == 4)


def extract_features(
    model: nn.Module, head: str, batches: Iterable[Any], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features, targets, indices): whatever the head module receives, for every sample.
    The model comes back in its own layout and mode; the features are contiguous."""
    captured: list[torch.Tensor] = []
    hook = head_module(model, head).register_forward_pre_hook(
        # contiguous: a spatial head input of a channels-last pass would be channels-last, a
        # layout safetensors refuses to save
        lambda _m, args: captured.append(args[0].detach().float().cpu().contiguous())
    )
    was_training = model.training
    switch = _channels_last_pass(model, device)
    targets, indices = [], []
    try:
        model.eval()
        if switch:
            model.to(memory_format=torch.channels_last)
        last = switch or not _plain(model.parameters())
        with torch.inference_mode():
            for x, y, idx in batches:
                x = x.to(device)
                model(x.to(memory_format=torch.channels_last) if last and x.dim() == 4 else x)
                targets.append(torch.as_tensor(y))
                indices.append(torch.as_tensor(idx))
    finally:
        hook.remove()
        if switch:
            model.to(memory_format=torch.contiguous_format)
        model.train(was_training)
    return torch.cat(captured), torch.cat(targets), torch.cat(indices)


class FeatureDataset(torch.utils.data.Dataset[tuple[torch.Tensor, Any, int]]):
    """Cached features in the (input, label, index) shape of :class:`ImageFolderDataset`."""

    def __init__(self, feats: torch.Tensor, targets: torch.Tensor, indices: torch.Tensor) -> None:
        order = indices.argsort()
        self.feats, self.targets = feats[order], targets[order]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, Any, int]:
        i = key[0] if isinstance(key, tuple) else key
        target = self.targets[i]
        return self.feats[i], (target if target.ndim else int(target)), i


def feature_key(model: nn.Module, head: str, dataset: Any, device: torch.device) -> str:
    """What the cached features of ``dataset`` (an :class:`ImageFolderDataset`) depend on,
    hashed: the backbone's weights, the images, the transform, the device type, torch, and
    the way the pass runs (:data:`PASS_VERSION`)."""
    recipe = f"{torch.__version__}|{device.type}|{head}|{_recipe(dataset)}"
    h = hashlib.sha256(f"{recipe}|{DECODE_VERSION}|pass{PASS_VERSION}".encode())
    for name, tensor in model.state_dict().items():
        if name.startswith(f"{head}."):
            continue
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for path, label in dataset.samples:
        st = Path(path).stat()
        h.update(f"{path}|{label}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def _recipe(dataset: Any) -> str:
    """How ``dataset`` turns a file into the model's input (PIL transform, or image cache)."""
    if hasattr(dataset, "transform"):
        return f"pil|{dataset.transform!r}"
    return f"cache|{dataset.cache.spec!r}|{dataset.aug!r}"


def load_or_extract(
    model: nn.Module,
    head: str,
    dataset: Any,
    batches: Callable[[], Iterable[Any]],
    device: torch.device,
) -> tuple[FeatureDataset, bool]:
    """``dataset``'s features from the disk cache, else extracted (``batches()``) and kept.

    Returns:
        The features, and whether they came from the cache.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save

    if " at 0x" in _recipe(dataset):  # a transform without a stable description: not kept
        return FeatureDataset(*extract_features(model, head, batches(), device)), False
    path = cache_home() / FEATURES_DIR / f"{feature_key(model, head, dataset, device)}.safetensors"
    if path.is_file():
        try:
            t = load_file(path)
            return FeatureDataset(t["feats"], t["targets"], t["indices"]), True
        except (SafetensorError, KeyError, OSError):  # damaged: computed again, written over
            pass
    feats, targets, indices = extract_features(model, head, batches(), device)
    tensors = {"feats": feats, "targets": targets, "indices": indices}
    durable.write_bytes(path, save(tensors), label=None)
    return FeatureDataset(feats, targets, indices), False
