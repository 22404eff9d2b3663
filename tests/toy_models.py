"""Small registry entries that misbehave on purpose, for the tests of README claims.

``register()`` adds them to the registry (idempotent). A test that needs them in a real ``zoo``
process runs ``python -c "import tests.toy_models as t; t.register(); from zoo.cli.app import
main; main()" ARGS`` from the repository root (see ``zoo_with_toys``). Their names start with
``tiny_``, which the model-card test skips.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import torch
from torch import nn

from zoo.metadata import ModelInfo

BRANCHY = "tiny_branchy.test"
NANBURST = "tiny_nanburst.test"


class Branchy(nn.Module):
    """Data-dependent control flow: inputs holding a value above 3 get +10 on every logit.

    Export traces it with a seeded standard-normal dummy (it holds such values), so the traced
    graph always adds 10, while real normalised photos (at most (1 − 0.406) / 0.225 ≈ 2.64)
    never should: the export genuinely breaks parity. ``torch.jit.script`` keeps the branch.
    """

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(torch.relu(self.conv(x)).mean((2, 3)))
        if bool(x.amax() > 3.0):
            y = y + 10.0
        return y


class NaNBurst(nn.Module):
    """A small conv net whose training forward passes number 5, 6 and 7 (counted in the
    process, not saved in checkpoints) return NaN: a transient burst of non-finite losses
    that a rollback to the last checkpoint survives."""

    burst = (4, 5, 6)

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, num_classes)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(torch.relu(self.conv(x)).mean((2, 3)))
        if self.training:
            self.calls += 1
            if self.calls - 1 in self.burst:
                y = y * float("nan")
        return y


def _info(arch: str, num_classes: int) -> ModelInfo:
    return ModelInfo(
        arch=arch,
        tag="test",
        input_size=(3, 32, 32),
        num_classes=num_classes,
        params=0,
        gflops=0.0,
        crop_pct=1.0,
        classifier="fc",
    )


def register() -> None:
    import zoo
    from zoo.registry import register_model

    known = set(zoo.list_models("tiny_*"))
    if BRANCHY not in known:
        info = _info("tiny_branchy", 4)
        n = sum(p.numel() for p in Branchy().parameters())
        register_model(replace(info, params=n))(Branchy)
    if NANBURST not in known:
        info = _info("tiny_nanburst", 10)
        n = sum(p.numel() for p in NaNBurst().parameters())
        register_model(replace(info, params=n))(NaNBurst)


def zoo_with_toys(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    """The real CLI entry point (``zoo.cli.app.main``: exit codes, error mapping) in a fresh
    process that has the toy entries registered."""
    from tests.conftest import ROOT

    code = "import tests.toy_models as t; t.register(); from zoo.cli.app import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, **kw
    )
