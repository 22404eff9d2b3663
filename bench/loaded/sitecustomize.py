"""Loaded at start-up by every Python process a benchmark starts (``bench/provenance.py`` puts
this folder first on ``PYTHONPATH``): at exit it writes the repository's source files the
process imported, one per line, to a file of its own in ``$ZOO_BENCH_LOADED``. The result file then names
the code it measured file by file, so a commit elsewhere leaves its figures current.

Written by hand: coverage.py and friends trace every line (a timing figure would measure them);
this only reads ``sys.modules`` once, at exit."""

import atexit
import os
import sys


def _write() -> None:
    out, root = os.environ.get("ZOO_BENCH_LOADED"), os.environ.get("ZOO_BENCH_ROOT")
    if not out or not root or not os.path.isdir(out):
        return
    prefix = os.path.join(os.path.realpath(root), "")
    files = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            path = os.path.realpath(path)
            if path.startswith(prefix):
                files.add(path[len(prefix) :])
    name = f"{os.getpid()}-{os.urandom(4).hex()}"  # pids come back in a long run
    with open(os.path.join(out, f".{name}.tmp"), "w") as f:
        f.write("\n".join(sorted(files)))
    os.replace(os.path.join(out, f".{name}.tmp"), os.path.join(out, f"{name}.txt"))


atexit.register(_write)
