"""Screenshots of mhaexport's HTML pages at 1280 px wide: Debian's chromium (/usr/bin/chromium) driven headless by
Playwright's Python client (pip install -e '.[browser]'; never ``playwright install``), every request that would
leave the machine refused, as tests/test_browser.py does.

    python scripts/screenshots.py OUT NAME=PAGE [NAME=PAGE ...] [--full]

PAGE: a file (report.html, bench.html) or a built site's folder (served on 127.0.0.1 while shot). Each page is
shot at 1280 x 900 (the first screen; ``--full``: the whole page) into OUT/NAME.png as an 8-bit palette PNG (small
enough to commit), and one line per page is printed: its name, the PNG's size and the page's scrollWidth (more
than 1280: something is wider than the window) and the widest table's overflow (a table that scrolls inside hides
its last columns).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import io
import threading
from pathlib import Path
from urllib.parse import urlsplit

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
WIDTH, HEIGHT = 1280, 900

# how far the widest table's content runs past its box (px; 0: every column shows)
TABLE_OVERFLOW = "Math.max(0, ...[...document.querySelectorAll('table')].map(t => t.scrollWidth - t.clientWidth))"


def _local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("file", "data", "blob", "about") or parts.hostname in ("127.0.0.1", "localhost")


def _serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # no line per request on stderr
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _png(raw: bytes, path: Path) -> None:
    """The screenshot as an adaptive-palette PNG (pages are flat colours and text: 256 colours lose nothing seen)."""
    from PIL import Image

    Image.open(io.BytesIO(raw)).convert("RGB").quantize(256).save(path, optimize=True)


def shoot(out: Path, pages: dict[str, Path], full: bool = False) -> list[str]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    lines = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            for name, target in pages.items():
                server = None
                if target.is_dir():
                    server, url = _serve(target)
                else:
                    url = target.resolve().as_uri()
                context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT})
                left: list[str] = []

                def route(r, left=left):
                    if _local(r.request.url):
                        r.continue_()
                    else:
                        left.append(r.request.url)
                        r.abort()

                context.route("**/*", route)
                page = context.new_page()
                page.goto(url, wait_until="load")
                page.wait_for_timeout(300)
                width = page.evaluate("document.documentElement.scrollWidth")
                overflow = page.evaluate(TABLE_OVERFLOW)
                path = out / f"{name}.png"
                _png(page.screenshot(full_page=full), path)
                context.close()
                if server is not None:
                    server.shutdown()
                lines.append(f"{name}: {path} {path.stat().st_size // 1024} KB, page scrollWidth {width} px, "
                             f"widest table overflows by {overflow} px"
                             + (f", {len(left)} request(s) refused" if left else ""))
        finally:
            browser.close()
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("pages", nargs="+", metavar="NAME=PAGE")
    ap.add_argument("--full", action="store_true", help="the whole page, not the first screen")
    a = ap.parse_args(argv)
    pages = {}
    for spec in a.pages:
        name, sep, target = spec.partition("=")
        if not sep or not Path(target).exists():
            ap.error(f"{spec}: want NAME=PAGE with PAGE an existing file or folder")
        pages[name] = Path(target)
    for line in shoot(a.out, pages, a.full):
        print(line)


if __name__ == "__main__":
    main()
