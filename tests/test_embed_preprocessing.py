"""``zoo export --embed-preprocessing``: the graph's own resize, crop and normalisation equal
the Python preprocessing (≤ 2 of 256 levels, on few pixels) on real images of many sizes; the
gate judges pixels to logits and refuses a wrong prefix; and the real ImageNet MobileNetV2,
exported so, answers through ``zoo predict`` and ``zoo serve`` (uploads and UINT8 tensors);
a Triton config for it passes Triton's schema."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.conftest import run_zoo
from tests.serving import json_infer, server
from zoo.deploy.export.graph_preprocess import embed_file, pixels, preprocessing_graph
from zoo.deploy.quantize.options import QuantizeOptions
from zoo.deploy.serve.run import default_name
from zoo.errors import InputError
from zoo.images import open_image
from zoo.preprocess import preprocess
from zoo.preprocessing import Preprocessing
from zoo.samples import sample_image_paths

IMAGENET = Preprocessing(
    (3, 224, 224), 0.875, "bilinear", (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
)
# crop_pct 1: the resized image's edges survive the crop, where resampling differs most
DIGITS = Preprocessing((1, 32, 32), 1.0, "bilinear", (0.5,), (0.25,))


def _images() -> list[Image.Image]:
    """The real photographs at their own sizes, shrunk, enlarged, odd and portrait."""
    ims = [open_image(p) for p in sample_image_paths()]
    chelsea = ims[0]
    sizes = [(37, 301), (225, 224), (224, 225), (999, 333), (64, 48), (13, 9)]
    return ims + [chelsea.resize(s) for s in sizes]


def _session(pre: Preprocessing) -> Any:
    import onnxruntime as ort

    model = preprocessing_graph(pre, "out", 18)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("pre", [IMAGENET, DIGITS], ids=["imagenet-rgb", "digits-gray"])
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_the_graph_preprocesses_as_python_does(pre: Preprocessing, interpolation: str) -> None:
    pre = replace(pre, interpolation=interpolation)
    sess = _session(pre)
    for im in _images():
        got = sess.run(None, {"pixels": pixels(im, pre.channels)[None]})[0][0]
        want = preprocess(im, pre)
        assert got.shape == want.shape, im.size
        levels = np.abs(got - want) * np.asarray(pre.std, np.float32).reshape(-1, 1, 1) * 255
        assert levels.max() <= 2.01, (im.size, float(levels.max()))
        assert levels.mean() <= 0.25, im.size  # PIL's fixed point vs float: rounding only


def test_an_image_too_thin_to_resize_is_refused_before_it_is_resized() -> None:
    strip = Image.new("RGB", (20000, 1))
    for prepare in (lambda: pixels(strip, 3), lambda: preprocess(strip, IMAGENET)):
        with pytest.raises(InputError, match=r"20000x1 pixels.*more than 100 times"):
            prepare()
    assert pixels(Image.new("RGB", (100, 1)), 3).shape == (1, 100, 3)  # the limit itself passes


def test_what_onnx_resize_cannot_reproduce_is_refused() -> None:
    for name in ("lanczos", "nearest"):
        with pytest.raises(InputError, match=f"'{name}'"):
            preprocessing_graph(replace(IMAGENET, interpolation=name), "out", 18)
    with pytest.raises(InputError, match="--opset 18"):
        preprocessing_graph(IMAGENET, "out", 17)


def test_a_triton_config_for_pixels_passes_tritons_schema() -> None:
    from zoo.deploy.export.triton import build_config, validate_config

    text = build_config("m", input_dims=[-1, -1, 3], num_classes=10, max_batch=8, pixels=True)
    cfg = validate_config(text)
    assert (cfg.input[0].name, list(cfg.input[0].dims)) == ("pixels", [-1, -1, 3])
    assert (
        cfg.input[0].data_type
        == type(cfg)
        .DESCRIPTOR.fields_by_name["input"]
        .message_type.fields_by_name["data_type"]
        .enum_type.values_by_name["TYPE_UINT8"]
        .number
    )


def _tiny_export(tmp_path: Path, pre: Preprocessing) -> tuple[Any, Path]:
    """A random-weight digits CNN exported plainly, then given ``pre`` as its prefix."""
    from zoo.deploy.export.onnx_export import export_onnx
    from zoo.factory import create_model

    net = create_model("simple_cnn", weights="none").eval()
    path = tmp_path / "m.onnx"
    export_onnx("simple_cnn", path, weights="none", model=net)
    embed_file(path, pre)
    return net, path


def test_the_gate_refuses_a_prefix_that_preprocesses_wrongly(tmp_path: Path) -> None:
    import onnxruntime as ort

    from zoo.deploy.export.parity import check_embedded_parity
    from zoo.factory import info_of

    images = sample_image_paths()
    right = None
    for mean, expect in (((0.4914, 0.4822, 0.4465), True), ((0.5, 0.5, 0.5), False)):
        from zoo.factory import create_model

        info = info_of(create_model("simple_cnn", weights="none"))
        pre = replace(info.preprocessing(), mean=mean)
        net, path = _tiny_export(tmp_path, pre)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        report = check_embedded_parity(
            net, info, lambda a, s=sess: s.run(None, {"pixels": a})[0], images
        )
        assert report.passed is expect, report.failures()
        if expect:
            right = report
    assert right is not None
    assert right.predictions is not None and right.predictions.to_dict() == {
        "n_images": 2,
        "agreement": 1.0,
        "passed": True,
    }
    assert [d.case for d in right.dynamic] == [
        "one image thrice",
        "small",
        "odd portrait",
    ]


@pytest.mark.slow
def test_the_real_mobilenet_takes_pixels_in_predict_serve_and_triton(
    mobilenet_weights: Path, tmp_path: Path
) -> None:
    out = tmp_path / "mb_pixels.onnx"
    r = run_zoo("export", "mobilenet_v2", "-o", str(out), "--embed-preprocessing", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["parity"]["passed"] and report["parity"]["predictions"]["agreement"] == 1.0
    from zoo.onnx_meta import read_metadata

    assert read_metadata(out)["input"] == {
        "dtype": "uint8",
        "layout": "NHWC",
        "preprocessing": "in-graph",
    }
    chelsea, coffee = sample_image_paths()
    from zoo.deploy.predict.scoring import load_scorer, predict

    scorer = load_scorer(str(out))
    assert scorer.pixels_in
    tops = predict(scorer, [str(chelsea), str(coffee)], k=1)
    assert [x.top[0].label for x in tops] == ["Egyptian cat", "espresso"]
    with pytest.raises(InputError, match="--embed-preprocessing"):
        load_scorer(str(out), tta="flip")

    with server(out) as (url, _):
        name = default_name(out)
        meta = httpx.get(f"{url}/v2/models/{name}").json()
        assert meta["inputs"] == [{"name": "pixels", "datatype": "UINT8", "shape": [-1, -1, -1, 3]}]
        up = httpx.post(
            f"{url}/v2/models/{name}/predict",
            content=coffee.read_bytes(),
            headers={"content-type": "image/jpeg"},
        )
        assert up.status_code == 200 and up.json()["predictions"][0]["label"] == "espresso"
        px = pixels(open_image(chelsea), 3)[None]
        body = json_infer(px, name="pixels", dtype="UINT8")
        res = httpx.post(f"{url}/v2/models/{name}/infer", json=body, timeout=60)
        assert res.status_code == 200, res.text
        logits = np.asarray(res.json()["outputs"][0]["data"]).reshape(1, -1)
        assert int(logits.argmax()) == 285  # Egyptian cat
        bad = httpx.post(
            f"{url}/v2/models/{name}/infer",
            json=json_infer(np.zeros((1, 3, 224, 224), np.float32), name="pixels"),
        )
        assert bad.status_code == 400 and "UINT8" in bad.json()["error"]
        strip = json_infer(np.zeros((1, 1, 20000, 3), np.uint8), name="pixels", dtype="UINT8")
        thin = httpx.post(f"{url}/v2/models/{name}/infer", json=strip, timeout=60)
        assert thin.status_code == 400 and "too thin" in thin.json()["error"]  # not gigabytes
    from zoo.deploy.quantize.int8 import quantize

    with pytest.raises(InputError, match="takes uint8 pixels"):
        quantize(QuantizeOptions(out, tmp_path / "q.onnx", mode="dynamic"))
