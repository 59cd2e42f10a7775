"""The documentation site (mkdocs.yml): it builds with warnings as errors, offline, and its pages are the README and
docs/ (the API reference generated from mhaexport.api's docstrings). Skips with the reason where the ``docs`` extra
is not installed; .ci/run installs it and runs this file."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings_handlers")),
    reason="the docs extra is not installed (pip install -e '.[docs]')")


def build_site(dest: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` into dest, with every proxy pointed at a closed port: a fetch would fail the build."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", no_proxy="", NO_PROXY="")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(dest)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_site_builds_strict_and_offline(tmp_path):
    site = tmp_path / "site"
    res = build_site(site)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "WARNING" not in res.stderr, res.stderr[-3000:]
    home = (site / "index.html").read_text()
    assert "Quick start" in home and 'href="verify.html#verify"' in home   # the README, its links made the site's
    for page in ("export", "verify", "untrusted-folders", "reference", "bench", "DESIGN", "api"):
        assert (site / f"{page}.html").is_file(), page
    api = (site / "api.html").read_text()
    assert 'id="mhaexport.api.verify"' in api and 'id="mhaexport.api.export_onnx"' in api  # from the docstrings
    assert "fonts.googleapis" not in home                                               # theme fonts: none fetched
