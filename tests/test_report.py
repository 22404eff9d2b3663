"""``zoo eval RUN --report`` on a real run (SimpleCNN fine-tuned on real digits): the file's
contents against the run's own figures, then the page in Debian's Chromium (no console errors,
every embedded image decodes, a confusion-matrix link lands on its images). The arithmetic
under it is in test_gates_report.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_zoo
from tests.test_browser import browser  # noqa: F401  # the shared Chromium fixture


@pytest.fixture(scope="module")
def report(small_digits: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    runs = tmp_path_factory.mktemp("report")
    r = run_zoo(
        "finetune", "simple_cnn", "--data", str(small_digits), "--epochs", "2", "--runs",
        str(runs), "--name", "cnn", "--num-workers", "0", "--no-progress", "--report",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"report: {runs / 'cnn' / 'report.html'} (" in r.stderr  # written by the run itself
    first = (runs / "cnn" / "report.html").read_text()
    e = run_zoo("eval", str(runs / "cnn"), "--report", "--json")
    assert e.returncode == 0, e.stderr
    result = json.loads(e.stdout)
    assert f"accuracy {result['acc']:.4f}" in first and 'id="losses"' in first
    return runs / "cnn", result


def test_report_holds_the_runs_figures_and_links_every_cell(report: tuple[Path, dict]) -> None:
    run, result = report
    page_file = run / "report.html"
    assert result["report"]["path"] == str(page_file) and page_file.exists()
    assert result["report"]["grad_cam"] == "features"  # SimpleCNN's last feature map
    page = page_file.read_text()
    assert f"accuracy {result['acc']:.4f}" in page and f"macro-F1 {result['macro_f1']:.4f}" in page
    for row in result["per_class"]:
        assert f"<td>{row['class']}</td><td>{row['precision']:.3f}</td>" in page
    cm = result["confusion_matrix"]
    cells = {(t, p) for t, row in enumerate(cm) for p, v in enumerate(row) if v}
    assert {tuple(map(int, m)) for m in re.findall(r'href="#cell-(\d+)-(\d+)"', page)} == cells
    assert {tuple(map(int, m)) for m in re.findall(r'id="cell-(\d+)-(\d+)"', page)} == cells
    for t, p in cells:  # each section says how many images the cell counts
        assert re.search(rf'id="cell-{t}-{p}"><h3>[^<]*: {cm[t][p]}</h3>', page)
    losses = page.split('id="losses">')[1].split("</div>\n")[0]
    assert losses.count('class="card"') == 16 and losses.count('class="cam"') == 16
    assert result["report"]["images"] == page.count('src="data:image/')
    assert 'alt="training curves"' in page  # the run's curves.png, embedded
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)


def test_report_out_needs_report(report: tuple[Path, dict]) -> None:
    from typer.testing import CliRunner

    from zoo.cli.app import app

    r = CliRunner().invoke(app, ["eval", str(report[0]), "--report-out", "x.html"])
    assert r.exit_code == 2 and "--report-out applies to --report only" in r.output


def test_report_out_that_is_a_folder_is_refused_before_the_evaluation(
    report: tuple[Path, dict], tmp_path: Path
) -> None:
    from tests.conftest import zoo_here

    r = zoo_here("eval", str(report[0]), "--report", "--report-out", str(tmp_path))
    assert r.returncode == 1, r.stderr
    assert f"--report-out {tmp_path} is a folder" in r.stderr
    assert f"--report-out {tmp_path / 'report.html'}" in r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file left


@pytest.mark.browser
def test_report_page_in_a_real_browser(
    browser: Any,  # noqa: F811
    report: tuple[Path, dict],
    tmp_path: Path,
) -> None:
    run, result = report
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((run / "report.html").as_uri())
    undecoded = page.eval_on_selector_all(
        "img", "imgs => imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length"
    )
    assert page.locator("img").count() == result["report"]["images"] and undecoded == 0
    link = page.locator("#pairs a").first  # the most-confused pair
    href = link.get_attribute("href")
    assert href is not None
    link.click()
    assert page.evaluate("location.hash") == href
    section = page.locator("section.cell:target")
    assert section.get_attribute("id") == href[1:] and section.is_visible()
    box = section.bounding_box()
    assert box is not None and -1 <= box["y"] < 900  # scrolled to it (to the subpixel)
    assert section.locator("img").count() >= 1
    page.screenshot(path=str(tmp_path / "report.png"))
    page.goto((run / "report.html").as_uri() + "#losses")
    page.screenshot(path=str(tmp_path / "report-losses.png"))
    assert errors == []


def test_tta_gain_is_measured_in_the_same_pass(report: tuple[Path, dict], tmp_path: Path) -> None:
    """`--tta flip`: the metrics are the views' mean, `tta.without` is the plain crop's from
    the same pass (the plain evaluation's figures, up to batch-size rounding), and the report
    states the gain. (Crops for a model that resizes to its crop: test_gates_tta.py.)"""
    run, plain = report
    page_file = tmp_path / "tta.html"
    e = run_zoo(
        "eval", str(run), "--tta", "flip", "--report", "--report-out", str(page_file), "--json"
    )
    assert e.returncode == 0, e.stderr
    got = json.loads(e.stdout)
    without = got["tta"]["without"]
    assert got["tta"]["mode"] == "flip" and got["tta"]["views"] == 2
    assert abs(without["acc"] - plain["acc"]) <= 1 / plain["n"] + 1e-9
    assert without["loss"] == pytest.approx(plain["loss"], abs=1e-4)
    assert got["loss"] != pytest.approx(plain["loss"], abs=1e-4)  # the views changed something
    page = page_file.read_text()
    gain = got["acc"] - without["acc"]
    assert f"a change of <b>{gain:+.4f}</b>" in page and f"accuracy {got['acc']:.4f}" in page


def test_eval_on_a_foreign_folder_uses_all_of_it(
    report: tuple[Path, dict], four_digits: Path
) -> None:
    """A folder the run did not train on (four of its classes): every image is evaluated, and
    only the classes met are listed and averaged."""
    e = run_zoo("eval", str(report[0]), "--data", str(four_digits), "--json")
    assert e.returncode == 0, e.stderr
    got = json.loads(e.stdout)
    assert got["split"] == "all" and got["n"] == 120
    met = [r for r in got["per_class"] if r["support"] or r["predicted"]]
    assert {r["class"] for r in met if r["support"]} == {f"digit_{d}" for d in (1, 3, 7, 8)}
    assert got["macro_f1"] == pytest.approx(sum(r["f1"] for r in met) / len(met), abs=1e-6)
    # an explicit --split is honoured (it was silently "all"): zoo's seeded split of the folder
    e = run_zoo("eval", str(report[0]), "--data", str(four_digits), "--split", "val", "--json")
    assert e.returncode == 0, e.stderr
    got = json.loads(e.stdout)
    assert got["split"] == "val" and 0 < got["n"] < 120
    e = run_zoo("eval", str(report[0]), "--data", str(four_digits), "--split", "vall")
    assert e.returncode == 2 and "val" in e.stderr and "Traceback" not in e.stderr


def test_report_says_why_a_fitted_temperature_was_not_kept(
    report: tuple[Path, dict], tmp_path: Path
) -> None:
    """A run whose fit zoo did not trust (here: written as fitted on 15 test images that were
    perfectly separated) gets the raw softmax, and the page says why, not just "T = 1"."""
    import shutil

    import torch

    from zoo.artifact import write_calibration
    from zoo.train.calibrate import fit_calibration

    run = tmp_path / "cnn"
    shutil.copytree(report[0], run)
    z = torch.eye(4).repeat(4, 1)[:15] * 3
    cal = fit_calibration(z, z.argmax(1), images="test")
    write_calibration(run / "model", cal)
    e = run_zoo("eval", str(run), "--report", "--json")
    assert e.returncode == 0, e.stderr
    page = (run / "report.html").read_text()
    assert (
        "Probabilities are the raw softmax (T = 1): the temperature fitted on 15 test images"
        in page
    )
    assert "was not kept, because the fit ran to the bound 0.01 (test perfectly separated" in page
    assert "after temperature scaling" not in page
