"""Pages tested the way a person meets them: Debian's Chromium driven by Playwright's Python
API (``executable_path``: no browser download), against the real ``zoo serve`` on loopback
with the real MobileNetV2 and real photos. Each browser test saves a screenshot in its temp
folder. The page's serving (escaping, no outside resources) is checked without a browser too.
"""

from __future__ import annotations

import base64
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serving import free_port, in_process_server, server
from zoo.deploy.serve.config import ServeConfig
from zoo.samples import sample_image_paths

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PHOTOS = {p.stem: p for p in sample_image_paths()}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed: apt-get install chromium (.ci/run does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed: pip install -e '.[test]'")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Watched:
    """A page with every console error, page error and request it made recorded."""

    def __init__(self, browser: Any, origin: str) -> None:
        self.page = browser.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.origin = origin

    def outside(self) -> list[str]:
        return [u for u in self.requests if not u.startswith((self.origin, "data:", "blob:"))]


def _drop(page: Any, path: Path) -> None:
    """Drop ``path`` on the drop zone as a file dragged from the desktop would arrive."""
    data = base64.b64encode(path.read_bytes()).decode()
    transfer = page.evaluate_handle(
        """([data, name]) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const t = new DataTransfer();
            t.items.add(new File([bytes], name, { type: "image/jpeg" }));
            return t;
        }""",
        [data, path.name],
    )
    page.dispatch_event("#drop", "drop", {"dataTransfer": transfer})


def _top(page: Any) -> list[tuple[str, float]]:
    rows = page.locator("#top .prediction")
    return [
        (
            rows.nth(i).locator(".label").inner_text(),
            float(rows.nth(i).locator(".score").inner_text().rstrip(" %")),
        )
        for i in range(rows.count())
    ]


@pytest.mark.browser
@pytest.mark.serve
def test_demo_page_answers_a_chosen_and_a_dropped_photo(
    browser: Any, mobilenet_onnx: Path, tmp_path: Path
) -> None:
    with server(mobilenet_onnx, log=tmp_path / "server.log") as (url, _):
        w = Watched(browser, url)
        page = w.page
        page.goto(url + "/")
        page.wait_for_function("document.getElementById('status').textContent === 'Ready.'")
        assert page.title() == "mobilenet_v2.tv_in1k · zoo serve"
        facts = page.inner_text("#facts")
        assert "1000 classes: tench, goldfish" in facts and "… and 988 more" in facts
        assert "resized to 256 px (bilinear), centre crop 224×224, 3 channels" in facts
        assert "mean [0.485, 0.456, 0.406]" in facts

        page.set_input_files("#file", str(PHOTOS["chelsea"]))  # choosing submits at once
        page.wait_for_function("document.getElementById('status').textContent === 'chelsea.jpg'")
        top = _top(page)
        assert len(top) == 5 and top[0][0] == "Egyptian cat"
        assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)
        widths = page.eval_on_selector_all(".bar", "bars => bars.map(b => b.style.width)")
        assert widths[0] == f"{top[0][1]:.1f}%"
        assert re.fullmatch(
            r"answered in \d+ ms \(round trip, upload included\)", page.inner_text("#timing")
        )
        assert page.eval_on_selector("#photo", "img => img.complete && img.naturalWidth") == 451

        _drop(page, PHOTOS["coffee"])  # dropping submits at once too
        page.wait_for_function("document.getElementById('status').textContent === 'coffee.jpg'")
        assert _top(page)[0][0] == "espresso"
        page.screenshot(path=str(tmp_path / "demo.png"), full_page=True)
        assert w.errors == [] and w.outside() == []

        note = tmp_path / "note.jpg"  # not an image: the server's 400 reason, shown in red
        note.write_text("not a picture")
        page.set_input_files("#file", str(note))
        page.wait_for_function("document.getElementById('error').textContent !== ''")
        assert page.inner_text("#error").startswith("note.jpg: Cannot decode")
        assert page.is_hidden("#result")
        page.screenshot(path=str(tmp_path / "demo-error.png"))
    assert (tmp_path / "demo.png").stat().st_size > 10_000


def test_demo_page_is_served_escaped_and_self_contained(mobilenet_onnx: Path) -> None:
    """No browser needed: the model name is escaped into the page, and the page names no
    resource outside the server (no CDN, no fonts, no scripts from elsewhere)."""
    cfg = ServeConfig(str(mobilenet_onnx), name='cats"<dogs>&', port=free_port(), threads=1)
    with in_process_server(cfg) as (url, _):
        r = httpx.get(url + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert '<meta name="zoo-model" content="cats&quot;&lt;dogs&gt;&amp;">' in page
    assert "<dogs>" not in page and "{{MODEL}}" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
