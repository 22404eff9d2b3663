"""``zoo finetune --nproc N``: re-run the same command under PyTorch's elastic launcher
(``torch.distributed.run``, i.e. ``torchrun --standalone --nproc-per-node N``)."""

from __future__ import annotations

import subprocess
import sys


def _strip_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def launch(nproc: int) -> int:
    args = _strip_nproc(sys.argv[1:])
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "zoo.cli.app",
        *args,
    ]
    print(
        f"launching {nproc} processes: torchrun --standalone --nproc-per-node={nproc} "
        f"-m zoo.cli.app {' '.join(args)}",
        file=sys.stderr,
        flush=True,
    )
    return subprocess.call(cmd)
