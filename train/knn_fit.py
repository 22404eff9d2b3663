"""Fitting a model's kNN bank (:mod:`zoo.knn`): the penultimate features of a class-stratified
sample of its training images, embedded at evaluation preprocessing by the weights it ships,
and the kNN scores of the validation images the rejection threshold is fitted on. Used at the
end of ``zoo finetune --reject knn|auto`` (:func:`zoo.train.finish.fit_run_calibration`) and
by ``zoo calibrate`` on a run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from zoo.errors import InputError
from zoo.knn import KnnBank, stratified
from zoo.metadata import ModelInfo


def embed_images(
    model: nn.Module,
    info: ModelInfo,
    paths: Sequence[Path],
    *,
    device: torch.device | str = "cpu",
    batch_size: int = 64,
) -> np.ndarray:
    """``(N, D)`` float32 features (the classifier module's input) of ``paths`` at the model's
    evaluation preprocessing, in order; the model's mode and hooks are left as they were.

    Raises:
        InputError: the model declares no classifier module.
    """
    from torch.utils.data import DataLoader

    from zoo.embeddings import flat
    from zoo.train.data import ImageFolderDataset
    from zoo.transforms import eval_transform

    if info.classifier is None:
        raise InputError(
            f"{info.name} declares no classifier layer, so it has no embeddings for the knn "
            "rule: use --reject msp."
        )
    got: list[np.ndarray] = []
    hook = model.get_submodule(info.classifier).register_forward_pre_hook(
        lambda _m, args: got.append(flat(args[0].float().cpu().numpy()))
    )
    was = model.training
    model.eval()
    try:
        ds = ImageFolderDataset([(p, 0) for p in paths], eval_transform(info))
        with torch.inference_mode():
            for batch in DataLoader(ds, batch_size=batch_size):
                model(batch[0].to(device))
    finally:
        hook.remove()
        model.train(was)
    return np.concatenate(got) if got else np.zeros((0, 0), np.float32)


def fit_bank(
    model: nn.Module,
    info: ModelInfo,
    train: Sequence[tuple[Path, Any]],
    *,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> KnnBank:
    """The bank of a class-stratified sample of the training ``(path, label)`` samples.

    Raises:
        InputError: no training images.
    """
    if not train:
        raise InputError("No training images to build the kNN bank from: use --reject msp.")
    labels = np.array([str(y) for _, y in train])
    chosen = stratified(labels, seed=seed)
    return KnnBank.of(embed_images(model, info, [train[i][0] for i in chosen], device=device))


def run_bank_and_scores(
    model: nn.Module,
    info: ModelInfo,
    train: Sequence[tuple[Path, Any]],
    val: Sequence[Path],
    *,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> tuple[KnnBank, np.ndarray]:
    """:func:`fit_bank` and the validation images' scores against it."""
    bank = fit_bank(model, info, train, device=device, seed=seed)
    return bank, bank.scores(embed_images(model, info, val, device=device))


__all__ = ["embed_images", "fit_bank", "run_bank_and_scores"]
