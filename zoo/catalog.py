"""Look models up by name: the registry's entries, and ``timm:<name>`` on demand.

This is the one module that imports every architecture family (:mod:`zoo.archs`), so that
the table in :mod:`zoo.registry` is complete before any lookup. Neither imports torch:
``zoo list`` and ``zoo info`` read static metadata only. ``timm:`` names are resolved from
timm's own pretrained configs (:mod:`zoo.timm_entries`), which does import torch and timm.
"""

from __future__ import annotations

import difflib
import fnmatch

import zoo.archs  # noqa: F401  (registers every built-in entry)
from zoo.errors import UnknownModelError
from zoo.metadata import ModelInfo
from zoo.registry import DEFAULT_TAG, ENTRIES, Entry


def try_canonical_name(name: str) -> str | None:
    """``arch.tag`` of a registry name or bare ``arch``; None when it is not registered."""
    if name in ENTRIES:
        return name
    if name in DEFAULT_TAG:
        return f"{name}.{DEFAULT_TAG[name]}"
    return None


def suggest(name: str) -> list[str]:
    """Up to three registered names close to ``name`` (for "did you mean")."""
    return difflib.get_close_matches(name, [*ENTRIES, *DEFAULT_TAG], n=3, cutoff=0.6)


def canonical_name(name: str) -> str:
    """The full registry name of ``name``.

    Args:
        name: ``arch.tag`` or a bare ``arch`` (meaning its default tag).

    Returns:
        ``arch.tag``, e.g. ``resnet18`` → ``resnet18.tv_in1k``.

    Raises:
        UnknownModelError: the name is not registered (with did-you-mean suggestions).
    """
    canonical = try_canonical_name(name)
    if canonical is None:
        raise UnknownModelError(name, suggest(name))
    return canonical


def get_entry(name: str) -> Entry:
    """The registry entry (metadata + builder) of a registry name or a ``timm:<name>``.

    Raises:
        UnknownModelError: the name is neither registered nor a timm model.
    """
    if name.startswith("timm:"):
        from zoo.timm_entries import timm_entry

        return timm_entry(name)
    return ENTRIES[canonical_name(name)]


def list_models(pattern: str | None = None) -> list[str]:
    """Registered names (``arch.tag``), sorted.

    Args:
        pattern: an fnmatch pattern; one without a dot also matches the architecture alone
            (``resnet*`` finds ``resnet18.tv_in1k``). ``None`` lists everything.

    Returns:
        The matching names, sorted (``timm:`` models are not listed).
    """
    names = sorted(ENTRIES)
    if pattern is None:
        return names
    return [
        n
        for n in names
        if fnmatch.fnmatch(n, pattern) or fnmatch.fnmatch(ENTRIES[n].info.arch, pattern)
    ]


def usable_here() -> list[str]:
    """Registered entries whose pretrained weights load here without the network: cached in
    the torch hub or Hugging Face cache and matching their pinned hash (random-init entries
    are left out). What an unavailable-weights error offers instead."""
    from zoo.weights import availability

    return [
        name
        for name, entry in sorted(ENTRIES.items())
        if entry.info.weights.kind != "none" and availability(entry.info.weights).available
    ]


def model_info(name: str) -> ModelInfo:
    """Metadata of an entry, without building it.

    Args:
        name: ``arch.tag``, a bare ``arch`` (its default tag) or ``timm:<name>``.

    Returns:
        The entry's :class:`ModelInfo`.

    Raises:
        UnknownModelError: the name is not known (with did-you-mean suggestions).
    """
    return get_entry(name).info
