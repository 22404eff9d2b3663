"""The model registry: names (``arch.tag``) → metadata + a builder.

Builders are tiny functions ``fn(num_classes: int, **kw) -> nn.Module`` decorated with
:func:`register_model`, one decorator call per architecture listing its weight tags (the
first tag is the default). Registering a name twice raises. ``timm:<name>`` entries are
resolved on demand from timm's own pretrained configs (see :mod:`zoo.timm_entries`).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from zoo.errors import DuplicateModelError, UnknownModelError
from zoo.metadata import ModelInfo

Builder = Callable[..., nn.Module]


@dataclass(frozen=True)
class Entry:
    info: ModelInfo
    builder: Builder


_ENTRIES: dict[str, Entry] = {}
_DEFAULT_TAG: dict[str, str] = {}


def register_model(*infos: ModelInfo) -> Callable[[Builder], Builder]:
    """Register ``builder`` under ``info.name`` for each info; the first is the default tag."""
    if not infos:
        raise ValueError("register_model needs at least one ModelInfo")

    def decorator(builder: Builder) -> Builder:
        for info in infos:
            if info.name in _ENTRIES:
                raise DuplicateModelError(f"Model {info.name!r} is already registered")
            _ENTRIES[info.name] = Entry(info, builder)
            _DEFAULT_TAG.setdefault(info.arch, info.tag)
        return builder

    return decorator


def _ensure_loaded() -> None:
    # Importing the architecture modules runs their @register_model decorators.
    import zoo.archs  # noqa: F401


def canonical_name(name: str) -> str:
    """``resnet18`` → ``resnet18.tv_in1k``; full names pass through; unknown names raise."""
    _ensure_loaded()
    if name in _ENTRIES:
        return name
    if name in _DEFAULT_TAG:
        return f"{name}.{_DEFAULT_TAG[name]}"
    candidates = list(_ENTRIES) + list(_DEFAULT_TAG)
    raise UnknownModelError(name, difflib.get_close_matches(name, candidates, n=3, cutoff=0.6))


def get_entry(name: str) -> Entry:
    if name.startswith("timm:"):
        from zoo.timm_entries import timm_entry

        return timm_entry(name)
    return _ENTRIES[canonical_name(name)]


def list_models(pattern: str | None = None) -> list[str]:
    """Registered names (``arch.tag``), sorted, optionally filtered with an fnmatch pattern.

    A pattern without a dot also matches the architecture alone (``resnet*`` finds
    ``resnet18.tv_in1k``).
    """
    _ensure_loaded()
    names = sorted(_ENTRIES)
    if pattern is None:
        return names
    return [
        n
        for n in names
        if fnmatch.fnmatch(n, pattern) or fnmatch.fnmatch(_ENTRIES[n].info.arch, pattern)
    ]


def model_info(name: str) -> ModelInfo:
    """Metadata of a registry entry (a bare arch means its default tag; ``timm:`` works too)."""
    return get_entry(name).info
