"""The docs site builds (``mkdocs build --strict``: no broken link or anchor, no missing page, no
page outside the nav) and renders: served on 127.0.0.1, opened in headless Chromium.

Guarantees checked: the home page, the tutorial and the API page show their headings (the API
page's come from the docstrings, through mkdocstrings); the search index holds every page of
the nav and is served; the built pages load nothing from another host (the build is offline
by design: no web fonts, no CDN). Screenshots of the three pages are saved in the test's
temporary directory (``--basetemp`` to keep them) to be looked at.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium"
                                         if Path("/usr/bin/chromium").exists() else None)
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-dev-shm-usage"]
pytestmark = pytest.mark.slow  # a build, a server and browser processes
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (CI "
                                    "installs Debian's 'chromium' package)")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """The site built into a temporary directory, and how long the build took (s)."""
    site = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_MKDOCS_2_WARNING": "1"}
    start = time.monotonic()
    # Not --quiet: it hides the warnings from --strict as well (a build with an orphan page
    # or a broken anchor passed with it).
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(site)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180, check=False)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-4000:]
    return site, took


@pytest.fixture(scope="module")
def served(built: tuple[Path, float]) -> Iterator[str]:
    site, _took = built

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=site))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def nav_pages() -> list[str]:
    """Every page file the nav names (reserved pages are YAML comments, not entries)."""
    config = yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    pages: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, str):
            pages.append(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)

    walk(config["nav"])
    return pages


def page_url(page: str) -> str:
    """docs path -> its URL path with directory URLs (``guide/try.md`` -> ``guide/try/``)."""
    stem = re.sub(r"(^|/)(index|README)\.md$", r"\1", page)
    return re.sub(r"\.md$", "/", stem)


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           *args], capture_output=True, text=True, timeout=60, check=False)


def test_every_nav_page_is_built(built: tuple[Path, float]) -> None:
    site, took = built
    sys.stderr.write(f"FIGURE docs build --strict: {took:.1f} s\n")
    for page in nav_pages():
        assert (site / page_url(page) / "index.html").is_file(), page


def test_search_index_holds_every_page(served: str) -> None:
    with urllib.request.urlopen(f"{served}/search/search_index.json", timeout=10) as answer:
        index = json.load(answer)
    locations = {doc["location"].split("#")[0] for doc in index["docs"]}
    for page in nav_pages():
        assert page_url(page).removesuffix("index.html") in locations | {""}, page
    assert any("lease" in doc["text"] for doc in index["docs"])


def test_pages_load_nothing_from_another_host(built: tuple[Path, float]) -> None:
    site, _took = built
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        for ref in re.findall(r'<(?:link|script|img)[^>]+(?:href|src)="([^"]+)"', text):
            assert not re.match(r"(https?:)?//", ref), f"{html.relative_to(site)}: {ref}"


PAGES = [  # (URL path, headings the page must show)
    ("", ["zkcrawl", "Where to go"]),
    ("tutorial/", ["Tutorial: crawl a blog end to end", "1. Try the selectors on one page",
                   "8. A page processor, and PostgreSQL"]),
    ("reference/api/", ["Python API", "Page", "PageResult", "ResultPipeline", "run_consumer"]),
]


@needs_chromium
@pytest.mark.parametrize(("path", "headings"), PAGES, ids=["home", "tutorial", "api"])
def test_page_renders_its_headings(served: str, tmp_path: Path, path: str,
                                   headings: list[str]) -> None:
    out = chromium(tmp_path, "--virtual-time-budget=3000", "--dump-dom", f"{served}/{path}")
    assert out.returncode == 0, out.stderr[-2000:]
    texts = (re.sub(r"<[^>]+>|¶", "", h).strip()
             for h in re.findall(r"<h[1-3][^>]*>(.*?)</h[1-3]>", out.stdout, re.S))
    shown = {t.splitlines()[0].strip() for t in texts if t}  # API: "Page" then its label
    for heading in headings:
        assert heading in shown, (heading, sorted(shown))
    # Material's scripts ran (the search box is wired up) and the page has its nav.
    assert 'data-md-component="search-query"' in out.stdout
    assert "md-nav" in out.stdout


@needs_chromium
@pytest.mark.parametrize("path", [p for p, _h in PAGES], ids=["home", "tutorial", "api"])
def test_page_screenshot(served: str, tmp_path: Path, path: str) -> None:
    png = tmp_path / f"docs-{path.strip('/').replace('/', '-') or 'home'}.png"
    out = chromium(tmp_path, f"--screenshot={png}", "--window-size=1280,1400",
                   "--hide-scrollbars", "--virtual-time-budget=3000", f"{served}/{path}")
    assert out.returncode == 0, out.stderr[-2000:]
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 30_000  # a blank 1280x1400 page compresses to a few KB
