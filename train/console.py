"""Progress messages for people: stderr, and only from rank 0 under torchrun."""

from __future__ import annotations

import os
import sys


def is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


def say(msg: str) -> None:
    if is_main_process():
        print(msg, file=sys.stderr, flush=True)
