"""A multi-label model gives the same decisions from ``zoo serve`` as from ``zoo predict``:
each class whose sigmoid score reaches the threshold tuned for it on validation (stored in
the ONNX metadata as ``thresholds``). One real run (simple_cnn, 1 epoch on the three-label
digits), exported, served by the real ``zoo serve`` on loopback, and asked image by image over
each path: the image upload (``/predict``: ``labels``), the v2 HTTP JSON inference (the
``labels`` output) and the v2 gRPC inference; the model metadata carries the thresholds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from tests.conftest import finetune_here, run_zoo, zoo_here
from tests.serving import free_port, json_infer, server
from zoo.deploy.runtimes.loader import OnnxClassifier
from zoo.deploy.serve.run import default_name
from zoo.onnx_meta import read_metadata, set_metadata

pytestmark = [pytest.mark.serve, pytest.mark.slow]

TIE = 1e-6  # a score this close to its threshold may fall either side between two runs


@pytest.fixture(scope="module")
def ml_onnx(multilabel_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real multi-label run with thresholds tuned on validation, exported."""
    runs = tmp_path_factory.mktemp("ml-decide")
    run = finetune_here(
        multilabel_digits, runs, "ml", model="simple_cnn", epochs=1, multi_label=True
    )
    ex = zoo_here("export", str(run), "--data", str(multilabel_digits / "images"))
    assert ex.returncode == 0, ex.stderr
    return run / "model" / "model.onnx"


@pytest.fixture(scope="module")
def images(multilabel_digits: Path) -> list[Path]:
    """Two images of each digit: 20 images, each with three true labels."""
    root = multilabel_digits / "images"
    return [p for d in range(10) for p in sorted((root / f"digit_{d}").iterdir())[:2]]


def _predict(model: Path, images: list[Path], tmp_path: Path) -> tuple[dict, dict]:
    """``zoo predict``'s answers: each image's scores of every class (``--json -k 14``), and
    its decided classes (the ``labels`` column of ``--out``, the same as ``--json``'s), by
    path."""
    shown = zoo_here("predict", str(model), *map(str, images), "-k", "14", "--json")
    assert shown.returncode == 0, shown.stderr
    scores = {
        r["image"]: {t["index"]: t["score"] for t in r["top"]} for r in json.loads(shown.stdout)
    }
    out = tmp_path / "rows.jsonl"
    written = zoo_here("predict", str(model), *map(str, images), "--out", str(out), "-k", "1")
    assert written.returncode == 0, written.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    labels = {r["path"]: r["labels"].split(";") if r["labels"] else [] for r in rows}
    assert set(labels) == set(scores) == {str(p) for p in images}
    assert {r["image"]: r["labels"] for r in json.loads(shown.stdout)} == labels
    return scores, labels


def _near(scores: dict[int, float], thresholds: list[float], classes: list[str]) -> set[str]:
    """The classes of one image whose score sits on its threshold (either side is right)."""
    return {classes[i] for i, t in enumerate(thresholds) if abs(scores[i] - t) < TIE}


def _same(got: list[str], want: list[str], near: set[str], classes: list[str], where: str) -> None:
    """Serve's decided classes are ``zoo predict``'s (but for a class on its threshold), in
    class order as predict lists them."""
    assert set(got) ^ set(want) <= near, f"{where}: serve says {got}, zoo predict {want}"
    assert got == [c for c in classes if c in got], f"{where}: {got} not in class order"


def _grpc_labels(port: int, name: str, x: np.ndarray) -> tuple[list[str], Any]:
    """The ``labels`` output of one v2 gRPC ``ModelInfer`` (raw tensors), and the metadata."""
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as v2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        req = pb.ModelInferRequest(model_name=name, id="ml")
        req.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        req.raw_input_contents.append(x.tobytes())
        req.outputs.add(name="labels")
        resp = stub.ModelInfer(req)
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=name))
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
        ("labels", "BYTES", [len(x)])
    ]
    raw, found = resp.raw_output_contents[0], []
    while raw:  # length-prefixed strings, as Triton's BYTES
        n = int.from_bytes(raw[:4], "little")
        found.append(raw[4 : 4 + n].decode())
        raw = raw[4 + n :]
    return found, meta


def test_serve_decides_each_image_as_zoo_predict(
    ml_onnx: Path, images: list[Path], tmp_path: Path
) -> None:
    clf = OnnxClassifier(ml_onnx)
    classes, thresholds = list(clf.classes), list(clf.meta["thresholds"])  # as stored
    assert clf.multi_label and len(thresholds) == len(classes) == 14
    assert set(thresholds) != {0.5}  # tuned on validation: a server using 0.5 would differ
    scores, decided = _predict(ml_onnx, images, tmp_path)
    at_half = {p: [classes[i] for i in range(14) if scores[p][i] >= 0.5] for p in map(str, images)}
    assert at_half != decided, "the thresholds change no decision: the test would prove nothing"
    x = np.stack(clf.preprocess_images(images)).astype(np.float32)  # what a v2 client sends
    name = default_name(ml_onnx)
    grpc_port = free_port()
    with server(ml_onnx, "--grpc-port", str(grpc_port), "--max-batch", "32") as (url, _):
        meta = httpx.get(f"{url}/v2/models/{name}").json()
        config = httpx.get(f"{url}/v2/models/{name}/config").json()
        uploads = [
            httpx.post(
                f"{url}/v2/models/{name}/predict?top_k=2",
                content=p.read_bytes(),
                headers={"content-type": "image/png"},
            )
            for p in images
        ]
        infer = httpx.post(f"{url}/v2/models/{name}/infer", json=json_infer(x), timeout=60)
        grpc_got, grpc_meta = _grpc_labels(grpc_port, name, x)
    # the metadata: the thresholds the decisions use, and the labels output after the logits
    assert meta["parameters"]["multi_label"] is True
    assert meta["parameters"]["thresholds"] == thresholds
    assert meta["outputs"] == [
        {"name": "logits", "datatype": "FP32", "shape": [-1, 14]},
        {"name": "labels", "datatype": "BYTES", "shape": [-1]},
    ]
    assert [(t.name, t.datatype) for t in grpc_meta.outputs] == [
        ("logits", "FP32"),
        ("labels", "BYTES"),
    ]
    assert config["output"][1] == {"name": "labels", "data_type": "TYPE_STRING", "dims": []}
    # the v2 JSON answer: the logits as before, then the decisions
    assert infer.status_code == 200, infer.text
    outputs = {o["name"]: o for o in infer.json()["outputs"]}
    assert list(outputs) == ["logits", "labels"]
    assert outputs["logits"]["shape"] == [len(images), 14]
    assert (outputs["labels"]["datatype"], outputs["labels"]["shape"]) == ("BYTES", [len(images)])
    for i, p in enumerate(map(str, images)):
        near = _near(scores[p], thresholds, classes)
        body = uploads[i].json()
        assert uploads[i].status_code == 200, body
        _same(body["labels"], decided[p], near, classes, f"{p} (/predict)")
        assert [t["index"] for t in body["predictions"]] == sorted(
            scores[p], key=lambda c: -scores[p][c]
        )[:2]
        np.testing.assert_allclose(
            [t["score"] for t in body["predictions"]],
            [scores[p][t["index"]] for t in body["predictions"]],
            rtol=1e-6,
        )
        row = outputs["labels"]["data"][i]
        _same(row.split(";") if row else [], decided[p], near, classes, f"{p} (v2 JSON)")
        got = grpc_got[i].split(";") if grpc_got[i] else []
        _same(got, decided[p], near, classes, f"{p} (gRPC)")


def test_serve_refuses_thresholds_that_do_not_fit_the_classes(
    ml_onnx: Path, images: list[Path], tmp_path: Path
) -> None:
    """A model whose thresholds are not one per class is refused at start-up, saying why (not
    a server that answers 500 for each image)."""
    import onnx

    model = onnx.load(str(ml_onnx))
    set_metadata(model, {**read_metadata(ml_onnx), "thresholds": [0.5, 0.5, 0.5]})
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    r = run_zoo("serve", str(bad), "--port", str(free_port()), timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "3 values for the model's 14 classes" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    one, out = str(images[0]), str(tmp_path / "rows.jsonl")
    for cmd in (("predict", str(bad), one), ("predict", str(bad), one, "--out", out)):
        p = zoo_here(*cmd)  # zoo predict refuses it the same way (was: numpy's broadcast error)
        assert p.returncode == 1 and "3 values for the model's 14 classes" in p.stderr, p.stderr
    assert not Path(out).exists()  # refused before anything is written
