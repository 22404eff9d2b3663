"""Two models in one `zoo serve` against two one-model servers on the same cores (issue #34):
the real MobileNetV2 ImageNet export (A) and a simple_cnn fine-tuned here on scikit-learn's
digits (B), both fed image uploads (multipart field `file`: the bundled 451×300 JPEG of a cat
for A, a 32×32 digit PNG for B) by the closed-loop aiohttp client of `bench/serve_peers.py`.
The two-model server runs as users run it (`zoo serve a=A b=B`: a worker process per model
behind one port) and, in the same run, with `--one-process` (both models in one process and
event loop, as before the workers).

1. Combined RPS: A and B at c=16 each, at the same time, on each two-model server (the CPU
   budget split between the two models) and on two `zoo serve` processes (`--threads` each
   the same share, so every side has the same inference threads); the idle servers are paused
   (SIGSTOP of their process group). Goal: one server ≥ 0.9× the two servers' combined RPS.
2. Isolation: B's p99 at c=16 alone and with A flooded (c=64 past its batch, the default
   queue), in alternating windows, on each two-model server and on the two one-model servers
   (the reference: the operating system, not one server, shares the cores between a flooded
   A and B). Goal: B's p99 with A flooded ≤ 1.5× alone. One more scenario splits that ratio:
   B alone while A's CPUs are kept busy by plain matrix work pinned to them (:class:`Hog`),
   what the machine itself takes from B when its neighbour cores are saturated, which no
   server can give back; the flood's cost beyond it is the server's part. The load generator
   also runs on these cores: each scenario records what it took of them.

Each scenario runs a discarded warm-up window, then the scenarios take turns in windows until
each one's last two windows agree within 10% on RPS (at most --rounds); a figure is the median
of a scenario's windows, with ``converged`` saying whether its last two agreed.

    pip install -e ".[bench]"
    python bench/serve_multi.py            # writes docs/bench/serve_multi.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx
import numpy as np
from bench_path import ROOT  # noqa: F401
from common import timed, zoo_cmd
from provenance import Recording, headline
from serve_peers import Server, _free_port, multipart, window

from zoo.deploy.export.onnx_export import export_onnx
from zoo.deploy.serve.workers import worker_cpus
from zoo.samples import sample_image_paths, write_digits_folder
from zoo.system import available_cpus

A, B = "a", "b"  # the names in the two-model server's URLs


@dataclass(frozen=True)
class Load:
    """One closed-loop client: ``conc`` connections posting ``body`` to ``url``."""

    url: str
    body: bytes
    headers: dict[str, str]
    conc: int


class Pausable(Protocol):
    """A server, or the busy work beside one: paused while another scenario runs."""

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def stop(self) -> None: ...


@dataclass(frozen=True)
class Scenario:
    """What one window runs: these processes awake (every other paused), these loads at once."""

    awake: tuple[Pausable, ...]
    loads: dict[str, Load]


async def _together(loads: dict[str, Load], seconds: float) -> dict[str, dict[str, object]]:
    runs = await asyncio.gather(
        *(window(ld.url, ld.body, ld.headers, ld.conc, seconds) for ld in loads.values())
    )
    return dict(zip(loads, runs, strict=True))


def _agree(rps: list[float]) -> bool:
    return len(rps) >= 2 and abs(rps[-2] - rps[-1]) / max(rps[-2], rps[-1], 1e-9) < 0.10


def alternate(
    scenarios: dict[str, Scenario], every: list[Pausable], seconds: float, rounds: int
) -> dict[str, dict[str, object]]:
    """Scenarios in turns (the other servers paused) until each one's total RPS agrees over
    its last two windows; per scenario and load the medians of RPS, p50 and p99."""

    client_cores: dict[str, list[float]] = {k: [] for k in scenarios}

    def run(sc: Scenario, secs: float) -> dict[str, dict[str, object]]:
        for s in every:
            (s.resume if s in sc.awake else s.pause)()
        # the load generator shares the cores with the servers: what it took of them
        cpu0, t0 = time.process_time(), time.perf_counter()
        w = asyncio.run(_together(sc.loads, secs))
        cores = (time.process_time() - cpu0) / (time.perf_counter() - t0)
        for k, other in scenarios.items():
            if other is sc:
                client_cores[k].append(round(cores, 3))
        return w

    for sc in scenarios.values():  # warm-up windows, discarded
        run(sc, seconds / 2)
    windows: dict[str, list[dict[str, dict[str, object]]]] = {k: [] for k in scenarios}
    total = {k: list[float]() for k in scenarios}
    for _ in range(rounds):
        for k, sc in scenarios.items():
            w = run(sc, seconds)
            windows[k].append(w)
            total[k].append(sum(float(r["rps"]) for r in w.values()))  # type: ignore[arg-type]
            print(k, json.dumps(w), flush=True)
        if all(_agree(t) for t in total.values()):
            break
    for s in every:
        s.resume()
    out: dict[str, dict[str, object]] = {}
    for k, ws in windows.items():

        def med(load: str, key: str, ws: list[dict[str, dict[str, object]]] = ws) -> float:
            return round(float(np.median([float(w[load][key]) for w in ws])), 1)  # type: ignore[arg-type]

        out[k] = {
            # the client's CPU (cores busy) in the scored windows, after the warm-up's
            "client_cores": round(float(np.median(client_cores[k][1:])), 2),
            "rps_total": round(float(np.median(total[k])), 1),
            "rps_total_windows": total[k],
            "converged": _agree(total[k]),
            "windows": len(ws),
            **{
                load: {
                    "concurrency": scenarios[k].loads[load].conc,
                    "rps": med(load, "rps"),
                    "p50_ms": med(load, "p50_ms"),
                    "p99_ms": med(load, "p99_ms"),
                    "p99_windows": [w[load]["p99_ms"] for w in ws],
                    "codes_last_window": ws[-1][load]["codes"],
                }
                for load in scenarios[k].loads
            },
        }
    return out


class Hog:
    """Busy work on the CPUs ``zoo serve`` gives model A's worker, and nothing else: one
    process per CPU, pinned to it, multiplying float32 matrices (the vector units and caches
    inference uses). B alone beside it is what the machine itself leaves B when A's cores are
    saturated (shared caches, memory bandwidth, a hypervisor's or SMT sibling's share), which
    no server can give back; paused (SIGSTOP) like a server when its scenario is not running."""

    CODE = (
        "import os, sys, numpy as np\n"
        "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
        "a = np.random.default_rng(0).random((256, 256), dtype=np.float32)\n"
        "while True:\n"
        "    a = (a @ a) / 256\n"
    )

    def __init__(self, cpus: list[int]) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        self.cpus = cpus
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", self.CODE, str(cpu)], env=env, start_new_session=True
            )
            for cpu in cpus
        ]

    def _signal(self, sig: int) -> None:
        for p in self.procs:
            os.killpg(p.pid, sig)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()


def top1(url: str, body: bytes, headers: dict[str, str]) -> str:
    r = httpx.post(url, content=body, headers=headers, timeout=60)
    r.raise_for_status()
    return str(r.json()["predictions"][0]["label"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--window", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=16, help="each model's clients")
    p.add_argument("--flood", type=int, default=64, help="A's clients in the isolation test")
    p.add_argument("--epochs", type=int, default=3, help="B's fine-tuning on the digits")
    p.add_argument("--out", default=None, help="default: docs/bench/serve_multi.json")
    args = p.parse_args()
    rec = Recording("serve_multi")
    cpus = available_cpus()
    shares = [max(1, cpus // 2 + cpus % 2), max(1, cpus // 2)]  # as `zoo serve a b` splits
    jpeg = sample_image_paths()[0].read_bytes()  # chelsea.jpg, 451×300
    result: dict[str, object] = {"cpus": cpus, "threads": {A: shares[0], B: shares[1]}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a_onnx = root / "mobilenet_v2.onnx"
        export_onnx("mobilenet_v2", a_onnx, dynamic_batch=True)
        digits = write_digits_folder(root / "digits")
        run = root / "runs" / "cnn"
        zoo = zoo_cmd()
        opts = ["--epochs", str(args.epochs), "--no-progress"]
        timed([*zoo, "finetune", "simple_cnn", "--data", str(digits), "--runs", str(run.parent),
               "--name", run.name, *opts], env={"ZOO_FINETUNE_REPORT": "0"})  # fmt: skip
        timed([*zoo, "export", str(run)])
        b_onnx = run / "model" / "model.onnx"
        digit = sorted((digits / "digit_7").iterdir())[0].read_bytes()
        ports = [_free_port() for _ in range(4)]
        serve = [*zoo, "serve", "--max-batch", "16"]
        multi = Server([*serve, f"{A}={a_onnx}", f"{B}={b_onnx}", "--port", str(ports[0])],
                       "/v2/health/ready", ports[0])  # fmt: skip
        multi.pause()
        shared = Server([*serve, f"{A}={a_onnx}", f"{B}={b_onnx}", "--one-process",
                         "--port", str(ports[3])], "/v2/health/ready", ports[3])  # fmt: skip
        shared.pause()
        one_a = Server([*serve, str(a_onnx), "--name", A, "--threads", str(shares[0]),
                        "--port", str(ports[1])], "/v2/health/ready", ports[1])  # fmt: skip
        one_a.pause()
        one_b = Server([*serve, str(b_onnx), "--name", B, "--threads", str(shares[1]),
                        "--port", str(ports[2])], "/v2/health/ready", ports[2])  # fmt: skip
        every: list[Pausable] = [multi, shared, one_a, one_b]
        try:
            for s in every:
                s.resume()
            img_a, img_b = multipart(jpeg), multipart(digit)
            labels = {
                "multi_a": top1(f"{multi.url}/v2/models/{A}/predict", *img_a),
                "one_process_a": top1(f"{shared.url}/v2/models/{A}/predict", *img_a),
                "single_a": top1(f"{one_a.url}/v2/models/{A}/predict", *img_a),
                "multi_b": top1(f"{multi.url}/v2/models/{B}/predict", *img_b),
                "one_process_b": top1(f"{shared.url}/v2/models/{B}/predict", *img_b),
                "single_b": top1(f"{one_b.url}/v2/models/{B}/predict", *img_b),
            }
            assert labels["multi_a"] == labels["one_process_a"] == labels["single_a"], labels
            assert labels["single_a"] == "Egyptian cat", labels
            assert labels["multi_b"] == labels["one_process_b"] == labels["single_b"], labels
            result["top1"] = labels
            c = args.concurrency

            def load(srv: Server, name: str, img: tuple[bytes, dict[str, str]], n: int) -> Load:
                return Load(f"{srv.url}/v2/models/{name}/predict", *img, n)

            def both(srv: Server) -> dict[str, Load]:
                return {A: load(srv, A, img_a, c), B: load(srv, B, img_b, c)}

            result["combined"] = alternate(
                {
                    "one_server": Scenario((multi,), both(multi)),
                    "one_process": Scenario((shared,), both(shared)),
                    "two_servers": Scenario(
                        (one_a, one_b), {A: load(one_a, A, img_a, c), B: load(one_b, B, img_b, c)}
                    ),
                },
                every,
                args.window,
                args.rounds,
            )

            # started after the answers were checked, and paused until its scenario runs
            hog = Hog(worker_cpus(0, shares, sorted(os.sched_getaffinity(0))))
            hog.pause()
            every.append(hog)
            result["a_cpus"] = hog.cpus

            def flooded(b_srv: Server, a_srv: Server) -> dict[str, Load]:
                return {B: load(b_srv, B, img_b, c), A: load(a_srv, A, img_a, args.flood)}

            result["isolation"] = alternate(
                {
                    "b_alone": Scenario((multi,), {B: load(multi, B, img_b, c)}),
                    "b_with_a_flooded": Scenario((multi,), flooded(multi, multi)),
                    # the machine's floor: A idle, its CPUs kept busy by plain matrix work
                    "b_alone_a_cpus_busy": Scenario((multi, hog), {B: load(multi, B, img_b, c)}),
                    "b_alone_one_process": Scenario((shared,), {B: load(shared, B, img_b, c)}),
                    "b_one_process_a_flooded": Scenario((shared,), flooded(shared, shared)),
                    # the reference: B in a server of its own, A flooded in another on the
                    # same cores
                    "b_alone_own_process": Scenario((one_b,), {B: load(one_b, B, img_b, c)}),
                    "b_own_process_a_flooded": Scenario((one_a, one_b), flooded(one_b, one_a)),
                },
                every,
                args.window,
                args.rounds,
            )
        finally:
            for s in every:
                s.stop()
    comb, iso = result["combined"], result["isolation"]

    def over(x: float, y: float) -> float:
        return round(x / max(y, 1e-9), 2)

    def b_p99(scenario: str) -> float:
        return float(iso[scenario][B]["p99_ms"])  # type: ignore[index]

    ratio = over(comb["one_server"]["rps_total"], comb["two_servers"]["rps_total"])  # type: ignore[index]
    p99 = over(b_p99("b_with_a_flooded"), b_p99("b_alone"))
    errors_5xx = sum(
        v
        for part in (comb, iso)
        for sc in part.values()  # type: ignore[attr-defined]
        for ld in (A, B)
        if ld in sc
        for k, v in sc[ld]["codes_last_window"].items()
        if k.startswith("5")
    )
    result["ratios"] = {
        "combined_rps": ratio,
        "combined_rps_one_process": over(
            comb["one_process"]["rps_total"],  # type: ignore[index]
            comb["two_servers"]["rps_total"],  # type: ignore[index]
        ),
        "b_p99_flooded_vs_alone": p99,
        "b_p99_flooded_vs_alone_one_process": over(
            b_p99("b_one_process_a_flooded"), b_p99("b_alone_one_process")
        ),
        "b_p99_flooded_vs_alone_own_processes": over(
            b_p99("b_own_process_a_flooded"), b_p99("b_alone_own_process")
        ),
        # the split of the headline ratio: what busy CPUs beside B cost it on this machine,
        # and what A's flood costs beyond that (the server's part)
        "b_p99_a_cpus_busy_vs_alone": over(b_p99("b_alone_a_cpus_busy"), b_p99("b_alone")),
        "b_p99_flooded_vs_a_cpus_busy": over(
            b_p99("b_with_a_flooded"), b_p99("b_alone_a_cpus_busy")
        ),
    }
    result["errors_5xx_last_windows"] = errors_5xx
    result["setup"] = {
        "one_server": f"zoo serve {A}=A {B}=B --max-batch 16 (ORT threads split: "
        f"{shares[0]} + {shares[1]} of {cpus} CPUs; a worker process per model behind one "
        "port)",
        "one_process": "the same with --one-process (both models in one process and event loop)",
        "two_servers": f"zoo serve A --threads {shares[0]} and zoo serve B --threads "
        f"{shares[1]}, --max-batch 16 (two processes, two event loops)",
        "models": "A: mobilenet_v2 ImageNet export (torchvision weights); B: simple_cnn "
        f"fine-tuned {args.epochs} epochs on scikit-learn's digits, then exported",
        "client": "aiohttp closed loop on the same machine (bench/serve_peers.py's window), "
        f"multipart image uploads, c={c} per model; A flooded at c={args.flood}",
    }
    result["headlines"] = [
        headline(
            f"serving two models: one server vs two servers, combined RPS (c={c} each)",
            "ratios.combined_rps",
            ratio,
            ">=",
            0.9,
        ),
        headline(
            f"serving two models: B's p99 with A flooded (c={args.flood}) vs B alone",
            "ratios.b_p99_flooded_vs_alone",
            p99,
            "<=",
            1.5,
            note=f"of which the machine: {result['ratios']['b_p99_a_cpus_busy_vs_alone']}× with "  # type: ignore[index]
            "A idle and its CPUs busy with plain matrix work",
        ),
    ]
    path = rec.write(result, args.out)
    print(path.read_text())


if __name__ == "__main__":
    sys.exit(main())
