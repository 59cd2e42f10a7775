"""report.html and the documentation site in a real browser: Debian's chromium (/usr/bin/chromium) driven by
Playwright's Python client (never ``playwright install``: the system chromium is used). Slow; skips with the reason
where chromium, Playwright or (for the site) the docs extra is absent. Not run by .ci/run.

Each page is opened with every request routed: only file:// and 127.0.0.1 may load, anything else is aborted and
fails the test. No console error, no page error; each plot (an inline SVG) has a non-blank box (pixel variance inside
its bounding box); every internal link resolves (the file exists and holds the #id). A screenshot per page goes to
artifacts/screenshots/ (CI keeps artifacts/).
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
SHOTS = ROOT / "artifacts" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no chromium at {CHROMIUM} (apt-get install -y chromium)"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                       reason="playwright is not installed (pip install -e '.[browser]')"),
]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("file", "data", "blob", "about") or parts.hostname in ("127.0.0.1", "localhost")


def visit(browser, url: str, shot: str):
    """Open url with every request checked; return the page, the requests that tried to leave, and the errors."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    left, errors = [], []

    def route(r):
        if local(r.request.url):
            r.continue_()
        else:
            left.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(url, wait_until="load")
    page.wait_for_timeout(300)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{shot}.png"))
    return page, left, errors


def plot_variances(page, limit: int = 6) -> list[float]:
    """Grey-level variance of the pixels inside each of the first plots' (SVG) bounding boxes."""
    from PIL import Image, ImageStat
    out = []
    for svg in page.locator("svg").all()[:limit]:
        box = svg.bounding_box()
        if not box or box["width"] < 50 or box["height"] < 30:
            continue  # icons, not plots
        svg.scroll_into_view_if_needed()
        img = Image.open(io.BytesIO(svg.screenshot())).convert("L")
        out.append(ImageStat.Stat(img).var[0])
    return out


def broken_links(page) -> list[str]:
    """Links to this machine's files whose file or #id is not there."""
    bad = []
    for href in page.eval_on_selector_all("a[href]", "els => els.map(a => a.href)"):
        parts = urlsplit(href)
        if parts.scheme == "file":
            path = Path(unquote(parts.path))
        elif parts.hostname in ("127.0.0.1", "localhost"):
            path = SITE_ROOT[0] / unquote(parts.path).lstrip("/")
            path = path / "index.html" if path.is_dir() else path
        else:
            continue
        if not path.exists():
            bad.append(href)
        elif parts.fragment and path.suffix == ".html":
            if not re.search(rf'id="{re.escape(unquote(parts.fragment))}"', path.read_text(errors="replace")):
                bad.append(href)
    return bad


SITE_ROOT: list[Path] = [ROOT]


def mhaexport(*args: str, ok: tuple[int, ...] = (0,)) -> None:
    res = subprocess.run([str(Path(sys.executable).parent / "mhaexport"), *args], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert res.returncode in ok, res.stdout[-2000:] + res.stderr[-2000:]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Three verify reports: the tiny preset (passes), a planted mask bug (fails), the windowed preset (passes)."""
    base = tmp_path_factory.mktemp("browser-reports")
    bugs = ROOT / "tests" / "planted" / "bugs.py"
    mhaexport("onnx", "--config", "tiny", "-o", str(base / "tiny"))
    mhaexport("verify", str(base / "tiny"), "--runtime", "ort-cpu", "-o", str(base / "pass"))
    mhaexport("onnx", "--model", f"{bugs}:no_mask", "-o", str(base / "bug"))
    mhaexport("verify", str(base / "bug"), "--runtime", "ort-cpu", "--trust-code", "-o", str(base / "fail"),
              ok=(1,))
    mhaexport("onnx", "--config", "tiny-window", "-o", str(base / "w"))
    mhaexport("verify", str(base / "w"), "--runtime", "ort-cpu", "-o", str(base / "window"))
    return {name: base / name / "report.html" for name in ("pass", "fail", "window")}


@pytest.mark.parametrize("name", ["pass", "fail", "window"])
def test_report_html_in_chromium(browser, reports, name):
    page, left, errors = visit(browser, reports[name].as_uri(), f"report-{name}")
    assert not left, f"requests that left the machine: {left}"
    assert not errors, errors
    text = page.inner_text("body")
    assert ("failed" in text.lower()) if name == "fail" else (" 0 failed" in text), text[:500]
    variances = plot_variances(page)
    assert len(variances) >= 2, "fewer than two plots rendered"
    assert min(variances) > 20, f"a blank plot (grey-level variance per plot): {variances}"
    assert not broken_links(page), broken_links(page)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The built site (docs extra), served on 127.0.0.1 (the theme's search worker does not load from file://)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("the docs extra is not installed (pip install -e '.[docs]')")
    from test_docs_site import build_site
    dest = tmp_path_factory.mktemp("site") / "site"
    res = build_site(dest)
    assert res.returncode == 0, res.stderr[-3000:]
    SITE_ROOT[0] = dest
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(dest))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()  # the listening socket too (an unclosed socket is an error in the tests)
    shutil.rmtree(dest, ignore_errors=True)


@pytest.mark.parametrize("page_name", ["index", "verify", "reference", "untrusted-folders", "bench", "api"])
def test_site_pages_in_chromium(browser, site, page_name):
    page, left, errors = visit(browser, f"{site}/{page_name}.html", f"site-{page_name}")
    assert not left, f"requests that left the machine: {left}"
    assert not errors, errors
    assert page.locator("nav").count() > 0 and page.locator("h1, h2").count() > 0
    assert not broken_links(page), broken_links(page)
