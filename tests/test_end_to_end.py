"""The user's whole path on real data: fine-tune → export → predict, from the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_zoo
from zoo.onnx_meta import read_metadata


@pytest.mark.slow
def test_finetune_export_predict(small_digits: Path, tmp_path: Path, mobilenet_weights) -> None:
    ft = run_zoo(
        "finetune",
        "mobilenet_v2",
        "--data",
        str(small_digits),
        "--strategy",
        "linear",
        "--cache-features",
        "--epochs",
        "10",
        "--image-size",
        "64",
        "--runs",
        str(tmp_path),
        "--name",
        "ft",
        "--no-progress",
    )
    assert ft.returncode == 0, ft.stderr
    run = tmp_path / "ft"
    ex = run_zoo("export", str(run), "--dynamic-batch", "--data", str(small_digits), "--json")
    assert ex.returncode == 0, ex.stderr
    report = json.loads(ex.stdout)
    onnx_path = run / "model" / "model.onnx"
    assert report["path"] == str(onnx_path) and report["parity"]["passed"]
    assert report["parity"]["predictions"]["n_images"] > 50  # real images from --data
    meta = read_metadata(onnx_path)
    assert meta["class_names"] == [f"digit_{i}" for i in range(10)]
    assert (
        meta["preprocessing"]["input_size"] == [3, 64, 64]
        and meta["parent"] == "mobilenet_v2.tv_in1k"
    )
    images = [small_digits / f"digit_{d}" / "0000.png" for d in range(10)]
    onnx_pred = run_zoo("predict", str(onnx_path), *map(str, images), "--json")
    torch_pred = run_zoo("predict", str(run), *map(str, images), "--json")
    assert onnx_pred.returncode == 0 and torch_pred.returncode == 0, (
        onnx_pred.stderr + torch_pred.stderr
    )
    a = [r["top"][0]["label"] for r in json.loads(onnx_pred.stdout)]
    b = [r["top"][0]["label"] for r in json.loads(torch_pred.stdout)]
    assert a == b, "ONNX alone and PyTorch predict the same labels"
    truth = [f"digit_{d}" for d in range(10)]
    assert sum(x == y for x, y in zip(a, truth, strict=True)) >= 6, a
    # … and served: the fine-tuned ONNX answers the image endpoint and a KServe v2 client
    import numpy as np
    import tritonclient.http as th

    from tests.test_serve import server

    with server(onnx_path, "--max-batch", "4") as (url, _):
        import httpx

        meta = httpx.get(f"{url}/v2/models/mobilenet_v2.ft-ft").json()
        assert meta["parameters"]["classes"] == [f"digit_{i}" for i in range(10)]
        r = httpx.post(
            f"{url}/v2/models/mobilenet_v2.ft-ft/predict",
            content=images[3].read_bytes(),
            headers={"content-type": "image/png"},
        )
        assert r.status_code == 200 and r.json()["predictions"][0]["label"] == a[3]
        x = np.zeros((2, 3, 64, 64), np.float32)
        inp = th.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        client = th.InferenceServerClient(url.removeprefix("http://"))
        out = client.infer("mobilenet_v2.ft-ft", [inp]).as_numpy("logits")
        assert out.shape == (2, 10)
