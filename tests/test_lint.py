"""ruff (lint + format) and mypy are configured and clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "cmd",
    [
        [str(BIN / "ruff"), "check", "."],
        [str(BIN / "ruff"), "format", "--check", "."],
        [sys.executable, "scripts/typecheck.py"],  # mypy over the installed layout
    ],
    ids=lambda c: " ".join(Path(p).name for p in c),
)
def test_tool_is_clean(cmd: list[str]) -> None:
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
