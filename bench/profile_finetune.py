"""Where a whole `zoo finetune` run spends its time: the command run in-process under cProfile,
timed by CPU time of the process (robust on a busy machine) or by wall clock, and the
functions that cost most, grouped by zoo's own code and the libraries it calls.

    python bench/profile_finetune.py                       # simple_cnn on the digits, 2 epochs
    python bench/profile_finetune.py --clock wall -- simple_cnn --data DIR --epochs 12 -b 64
    python -m pstats prof/finetune.prof                    # then browse (or snakeviz)

Only the CLI is used (``zoo.cli.app``), so it profiles whatever the trainer is at the time.
The data-loader workers are separate processes and are not profiled: time the main process
spends waiting for them shows up under the DataLoader's ``__next__``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

from bench_path import ROOT  # noqa: F401
from common import make_data

DEFAULT = ["simple_cnn", "-b", "64", "--no-augment", "--num-workers", "1", "--epochs", "2"]
SHOW = r"zoo/|train/|deploy/|cli/|tensorboard|matplotlib|safetensors|torch/serialization|PIL"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    p.add_argument("--out", default="prof/finetune.prof")
    p.add_argument("--top", type=int, default=45)
    p.add_argument("finetune_args", nargs="*", help="after --: arguments of `zoo finetune`")
    args = p.parse_args()
    t_import = time.perf_counter()
    from zoo.cli.app import main as zoo_main  # imports every command module (not profiled)

    t_import = time.perf_counter() - t_import

    with tempfile.TemporaryDirectory() as tmp:
        ft = args.finetune_args or DEFAULT
        if "--data" not in ft:
            ft = [*ft, "--data", str(make_data(Path(tmp), 1))]
        if "--runs" not in ft:
            ft = [*ft, "--runs", str(Path(tmp) / "runs")]
        timer = time.process_time if args.clock == "cpu" else time.perf_counter
        prof = cProfile.Profile(timer)
        sys.argv = ["zoo", "finetune", *ft]
        t0, c0 = time.perf_counter(), time.process_time()
        prof.enable()
        try:
            zoo_main()
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        finally:
            prof.disable()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.dump_stats(str(out))
    print(f"zoo finetune {' '.join(ft)}")
    print(f"import zoo.cli.app {t_import:.2f}s wall; the command: {wall:.2f}s wall, {cpu:.2f}s CPU")
    stats = pstats.Stats(str(out))
    stats.sort_stats("cumulative").print_stats(SHOW, args.top)
    print(f"profile → {out}")


if __name__ == "__main__":
    main()
