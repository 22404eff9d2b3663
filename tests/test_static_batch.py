"""Batch dimension of exports: dynamic by default, ``--static-batch N`` as the opt-in, and a
fixed-batch graph padded and chunked in one place (``run_padded``) so predict, serve and parity
give the dynamic graph's outputs for any number of images."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from PIL import Image

from tests.conftest import zoo_here
from tests.serving import NAME, binary_infer, binary_logits, metric, server, x_of
from zoo.deploy.runtimes.loader import OnnxClassifier, make_session, run_padded
from zoo.onnx_meta import read_metadata
from zoo.samples import sample_image_paths


def _batch_dim(path: Path) -> onnx.TensorShapeProto.Dimension:
    return onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 15])
def test_run_padded_feeds_exactly_the_fixed_batch_and_keeps_order(n: int) -> None:
    calls: list[int] = []

    def fixed4(x: np.ndarray) -> np.ndarray:
        assert len(x) == 4, f"a fixed-batch graph was fed {len(x)} samples"
        calls.append(len(x))
        return x * 2 + 1

    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    np.testing.assert_array_equal(run_padded(fixed4, x, 4), x * 2 + 1)
    assert len(calls) == -(-n // 4)  # ceil(n / 4) calls, no more


def test_export_is_dynamic_by_default_and_static_batch_is_the_opt_in(tmp_path: Path) -> None:
    default = zoo_here("export", "simple_cnn", "-o", str(tmp_path / "d.onnx"), "--json")
    assert default.returncode == 0, default.stderr
    rep = json.loads(default.stdout)
    assert rep["dynamic_batch"] and rep["static_batch"] is None
    assert [d["batch"] for d in rep["parity"]["dynamic"]] == [1, 2, 5]
    assert _batch_dim(tmp_path / "d.onnx").dim_param
    fixed = zoo_here(
        "export", "simple_cnn", "--static-batch", "3", "-o", str(tmp_path / "s.onnx"), "--json"
    )
    assert fixed.returncode == 0, fixed.stderr
    rep = json.loads(fixed.stdout)
    assert not rep["dynamic_batch"] and rep["static_batch"] == 3 and rep["parity"]["passed"]
    assert _batch_dim(tmp_path / "s.onnx").dim_value == 3
    meta = read_metadata(tmp_path / "s.onnx")
    assert meta["static_batch"] == 3 and meta["dynamic_batch"] is False
    both = zoo_here("export", "simple_cnn", "--dynamic-batch", "--static-batch", "3")
    assert both.returncode == 2 and "contradict" in both.stderr
    zero = zoo_here("export", "simple_cnn", "--static-batch", "0")
    assert zero.returncode == 2


@pytest.fixture(scope="module")
def static4(tmp_path_factory: pytest.TempPathFactory, mobilenet_weights: Path) -> Path:
    out = tmp_path_factory.mktemp("static") / "mobilenet_v2.b4.onnx"
    r = zoo_here("export", "mobilenet_v2", "--static-batch", "4", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["parity"]["passed"] and _batch_dim(out).dim_value == 4
    return out


@pytest.fixture(scope="module")
def fifteen_images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """15 real photos: zoo's two samples and 13 of scikit-image's (grey, RGB and RGBA)."""
    import skimage.data

    folder = tmp_path_factory.mktemp("photos")
    names = ["astronaut", "brick", "camera", "cat", "clock", "coins", "colorwheel", "grass"]
    names += ["gravel", "hubble_deep_field", "immunohistochemistry", "logo", "rocket"]
    paths = list(sample_image_paths())
    for name in names:
        path = folder / f"{name}.png"
        Image.fromarray(getattr(skimage.data, name)()).save(path)
        paths.append(path)
    assert len(paths) == 15
    return paths


def test_static_batch_outputs_equal_the_dynamic_graph_for_1_2_and_15_images(
    mobilenet_onnx: Path, static4: Path, fifteen_images: list[Path]
) -> None:
    dynamic, fixed = OnnxClassifier(mobilenet_onnx), OnnxClassifier(static4)
    assert (dynamic.static_batch, fixed.static_batch) == (None, 4)
    x = np.stack(dynamic.preprocess_images(fifteen_images))
    for n in (1, 2, 15):
        np.testing.assert_allclose(fixed.run(x[:n]), dynamic.run(x[:n]), rtol=1e-4, atol=1e-4)
    for n in (1, 15):  # and the CLI: no onnxruntime traceback, the dynamic graph's answers
        r = zoo_here("predict", str(static4), *map(str, fifteen_images[:n]), "-k", "3", "--json")
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        want = dynamic.classify(fifteen_images[:n], k=3)
        assert [[p["index"] for p in g["top"]] for g in got] == [[p.index for p in w] for w in want]
        np.testing.assert_allclose(
            [[p["score"] for p in g["top"]] for g in got],
            [[p.score for p in w] for w in want],
            rtol=1e-4,
            atol=1e-5,
        )
    assert got[1]["top"][0]["label"] == "espresso"


@pytest.mark.serve
def test_serving_a_static_batch_model_batches_concurrent_requests(
    mobilenet_onnx: Path, static4: Path
) -> None:
    direct = make_session(mobilenet_onnx)
    sizes = [1, 3, 2, 1, 4, 1, 2, 5, 1, 3, 1, 2]
    xs = [x_of(500 + i, n) for i, n in enumerate(sizes)]
    with server(static4, "--max-batch", "8") as (url, _):
        meta = httpx.get(f"{url}/v2/models/{NAME}").json()
        assert meta["parameters"]["static_batch"] == 4 and meta["parameters"]["max_batch"] == 8
        before = httpx.get(f"{url}/metrics").text

        def call(x: np.ndarray) -> np.ndarray:
            r = httpx.post(f"{url}/v2/models/{NAME}/infer", timeout=120, **binary_infer(x))
            return binary_logits(r, len(x))

        with ThreadPoolExecutor(len(xs)) as pool:
            outs = list(pool.map(call, xs))
        after = httpx.get(f"{url}/metrics").text
        coffee = sample_image_paths()[1].read_bytes()
        r = httpx.post(
            f"{url}/v2/models/{NAME}/predict",
            content=coffee,
            headers={"content-type": "image/jpeg"},
        )
        assert r.json()["predictions"][0]["label"] == "espresso"
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(y, direct.run(None, {"input": x})[0], rtol=1e-4, atol=1e-4)
    calls = metric(after, "zoo_batch_size_count") - metric(before, "zoo_batch_size_count")
    samples = metric(after, "zoo_batch_size_sum") - metric(before, "zoo_batch_size_sum")
    assert samples == sum(sizes) and calls < len(sizes), (calls, samples)
