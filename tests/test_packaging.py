"""The installed distribution claims one top-level name, ``zoo`` (train/, deploy/ and cli/ are
mapped under it), and ``python -m zoo`` is the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT


def test_wheel_has_only_the_zoo_package(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("zoo-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"zoo", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for module in (
        "zoo/train/trainer.py",
        "zoo/deploy/serve/app.py",
        "zoo/cli/app.py",
        "zoo/sample_images/coffee.jpg",
        "zoo/archs/imagenet_classes.txt",
        "zoo/py.typed",
    ):
        assert module in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "zoo = zoo.cli.app:main" in zipfile.ZipFile(wheel).read(entry).decode()
    installed_as = {"zoo": "zoo", "train": "zoo/train", "deploy": "zoo/deploy", "cli": "zoo/cli"}
    sources = {
        f"{installed_as[top]}/{p.relative_to(ROOT / top).as_posix()}"
        for top in installed_as
        for p in (ROOT / top).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    missing = sorted(sources - set(names))
    assert not missing, f"sources left out of the wheel (pyproject's packages): {missing}"

    site = tmp_path / "site"  # the wheel as `pip install .` lays it out, ahead of the checkout
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = subprocess.run(
        [sys.executable, "-m", "zoo", "list", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr  # every command module imports from the wheel alone
    # an editable install's finder serves a module the wheel lacks from the checkout: every
    # zoo module the CLI imports must come from the wheel
    from_checkout = (
        "import sys, zoo.cli.app; print([n for n, m in sys.modules.items() if "
        "n.split('.')[0] == 'zoo' and getattr(m, '__file__', None) and "
        f"not m.__file__.startswith({str(site)!r})])"
    )
    r = subprocess.run(
        [sys.executable, "-c", from_checkout], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_python_dash_m_zoo_is_the_cli() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "zoo", "list", "--json"], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    assert '"resnet18.tv_in1k"' in r.stdout
