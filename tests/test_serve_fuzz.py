"""The live server fuzzed from its own OpenAPI description (schemathesis + Hypothesis): at least
5,000 generated requests, valid and invalid, over every endpoint, with API keys on (each
request sends the key; the document declares the bearer scheme); not one answer ≥ 500, every
answer as documented; afterwards a good request still gets the right class and the server's
memory did not grow. The server serves two models (a worker process each), so whichever
worker a fuzzing connection lands on, the other model's requests are relayed to its owner."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from tests.conftest import ROOT
from tests.serving import NAME, binary_infer, binary_logits, server, x_of
from zoo.deploy.runtimes.loader import make_session
from zoo.samples import sample_image_paths

pytestmark = pytest.mark.serve

FUZZ_REQUESTS = 5000
WORKERS = 2  # generation is CPU-bound: one Hypothesis process per core
SEEDS = (20261, 20262)
KEY = "fuzz-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}


def tree_rss(pid: int) -> int:
    """The resident memory of the server: its process and its workers."""
    parent = psutil.Process(pid)
    return sum(p.memory_info().rss for p in (parent, *parent.children(recursive=True)))


@pytest.mark.timeout(1800)
def test_fuzzing_from_openapi_never_gets_a_5xx(mobilenet_onnx: Path, tmp_path: Path) -> None:
    sess = make_session(mobilenet_onnx)
    coffee = sample_image_paths()[1].read_bytes()
    x = x_of(11, 3)
    direct = sess.run(None, {"input": x})[0]
    log = tmp_path / "server.log"
    env = {"ZOO_API_KEY": KEY}
    second = f"second={mobilenet_onnx}"
    with server(mobilenet_onnx, second, "--max-batch", "8", log=log, env=env) as (url, proc):

        def still_right() -> None:
            r = httpx.post(
                f"{url}/v2/models/{NAME}/predict",
                content=coffee,
                headers={"content-type": "image/jpeg", **AUTH},
                timeout=60,
            )
            assert r.status_code == 200 and r.json()["predictions"][0]["label"] == "espresso"
            body = binary_infer(x)
            r = httpx.post(
                f"{url}/v2/models/{NAME}/infer",
                content=body["content"],
                headers={**body["headers"], **AUTH},
                timeout=60,
            )
            np.testing.assert_allclose(binary_logits(r, 3), direct, rtol=1e-4, atol=1e-4)

        assert httpx.get(f"{url}/openapi.json").status_code == 401
        doc = httpx.get(f"{url}/openapi.json", headers=AUTH).json()
        assert doc["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
        assert {m for item in doc["paths"].values() for m in item} == {"get", "post"}
        for _ in range(3):  # warm every path the good requests take, then measure
            still_right()
        rss_before = tree_rss(proc.pid)
        outs = [tmp_path / f"fuzz-{s}.json" for s in SEEDS]
        each = str(FUZZ_REQUESTS // WORKERS)
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.fuzz_client", url, each, str(s), str(out)],
                cwd=ROOT,
                env={**os.environ, "ZOO_FUZZ_API_KEY": KEY},
            )
            for s, out in zip(SEEDS, outs, strict=True)
        ]
        codes = [w.wait(1700) for w in workers]
        assert codes == [0] * WORKERS
        still_right()
        rss_after = tree_rss(proc.pid)
        assert proc.poll() is None
    reports = [json.loads(out.read_text()) for out in outs]
    statuses: collections.Counter[str] = collections.Counter()
    per_operation: collections.Counter[str] = collections.Counter()
    for rep in reports:
        statuses.update(rep["statuses"])
        per_operation.update(rep["per_operation"])
    failures = [f for rep in reports for f in rep["failures"]]
    total = sum(statuses.values())
    summary = {
        "requests": total,
        "statuses": dict(sorted(statuses.items())),
        "per_operation": dict(sorted(per_operation.items())),
        "seconds": [rep["seconds"] for rep in reports],
        "rss_mb": [round(rss_before / 2**20, 1), round(rss_after / 2**20, 1)],
    }
    print(json.dumps(summary, indent=1))  # the figures behind the README's fuzzing claim
    assert total >= FUZZ_REQUESTS
    assert not [s for s in statuses if not s.isdigit() or int(s) >= 500], summary
    assert failures == [], json.dumps(failures[:5], indent=1)
    tried = {key.rsplit(" ", 1)[0] for key in per_operation}
    documented = {f"{m.upper()} {p}" for p, item in doc["paths"].items() for m in item}
    assert tried == documented - {"GET /openapi.json"}  # the document itself is not fuzzed
    assert "Traceback" not in log.read_text(errors="replace")
    assert rss_after < 1.05 * rss_before, summary["rss_mb"]
    assert KEY not in log.read_text(errors="replace")
