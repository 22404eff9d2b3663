"""mypy over the installed package layout (zoo, zoo.train, zoo.deploy, zoo.cli).

mypy has no equivalent of setuptools' package-dir mapping, so this builds the installed tree
as symlinks in a temporary folder, checks ``-p zoo`` there, and prints paths as repo paths.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("train", "deploy", "cli")  # repo folder -> zoo.<folder>


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="zoo-typecheck-") as tmp:
        view = Path(tmp) / "zoo"
        view.mkdir()
        for entry in (ROOT / "zoo").iterdir():
            if entry.name != "__pycache__":
                (view / entry.name).symlink_to(entry)
        for name in MAPPED:
            (view / name).symlink_to(ROOT / name)
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--config-file",
                str(ROOT / "pyproject.toml"),
                "-p",
                "zoo",
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
    out = r.stdout + r.stderr
    for name in MAPPED:  # report repo paths, not the view's
        out = out.replace(f"zoo/{name}/", f"{name}/")
    sys.stdout.write(out)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
