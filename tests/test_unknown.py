"""``unknown`` answered by ``zoo predict`` and ``zoo serve`` (issue #33): a real SimpleCNN run on
real digits with ``--reject energy``, and a copy refitted with ``zoo calibrate --reject
msp`` and one with ``--reject knn`` (the kNN bank of its training embeddings, built into the
export as a second output), each exported; real photographs (scikit-image's) and real digits through ``zoo predict``
on the ONNX file alone (in memory and ``--out``), the run folder, and a real ``zoo serve`` on
loopback (``/predict`` and KServe v2). What each image should get is computed from the stored
rule and the graph's own logits, never written down. (A 2-epoch CNN on 96 digits hardly
separates photographs by energy, so the ``msp`` copy is the one that must reject some.)"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import finetune_here, zoo_here
from tests.serving import json_infer, server
from zoo.calibration import UNKNOWN_LABEL, Calibration
from zoo.images import open_image

NAME = "digits"


@pytest.fixture(scope="module")
def run(four_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``--reject energy`` fitted at the end of training, exported by ``zoo export`` (both in
    this process: the commands' start-up is not what is tested; the fixtures below likewise)."""
    runs = tmp_path_factory.mktemp("unknown")
    finetune_here(four_digits, runs, "cnn", model="simple_cnn", epochs=2, reject="energy")
    e = zoo_here("export", str(runs / "cnn"))
    assert e.returncode == 0, e.stderr
    return runs / "cnn"


@pytest.fixture(scope="module")
def msp_run(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights with an msp rule (``zoo calibrate``), exported again."""
    copy = tmp_path_factory.mktemp("msp") / "cnn"
    shutil.copytree(run, copy, symlinks=True)
    c = zoo_here("calibrate", str(copy), "--reject", "msp")
    assert c.returncode == 0, c.stderr
    e = zoo_here("export", str(copy))
    assert e.returncode == 0, e.stderr
    return copy


@pytest.fixture(scope="module")
def knn_run(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights with a knn rule (``zoo calibrate``: the bank from the run's training
    images), exported again: the graph gains ``knn_score``."""
    copy = tmp_path_factory.mktemp("knn") / "cnn"
    shutil.copytree(run, copy, symlinks=True)
    c = zoo_here("calibrate", str(copy), "--reject", "knn")
    assert c.returncode == 0, c.stderr
    assert "rejects below knn" in c.stdout + c.stderr
    e = zoo_here("export", str(copy))
    assert e.returncode == 0, e.stderr
    assert "parity knn_score: max abs" in e.stdout and "→ pass" in e.stdout
    return copy


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from zoo.samples import write_photo_folder

    return sorted(write_photo_folder(tmp_path_factory.mktemp("ood"), per_class=3).rglob("*.*"))


def _expected(onnx_file: Path, photos: list[Path], four_digits: Path) -> dict:
    """Images and what the stored rule makes of each, from the graph's outputs (onnxruntime):
    the logits, and for a knn rule the graph's own knn_score."""
    from zoo.deploy.runtimes.loader import load_classifier
    from zoo.onnx_meta import read_calibration, read_metadata

    cal = read_calibration(read_metadata(onnx_file), onnx_file)
    assert cal is not None and cal.reject is not None
    digits = sorted((four_digits / "digit_7").iterdir())[:4]
    clf = load_classifier(onnx_file)
    images = [*photos, *digits]
    x = np.stack([clf.prepare(open_image(p)) for p in images])
    logits, knn = clf.split(clf.outputs(x))
    assert (knn is not None) == (cal.reject.score == "knn")  # the output exactly with the rule
    s = cal.reject.scores(logits, cal.temperature, knn)
    accepted = s >= cal.reject.threshold
    probs = Calibration(cal.temperature).probabilities(logits)
    table = {
        str(p): {"accepted": bool(a), "score": float(v), "best": clf.classes[int(r.argmax())],
                 "prob": float(r.max())}
        for p, a, v, r in zip(images, accepted, s, probs, strict=True)
    }  # fmt: skip
    photo = next((str(p) for p in photos if not table[str(p)]["accepted"]), str(photos[0]))
    digit = next((str(p) for p in digits if table[str(p)]["accepted"]), str(digits[0]))
    return {"onnx": onnx_file, "rule": cal.reject, "table": table, "photo": photo, "digit": digit}


@pytest.fixture(scope="module")
def energy(run: Path, photos: list[Path], four_digits: Path) -> dict:
    found = _expected(run / "model" / "model.onnx", photos, four_digits)
    assert found["rule"].score == "energy"  # what the run was fitted with
    return found


@pytest.fixture(scope="module")
def expected(msp_run: Path, photos: list[Path], four_digits: Path) -> dict:
    """The msp model's: both answers occur (else the checks below would prove little)."""
    found = _expected(msp_run / "model" / "model.onnx", photos, four_digits)
    assert not found["table"][found["photo"]]["accepted"], "no photograph is rejected"
    assert found["table"][found["digit"]]["accepted"], "no digit is accepted"
    return found


@pytest.fixture(scope="module")
def knn(knn_run: Path, photos: list[Path], four_digits: Path) -> dict:
    """The knn model's: it rejects photographs and accepts digits, both occur."""
    found = _expected(knn_run / "model" / "model.onnx", photos, four_digits)
    assert found["rule"].score == "knn"
    assert not found["table"][found["photo"]]["accepted"], "no photograph is rejected"
    assert found["table"][found["digit"]]["accepted"], "no digit is accepted"
    return found


@pytest.fixture(scope="module")
def onnx_file(expected: dict) -> Path:
    return expected["onnx"]


def _check(row: dict, want: dict, rule_threshold: float) -> None:
    assert row["accepted"] is want["accepted"]
    assert row["label"] == (want["best"] if want["accepted"] else UNKNOWN_LABEL)
    assert row["score"] == pytest.approx(want["score"], abs=1e-4)
    assert row.get("threshold", rule_threshold) == pytest.approx(rule_threshold)


def test_predict_from_the_onnx_file_alone(
    energy: dict, expected: dict, knn: dict, tmp_path: Path
) -> None:
    for model in (energy, expected, knn):
        alone = tmp_path / model["rule"].score / "model.onnx"  # no model folder: metadata alone
        alone.parent.mkdir()
        shutil.copy(model["onnx"], alone)
        rule, table = model["rule"], model["table"]
        r = zoo_here("predict", str(alone), *table, "-k", "2", "--json")
        assert r.returncode == 0, r.stderr
        for row in json.loads(r.stdout):
            want = table[row["image"]]
            _check(row, want, rule.threshold)
            assert row["score_kind"] == rule.score
            assert row["top"][0]["label"] == want["best"]  # the best class stays visible
    rule, table = expected["rule"], expected["table"]
    alone = tmp_path / rule.score / "model.onnx"
    # the text answer of a rejected photo: unknown, the score against the threshold, best class
    t = zoo_here("predict", str(alone), expected["photo"], expected["digit"])
    assert t.returncode == 0, t.stderr
    photo = table[expected["photo"]]
    assert (
        f"  {UNKNOWN_LABEL}  ({rule.score} {photo['score']:.4g} < threshold "
        f"{rule.threshold:.4g}; best class: {photo['best']} {photo['prob']:.4f})"
    ) in t.stdout
    assert f"  {table[expected['digit']]['best']}" in t.stdout
    # --no-reject: the raw top-k, as a model without a rule answers
    n = zoo_here("predict", str(alone), expected["photo"], "-k", "2", "--json", "--no-reject")
    assert n.returncode == 0, n.stderr
    (raw,) = json.loads(n.stdout)
    assert set(raw) == {"image", "top"} and raw["top"][0]["label"] == photo["best"]


def test_predict_from_the_run_folder(
    run: Path, msp_run: Path, knn_run: Path, energy: dict, expected: dict, knn: dict
) -> None:
    """Through PyTorch (a knn rule: the model folder's bank of embeddings): the same verdicts
    as the exported graph (parity-close scores)."""
    for folder, model in ((run, energy), (msp_run, expected), (knn_run, knn)):
        images = [model["photo"], model["digit"]]
        r = zoo_here("predict", str(folder), *images, "--json")
        assert r.returncode == 0, r.stderr
        for row in json.loads(r.stdout):
            _check(row, model["table"][row["image"]], model["rule"].threshold)


@pytest.mark.parametrize("ext", ["jsonl", "csv", "parquet"])
def test_predict_out_rows(onnx_file: Path, expected: dict, tmp_path: Path, ext: str) -> None:
    table = expected["table"]
    out = tmp_path / f"rows.{ext}"
    r = zoo_here("predict", str(onnx_file), *table, "--out", str(out), "-k", "2")
    assert r.returncode == 0, r.stderr
    if ext == "jsonl":
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    elif ext == "csv":
        with out.open(newline="") as f:
            rows = [
                {**d, "accepted": d["accepted"] == "True", "score": float(d["score"])}
                for d in csv.DictReader(f)
            ]
    else:
        import pyarrow.parquet as pq

        rows = pq.read_table(out).to_pylist()
    assert [row["path"] for row in rows] == list(table)
    for row in rows:
        _check(row, table[row["path"]], expected["rule"].threshold)
    n = zoo_here("predict", str(onnx_file), *table, "--out", str(out), "--overwrite", "--no-reject")
    assert n.returncode == 0, n.stderr
    if ext == "jsonl":
        assert "accepted" not in json.loads(out.read_text().splitlines()[0])


@pytest.mark.parametrize("rule_kind", ["msp", "knn"])
def test_serve_answers_unknown(
    rule_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from zoo.deploy.runtimes.loader import load_classifier

    expected = request.getfixturevalue("expected" if rule_kind == "msp" else "knn")
    onnx_file = expected["onnx"]
    rule, table = expected["rule"], expected["table"]
    images = [expected["photo"], expected["digit"]]
    clf = load_classifier(onnx_file)
    x = np.stack([clf.prepare(open_image(p)) for p in images])
    with server(onnx_file, "--name", NAME, log=tmp_path / "serve.log") as (url, _):
        meta = httpx.get(f"{url}/v2/models/{NAME}").json()
        assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [
            (clf.output_name, "FP32"),
            ("accepted", "BOOL"),
            ("score", "FP32"),
        ]
        assert meta["parameters"]["rejection"] == {**rule.to_dict(), "unknown_label": "unknown"}
        for p in images:
            r = httpx.post(
                f"{url}/v2/models/{NAME}/predict",
                content=Path(p).read_bytes(),
                headers={"content-type": "image/jpeg" if p.endswith(".jpg") else "image/png"},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            body = r.json()
            _check(body, table[p], rule.threshold)
            assert body["predictions"][0]["label"] == table[p]["best"]
        v2 = httpx.post(f"{url}/v2/models/{NAME}/infer", json=json_infer(x, clf.input_name))
        assert v2.status_code == 200, v2.text
        outs = {o["name"]: o for o in v2.json()["outputs"]}
        assert list(outs) == [clf.output_name, "accepted", "score"]
        assert outs[clf.output_name]["shape"] == [2, len(clf.classes)]  # the logits, unchanged
        assert outs["accepted"]["datatype"] == "BOOL"
        assert outs["accepted"]["data"] == [table[p]["accepted"] for p in images]
        assert outs["score"]["data"] == pytest.approx([table[p]["score"] for p in images], abs=1e-4)
        # a client asking for the logits alone gets them alone
        only = json_infer(x, clf.input_name) | {"outputs": [{"name": clf.output_name}]}
        v2 = httpx.post(f"{url}/v2/models/{NAME}/infer", json=only)
        assert [o["name"] for o in v2.json()["outputs"]] == [clf.output_name]
        bad = json_infer(x, clf.input_name) | {
            "outputs": [{"name": "accepted", "parameters": {"classification": 2}}]
        }
        v2 = httpx.post(f"{url}/v2/models/{NAME}/infer", json=bad)
        assert v2.status_code == 400 and "has no classes" in v2.json()["error"]


def test_a_model_without_a_rule_answers_as_before(
    run: Path, expected: dict, tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(run, plain, symlinks=True)
    c = zoo_here("calibrate", str(plain), "--reject", "off")  # the copy's rule dropped, in this
    assert c.returncode == 0, c.stderr  # process as the fixtures' (predict and serve are tested)
    e = zoo_here("export", str(plain))
    assert e.returncode == 0, e.stderr
    onnx_file = plain / "model" / "model.onnx"
    r = zoo_here("predict", str(onnx_file), expected["photo"], "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert set(row) == {"image", "top"}
    assert row["top"][0]["label"] == expected["table"][expected["photo"]]["best"]
    with server(onnx_file, "--name", NAME, log=tmp_path / "serve.log") as (url, _):
        meta = httpx.get(f"{url}/v2/models/{NAME}").json()
        assert len(meta["outputs"]) == 1 and "rejection" not in meta["parameters"]
        body = httpx.post(
            f"{url}/v2/models/{NAME}/predict",
            content=Path(expected["photo"]).read_bytes(),
            timeout=60,
        ).json()
        assert set(body) == {"model_name", "predictions"}


def test_knn_gate_catches_a_graph_that_scores_against_another_bank(
    knn_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Break the graph's kNN score (its bank's rows nudged): the parity gate refuses the export
    and writes nothing; the untouched export passes with a tight bound."""
    import zoo.deploy.export.knn as knn_export
    from zoo.deploy.export.onnx_export import export_onnx
    from zoo.errors import ParityError
    from zoo.knn import KnnBank, add_to_graph

    def nudged(model: object, features: str, bank: KnnBank) -> None:
        rows = bank.rows.copy()
        rows[:, 0] += 0.05
        add_to_graph(
            model, features, KnnBank(rows / np.linalg.norm(rows, axis=1, keepdims=True), bank.k)
        )

    out = tmp_path / "broken.onnx"
    monkeypatch.setattr(knn_export, "add_to_graph", nudged)
    with pytest.raises(ParityError, match="knn_score"):
        export_onnx(str(knn_run), out)
    assert not out.exists() and not list(tmp_path.iterdir())
    monkeypatch.undo()
    result = export_onnx(str(knn_run), out)
    assert result.parity is not None and result.parity.knn is not None
    assert result.parity.knn.passed and result.parity.knn.max_abs < 1e-5
    assert result.parity.knn.images == result.parity.predictions.n_images  # every gate image


def test_a_knn_rule_without_its_bank_is_refused_plainly(knn_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "cnn"
    shutil.copytree(knn_run, copy, symlinks=True)
    (copy / "model" / "knn_bank.safetensors").unlink()
    from PIL import Image

    image = tmp_path / "a.png"
    Image.new("RGB", (8, 8)).save(image)
    for cmd in (
        ("export", str(copy), "-o", str(tmp_path / "x.onnx")),
        ("predict", str(copy), str(image)),
    ):
        r = zoo_here(*cmd)  # refused before any work: in this process
        assert r.returncode == 1, r.stderr
        assert "no knn_bank.safetensors" in r.stderr and "zoo calibrate" in r.stderr
    assert not (tmp_path / "x.onnx").exists()


def test_int8_keeps_the_knn_score_float(knn_run: Path, knn: dict, tmp_path: Path) -> None:
    """zoo quantize (onnxruntime's static int8) leaves the kNN nodes float, the coverage
    counts only the model's own nodes, and the int8 file still answers unknown."""
    import onnx

    from zoo.knn import KNN_OUTPUT, NODE_PREFIX

    q = tmp_path / "int8.onnx"
    r = zoo_here("quantize", str(knn["onnx"]), "--engine", "ort", "-o", str(q))
    assert r.returncode == 0, r.stderr
    graph = onnx.load(str(q)).graph
    assert KNN_OUTPUT in [o.name for o in graph.output]
    knn_nodes = [n for n in graph.node if n.name.startswith(NODE_PREFIX)]
    assert {n.op_type for n in knn_nodes} >= {"MatMul", "TopK", "LpNormalization"}
    producer = {o: n.op_type for n in graph.node for o in n.output}
    sims = next(n for n in knn_nodes if n.op_type == "MatMul")
    assert all(producer.get(i) != "DequantizeLinear" for i in sims.input)  # float both sides
    p = zoo_here("predict", str(q), knn["photo"], knn["digit"], "--json")
    assert p.returncode == 0, p.stderr
    rows = {row["image"]: row for row in json.loads(p.stdout)}
    assert rows[knn["photo"]]["score_kind"] == "knn"
    assert rows[knn["photo"]]["accepted"] is False


def test_eval_ood_judges_the_stored_knn_rule(knn_run: Path, knn: dict, photos: list[Path]) -> None:
    r = zoo_here("eval", str(knn_run), "--ood", str(photos[0].parent.parent), "--json")
    assert r.returncode == 0, r.stderr
    ood = json.loads(r.stdout)["ood"]
    assert ood["rule"]["score"] == "knn" and set(ood["scores"]) == {"msp", "energy", "knn"}
    assert ood["rejected_out"] == pytest.approx(
        1 - sum(knn["table"][str(p)]["accepted"] for p in photos) / len(photos), abs=1e-9
    )


def test_enrolling_into_a_knn_model_adds_the_images_to_its_bank(
    knn_run: Path, photos: list[Path], tmp_path: Path
) -> None:
    from zoo.knn import KnnBank
    from zoo.train.enroll_images import BANK_VIEWS

    new = [p for p in photos if p.parent.name in ("astronaut", "chelsea")][:5]
    out = tmp_path / "enrolled"
    r = zoo_here("enroll", str(knn_run), "--class", "photo", *map(str, new), "-o", str(out))
    assert r.returncode == 0, r.stderr
    before, after = KnnBank.load(knn_run / "model"), KnnBank.load(out)
    # each image's eval view and BANK_VIEWS augmented views; k at most the images
    assert len(after.rows) == len(before.rows) + len(new) * (1 + BANK_VIEWS)
    assert after.k == min(before.k, len(new))
    assert np.array_equal(after.rows[: len(before.rows)], before.rows)
    cal = json.loads((out / "config.json").read_text())["calibration"]["reject"]
    assert cal["score"] == "knn" and "refitted" in r.stdout + r.stderr
    e = zoo_here("export", str(out), "-o", str(tmp_path / "e.onnx"))
    assert e.returncode == 0 and "parity knn_score" in e.stdout, e.stderr
