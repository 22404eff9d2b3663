"""The images int8 is judged and calibrated on: ``--data`` (labels from class folders), else
the validation (judged) or training (calibrated) split of the run the model belongs to
(:mod:`zoo.run_images`), else, for judging only, the two bundled photos, which prove nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from zoo.deploy.export.parity import real_images
from zoo.deploy.quantize.calibration import file_digest
from zoo.errors import InputError, some_of
from zoo.run_images import find_run, run_validation_images

EVAL_LIMIT = 500
"""At most this many evaluation images (a run's validation split, or ``--data``)."""
ImageSource = Literal["data", "run", "builtin"]


@dataclass(frozen=True)
class EvalImages:
    """The images int8 is judged on, where they came from, and their labels (class indices,
    None when unknown or multi-label)."""

    paths: tuple[Path, ...]
    labels: np.ndarray | None
    source: ImageSource
    description: str

    @property
    def proves_nothing(self) -> bool:
        """The bundled photos: two ImageNet images say nothing about a model's own domain."""
        return self.source == "builtin"


def eval_images(model: Path, data: str | None, classes: list[str]) -> EvalImages:
    """``--data`` (labels from class folders), else the run's validation images (labels from
    its split), else the bundled photos."""
    if data is not None:
        paths = real_images(data, limit=EVAL_LIMIT)
        if not paths:
            raise InputError(f"No images found in --data {data}: give a folder of real images.")
        labels, described = labels_for(paths, classes), f"{len(paths)} images of {data}"
        if labels is None and classes:  # said, not silently dropped (eval refuses them)
            other = sorted({p.parent.name for p in paths if p.parent != Path(data)} - set(classes))
            why = (
                f"{some_of(other, 3)} not among the model's classes"
                if other
                else "no class folders"
            )
            described += f" (unlabelled: {why}, so agreement with fp32 only, no accuracy)"
        return EvalImages(tuple(paths), labels, "data", described)
    run = find_run(model)
    if run is not None:
        imgs = run_validation_images(run, limit=EVAL_LIMIT)
        index = {c: i for i, c in enumerate(classes)}
        labels = (
            np.array([index[label] for label in imgs.labels])
            if all(label in index for label in imgs.labels)
            else None
        )
        return EvalImages(imgs.paths, labels, "run", imgs.describe())
    paths = real_images(None)
    return EvalImages(
        tuple(paths),
        labels_for(paths, classes),
        "builtin",
        f"the {len(paths)} bundled sample photos",
    )


def calibration_images(
    model: Path, calib: str | None, limit: int, *, held_out: EvalImages | None = None
) -> tuple[list[Path], str]:
    """``--calib`` (up to ``limit``), else a seeded sample of the model's run's training split;
    with a description.

    When int8 is judged on the run's own validation images (``held_out``, chosen by zoo, not
    by the user), calibration images with the same bytes as one of them are left out, and
    the description says how many: ``--calib`` the folder the run was trained on (the user's
    natural ``--calib ./my-data``) works, so does a run whose folder holds a photo twice (one
    copy in each split), and the agreement is still measured on held-out images.
    A ``--data`` the user gave is checked instead (:func:`check_disjoint` refuses overlap).

    Raises:
        InputError: neither (or no images in ``calib``, or none left once the held-out
            images are left out).
    """
    judged = held_out.paths if held_out is not None and held_out.source == "run" else ()
    if calib is not None:
        paths = real_images(calib, limit=limit + len(judged))
        if not paths:
            raise InputError(f"No images found for calibration in {calib}.")
        unjudged = _without(paths, judged)
        kept = unjudged[:limit]
        describe = f"{len(kept)} images of {calib}"
        where = f"--calib {calib}"
        fix = (
            "give --calib other images like them (or omit it: zoo then calibrates on the "
            "run's training split)"
        )
    else:
        run = find_run(model)
        if run is None:
            raise InputError("--mode static needs --calib DIR with representative real images.")
        imgs = run_validation_images(run, limit=limit + len(judged), split="train")
        paths = list(imgs.paths)
        unjudged = _without(paths, judged)
        kept = unjudged[:limit]
        describe = imgs.describe(len(kept))
        where = f"run {run.name}'s training split"
        fix = (
            "its folder holds the same photos more than once: give --calib DIR with other "
            "images like them"
        )
    if not kept:
        raise InputError(
            f"Every image of {where} is one of the run's validation images int8 is judged "
            f"on: {fix}."
        )
    left_out = len(paths) - len(unjudged)
    note = f" (left out: {left_out} of the run's validation images)" if left_out else ""
    return kept, describe + note


def _without(paths: list[Path], judged: tuple[Path, ...]) -> list[Path]:
    """``paths`` less those with the same bytes as one of ``judged`` (whatever their name)."""
    if not judged:
        return paths
    digests = {file_digest(p) for p in judged}
    return [p for p in paths if file_digest(p) not in digests]


def labels_for(images: list[Path], classes: list[str]) -> np.ndarray | None:
    """Labels from the parent folder names, when every folder is a class of the model."""
    index = {c: i for i, c in enumerate(classes)}
    if not classes or not all(p.parent.name in index for p in images):
        return None
    return np.array([index[p.parent.name] for p in images])
