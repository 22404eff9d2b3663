"""A model folder's ``config.json`` as typed values: the one place its keys are spelled.

Written by ``zoo finetune`` (:func:`zoo.train.finish.model_config`), ``zoo bundle``/``convert``
and ``zoo enroll``; read strictly by :func:`zoo.artifact.read_config`, which returns a
:class:`ModelConfig`. The JSON stays the on-disk form (written as it is, unknown keys kept on
rewrite, so a folder from a newer zoo survives a calibration); everything else reads these
properties instead of indexing the dict. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zoo.calibration import Calibration
from zoo.preprocessing import Preprocessing


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def _section(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A nested object (``data``, ``train``): empty when absent or not an object."""
    value = raw.get(key)
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class DataSummary:
    """What the folder's weights were trained on (``config.json`` ``data``)."""

    name: str | None
    fingerprint: str | None  # :meth:`zoo.train.data.Splits.fingerprint`
    num_images: int | None


@dataclass(frozen=True)
class ModelConfig:
    """One model folder's ``config.json``; ``raw`` is the JSON object exactly as stored.

    Properties give absent optional keys their documented defaults (a folder written before
    zoo recorded them); :func:`zoo.artifact.read_config` has checked the required ones.
    """

    raw: Mapping[str, Any]
    where: Path | None = field(default=None, compare=False)  # the file, for messages

    @property
    def base(self) -> str:
        """The registry entry whose architecture the weights fit."""
        return str(self.raw["base"])

    @property
    def num_classes(self) -> int:
        return int(self.raw["num_classes"])

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(str(c) for c in self.raw["class_names"])

    @property
    def weights_sha256(self) -> str | None:
        """The weights file's hash (None before :func:`zoo.artifact.save_model_folder`)."""
        value = self.raw.get("weights_sha256")
        return str(value) if value is not None else None

    @property
    def arch(self) -> str | None:
        value = self.raw.get("arch")
        return str(value) if value else None

    @property
    def tag(self) -> str | None:
        value = self.raw.get("tag")
        return str(value) if value else None

    @property
    def lineage(self) -> tuple[str, ...]:
        """Every model this one descends from, oldest first (default: its base)."""
        found = self.raw["lineage"] if "lineage" in self.raw else [self.raw["base"]]
        return tuple(str(x) for x in found or ())

    @property
    def multi_label(self) -> bool:
        return bool(self.raw.get("multi_label", False))

    @property
    def thresholds(self) -> tuple[float, ...] | None:
        found = self.raw.get("thresholds")
        return tuple(float(t) for t in found) if found else None

    @property
    def params(self) -> int | None:
        return _int(self.raw.get("params"))

    @property
    def gflops(self) -> float | None:
        return _number(self.raw.get("gflops"))

    @property
    def metrics(self) -> dict[str, float]:
        """The numeric validation metrics measured by zoo (``val/acc`` …)."""
        found = _section(self.raw, "metrics")
        return {k: v for k, v in ((k, _number(v)) for k, v in found.items()) if v is not None}

    @property
    def data(self) -> DataSummary:
        d = _section(self.raw, "data")
        name, fp = d.get("name"), d.get("fingerprint")
        return DataSummary(
            str(name) if name else None, str(fp) if fp else None, _int(d.get("num_images"))
        )

    @property
    def parent_weights(self) -> str | None:
        value = self.raw.get("parent_weights")
        return str(value) if value else None

    @property
    def parent_weights_sha256(self) -> str | None:
        value = self.raw.get("parent_weights_sha256")
        return str(value) if value else None

    @property
    def strategy(self) -> str | None:
        value = _section(self.raw, "train").get("strategy")
        return str(value) if value else None

    @property
    def epochs(self) -> int | None:
        return _int(_section(self.raw, "train").get("epochs"))

    @property
    def shipped_epoch(self) -> int | None:
        """The training epoch whose weights the folder holds (None: not recorded)."""
        return _int(_section(self.raw, "train").get("shipped_epoch"))

    @property
    def quantization_aware(self) -> bool | None:
        """Whether the weights were trained through int8 rounding (None: not recorded)."""
        value = _section(self.raw, "train").get("quantization_aware")
        return value if isinstance(value, bool) else None

    @property
    def qat_weight_bits(self) -> int | None:
        """The int8 weights' bits ``zoo distill --qat`` trained for: 8 or 7 (None: not
        recorded, as in folders written before zoo recorded it, or not quantization-aware)."""
        value = _int(_section(self.raw, "train").get("qat_weight_bits"))
        return value if value in (7, 8) else None

    @property
    def enrolled(self) -> tuple[Mapping[str, Any], ...]:
        """``zoo enroll``'s records, one per added class, oldest first."""
        return tuple(r for r in self.raw.get("enrolled") or [] if isinstance(r, Mapping))

    @property
    def preprocessing(self) -> Preprocessing | None:
        """None only in folders written before zoo recorded it.

        Raises:
            ArtifactError: the stored value is malformed.
        """
        found = self.raw.get("preprocessing")
        if found is None:
            return None
        return Preprocessing.from_dict(
            found, where=f"{self.where or 'config.json'} 'preprocessing'"
        )

    @property
    def calibration(self) -> Calibration | None:
        """The fitted calibration (None: never calibrated, or written before zoo did).

        Raises:
            ArtifactError: the stored value is malformed.
        """
        found = self.raw.get("calibration")
        if not found:
            return None
        return Calibration.from_dict(found, where=f"{self.where or 'config.json'} 'calibration'")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object to write back (a copy: ``{**c.to_dict(), key: new}``)."""
        return dict(self.raw)
