"""``zoo bench``'s options: :class:`BenchOptions`, the one place their defaults and checks
live. Nothing here imports torch: the CLI reads the defaults at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from zoo.deploy.choices import BACKENDS
from zoo.errors import ChoiceError, InputError, UsageError


@dataclass(frozen=True)
class BenchOptions:
    """What ``zoo bench`` is asked to time; made once, checked on construction.

    Args:
        model: a model reference (registry, ``timm:`` or Hub name, run or model folder).
        backends: any of :data:`zoo.deploy.choices.BACKENDS`.
        devices: ``cpu``, ``cuda``, ``cuda:N``.
        batch_sizes: batch sizes to time.
        threads: torch and ORT intra-op threads (default: available CPUs).
        calib: calibration images for ``ort_int8`` (default: the bundled samples) and
            ``ov_int8`` (which needs them, disjoint from ``data``).
        min_seconds: time each row for at least this long.
        weights: as for :func:`zoo.create_model`.
        data: real images (up to 200) on which each backend's top-1 agreement with eager is
            measured (default: the bundled samples).
        min_agreement: also name, per device and batch size, the fastest backend whose
            agreement reaches this floor, in [0, 1].
        variant: a derived file of the run or model folder (``int8`` → its
            ``variants/int8-static.onnx``), timed as its backend (added to ``backends``)
            instead of one made afresh.
        prebuilt: backend → a file already made of this model, timed instead of one exported
            or quantized afresh (``variant`` adds to it).

    Raises:
        ChoiceError: an unknown backend.
        InputError: ``ov_int8`` without ``calib``.
        UsageError: ``min_agreement`` outside [0, 1], or no backend, device or batch size.
    """

    model: str
    backends: tuple[str, ...] = ("eager", "torchscript", "ort_fp32", "ort_fp16", "ort_int8")
    devices: tuple[str, ...] = ("cpu",)
    batch_sizes: tuple[int, ...] = (1,)
    threads: int | None = None
    calib: str | None = None
    min_seconds: float = 1.0
    weights: str | None = None
    data: str | None = None
    min_agreement: float | None = None
    variant: str | None = None
    prebuilt: Mapping[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for b in self.backends:
            ChoiceError.check("backend", b, BACKENDS)
        for what, given in (
            ("--backends", self.backends),
            ("--devices", self.devices),
            ("--batch-sizes", self.batch_sizes),
        ):
            if not given:
                raise UsageError(f"{what}: give at least one", param_hint=what)
        if self.min_agreement is not None and not 0 <= self.min_agreement <= 1:
            raise UsageError(
                f"{self.min_agreement}: give a share in [0, 1], e.g. 0.99",
                param_hint="--min-agreement",
            )
        # refused before anything is timed (once the variant has added its backend)
        if self.variant is None and "ov_int8" in self.backends and self.calib is None:
            raise InputError(
                "ov_int8 needs --calib DIR: real calibration images, disjoint from --data."
            )

    def resolved(self) -> BenchOptions:
        """These options with ``variant`` made a ``prebuilt`` file of its backend (and the
        backend added to ``backends``), checked again.

        Raises:
            Everything :func:`zoo.variants.find_variant` raises (no such variant, a model that
            is not a folder), and what construction raises.
        """
        if self.variant is None:
            return self
        from zoo.ref import ModelRef
        from zoo.variants import find_variant

        v = find_variant(ModelRef.parse(self.model).model_folder, self.variant)
        backends = self.backends + ((v.backend,) if v.backend not in self.backends else ())
        prebuilt = {**self.prebuilt, v.backend: v.path}
        return replace(self, backends=backends, prebuilt=prebuilt, variant=None)


def option_defaults() -> dict[str, Any]:
    """Each option's default: the CLI's options read theirs from here."""
    return {f.name: f.default for f in fields(BenchOptions) if f.default is not MISSING}


__all__ = ["BenchOptions", "option_defaults"]
