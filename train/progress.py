"""The rich progress bar (epoch, step, loss, accuracy, img/s, data-wait share)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


@contextmanager
def make_progress(enabled: bool) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    console = Console(stderr=True)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=not console.is_terminal,
        disable=not console.is_terminal,
    )
    with progress:
        yield progress
