"""Triton's model configuration schema (``model_config_pb2``, shipped by ``tritonclient``):
used to write a Triton repository's ``config.pbtxt`` (:mod:`zoo.deploy.export.triton`) and
to answer Triton's model-configuration request over gRPC (``zoo serve --grpc-port``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from zoo.errors import InputError

_MODULE = "zoo_triton_model_config_pb2"


def model_config_pb2(purpose: str) -> Any:
    """Triton's ``model_config_pb2``, loaded from its file alone. Importing it the usual way
    (``from tritonclient.grpc import model_config_pb2``) runs ``tritonclient.grpc``'s
    ``__init__``, which registers Triton's gRPC service messages (``inference.ServerLive…``)
    in protobuf's process-wide pool; KServe's SDK registers the same names, so a process that
    then imports ``kserve`` fails with "duplicate symbol". The schema alone clashes with
    neither.

    Raises:
        InputError: ``tritonclient`` is not installed (``purpose`` says what needed it).
    """
    if _MODULE in sys.modules:
        return sys.modules[_MODULE]
    package = importlib.util.find_spec("tritonclient")
    locations = list(package.submodule_search_locations or []) if package else []
    files = [Path(loc) / "grpc" / "model_config_pb2.py" for loc in locations]
    found = next((f for f in files if f.is_file()), None)
    if found is None:
        raise InputError(f"{purpose} needs Triton's schema: pip install tritonclient")
    spec = importlib.util.spec_from_file_location(_MODULE, found)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODULE] = module  # before executing: protobuf registers it once
    spec.loader.exec_module(module)
    return module
