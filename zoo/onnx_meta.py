"""zoo's metadata embedded in an ONNX file (``metadata_props['zoo']``, one JSON object):
registry id, class names, preprocessing, calibration (temperature and rejection rule), opset,
exporter, versions, source-weights hash, parity summary. ``zoo predict`` and ``zoo serve`` need nothing else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx

from zoo.calibration import Calibration
from zoo.errors import InputError
from zoo.preprocessing import Preprocessing

META_KEY = "zoo"


def set_metadata(model: onnx.ModelProto, meta: dict[str, Any]) -> None:
    for prop in list(model.metadata_props):
        if prop.key == META_KEY:
            model.metadata_props.remove(prop)
    entry = model.metadata_props.add()
    entry.key, entry.value = META_KEY, json.dumps(meta)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """zoo metadata of an ONNX file, reading only the model header (no weights needed)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"ONNX file {path} does not exist.")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise InputError(f"{path} is not an ONNX model ({type(exc).__name__}: {exc}).") from exc
    for prop in model.metadata_props:
        if prop.key == META_KEY:
            return dict(json.loads(prop.value))
    return {}


def read_preprocessing(meta: dict[str, Any], path: str | Path) -> Preprocessing:
    """The typed preprocessing in an ONNX file's zoo metadata (from :func:`read_metadata`).

    Raises:
        InputError: the file carries no zoo metadata (it was not exported by zoo).
        ArtifactError: the stored preprocessing is incomplete or inconsistent.
    """
    if not meta.get("preprocessing"):
        raise InputError(f"{path} carries no zoo metadata: export it with `zoo export`.")
    return Preprocessing.from_dict(meta["preprocessing"], where=f"{path} zoo metadata")


def read_calibration(meta: dict[str, Any], path: str | Path) -> Calibration | None:
    """The calibration in an ONNX file's zoo metadata (None: exported without one: its
    softmax is the raw one and it never answers ``unknown``).

    Raises:
        ArtifactError: the stored calibration is malformed.
    """
    found = meta.get("calibration")
    if not found:
        return None
    return Calibration.from_dict(found, where=f"{path} zoo metadata")
