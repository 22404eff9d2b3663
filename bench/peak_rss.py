"""Run a command and read its own peak RSS and wall time, through a tiny launcher process.

Linux keeps a process's ``ru_maxrss`` across ``execve``: a child forked from a large parent
(a benchmark holding an ONNX Runtime session and a batch of images) reports the parent's size
when that is larger than its own peak. A launcher of a few MiB forks the command instead, so
the peak ``wait4`` returns is the command's. It also times the command itself, so its own
start-up is not counted either. Written by hand: psutil and /usr/bin/time sample or are not
everywhere; this is exact and a dozen lines.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

_LAUNCH = (
    "import os, subprocess, sys, time\n"
    "t0 = time.perf_counter()\n"
    "p = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "seconds = time.perf_counter() - t0\n"
    "open(sys.argv[1], 'w').write(f'{usage.ru_maxrss} {seconds}')\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def run_with_peak_rss(
    cmd: list[str],
    *,
    stdout: int | IO | None = None,
    stderr: int | IO | None = None,
    cwd: str | None = None,
) -> tuple[int, float, float]:
    """Run ``cmd`` to the end.

    Returns:
        (exit code, wall seconds of the command alone, its own peak RSS in MiB).
    """
    with tempfile.TemporaryDirectory() as d:
        report = Path(d) / "usage"
        code = subprocess.call(
            [sys.executable, "-c", _LAUNCH, str(report), *cmd],
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
        )
        if not report.exists():  # the launcher itself failed
            return code, 0.0, 0.0
        kib, seconds = report.read_text().split()
        return code, float(seconds), int(kib) / 1024  # ru_maxrss is in KiB on Linux
