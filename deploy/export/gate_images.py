"""The real images the export gate judges a model on, and where each group comes from.

``--data DIR``, or zoo's bundled photos plus, for a run or its model folder, a seeded sample of
the run's own validation images (:mod:`zoo.run_images`). The report names each source
(:class:`ImageSource`), so a reader knows what a verdict was reached on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from zoo.images import list_images
from zoo.ref import ModelRef

ImageKind = Literal["bundled", "data", "run", "given"]


@dataclass(frozen=True)
class ImageSource:
    """Where some of the gate's real images come from, for the report.

    Attributes:
        kind: ``bundled`` (zoo's sample photos), ``data`` (``--data DIR``), ``run`` (the
            seeded sample of the run's validation split) or ``given`` (a caller's list).
        count: how many images of this source the gate used.
        description: for people, e.g. ``64 of run digits's 359 validation images (seed 0)``.
    """

    kind: ImageKind
    count: int
    description: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GateImages:
    """The real images the gate judges with, and where each group comes from."""

    paths: tuple[Path, ...]
    sources: tuple[ImageSource, ...]

    @classmethod
    def given(cls, paths: Sequence[Path]) -> GateImages:
        return cls(tuple(paths), (ImageSource("given", len(paths), f"{len(paths)} given images"),))


def real_images(data: str | Path | None, limit: int = 64) -> list[Path]:
    """Images for the prediction check: ``--data DIR`` (up to ``limit``) or the bundled samples."""
    if data is None:
        from zoo.samples import sample_image_paths

        return sample_image_paths()
    files = list_images(Path(data))
    step = max(1, len(files) // limit)
    return files[::step][:limit]


def gate_images(model: ModelRef | None, data: str | Path | None, limit: int = 64) -> GateImages:
    """The real images the export gate judges ``model`` on.

    ``--data DIR``: up to ``limit`` of its images, spread over the folder (as always).
    Otherwise zoo's bundled photos, and, when ``model`` is a run or a folder of one, a seeded
    sample of ``limit`` of the run's own validation images at the run's image size
    (:mod:`zoo.run_images`): a fine-tuned model is judged on its own distribution too.

    Args:
        model: what is being exported (only a run or its model folder has images of its own).
        data: ``--data DIR``, or None.
        limit: the most images taken from ``data`` or the run.

    Raises:
        DataError: the run's ``split.json`` cannot be read or none of its validation images
            exist any more (the message says to pass ``--data DIR``).
    """
    if data is not None:
        paths = real_images(data, limit)
        return GateImages(
            tuple(paths),
            (ImageSource("data", len(paths), f"{len(paths)} images of --data {data}"),),
        )
    from zoo.run_images import images_for
    from zoo.samples import sample_image_paths

    bundled = tuple(sample_image_paths())
    sources = [ImageSource("bundled", len(bundled), f"{len(bundled)} bundled photos")]
    run = None
    if model is not None and model.kind in ("run", "model-folder"):
        run = images_for(model.model_folder, limit=limit)  # None: a folder outside a run
    if run is None:
        return GateImages(bundled, tuple(sources))
    sources.append(ImageSource("run", len(run.paths), run.describe()))
    return GateImages(bundled + run.paths, tuple(sources))


__all__ = ["GateImages", "ImageKind", "ImageSource", "gate_images", "real_images"]
