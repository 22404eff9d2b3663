"""The registry table: names (``arch.tag``) → metadata + a builder.

Architecture modules (one per family, under :mod:`zoo.archs`) register into this table with
:func:`register_model`; this module imports none of them, and nothing here imports torch.
Look names up through :mod:`zoo.catalog`, the one place that imports every family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zoo.errors import DuplicateModelError
from zoo.metadata import ModelInfo

if TYPE_CHECKING:
    from torch import nn

Builder = Callable[..., "nn.Module"]
"""``fn(num_classes: int, **kw) -> nn.Module``; imports torch itself, when called."""


@dataclass(frozen=True)
class Entry:
    """One registry row: static metadata and the function that builds the module."""

    info: ModelInfo
    builder: Builder


ENTRIES: dict[str, Entry] = {}
"""``arch.tag`` → entry, in registration order."""
DEFAULT_TAG: dict[str, str] = {}
"""``arch`` → its default tag (the first one registered)."""


def register_model(*infos: ModelInfo) -> Callable[[Builder], Builder]:
    """Decorator registering a builder under each ``info.name``; the first info is the default tag.

    Args:
        *infos: one :class:`ModelInfo` per weight tag of the architecture.

    Returns:
        The decorator; it returns the builder unchanged.

    Raises:
        ValueError: no info given.
        DuplicateModelError: a name is already registered (nothing is registered then).
    """
    if not infos:
        raise ValueError("register_model needs at least one ModelInfo")

    def decorator(builder: Builder) -> Builder:
        taken = [info.name for info in infos if info.name in ENTRIES]
        if taken:
            raise DuplicateModelError(f"Model {taken[0]!r} is already registered")
        for info in infos:
            ENTRIES[info.name] = Entry(info, builder)
            DEFAULT_TAG.setdefault(info.arch, info.tag)
        return builder

    return decorator
