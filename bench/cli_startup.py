"""CLI start-up: wall time and peak memory of `zoo --help`, `zoo list` and `zoo info resnet18`
against `python -c "import typer, rich"`, measured side by side in one run (rounds alternate
the commands; medians). Goals: `zoo --help` ≤ 3× the typer+rich start-up, peak RSS < 150 MiB.

    python bench/cli_startup.py [--rounds 30]

Writes the raw samples, with provenance, to docs/bench/cli_startup.json (bench/provenance.py).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_path import ROOT  # noqa: F401
from peak_rss import run_with_peak_rss
from provenance import Recording, headline

ZOO = str(Path(sys.executable).parent / "zoo")  # the console script the user runs

COMMANDS: dict[str, list[str]] = {
    "typer+rich": [sys.executable, "-c", "import typer, rich"],
    "zoo --help": [ZOO, "--help"],
    "zoo list": [ZOO, "list"],
    "zoo info resnet18": [ZOO, "info", "resnet18"],
}
BASELINE, HELP = "typer+rich", "zoo --help"


def run_once(cmd: list[str], cwd: str) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one run of ``cmd``: its own, not this process's."""
    code, seconds, rss = run_with_peak_rss(
        cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {code}")
    return seconds, rss


def byte_compile() -> list[str]:
    """Byte-compile zoo's packages first, as ``pip install`` does: where PYTHONDONTWRITEBYTECODE
    is set (this machine sets it), a module edited since its last .pyc would otherwise be
    compiled again at every start, and the figure would depend on the checkout's history."""
    import compileall
    import importlib.util

    folders = []
    for name in ("zoo", "zoo.cli", "zoo.deploy", "zoo.train"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, name
        folders.append(next(iter(spec.submodule_search_locations)))
    for folder in folders:
        compileall.compile_dir(folder, quiet=1)
    return folders


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--out", type=Path, default=None, help="default: docs/bench/cli_startup.json")
    args = p.parse_args()
    rec = Recording("cli_startup")
    samples: dict[str, dict[str, list[float]]] = {k: {"s": [], "mib": []} for k in COMMANDS}
    compiled = byte_compile()
    with tempfile.TemporaryDirectory() as cwd:  # no ./runs folder to scan
        for cmd in COMMANDS.values():  # warm the file cache once
            run_once(cmd, cwd)
        for r in range(args.rounds):
            order = list(COMMANDS) if r % 2 == 0 else list(reversed(COMMANDS))
            for name in order:
                s, mib = run_once(COMMANDS[name], cwd)
                samples[name]["s"].append(round(s, 4))
                samples[name]["mib"].append(round(mib, 1))
    base = statistics.median(samples[BASELINE]["s"])
    summary = {
        name: {
            "median_s": round(statistics.median(v["s"]), 4),
            "ratio_vs_typer_rich": round(statistics.median(v["s"]) / base, 2),
            "peak_rss_mib_median": round(statistics.median(v["mib"]), 1),
            "peak_rss_mib_max": max(v["mib"]),
        }
        for name, v in samples.items()
    }
    help_ = summary[HELP]
    result = {
        "rounds": args.rounds,
        "byte_compiled": compiled,
        "summary": summary,
        "samples": samples,
        "headlines": [
            headline(
                "`zoo --help` start-up vs `python -c 'import typer, rich'`",
                f"summary.{HELP}.ratio_vs_typer_rich",
                help_["ratio_vs_typer_rich"],
                "<=",
                3.0,
            ),
            headline(
                "`zoo --help` peak memory (MiB, worst round)",
                f"summary.{HELP}.peak_rss_mib_max",
                help_["peak_rss_mib_max"],
                "<",
                150.0,
            ),
        ],
    }
    print(f"{'command':<20} {'median s':>9} {'× typer+rich':>13} {'peak MiB':>9}")
    for name, row in summary.items():
        print(
            f"{name:<20} {row['median_s']:>9.3f} {row['ratio_vs_typer_rich']:>13.2f} "
            f"{row['peak_rss_mib_max']:>9.1f}"
        )
    print("goals met: " + ", ".join(str(h["met"]) for h in result["headlines"]))
    rec.write(result, args.out)


if __name__ == "__main__":
    main()
