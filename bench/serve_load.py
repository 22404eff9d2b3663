"""Closed-loop load on a real `zoo serve` (ResNet-18, CPU, loopback), binary KServe v2 requests
of one image each. For every concurrency: a warm-up window is discarded, then windows repeat
until two in a row agree within 10% (at most 4). Reports RPS, p50/p90/p99 and error %.

1. batching on (--max-batch 32) vs --max-batch 1 at c=32 — goal ≥ 2× RPS;
2. server RPS vs the raw in-process ORT ceiling at its best batch size — goal ≥ 0.7;
3. a soak at c=64 (60 s): no unexpected 5xx, server memory stable, /v2/health/live fast.

    python bench/serve_load.py [--soak 60]      # writes docs/bench/serve_load.json

The load generator shares the machine's cores with the server, as it would on one host.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from bench_path import ROOT  # noqa: F401
from common import v2_binary
from provenance import Recording, headline

from zoo.deploy.bench.harness import _percentile
from zoo.deploy.export.onnx_export import export_onnx
from zoo.deploy.runtimes.loader import make_session
from zoo.system import available_cpus

NAME = "resnet18.tv_in1k"


def _body(seed: int) -> tuple[bytes, dict[str, str]]:
    return v2_binary(
        np.random.default_rng(seed).standard_normal((1, 3, 224, 224)).astype(np.float32)
    )


def ceiling(model: Path, threads: int) -> dict[str, float]:
    sess = make_session(model, threads=threads)
    out = {}
    for bs in (1, 4, 8, 16, 32):
        x = np.random.default_rng(0).standard_normal((bs, 3, 224, 224)).astype(np.float32)
        sess.run(None, {"input": x})
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < 3.0:
            sess.run(None, {"input": x})
            n += bs
        out[str(bs)] = round(n / (time.perf_counter() - t0), 2)
    return out


class Server:
    def __init__(self, model: Path, *args: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        zoo = str(Path(sys.executable).parent / "zoo")
        self.proc = subprocess.Popen(
            [zoo, "serve", str(model), "--port", str(self.port), "--name", NAME, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not become ready")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> int:
        """SIGTERM (the server drains and exits); killed if it has not exited in 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


async def window(
    url: str, conc: int, seconds: float, bodies: list[tuple[bytes, dict[str, str]]]
) -> dict[str, float]:
    lat: list[float] = []
    codes: dict[int | str, int] = {}
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def worker(i: int) -> None:
            body, headers = bodies[i % len(bodies)]
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    r = await client.post(
                        f"{url}/v2/models/{NAME}/infer", content=body, headers=headers
                    )
                except httpx.TransportError as exc:  # a reset or timeout: an error, not a crash
                    key = f"transport:{type(exc).__name__}"
                    codes[key] = codes.get(key, 0) + 1
                    continue
                lat.append((time.perf_counter() - t0) * 1000)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(conc)))
        elapsed = time.perf_counter() - t0
    ok = codes.get(200, 0)
    total = sum(codes.values())
    return {
        "rps": round(ok / elapsed, 2),
        "p50_ms": round(_percentile(lat, 0.5), 1),
        "p90_ms": round(_percentile(lat, 0.9), 1),
        "p99_ms": round(_percentile(lat, 0.99), 1),
        "error_pct": round(100 * (total - ok) / max(1, total), 2),
        "n": total,
        "codes": {str(k): v for k, v in codes.items()},
    }


async def stable(
    url: str, conc: int, bodies: list[tuple[bytes, dict[str, str]]], win: float
) -> dict[str, object]:
    await window(url, conc, win / 2, bodies)  # warm-up, discarded
    runs = [await window(url, conc, win, bodies)]
    for _ in range(3):
        runs.append(await window(url, conc, win, bodies))
        a, b = runs[-2]["rps"], runs[-1]["rps"]
        if abs(a - b) / max(a, b, 1e-9) < 0.10:
            break
    return {
        "concurrency": conc,
        **runs[-1],
        "windows": len(runs),
        "rps_windows": [r["rps"] for r in runs],
    }


async def soak(
    server: Server, seconds: float, bodies: list[tuple[bytes, dict[str, str]]]
) -> dict[str, object]:
    health: list[float] = []
    rss = [server.rss_mb()]
    stop = time.perf_counter() + seconds

    async def probe() -> None:
        async with httpx.AsyncClient(timeout=10) as c:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                r = await c.get(f"{server.url}/v2/health/live")
                assert r.status_code == 200
                health.append((time.perf_counter() - t0) * 1000)
                rss.append(server.rss_mb())
                await asyncio.sleep(0.5)

    load, _ = await asyncio.gather(window(server.url, 64, seconds, bodies), probe())
    return {
        "seconds": seconds,
        **load,
        "rss_mb_start": round(rss[0]),
        "rss_mb_mid": round(rss[len(rss) // 2]),
        "rss_mb_end": round(rss[-1]),
        "health_p50_ms": round(_percentile(health, 0.5), 1),
        "health_p99_ms": round(_percentile(health, 0.99), 1),
        "health_probes": len(health),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--soak", type=float, default=60.0)
    p.add_argument("--window", type=float, default=4.0)
    p.add_argument("--concurrency", default="1,4,16,32,64")
    p.add_argument("--out", default=None, help="default: docs/bench/serve_load.json")
    args = p.parse_args()
    rec = Recording("serve_load")
    threads = available_cpus()
    bodies = [_body(i) for i in range(8)]
    result: dict[str, object] = {"threads": threads, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "r18.onnx"
        export_onnx("resnet18", model, dynamic_batch=True, weights="none")
        result["ort_ceiling_samples_per_s"] = ceiling(model, threads)
        best = max(result["ort_ceiling_samples_per_s"].values())  # type: ignore[union-attr]
        on = Server(model, "--max-batch", "32")
        try:
            result["batching_on"] = [
                asyncio.run(stable(on.url, int(c), bodies, args.window))
                for c in args.concurrency.split(",")
            ]
            result["soak_c64"] = asyncio.run(soak(on, args.soak, bodies))
        finally:
            result["batching_on_exit_code"] = on.stop()
        off = Server(model, "--max-batch", "1")
        try:
            result["batching_off_c32"] = asyncio.run(stable(off.url, 32, bodies, args.window))
        finally:
            off.stop()
    on32 = next(r for r in result["batching_on"] if r["concurrency"] == 32)  # type: ignore[union-attr,index]
    peak = max(r["rps"] for r in result["batching_on"])  # type: ignore[union-attr,index]
    soak_ = result["soak_c64"]
    result["ratios"] = {
        "batching_on_vs_off_c32": round(on32["rps"] / result["batching_off_c32"]["rps"], 2),  # type: ignore[index]
        "server_peak_vs_ort_ceiling": round(peak / best, 2),
        "server_peak_rps": peak,
        "ort_best_samples_per_s": best,
    }
    errors_5xx = sum(v for k, v in soak_["codes"].items() if k.startswith("5"))
    transport = sum(v for k, v in soak_["codes"].items() if k.startswith("transport"))  # type: ignore[index,union-attr]
    result["soak_c64"]["errors_5xx"] = errors_5xx  # type: ignore[index]
    result["soak_c64"]["transport_errors"] = transport  # type: ignore[index]
    result["headlines"] = [
        headline(
            "serving: batching on vs `--max-batch 1` RPS at c=32",
            "ratios.batching_on_vs_off_c32",
            result["ratios"]["batching_on_vs_off_c32"],
            ">=",
            2.0,
        ),
        headline(
            "serving: server peak RPS vs in-process ORT ceiling",
            "ratios.server_peak_vs_ort_ceiling",
            result["ratios"]["server_peak_vs_ort_ceiling"],
            ">=",
            0.7,
        ),
        headline(
            "serving: 5xx answers in the soak at c=64", "soak_c64.errors_5xx", errors_5xx, "<=", 0
        ),
    ]
    path = rec.write(result, args.out)
    print(path.read_text())


if __name__ == "__main__":
    main()
