"""What MLflow tracking costs a whole run, as a user waits for it: ``zoo finetune`` of
simple_cnn on sklearn's real digits (default 12 epochs, CPU) untracked vs ``--track mlflow``
to a local tracking server (``mlflow server`` on loopback, SQLite store, local artifacts: as a
team runs one), the two alternating round by round (the first of each round alternates too).

Each process is timed from spawn to exit (wall clock, and the CPU time of it and its
children); the ratio tracked / untracked is taken per round and its median reported. The
tracked runs' MLflow runs are read back: every epoch must be there (a fast run that logged
nothing would be no measurement). Goal: ≤ 1.02 (2% of the whole run). One warm-up run of
each kind (1 epoch) comes first and is reported, not compared.

    python bench/tracking_overhead.py                    # writes docs/bench/tracking_overhead.json
    python bench/tracking_overhead.py --epochs 1 --rounds 1 --out /tmp/t.json   # a smoke run
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_path import ROOT  # noqa: F401  (puts the repo on sys.path)
from common import Process, make_data, zoo_finetune
from provenance import Recording, headline

GOAL = 1.02


def start_server(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``mlflow server`` on a free loopback port; returns it and its URI once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        *(sys.executable, "-m", "mlflow", "server"),
        *("--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"),
        *("--default-artifact-root", str(root / "artifacts")),
        *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
    ]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((root / "server.log").read_text()[-3000:])
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return proc, uri
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("mlflow server never answered")


def logged_epochs(uri: str, run: Path) -> list[int]:
    """The epochs (steps of ``val/loss``) the run's MLflow run holds."""
    import json

    from mlflow.tracking import MlflowClient

    run_id = json.loads((run / "tracking.json").read_text())["run_id"]
    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, "val/loss"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="simple_cnn")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", default=None, help="default: docs/bench/tracking_overhead.json")
    args = p.parse_args()
    rec = Recording("tracking_overhead")
    opts = ["-b", str(args.batch), "--num-workers", str(args.workers), "--no-progress"]
    kinds = ("untracked", "tracked")
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        os.environ["ZOO_CACHE"] = str(t / "zoo-cache")
        (t / "mlflow").mkdir()
        server, uri = start_server(t / "mlflow")
        try:
            data = make_data(t, 1)
            n = 0

            def run(kind: str, epochs: int) -> Process:
                nonlocal n
                n += 1
                run_dir = t / "runs" / f"{kind}{n}"
                extra = ["--track", "mlflow"] if kind == "tracked" else []
                env = {"MLFLOW_TRACKING_URI": uri}  # set for both: only --track uses it
                proc = zoo_finetune(args.model, data, run_dir, *opts, *extra, "--epochs",
                                    str(epochs), env=env)  # fmt: skip
                if kind == "tracked":
                    got = logged_epochs(uri, run_dir)
                    if got != list(range(1, epochs + 1)):
                        raise RuntimeError(f"{run_dir}: MLflow holds epochs {got}, not 1..{epochs}")
                return proc

            warm = {k: round(run(k, 1).seconds, 2) for k in kinds}
            print(f"warm-up (1 epoch): {warm}", flush=True)
            for r in range(args.rounds):
                for kind in kinds if r % 2 == 0 else kinds[::-1]:
                    proc = run(kind, args.epochs)
                    wall[kind].append(proc.seconds)
                    cpu[kind].append(proc.cpu_s)
                    print(f"round {r + 1}: {kind} {proc.seconds:.2f}s wall, {proc.cpu_s:.2f}s cpu",
                          flush=True)  # fmt: skip
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)

    def clock(times: dict[str, list[float]]) -> dict[str, object]:
        ratios = [a / b for a, b in zip(times["tracked"], times["untracked"], strict=True)]
        return {
            "runs_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
            "median_s": {k: round(statistics.median(v), 2) for k, v in times.items()},
            "ratio_per_round": [round(x, 4) for x in ratios],
            "ratio": round(statistics.median(ratios), 4),
        }

    clocks = {"wall": clock(wall), "cpu": clock(cpu)}
    results = {
        "setup": {
            "model": args.model,
            "data": "sklearn digits (1,797 images)",
            "epochs": args.epochs,
            "rounds": args.rounds,
            "batch": args.batch,
            "workers": args.workers,
            "device": "cpu",
            "server": "mlflow server, SQLite store, local artifact root, 127.0.0.1, 1 worker",
            "zoo_command": "zoo finetune MODEL --data DIR " + " ".join(opts) + " --epochs E "
            "[--track mlflow]",
        },
        "warmup_1_epoch_s": warm,
        "all_epochs_logged": True,  # checked for every tracked run above
        **clocks,
        "headlines": [
            headline(
                f"tracking overhead, whole run ({args.epochs}-epoch {args.model}, digits, "
                "local MLflow server)",
                "wall.ratio",
                clocks["wall"]["ratio"],
                "<=",
                GOAL,
            )
        ],
    }
    rec.write(results, args.out)
    print(
        f"tracked / untracked: {clocks['wall']['ratio']:.4f} wall (goal ≤ {GOAL}), "
        f"{clocks['cpu']['ratio']:.4f} CPU time"
    )


if __name__ == "__main__":
    main()
