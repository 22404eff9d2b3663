"""Helpers for the crash-consistency tests: run the real ``zoo`` command in fresh processes
forked from a preloaded server, and compare two run folders the way a user would care about.

A child is a real process (its own pid, its own DataLoader workers) that runs
``zoo.cli.app.main`` with the given argv; ``ZOO_FAULT_KILL_AT`` makes it SIGKILL itself. The
fork server has imported torch, the trainer and TensorBoard once (and run no
torch op, so forking is safe), which saves seconds of start-up per process.
"""

from __future__ import annotations

import csv
import json
import multiprocessing as mp
import os
import sys
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

import torch

PRELOAD = [
    "tests.crash",
    "zoo.cli.app",
    "zoo.cli.finetune",
    "zoo.train.trainer",
    "zoo.train.finish",
    "zoo.train.plots",
    "torch.utils.tensorboard",
    "safetensors.torch",
    "zoo.deploy.predict.batch",  # zoo predict --out (test_predict_out.py)
    "onnxruntime",
    "pyarrow.parquet",
]
# Values measured by the clock: they differ between any two runs.
TIMING = frozenset({"data_wait", "img_per_s", "epoch_s"})


def fork_server() -> ForkServerContext:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _child(argv: list[str], env: dict[str, str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(env)
    # As in the real command: DataLoader workers are forked from this process (and die with
    # it), not started by the fork server, whose start method a child would inherit.
    mp.set_start_method("fork", force=True)
    torch.set_num_threads(1)  # the same in every run compared; 2 CI cores, no oversubscription
    sys.argv = ["zoo", *argv]
    from zoo.cli.app import main

    main()


def run(ctx: ForkServerContext, argv: list[str], log: Path, **env: str) -> int:
    """Run ``zoo ARGV`` in a fresh process; its exit code (``-9``: it SIGKILLed itself)."""
    p = ctx.Process(target=_child, args=(argv, env, str(log)))
    p.start()
    p.join(600)
    if p.exitcode is None:
        p.kill()
        p.join()
        raise TimeoutError(f"zoo {' '.join(argv)} did not finish; see {log}")
    return int(p.exitcode)


def trace(path: Path) -> list[str]:
    """The labels of a ``ZOO_FAULT_TRACE`` file, in write order (write n is entry n - 1)."""
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1))
    return [label for _, label in rows]


# ---------------------------------------------------------------------------- comparison
def _bits(t: torch.Tensor) -> torch.Tensor:
    """Floats as raw bytes: NaN payloads and -0.0 count, unlike ``==``."""
    if t.is_floating_point() and t.numel():
        return t.detach().contiguous().reshape(-1).view(torch.uint8)
    return t


def _same(a: Any, b: Any, where: str) -> None:
    """Recursive equality; tensors bitwise (dtype, shape and every bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(_bits(a), _bits(b)), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {a.keys()} != {b.keys()}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _checkpoint(path: Path) -> dict[str, Any]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    state["history"] = _untimed(state["history"])
    return state


def _report(run: Path) -> dict[str, Any]:
    report = json.loads((run / "report.json").read_text())
    del report["timing"]  # wall clock
    for key in ("run", "model_dir"):
        report[key] = report[key].replace(str(run), "RUN")
    return report


def _config(run: Path) -> dict[str, Any]:
    from zoo.train.config import RUNTIME_KEYS

    cfg = json.loads((run / "config.json").read_text())
    return {k: v for k, v in cfg.items() if k not in RUNTIME_KEYS}


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard shows for a run folder (purged events dropped), timing tags aside."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {
        tag: [(e.step, e.value) for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
        if tag not in TIMING
    }


def files(run: Path) -> set[str]:
    return {
        str(p.relative_to(run))
        for p in run.rglob("*")
        if p.is_file() and p.relative_to(run).parts[0] != "tensorboard"
    }


def assert_same_run(ref: Path, got: Path) -> None:
    """``got`` equals the uninterrupted ``ref``: the same files (no temporary ones left),
    checkpoints and weights bitwise, the same metrics rows, report, config, TensorBoard
    scalars and plots; only wall-clock timings and the folder's own path differ."""
    from zoo.train.run_dir import LOCK_FILE

    hidden = [str(p.relative_to(got)) for p in got.rglob(".*") if p.name != LOCK_FILE]
    assert not hidden, f"left behind: {hidden}"
    assert files(got) == files(ref)
    for name in sorted(files(ref)):
        a, b = ref / name, got / name
        if name.endswith(".pt"):
            _same(_checkpoint(a), _checkpoint(b), name)
        elif name == "metrics.jsonl":
            rows = [_untimed([json.loads(x) for x in p.read_text().splitlines()]) for p in (a, b)]
            assert rows[0] == rows[1], name
        elif name == "metrics.csv":
            rows = [_untimed(list(csv.DictReader(p.open(newline="")))) for p in (a, b)]
            assert rows[0] == rows[1], name
        elif name == "report.json":
            assert _report(ref) == _report(got)
        elif name == "config.json":
            assert _config(ref) == _config(got)
        else:  # model/ (safetensors, config, card), split, classes, plots: byte for byte
            assert a.read_bytes() == b.read_bytes(), name
    for sub in ("", "grad_norms"):
        if (ref / "tensorboard" / sub).is_dir():
            assert scalars(got / "tensorboard" / sub) == scalars(ref / "tensorboard" / sub), sub
