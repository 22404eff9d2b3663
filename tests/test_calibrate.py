"""Calibration (issue #33): the temperature fit against a known answer, then the user's chain
on a real run (SimpleCNN fine-tuned on real digits): ``zoo finetune --reject auto`` stores the
temperature and rule, ``zoo eval`` judges them, ``zoo export`` carries them into the ONNX
metadata, ``zoo calibrate`` refits an older run to the same value, and the report shows the
reliability diagram before and after."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import zoo_here
from zoo.calibration import (
    DEFAULT_SCORE,
    MIN_FIT_IMAGES,
    TEMPERATURE_RANGE,
    Calibration,
    Rejection,
    TemperatureFit,
    ood_score,
)
from zoo.errors import ArtifactError
from zoo.train.calibrate import (
    acceptance_cut,
    fit_calibration,
    fit_rejection,
    fit_temperature,
)
from zoo.train.calibration import ece_of


def test_fit_temperature_recovers_the_temperature_labels_were_drawn_at() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(20000, 5, generator=g) * 3
    y = torch.multinomial(torch.softmax(z / 2.5, 1), 1, generator=g)[:, 0]
    assert fit_temperature(z, y) == pytest.approx(2.5, rel=0.05)
    assert fit_temperature(z * 2.5, y) == pytest.approx(6.25, rel=0.05)  # over-confident logits


def test_calibration_lowers_the_nll_and_keeps_every_top1() -> None:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2000, 10, generator=g) * 6  # far too sharp for labels drawn at T = 3
    y = torch.multinomial(torch.softmax(z / 3, 1), 1, generator=g)[:, 0]
    cal = fit_calibration(z, y)
    assert cal.fit is not None and cal.fit.kept and cal.why_not_kept() is None  # a real fit
    assert cal.temperature == cal.fit.temperature == pytest.approx(3.0, rel=0.1)
    assert cal.temperature_line().startswith(f"temperature {cal.temperature:.4g}, expected")
    nll = torch.nn.functional.cross_entropy
    assert nll(z / cal.temperature, y) < nll(z, y)
    assert cal.ece_after < 0.5 * cal.ece_before  # the goal, on a known miscalibration
    probs = cal.probabilities(z.numpy())
    assert (probs.argmax(1) == z.numpy().argmax(1)).all()
    assert cal.ece_after == pytest.approx(ece_of(z, y, cal.temperature), abs=1e-6)


def test_a_perfectly_separated_set_keeps_the_raw_softmax_and_says_why() -> None:
    """Every top-1 right: the NLL falls all the way to T → 0, so the fit runs to the bound and
    would make every answer read 1.0000 (the issue's 15-image run); kept at T = 1 instead."""
    lo = TEMPERATURE_RANGE[0]
    for n in (15, 200):  # too few, and plenty: separated either way
        z = torch.randn(n, 4, generator=torch.Generator().manual_seed(n))
        y = z.argmax(1)
        assert fit_temperature(z, y) == lo
        cal = fit_calibration(z, y, reject="msp")
        assert cal.temperature == 1.0 and cal.fit is not None and not cal.fit.kept
        assert cal.fit.temperature == lo and cal.fit.not_kept[0] == "separated"
        assert ("too_few" in cal.fit.not_kept) == (n < MIN_FIT_IMAGES)
        assert cal.ece_after == cal.ece_before == pytest.approx(ece_of(z, y, 1.0), abs=1e-6)
        assert cal.reject is not None  # the rule is fitted at the kept temperature
        assert cal.reject == fit_rejection(z, "msp", 1.0, 0.95)
    assert cal.why_not_kept() == "the fit ran to the bound 0.01 (validation perfectly separated)"
    small = fit_calibration(*(lambda z: (z, z.argmax(1)))(torch.eye(4).repeat(4, 1)[:15] * 3))
    assert small.temperature_line() == (
        "temperature kept at 1: the fit ran to the bound 0.01 (validation perfectly separated, "
        f"15 images: too few to calibrate); expected calibration error {small.ece_before:.4f} on "
        "15 validation images"
    )
    d = small.to_dict()
    assert d["temperature"] == 1.0 and d["fit"]["kept"] is False
    assert d["fit"]["not_kept"] == ["separated", "too_few"] and "too few" in d["fit"]["why"]
    # zoo calibrate --split test: the stored reason names the images it was fitted on
    on_test = fit_calibration(
        *(lambda z: (z, z.argmax(1)))(torch.eye(4).repeat(4, 1)[:15] * 3), images="test"
    )
    back = Calibration.from_dict(on_test.to_dict(), where="config.json")
    assert back.fitted_images == "test" and back == on_test
    assert on_test.to_dict()["fit"]["why"].startswith(
        "the fit ran to the bound 0.01 (test perfectly"
    )
    assert on_test.temperature_line().endswith("on 15 test images")


def test_a_fit_that_raises_the_ece_keeps_the_raw_softmax() -> None:
    """40 images, 38 right at a calibrated 0.95 and two confident errors: the NLL optimum
    (T ≈ 1.4) softens the right ones to pay for the errors, and the ECE rises."""
    m = float(np.log(0.95 / 0.05))
    z = torch.tensor([[m, 0.0]] * 38 + [[6.0, 0.0]] * 2, dtype=torch.float64)
    y = torch.tensor([0] * 38 + [1] * 2)
    cal = fit_calibration(z, y)
    assert cal.fit is not None and cal.fit.not_kept == ("ece_not_lowered",)
    assert 1.2 < cal.fit.temperature < 1.6 and cal.fit.ece > cal.ece_before
    assert cal.temperature == 1.0 and cal.ece_after == cal.ece_before
    assert cal.why_not_kept() == (
        f"the fit (T {cal.fit.temperature:.4g}) raised the ECE {cal.ece_before:.4f} → "
        f"{cal.fit.ece:.4f}"
    )


def test_a_fit_at_the_upper_bound_or_on_too_few_images_keeps_the_raw_softmax() -> None:
    g = torch.Generator().manual_seed(3)
    z, y = torch.randn(400, 4, generator=g) * 3, torch.randint(0, 4, (400,), generator=g)
    cal = fit_calibration(z, y)  # logits unrelated to the labels: uniform is the NLL optimum
    assert cal.fit is not None and cal.fit.not_kept[0] == "upper_bound"
    assert cal.temperature == 1.0 and cal.fit.temperature >= 0.95 * TEMPERATURE_RANGE[1]
    assert "ran to the bound 100" in (cal.why_not_kept() or "")
    z = torch.randn(7, 5, generator=g) * 6  # over-confident, but seven images
    y = torch.multinomial(torch.softmax(z / 3, 1), 1, generator=g)[:, 0]
    y[0] = (z[0].argmax() + 1) % 5  # one error: not separated
    cal = fit_calibration(z, y)
    assert cal.temperature == 1.0 and cal.fit is not None and "too_few" in cal.fit.not_kept
    assert (cal.why_not_kept() or "").endswith("(7 images: too few to calibrate)")


def test_rejection_threshold_is_the_conformal_quantile() -> None:
    logits = torch.randn(101, 4, generator=torch.Generator().manual_seed(2))
    s = np.sort(ood_score(logits.numpy(), "energy"))
    for acceptance, rank in ((0.5, 51), (0.9, 10), (0.95, 5), (0.99, 1), (1.0, 0)):
        rule = fit_rejection(logits, "energy", 1.0, acceptance)  # rank: ⌊(1 − a)·102⌋
        assert rule.threshold == s[max(rank - 1, 0)]
        assert (s >= rule.threshold).mean() >= acceptance
    with pytest.raises(Exception, match=r"--accept.*\(0, 1\]"):
        fit_rejection(logits, "msp", 1.0, 1.5)


def test_rejection_threshold_accepts_the_share_asked_of_new_images() -> None:
    # the promise is about images the fit never saw: averaged over many draws of N validation
    # scores and one new image from the same distribution, it accepts at least 95%; the
    # empirical quantile (the ⌊0.05·N⌋ + 1-th lowest) falls short of it
    rng = np.random.default_rng(0)
    draws, n = 20000, 30
    val, new = rng.normal(size=(draws, n)), rng.normal(size=draws)
    cuts = np.array([acceptance_cut(v, 0.95) for v in val])
    empirical = np.sort(val, axis=1)[:, int(0.05 * n)]
    assert (new >= cuts).mean() >= 0.95 - 0.004  # 1 − 1/31 = 0.968 expected
    assert (new >= empirical).mean() < 0.95 - 0.004  # 1 − 2/31 = 0.935 expected


def test_scores_by_hand() -> None:
    x = np.array([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert ood_score(x, "energy") == pytest.approx(np.log(np.exp(x).sum(1)))
    e = np.exp(x / 2)
    assert ood_score(x, "msp", 2.0) == pytest.approx((e / e.sum(1, keepdims=True)).max(1))


def test_calibration_round_trip_and_malformed_values() -> None:
    cal = Calibration(
        2.0, Rejection("msp", 0.7, 0.95), fitted_on=10, ece_before=0.2, ece_after=0.05
    )
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict())), where="x") == cal
    kept_at_1 = Calibration(
        1.0, fitted_on=15, ece_before=0.6, ece_after=0.6,
        fit=TemperatureFit(0.01, 0.0001, ("separated", "too_few")),
    )  # fmt: skip
    assert Calibration.from_dict(json.loads(json.dumps(kept_at_1.to_dict())), where="x") == (
        kept_at_1
    )
    old = {k: v for k, v in cal.to_dict().items() if k != "fit"}  # written before fits were judged
    assert Calibration.from_dict(old, where="x").fit is None
    with pytest.raises(ArtifactError, match=r"malformed.*must be a name such as separated"):
        Calibration.from_dict(
            {"temperature": 1, "fit": {"temperature": 2, "not_kept": [3]}}, where="cfg.json"
        )
    with pytest.raises(ArtifactError, match=r"malformed.*must be a list of names"):
        Calibration.from_dict(
            {"temperature": 1, "fit": {"temperature": 2, "not_kept": "too_few"}}, where="cfg.json"
        )
    with pytest.raises(ArtifactError, match=r"cfg.json: calibration is malformed.*positive"):
        Calibration.from_dict({"temperature": -1}, where="cfg.json")
    with pytest.raises(ArtifactError, match=r"Unknown rejection score 'mahalanobis'"):
        Calibration.from_dict(
            {
                "temperature": 1,
                "reject": {"score": "mahalanobis", "threshold": 1, "acceptance": 0.9},
            },
            where="cfg.json",
        )


def test_a_newer_zoos_unknown_not_kept_reason_still_reads() -> None:
    """A newer zoo may judge its fits by a reason this version does not know: the calibration
    still reads, not kept (T = 1, the raw softmax, as written), the reason said by name, and
    written back unchanged."""
    d = {
        "temperature": 1.0, "fitted_on": 400, "ece_before": 0.1, "ece_after": 0.1,
        "fit": {"temperature": 2.5, "ece": 0.02, "kept": False,
                "not_kept": ["drifted"], "why": "a newer zoo's words"},
    }  # fmt: skip
    cal = Calibration.from_dict(d, where="config.json")
    assert cal.temperature == 1.0 and cal.fit is not None and not cal.fit.kept
    assert cal.why_not_kept() == (
        "the fit (T 2.5) is not trusted (a reason this zoo version does not know: drifted)"
    )
    assert cal.temperature_line().startswith("temperature kept at 1: the fit (T 2.5)")
    assert cal.to_dict()["fit"]["not_kept"] == ["drifted"]
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict())), where="x") == cal


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """21 real photographs (scikit-image's): images from outside any digit class."""
    from zoo.samples import write_photo_folder

    return write_photo_folder(tmp_path_factory.mktemp("ood") / "photos", per_class=3)


@pytest.fixture(scope="module")
def run(four_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("calib")
    r = zoo_here(
        "finetune", "simple_cnn", "--data", str(four_digits), "--epochs", "2", "--runs",
        str(runs), "--name", "cnn", "--num-workers", "0", "--no-progress", "--reject", "auto",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "calibration: temperature " in r.stderr and f"rejects below {DEFAULT_SCORE}" in r.stderr
    return runs / "cnn"


def _config(run: Path) -> dict:
    return json.loads((run / "model" / "config.json").read_text())


def test_eval_of_four_classes_says_top_1_and_no_top_5(run: Path) -> None:
    """Among five classes or fewer every label is in the top five: ``zoo eval`` leaves top-5
    out (JSON and summary line) and still calls the accuracy top-1, not exact-match."""
    r = zoo_here("eval", str(run), "--json")
    assert r.returncode == 0, r.stderr
    assert "top5" not in json.loads(r.stdout)
    r = zoo_here("eval", str(run))
    assert r.returncode == 0, r.stderr
    assert "top-1 " in r.stdout and "top-5" not in r.stdout and "exact-match" not in r.stdout


def test_finetune_stores_the_fit_and_eval_judges_it(run: Path) -> None:
    cal = Calibration.from_dict(_config(run)["calibration"], where="config")
    report = json.loads((run / "report.json").read_text())
    assert report["calibration"] == cal.to_dict()
    assert cal.fitted_on == len(json.loads((run / "split.json").read_text())["splits"]["val"])
    assert cal.reject is not None and cal.reject.score == DEFAULT_SCORE
    assert cal.reject.acceptance == 0.95
    e = zoo_here("eval", str(run), "--json")
    assert e.returncode == 0, e.stderr
    result = json.loads(e.stdout)
    # the same weights on the same split: the fit's figures, and the run's own accuracy
    assert result["calibration"] == {
        "temperature": cal.temperature,
        "ece_before": cal.ece_before,
        "ece_after": cal.ece_after,
    }
    assert result["acc"] == pytest.approx(report["best"]["val/acc"])


def test_export_carries_the_calibration(run: Path) -> None:
    from zoo.onnx_meta import read_calibration, read_metadata

    r = zoo_here("export", str(run))
    assert r.returncode == 0, r.stderr
    onnx_file = run / "model" / "model.onnx"
    stored = read_calibration(read_metadata(onnx_file), onnx_file)
    assert stored == Calibration.from_dict(_config(run)["calibration"], where="config")


def test_predict_answers_calibrated_probabilities(run: Path, four_digits: Path) -> None:
    """The ONNX file (metadata alone) and the run through PyTorch give softmax(logits / T)."""
    from zoo.factory import create_model, info_of
    from zoo.images import open_image
    from zoo.transforms import eval_transform

    onnx_file = run / "model" / "model.onnx"
    if not onnx_file.exists():
        assert zoo_here("export", str(run)).returncode == 0
    images = sorted((four_digits / "digit_7").iterdir())[:3]
    net = create_model(str(run)).eval()
    info = info_of(net)
    x = torch.stack([eval_transform(info)(open_image(p)) for p in images])
    with torch.inference_mode():
        logits = net(x).double().numpy()
    t = info.calibration.temperature
    want = Calibration(t).probabilities(logits)
    assert t != pytest.approx(1.0)  # a fitted temperature, so the check below means something
    for model in (str(run), str(onnx_file)):
        r = zoo_here("predict", model, *map(str, images), "-k", "2", "--json")
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        for row, p, z in zip(got, want, logits, strict=True):
            top = row["top"][0]
            assert top["index"] == int(p.argmax()) == int(z.argmax())
            assert top["score"] == pytest.approx(p.max(), abs=1e-4)


def test_calibrate_an_older_run_refits_the_same_value(run: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"
    shutil.copytree(run, old, symlinks=True)
    config = _config(old)
    fitted = config.pop("calibration")
    (old / "model" / "config.json").write_text(json.dumps(config))  # as zoo wrote it before
    e = zoo_here("eval", str(old), "--json")
    assert e.returncode == 0 and "calibration" not in json.loads(e.stdout)
    c = zoo_here("calibrate", str(old), "--reject", "auto", "--json")
    assert c.returncode == 0, c.stderr
    refit = json.loads(c.stdout)
    assert refit["temperature"] == pytest.approx(fitted["temperature"], rel=1e-6)
    assert refit["reject"]["threshold"] == pytest.approx(fitted["reject"]["threshold"], rel=1e-6)
    assert _config(old)["calibration"]["temperature"] == refit["temperature"]
    # weights untouched: the folder still reads (its hash holds)
    assert _config(old)["weights_sha256"] == config["weights_sha256"]
    m = zoo_here("calibrate", str(old), "--reject", "msp", "--acceptance", "0.8", "--json")
    assert m.returncode == 0, m.stderr
    assert json.loads(m.stdout)["reject"] == {
        "score": "msp",
        "threshold": pytest.approx(json.loads(m.stdout)["reject"]["threshold"]),
        "acceptance": 0.8,
    }


def test_an_export_made_before_zoo_calibrate_reads_as_stale_until_exported_again(
    run: Path, four_digits: Path, tmp_path: Path
) -> None:
    """``zoo export`` → ``zoo calibrate`` (another rule) → the export still carries the old
    calibration, which predict and serve apply: calibrate names it with the refresh command,
    loading it warns once, ``zoo list --json`` flags it; ``zoo export`` again clears it."""
    cal = tmp_path / "runs" / "cnn"
    shutil.copytree(run, cal, symlinks=True)
    assert zoo_here("export", str(cal)).returncode == 0
    onnx_file, image = (
        cal / "model" / "model.onnx",
        str(sorted((four_digits / "digit_7").iterdir())[0]),
    )
    fresh = zoo_here("predict", str(onnx_file), image)
    assert fresh.returncode == 0 and "warning" not in fresh.stderr, fresh.stderr
    c = zoo_here("calibrate", str(cal), "--reject", "msp", "--acceptance", "0.8")
    assert c.returncode == 0, c.stderr
    said = [line for line in c.stderr.splitlines() if line.startswith("warning:")]
    assert len(said) == 1 and str(onnx_file) in said[0], c.stderr
    assert said[0].endswith(f"refresh it: zoo export {cal}"), said[0]
    p = zoo_here("predict", str(onnx_file), image)
    warned = [line for line in p.stderr.splitlines() if line.startswith("warning:")]
    assert p.returncode == 0 and len(warned) == 1 and "another calibration" in warned[0]
    listed = json.loads(
        zoo_here("list", f"{cal.parent}/*", "--runs", str(cal.parent), "--json").stdout
    )
    assert [v["calibration_stale"] for v in listed[0]["variants"]] == [True]
    assert [v["stale"] for v in listed[0]["variants"]] == [False]  # the weights are the same
    assert zoo_here("export", str(cal)).returncode == 0  # the refresh command
    again = zoo_here("predict", str(onnx_file), image)
    assert again.returncode == 0 and "warning" not in again.stderr, again.stderr


def test_calibrate_on_too_few_images_keeps_t_1_and_says_so(
    run: Path, four_digits: Path, tmp_path: Path
) -> None:
    few = tmp_path / "few"
    for d in sorted(four_digits.iterdir()):
        (few / d.name).mkdir(parents=True)
        for p in sorted(d.iterdir())[:3]:
            (few / d.name / p.name).symlink_to(p.resolve())
    cal = tmp_path / "cnn"
    shutil.copytree(run, cal, symlinks=True)
    c = zoo_here("calibrate", str(cal), "--data", str(few), "--reject", "msp", "--json")
    assert c.returncode == 0, c.stderr
    got = json.loads(c.stdout)
    assert got["fitted_on"] == 12 and got["temperature"] == 1.0
    assert got["fit"]["kept"] is False and "too_few" in got["fit"]["not_kept"]
    assert got["ece_after"] == got["ece_before"]
    assert f"temperature kept at 1: {got['fit']['why']}" in c.stderr
    assert "12 images: too few to calibrate" in got["fit"]["why"]
    stored = Calibration.from_dict(_config(cal)["calibration"], where="config")
    assert stored.temperature == 1.0 and stored.fit is not None and not stored.fit.kept
    assert stored.reject is not None and stored.reject.score == "msp"
    assert got["split"] == "all" and got["fitted_images"] == stored.fitted_images == "held-out"
    line = zoo_here("calibrate", str(cal), "--data", str(few))
    assert line.returncode == 0, line.stderr
    assert line.stdout.startswith("temperature kept at 1: the fit (T ")
    assert " on 12 held-out images (accuracy " in line.stdout  # not "all images"


def test_calibrate_refuses_bad_input(run: Path) -> None:
    r = zoo_here("calibrate", "simple_cnn")
    assert r.returncode == 1 and "not a run or model folder" in r.stderr
    r = zoo_here("calibrate", str(run), "--split", "train")
    assert r.returncode == 2 and "overfits the temperature" in r.stderr  # a usage error
    r = zoo_here("calibrate", str(run), "--split", "all")  # the run's own: training included
    assert r.returncode == 2 and "includes its training images" in r.stderr, r.stderr
    r = zoo_here("calibrate", str(run), "--acceptance", "1.5")
    assert r.returncode == 2 and "must be in (0, 1]" in r.stderr
    r = zoo_here("calibrate", str(run), "--reject", "mahalanobis")
    assert r.returncode == 2 and "knn" in r.stderr  # the valid ones named


def test_report_shows_before_and_after_and_the_outside_images(run: Path, photos: Path) -> None:
    e = zoo_here("eval", str(run), "--report", "--ood", str(photos), "--json")
    assert e.returncode == 0, e.stderr
    result = json.loads(e.stdout)
    page = (run / "report.html").read_text()
    c = result["calibration"]
    assert page.count('aria-label="reliability diagram"') == 2
    assert f"raw softmax: ECE {c['ece_before']:.4f}" in page
    assert f"ECE {c['ece_after']:.4f}</figcaption>" in page
    ood = result["ood"]
    assert ood["n_out"] == 21 and ood["n_in"] == result["n"]
    for kind, s in ood["scores"].items():
        assert 0.0 <= s["auroc"] <= 1.0
        assert f"<tr><td>{kind}</td><td>{s['auroc']:.4f}</td>" in page
    # the stored rule, fitted on these very images, accepts its share of them
    assert ood["accepted_in"] >= 0.95
    assert f"rejects <b>{ood['rejected_out']:.1%}</b>" in page
