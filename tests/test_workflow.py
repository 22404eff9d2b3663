"""The README's path walked as a user walks it: one ``zoo`` process per command, each
command's output the next one's input, and every consumer checked after every producer.

finetune → export → quantize (default output) → predict / eval / bench / list / serve the run
and its int8 variant (with Triton's and KServe's own clients) → resume --extend (the export is
kept, and read as stale) → export again → bundle → predict the bundle; and export
--dynamic-size → serve (tensors at other sizes, HTTP and gRPC) and predict.

One run on real handwritten digits (scikit-learn's), MobileNetV2 with its real ImageNet weights
as a linear probe at 32 px: the whole chain costs about a minute on 2 cores.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import run_zoo
from tests.serving import free_port, kserve_infer, kserve_request, server

pytestmark = pytest.mark.usefixtures("mobilenet_weights")


@dataclass(frozen=True)
class Chain:
    data: Path
    run: Path
    image: Path  # one validation digit

    @property
    def model(self) -> Path:
        return self.run / "model"


def ok(*args: str) -> str:
    r = run_zoo(*args)
    assert r.returncode == 0, f"zoo {' '.join(args)}\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory, small_digits: Path) -> Iterator[Chain]:
    root = tmp_path_factory.mktemp("chain")
    ok(
        "finetune", "mobilenet_v2", "--data", str(small_digits), "--strategy", "linear",
        "--cache-features", "--epochs", "2", "--image-size", "32",
        "--runs", str(root), "--name", "digits",
    )  # fmt: skip
    run = root / "digits"
    split = json.loads((run / "split.json").read_text())
    rel, _ = split["splits"]["val"][0]
    yield Chain(data=small_digits, run=run, image=Path(split["root"]) / rel)


@pytest.fixture(scope="module")
def exported(chain: Chain) -> str:
    """``zoo export RUN``: no --data; the gate takes the run's own validation images."""
    return ok("export", str(chain.run))


@pytest.fixture(scope="module")
def quantized(chain: Chain, exported: str) -> tuple[Path, str]:
    """``zoo quantize RUN/model/model.onnx --calib DATA``, as a user types it with the folder
    the run was trained on: judged on the run's validation split, which is left out of the
    calibration, and written to the default output."""
    before = set(p.name for p in chain.model.iterdir())
    r = run_zoo(
        "quantize", str(chain.model / "model.onnx"), "--calib", str(chain.data), "--allow-drop"
    )
    assert r.returncode == 0, r.stderr
    variants = sorted((chain.model / "variants").glob("int8-*.onnx"))
    assert len(variants) == 1, list((chain.model).rglob("*"))
    assert set(p.name for p in chain.model.iterdir()) <= before | {"variants"}
    return variants[0], r.stdout + r.stderr


def test_export_gates_on_the_runs_own_images(chain: Chain, exported: str) -> None:
    assert (chain.model / "model.onnx").is_file()
    assert "validation images" in exported and chain.run.name in exported


def test_quantize_measures_on_the_runs_validation_images(
    chain: Chain, quantized: tuple[Path, str]
) -> None:
    _, summary = quantized
    assert "validation images" in summary
    assert "left out:" in summary  # --calib DATA held the run's validation images
    assert "on 2 images" not in summary  # never the two bundled ImageNet photos


def test_every_consumer_reads_the_run_after_quantize(
    chain: Chain, quantized: tuple[Path, str]
) -> None:
    variant, _ = quantized
    plain = json.loads(ok("predict", str(chain.run), str(chain.image), "--json"))
    int8 = json.loads(
        ok("predict", str(chain.run), str(chain.image), "--variant", "int8", "--json")
    )
    assert plain and int8
    listed = ok("list", f"{chain.run.parent}/*", "--runs", str(chain.run.parent), "--json")
    assert variant.stem in listed and str(chain.run.name) in listed
    report = json.loads(ok("eval", str(chain.run), "--json"))
    assert 0.3 < report["acc"] <= 1.0
    scored = json.loads(ok("eval", str(chain.run), "--variant", "int8", "--json"))
    assert Path(scored["scored_by"]).resolve() == variant.resolve()
    assert scored["n"] == report["n"]
    assert abs(scored["acc"] - report["acc"]) < 0.2  # int8 judged on the same images
    ok("bench", str(chain.run), "--backends", "ort_fp32", "--seconds", "0.05")


def test_serve_the_run_and_its_int8_variant_to_real_v2_clients(
    chain: Chain, quantized: tuple[Path, str]
) -> None:
    """The run and its variant served by name, called with Triton's client (binary tensors)
    and KServe's SDK (JSON), answers equal to ONNX Runtime on the same graph."""
    import onnxruntime as ort
    import tritonclient.http as th

    variant, _ = quantized
    for args, graph in (((), chain.model / "model.onnx"), (("--variant", "int8"), variant)):
        sess = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        shape = [1, *sess.get_inputs()[0].shape[1:]]
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        want = sess.run(None, {"input": x})[0]
        with server(chain.run, "--name", "digits", *args) as (url, _):
            triton = th.InferenceServerClient(url.removeprefix("http://"))
            inp = th.InferInput("input", shape, "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            got = triton.infer("digits", [inp]).as_numpy("logits")
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
            request = kserve_request(x, binary=False, model="digits")
            res = kserve_infer(url, request, model="digits")
            np.testing.assert_allclose(res.outputs[0].as_numpy(), want, rtol=1e-4, atol=1e-4)


def test_extend_keeps_the_export_and_says_which_epoch_shipped(
    chain: Chain, quantized: tuple[Path, str], tmp_path: Path
) -> None:
    variant, _ = quantized
    log = ok("finetune", "--resume", str(chain.run), "--extend", "1")
    assert "shipped epoch" in log
    assert (chain.model / "model.onnx").is_file() and variant.is_file()
    shipped_new = "shipped epoch 3" in log
    warned = ok("predict", str(chain.model / "model.onnx"), str(chain.image))
    assert ("stale" in warned.lower() or "older weights" in warned) == shipped_new
    ok("export", str(chain.run))
    fresh = ok("predict", str(chain.model / "model.onnx"), str(chain.image))
    assert "stale" not in fresh.lower()
    bundle = tmp_path / "bundle"
    ok("bundle", str(chain.run), str(bundle))
    assert json.loads(ok("predict", str(bundle), str(chain.image), "--json"))
    shutil.rmtree(bundle)


def test_a_dynamic_size_export_is_served_at_other_sizes_and_predicts_as_served(
    chain: Chain, tmp_path: Path
) -> None:
    """``zoo export RUN --dynamic-size -o F`` → ``zoo serve F --grpc-port`` → clients that
    send tensors at sizes other than the export's (one the gate proved, one it did not,
    non-square), concurrently so that mixed sizes meet in the batcher: every answer is ONNX
    Runtime's on the same tensor; the metadata says height and width are free. ``zoo predict
    F`` on the run's image answers as the served upload of that image does."""
    import asyncio

    import grpc
    import httpx
    import kserve
    import onnxruntime as ort
    import tritonclient.http as th

    graph = tmp_path / "dyn.onnx"
    said = ok("export", str(chain.run), "--dynamic-size", "-o", str(graph))
    assert "batch 3, 16 px" in said and "batch 3, 64 px" in said  # the sizes the gate proved
    sess = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    sizes = [(32, 32), (16, 16), (48, 64), (32, 32), (40, 24)]  # (height, width)
    xs = [rng.standard_normal((2, 3, h, w)).astype(np.float32) for h, w in sizes]
    want = [sess.run(None, {"input": x})[0] for x in xs]
    predicted = json.loads(ok("predict", str(graph), str(chain.image), "--json"))
    grpc_port = free_port()
    with server(graph, "--name", "dyn", "--grpc-port", str(grpc_port)) as (url, _):
        meta = httpx.get(f"{url}/v2/models/dyn").json()
        assert meta["inputs"][0]["shape"] == [-1, 3, -1, -1]

        async def concurrently() -> tuple[list[Any], str]:
            client = kserve.InferenceGRPCClient(f"127.0.0.1:{grpc_port}", retries=0)
            try:
                requests = [kserve_request(x, binary=True, model="dyn") for x in xs]
                answers = await asyncio.gather(*(client.infer(r) for r in requests))
                big = np.zeros((1, 3, 160, 160), np.float32)  # 25 samples' work: over 16
                try:
                    await client.infer(kserve_request(big, binary=True, model="dyn"))
                except grpc.aio.AioRpcError as exc:
                    return answers, f"{exc.code().name}: {exc.details()}"
                return answers, "OK"
            finally:
                await client.close()

        answers, refused = asyncio.run(concurrently())
        assert refused.startswith("INVALID_ARGUMENT: input 'input' has shape [1, 3, 160, 160]")
        assert "as much work as 25 samples of the export size [3, 32, 32]" in refused
        for res, expected in zip(answers, want, strict=True):
            np.testing.assert_allclose(res.outputs[0].as_numpy(), expected, rtol=1e-4, atol=1e-4)
        triton = th.InferenceServerClient(url.removeprefix("http://"))
        inp = th.InferInput("input", list(xs[2].shape), "FP32")
        inp.set_data_from_numpy(xs[2], binary_data=True)
        got = triton.infer("dyn", [inp]).as_numpy("logits")
        np.testing.assert_allclose(got, want[2], rtol=1e-4, atol=1e-4)
        upload = httpx.post(
            f"{url}/v2/models/dyn/predict",
            files={"file": (chain.image.name, chain.image.read_bytes(), "image/png")},
        )
    assert upload.status_code == 200, upload.text
    served = upload.json()["predictions"][0]["label"]
    assert served == predicted[0]["top"][0]["label"], (served, predicted)
