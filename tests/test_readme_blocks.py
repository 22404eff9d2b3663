"""Every code block of the README is exercised, or says why not.

Each fenced block is preceded by a marker comment, one of:

- ``<!-- readme: run -->``: this file executes the block as written (shell blocks line by line
  in a scratch folder, against a live server where it talks to one).
- ``<!-- readme: tested by tests/a.py [tests/b.py …] -->``: those files run the block's
  commands (on small real data, e.g. ``mobilenet_v2`` on digits where the README says
  ``resnet18`` on ``./fish``); checked here: every ``zoo`` sub-command and every option the block
  shows occurs in those files.
- ``<!-- readme: not run: REASON -->``: needs a GPU, the network or a service this machine
  lacks (the reason says which). A ``tested by`` marker may end with ``; not run: REASON`` for
  the block's lines that are not ``zoo`` commands (an install line, ``tritonserver``).

And every ``zoo …`` line of every block, run or not, parses against the real CLI: its command,
options and choices exist (a README that drifted from the CLI fails here).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

README = ROOT / "README.md"
MARKER = re.compile(r"<!--\s*readme:\s*(.*?)\s*-->")
NOT_RUN_REASONS = ("GPU", "network", "service", "CI")


@dataclass(frozen=True)
class Block:
    line: int  # the opening fence's line number (1-based)
    lang: str
    code: str
    marker: str | None

    def commands(self) -> list[str]:
        """Shell lines with continuations joined and comments dropped."""
        joined = self.code.replace("\\\n", " ")
        out = []
        for raw in joined.splitlines():
            line = raw.split("  #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
        return out


def blocks() -> list[Block]:
    lines = README.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```") and len(lines[i]) > 3:
            start, lang = i, lines[i][3:].strip()
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            m = MARKER.search(prev)
            found.append(Block(start + 1, lang, "\n".join(lines[start + 1 : j]), m and m.group(1)))
            i = j + 1
        else:
            i += 1
    return found


def zoo_argv(command: str) -> list[str] | None:
    """``zoo …``'s arguments, or None for another program."""
    # an optional part written [--a v | --b] is documentation, not arguments
    words = shlex.split(re.sub(r"\[[^\]]*\]", "", command).replace("…", "x"))
    return words[1:] if words and words[0] == "zoo" else None


def test_every_block_says_how_it_is_exercised() -> None:
    unmarked = [b.line for b in blocks() if b.marker is None]
    assert not unmarked, f"README blocks without a <!-- readme: … --> marker at lines {unmarked}"
    for b in blocks():
        kind, rest = b.marker or "", ""
        if kind.startswith("tested by "):
            kind, _, rest = kind.partition("; ")
        assert (
            kind == "run"
            or kind.startswith("tested by ")
            or (kind.startswith("not run: ") and any(r in kind for r in NOT_RUN_REASONS))
        ), f"README line {b.line}: unknown marker {kind!r}"
        assert not rest or rest.startswith("not run: "), (
            f"README line {b.line}: a tested-by marker's tail is '; not run: REASON'"
        )


def _parse(command: Any, argv: list[str], name: str = "zoo", parent: Any = None) -> None:
    """Click's parsing of ``argv`` down to the leaf command (options, choices, conversions),
    without calling the command. (Duck-typed: typer ships its own copy of click.)"""
    with command.make_context(name, list(argv), parent=parent) as ctx:
        if hasattr(command, "resolve_command"):  # a group: parse its sub-command too
            given = [*getattr(ctx, "_protected_args", []), *ctx.args]
            sub, cmd, rest = command.resolve_command(ctx, given)
            assert cmd is not None and sub is not None
            _parse(cmd, rest, sub, ctx)


def test_every_zoo_line_parses_against_the_cli() -> None:
    """Options and choices the README shows exist (the command function is not run)."""
    import typer

    from zoo.cli.app import app

    group = typer.main.get_command(app)
    bad = []
    for b in blocks():
        for command in b.commands() if b.lang == "bash" else []:
            argv = zoo_argv(command)
            if argv is None:
                continue
            try:
                _parse(group, argv)
            except Exception as exc:  # typer's click's UsageError, BadParameter, NoSuchOption
                if not hasattr(exc, "format_message"):
                    raise
                bad.append(f"line {b.line}: {command}\n    {exc.format_message()}")
    assert not bad, "README commands the CLI refuses:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    "block", [b for b in blocks() if (b.marker or "").startswith("tested by ")], ids=str
)
def test_tested_blocks_name_files_that_use_every_command_and_option(block: Block) -> None:
    files = (block.marker or "").partition("; ")[0].removeprefix("tested by ").split()
    source = ""
    for f in files:
        path = ROOT / f
        assert path.is_file(), f"README line {block.line} names {f}, which does not exist"
        source += path.read_text()
    missing = []
    for command in block.commands():
        argv = zoo_argv(command)
        if argv is None:
            continue
        wanted = [argv[0]] + [a.split("=")[0] for a in argv if a.startswith("-")]
        missing += [f"{command}: {w}" for w in wanted if f'"{w}"' not in source]
    assert not missing, (
        f"README line {block.line}: not exercised by {', '.join(files)}:\n" + "\n".join(missing)
    )


@pytest.mark.parametrize(
    "block",
    [b for b in blocks() if b.marker == "run" and b.lang == "bash" and "curl" not in b.code],
    ids=str,
)
def test_run_blocks_succeed(block: Block, tmp_path: Path) -> None:
    zoo = str(ROOT / ".venv" / "bin" / "zoo")
    for command in block.commands():
        argv = zoo_argv(command)
        assert argv is not None, f"README line {block.line}: only zoo lines run here: {command}"
        r = subprocess.run([zoo, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"README line {block.line}: {command}\n{r.stderr}"


def test_serving_blocks_against_a_live_server(mobilenet_weights: Path, tmp_path: Path) -> None:
    """The curl block and the tritonclient snippet, as written, against ``zoo serve
    mobilenet_v2`` (the README's port 8000 swapped for a free one)."""
    import sys

    from tests.serving import server

    served = [b for b in blocks() if b.marker == "run" and ("curl" in b.code or "8000" in b.code)]
    assert served, "the README's serving blocks are marked run"
    with server("mobilenet_v2") as (url, _):
        port = url.rsplit(":", 1)[1]
        for b in served:
            code = b.code.replace("localhost:8000", f"localhost:{port}").replace(
                "127.0.0.1:8000", f"127.0.0.1:{port}"
            )
            if b.lang == "python":
                cmd = [sys.executable, "-c", code]
            else:
                cmd = ["bash", "-euo", "pipefail", "-c", code.replace("curl -s", "curl -sf")]
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, f"README line {b.line}:\n{r.stdout}\n{r.stderr}"
