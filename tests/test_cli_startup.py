"""Instant start: help, listing and metadata never import torch, timm or onnxruntime.

The real console entry point (``zoo.cli.app.main``) runs each command in one fresh
interpreter, and ``sys.modules`` is read after every command, so the first command that
pulls in a heavy library is named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "timm", "onnxruntime")

_PROBE = """
import json, sys
from zoo.cli.app import app, main
heavy, out_path, commands = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
names = sorted(c.name for c in app.registered_commands)
commands += [[name, "--help"] for name in names]
results = []
for args in commands:
    sys.argv = ["zoo", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    results.append({"args": args, "code": code, "heavy": [m for m in heavy if m in sys.modules]})
with open(out_path, "w") as f:
    json.dump({"commands": names, "results": results}, f)
"""


def _probe(commands: list[list[str]], cwd: Path) -> dict:
    out = cwd / "probe.json"
    r = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(HEAVY), str(out), json.dumps(commands)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_help_list_info_do_not_import_torch(tmp_path: Path) -> None:
    from zoo.bundle import bundle

    # a local run, so that `zoo list` and `zoo info RUN` read a real model folder
    bundle("mlp", tmp_path / "runs" / "digits-mlp" / "model")
    probe = _probe(
        [
            ["--help"],
            ["list"],
            ["list", "--json"],
            ["info", "resnet18"],
            ["info", "runs/digits-mlp"],
        ],
        tmp_path,
    )
    results = probe["results"]
    assert len(probe["commands"]) >= 17  # every command's --help was run
    for res in results:
        assert res["code"] in (0, None), res
        assert not res["heavy"], f"`zoo {' '.join(res['args'])}` imported {res['heavy']}"
    listed = [r for r in results if r["args"] == ["list", "--json"]]
    assert listed and not listed[0]["heavy"]


def test_probe_detects_a_heavy_import(tmp_path: Path) -> None:
    """The probe itself works: `zoo doctor`, which reports torch's version, is caught."""
    probe = _probe([["--help"], ["doctor", "--json"]], tmp_path)
    by_args = {tuple(r["args"]): r for r in probe["results"]}
    assert by_args[("--help",)]["heavy"] == []
    assert "torch" in by_args[("doctor", "--json")]["heavy"]


def test_import_zoo_is_cheap_and_every_public_name_resolves() -> None:
    code = (
        "import json, sys, zoo\n"
        "before = [m for m in json.loads(sys.argv[1]) if m in sys.modules]\n"
        "names = {n: type(getattr(zoo, n)).__name__ for n in zoo.__all__}\n"
        "print(json.dumps({'before': before, 'names': names, 'lazy': sorted(zoo._LAZY)}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, json.dumps(HEAVY)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["before"] == []
    assert sorted(d["names"]) == d["lazy"]
    assert d["names"]["create_model"] == "function" and d["names"]["ModelInfo"] == "type"
