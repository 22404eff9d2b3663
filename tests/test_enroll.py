"""``zoo enroll`` (issue #33): a class added from five images to a real MLP run on nine of the
real digits, then the user's chain on the result: ``zoo export`` → ``zoo predict`` on the
ONNX file alone answers the new class for held-out images of it → ``zoo serve``'s metadata
lists it; a second enrolment on top; a model folder away from its run with ``--data`` and
``--in-place``; and the refusals (too few images, a class that exists, unreadable or repeated
images), none of which touches the source."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import file_sha256, read_safetensors, zoo_here
from tests.serving import server
from zoo.train.imprint import fit_new_row, imprint

NEW = "digit_9"
HEAD = "head"  # the mlp's declared classifier


@pytest.fixture(scope="module")
def nine(digits_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Digits 0–8 (all of sklearn's real images of them): the classes the run knows."""
    root = tmp_path_factory.mktemp("nine") / "digits"
    root.mkdir()
    for d in range(9):
        (root / f"digit_{d}").symlink_to(digits_dir / f"digit_{d}")
    return root


@pytest.fixture(scope="module")
def nines(digits_dir: Path) -> list[Path]:
    """Digit 9's real images: the first five enrol it, the others are held out."""
    return sorted((digits_dir / NEW).iterdir())


@pytest.fixture(scope="module")
def run(nine: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("enroll")
    r = zoo_here(
        "finetune", "mlp", "--data", str(nine), "--epochs", "3", "--runs", str(runs),
        "--name", "cnn", "--num-workers", "0", "--no-progress", "--reject", "auto",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return runs / "cnn"


def _source_state(run: Path) -> dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted((run / "model").iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def enrolled(run: Path, nines: list[Path]) -> tuple[Path, dict, dict[str, str]]:
    """``zoo enroll RUN --class digit_9 FIVE --json``: (the folder, its JSON, the source's
    file digests before)."""
    before = _source_state(run)
    r = zoo_here("enroll", str(run), "--class", NEW, *map(str, nines[:5]), "--json")
    assert r.returncode == 0, r.stderr
    assert "zoo export" in r.stderr
    result = json.loads(r.stdout)
    return Path(result["out"]), result, before


def test_the_folder_holds_one_class_more_and_says_how(
    run: Path, nines: list[Path], enrolled: tuple[Path, dict, dict[str, str]]
) -> None:
    out, result, before = enrolled
    assert out == (run / "model+digit_9").resolve()  # inside the run: export finds its images
    assert _source_state(run) == before  # the source is never touched
    config = json.loads((out / "config.json").read_text())
    source = json.loads((run / "model" / "config.json").read_text())
    assert config["class_names"] == [*source["class_names"], NEW] and config["num_classes"] == 10
    assert result["index"] == 9 and result["num_classes"] == 10 and result["images"] == 5
    (record,) = config["enrolled"]
    assert record["sha256"] == [file_sha256(p) for p in nines[:5]]
    assert record["class"] == NEW and record["images"] == 5
    # the check on the run's own validation images: "before" is the run's measured top-1
    report = json.loads((run / "report.json").read_text())
    old = record["old_classes"]
    assert old == result["old_classes"]
    assert old["acc_before"] == pytest.approx(report["best"]["val/acc"], abs=1e-4)
    assert (
        old["total"]
        == old["images"]
        == len(json.loads((run / "split.json").read_text())["splits"]["val"])
    )
    assert abs(old["acc_after"] - old["acc_before"]) <= 0.05
    # the bias cap's promise, on exactly these images: at most MAX_COST of top-1 lost
    from zoo.train.imprint import MAX_COST

    assert old["acc_before"] - old["acc_after"] <= MAX_COST + 1e-6
    assert config["metrics"] == {"val/acc": old["acc_after"]}
    # calibration: the temperature kept, the rejection threshold refitted on those images
    assert config["calibration"]["temperature"] == source["calibration"]["temperature"]
    assert config["calibration"]["reject"]["acceptance"] == 0.95
    assert "temperature fitted before enrolment" in record["calibration"]
    assert "refitted to accept 95%" in record["calibration"] and result["rejection"]
    card = (out / "README.md").read_text()
    assert "## Enrolled classes" in card and record["sha256"][0][:16] in card
    # the weights: every tensor as before, the classifier one row longer
    new, src = (
        read_safetensors(out / "model.safetensors"),
        read_safetensors(run / "model" / "model.safetensors"),
    )
    assert set(new) == set(src)
    for key, t in src.items():
        if key.startswith(HEAD):
            assert new[key].shape[0] == t.shape[0] + 1 and torch.equal(new[key][:-1], t)
        else:
            assert torch.equal(new[key], t)


def _labels(model: Path, images: list[Path]) -> list[str]:
    """The model folder's top-1 labels, through PyTorch."""
    from zoo.factory import create_model, info_of
    from zoo.images import open_image
    from zoo.transforms import eval_transform

    net = create_model(str(model)).eval()
    info = info_of(net)
    x = torch.stack([eval_transform(info)(open_image(p)) for p in images])
    with torch.inference_mode():
        return [info.label_names[i] for i in net(x).argmax(1).tolist()]


def test_export_predict_and_serve_answer_it_from_the_onnx_file_alone(
    enrolled: tuple[Path, dict, dict[str, str]], nines: list[Path], tmp_path: Path
) -> None:
    from zoo.onnx_meta import read_metadata

    out, _, _ = enrolled
    e = zoo_here("export", str(out))
    assert e.returncode == 0, e.stderr
    onnx_file = out / "model.onnx"
    assert read_metadata(onnx_file)["class_names"][-1] == NEW
    held_out = nines[5:35]
    r = zoo_here("predict", str(onnx_file), *map(str, held_out), "-k", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    top = [row["top"][0]["label"] for row in rows]
    assert top.count(NEW) >= 0.6 * len(held_out), top
    assert top == _labels(out, held_out)  # the same answers as the PyTorch model folder
    name = "enrolled"
    one = held_out[top.index(NEW)]
    with server(onnx_file, "--name", name, log=tmp_path / "serve.log") as (url, _):
        meta = httpx.get(f"{url}/v2/models/{name}").json()
        assert meta["parameters"]["classes"][-1] == NEW
        assert meta["outputs"][0]["shape"] == [-1, 10]
        body = httpx.post(
            f"{url}/v2/models/{name}/predict",
            content=one.read_bytes(),
            headers={"content-type": "image/png"},
            timeout=60,
        ).json()
        assert body["predictions"][0]["label"] == NEW, body


def test_a_second_enrolment_adds_another_class(
    enrolled: tuple[Path, dict, dict[str, str]], nines: list[Path], tmp_path: Path
) -> None:
    from zoo.samples import write_photo_folder

    out, _, _ = enrolled
    photos = write_photo_folder(tmp_path / "photos", per_class=10)
    coffee = sorted((photos / "coffee").iterdir())
    r = zoo_here("enroll", str(out), "--class", "coffee", *map(str, coffee[:5]), "--json")
    assert r.returncode == 0, r.stderr
    second = Path(json.loads(r.stdout)["out"])
    assert second.name == "model+digit_9+coffee"
    config = json.loads((second / "config.json").read_text())
    assert config["class_names"][-2:] == [NEW, "coffee"] and config["num_classes"] == 11
    assert [e["class"] for e in config["enrolled"]] == [NEW, "coffee"]
    assert config["enrolled"][1]["old_classes"] is not None  # the run's images found again
    labels = _labels(second, [*coffee[5:], *nines[5:15]])
    assert labels[:5].count("coffee") >= 4, labels
    assert labels[5:].count(NEW) >= 6, labels  # the first enrolment still answers


def test_a_model_folder_away_from_its_run_needs_data(
    run: Path, nine: Path, nines: list[Path], tmp_path: Path
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(run / "model", folder)
    args = ["enroll", str(folder), "--class", NEW, *map(str, nines[:5])]
    r = zoo_here(*args)
    assert r.returncode == 1 and "--data DIR" in r.stderr, r.stderr
    r = zoo_here(*args, "--data", str(nine), "--in-place", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert Path(result["out"]) == folder and result["old_classes"] is None
    assert "of the 1617 images in" in result["reference"]
    config = json.loads((folder / "config.json").read_text())
    assert config["num_classes"] == 10 and config["metrics"] == {}
    assert "fitted before enrolment (no validation images" in config["enrolled"][0]["calibration"]


def test_refusals_name_the_problem_and_leave_the_source_alone(
    run: Path, nines: list[Path], tmp_path: Path, enrolled: tuple[Path, dict, dict[str, str]]
) -> None:
    five = [str(p) for p in nines[:5]]
    before = _source_state(run)
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    cases = [
        (["--class", "x", *five[:4]], 2, "needs at least 5"),
        (["--class", "digit_3", *five], 1, "already has a class 'digit_3'"),
        (["--class", "x", *five[:4], str(bad)], 1, "bad.png"),
        (["--class", "x", *[five[0]] * 5], 1, "Only 1 distinct images"),
        (["--class", "x", *five, "-o", str(tmp_path), "--in-place"], 2, "not both"),
        (["--class", "x", *five, "-o", str(tmp_path)], 1, "exists"),
        (["--class", NEW, *five], 1, "exists"),  # the default folder: enrolled before
    ]
    for args, code, message in cases:
        r = zoo_here("enroll", str(run), *args)
        assert r.returncode == code and message in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    onnx_model = tmp_path / "m.onnx"
    onnx_model.write_bytes(b"")
    r = zoo_here("enroll", str(onnx_model), "--class", "x", *five)
    assert r.returncode == 1 and "give the run or model folder" in r.stderr, r.stderr
    assert _source_state(run) == before


def test_the_fit_on_separated_clusters() -> None:
    """Three known classes under a nearest-centroid head and a fourth cluster, all in the
    positive orthant as ReLU features are: the fitted row takes the new cluster from five
    samples and leaves the old ones their answers."""
    rng = np.random.default_rng(0)
    d, centres = 16, np.abs(rng.normal(size=(4, 16))) * 3
    weight, bias = centres[:3], -0.5 * (centres[:3] ** 2).sum(1)  # nearest centroid

    def sample(k: int, n: int) -> np.ndarray:
        return np.abs(centres[k] + rng.normal(scale=0.5, size=(n, d)))

    ref = np.concatenate([sample(k, 50) for k in range(3)])
    labels = np.repeat(np.arange(3), 50)
    pos, new_test = sample(3, 5), sample(3, 200)
    old_test, old_y = (
        np.concatenate([sample(k, 100) for k in range(3)]),
        np.repeat(np.arange(3), 100),
    )
    assert ((old_test @ weight.T + bias).argmax(1) == old_y).all()
    row = fit_new_row(pos, ref, labels, weight, bias)

    def answers(f: np.ndarray) -> np.ndarray:
        return np.concatenate([f @ weight.T + bias, row.logits(f)[:, None]], 1).argmax(1)

    assert (answers(new_test) == 3).mean() >= 0.95
    assert (answers(old_test) == old_y).mean() >= 0.98
    imprinted, b0 = imprint(pos, ref.mean(0), weight, bias)
    assert np.linalg.norm(imprinted) == pytest.approx(np.linalg.norm(weight, axis=1).mean())
    assert (row.imprinted == imprinted).all() and row.imprinted_bias == b0


def test_the_bias_cap_keeps_the_promised_cost_to_the_old_classes() -> None:
    from zoo.train.imprint import NewRow, cap_bias

    rng = np.random.default_rng(1)
    f = rng.normal(size=(300, 8))
    old = f @ rng.normal(size=(3, 8)).T
    labels = old.argmax(1)
    labels[:60] = (labels[:60] + 1) % 3  # 60 images the old rows already get wrong
    greedy = NewRow(weight=rng.normal(size=8), bias=50.0, imprinted=np.zeros(8), imprinted_bias=0)

    def lost(row: NewRow) -> int:  # right before, taken by the new class after
        after = np.concatenate([old, row.logits(f)[:, None]], 1).argmax(1)
        return int(((old.argmax(1) == labels) & (after == 3)).sum())

    assert lost(greedy) == 240  # a bias that takes everything …
    for cost, most in ((0.01, 3), (0.1, 30), (0.0, 0)):
        capped = cap_bias(greedy, f, old, labels, cost)
        assert lost(capped) == most  # … is lowered to cost ⌊cost·N⌋ of the N, no fewer
        assert (capped.weight == greedy.weight).all()
        # the boundary image stays with its class in float32 too (the served head's precision)
        logits32 = np.concatenate([old, capped.logits(f)[:, None]], 1).astype(np.float32)
        assert int(((old.argmax(1) == labels) & (logits32.argmax(1) == 3)).sum()) <= most
    modest = NewRow(weight=greedy.weight, bias=-50.0, imprinted=np.zeros(8), imprinted_bias=0)
    assert cap_bias(modest, f, old, labels, 0.01) == modest  # never raised
    assert cap_bias(greedy, f, old, labels, 0.9) == greedy  # more than the right ones: no cap
