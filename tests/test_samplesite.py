"""The demo site serves what it promises (zkcrawl.admin.samplesite)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import lxml.html
import pytest
import requests

from zkcrawl.admin import samplesite as ss
from zkcrawl.admin.samplesite import SampleSite, expected_articles, expected_titles

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site() -> Iterator[SampleSite]:
    with SampleSite(slow_s=0.5) as s:
        yield s


def simple_normalize(href: str, base: str) -> str:
    """Just enough normalization for this site: resolve, drop fragment and utm_*."""
    parts = urlsplit(urljoin(base, href))
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if not k.startswith("utm_")])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


def crawl_listings(base_url: str) -> tuple[list[str], list[str]]:
    """Follow rel=next from page 1; return (pages visited, raw titlelink hrefs with page)."""
    pages, links = [], []
    url: str | None = f"{base_url}/blog/page/1"
    while url:
        r = requests.get(url, timeout=5)
        assert r.status_code == 200
        doc = lxml.html.fromstring(r.content)
        pages.append(url)
        links += [(h, url) for h in doc.xpath(ss.LINKS_XPATH)]
        nxt = doc.xpath(ss.NEXT_XPATH)
        url = urljoin(url, nxt[0]) if nxt else None
    return pages, links


def test_listings_and_expected_articles(site: SampleSite) -> None:
    pages, links = crawl_listings(site.base_url)
    assert pages == [f"{site.base_url}/blog/page/{n}" for n in range(1, 6)]
    hrefs = [h for h, _ in links]
    # The traps are there.
    assert "javascript:void(0)" in hrefs
    assert any(h.startswith("mailto:") for h in hrefs)
    assert any(h.startswith("//127.0.0.1:") for h in hrefs)
    assert any(h.startswith("../posts/") for h in hrefs)
    assert any(h.startswith("http://127.0.0.1:") for h in hrefs)
    assert any("#comments" in h for h in hrefs)
    assert any("utm_source=x" in h for h in hrefs)
    assert ss.EXTERNAL_URL in hrefs
    normalized = [simple_normalize(h, page) for h, page in links
                  if h.startswith(("/", ".", "http"))]
    same_host = [u for u in normalized if urlsplit(u).netloc == site.host]
    assert len(same_host) > len(set(same_host)), "no duplicates to de-duplicate"
    expected = expected_articles(site.base_url)
    assert set(same_host) == set(expected)
    assert sum(v == "ok" for v in expected.values()) == 40
    assert sorted(set(expected.values())) == ["content-type", "http-404", "ok", "robots"]


def test_links_normalize_with_urls_module(site: SampleSite) -> None:
    """Cross-check with the producer's own link filter, when it is available."""
    urls = pytest.importorskip("zkcrawl.web.urls")
    if not hasattr(urls, "LinkFilter"):
        pytest.skip("zkcrawl.web.urls.LinkFilter not available")
    flt = urls.LinkFilter(same_host=True, strip_params=("utm_*",))
    _, links = crawl_listings(site.base_url)
    kept = {flt.check(h, page)[0] for h, page in links} - {None}
    assert kept == set(expected_articles(site.base_url))


def test_articles_outcomes(site: SampleSite) -> None:
    titles = expected_titles(site.base_url)
    for url, outcome in expected_articles(site.base_url).items():
        if urlsplit(url).path == f"/blog/posts/{ss.SLOW_ARTICLE}.html":
            continue  # covered by test_slow_article
        r = requests.get(url, timeout=5)
        if outcome == "http-404":
            assert r.status_code == 404
            continue
        assert r.status_code == 200, url
        if outcome == "content-type":
            assert r.headers["Content-Type"] == "application/json"
            continue
        # lxml honours <meta charset>; with no charset at all it assumes Latin-1,
        # which is exactly the trap the UTF-8 article sets for a crawler.
        nocharset = b"charset" not in r.content
        doc = lxml.html.fromstring(r.content.decode() if nocharset else r.content)
        if outcome == "ok":
            assert doc.findtext(".//title") == titles[url]
            assert doc.xpath(ss.FIELDS["headline"]) == [titles[url]]
            assert doc.xpath(ss.FIELDS["author"])
            assert doc.xpath(ss.FIELDS["published"])[0].endswith("Z")


def test_gbk_article_bytes(site: SampleSite) -> None:
    r = requests.get(f"{site.base_url}/blog/posts/{ss.GBK_ARTICLE}.html", timeout=5)
    assert r.headers["Content-Type"] == "text/html"  # no charset in the header
    assert b'<meta charset="gbk">' in r.content
    title_gbk = ss.GBK_TITLE.encode("gbk")
    assert title_gbk in r.content
    with pytest.raises(UnicodeDecodeError):
        r.content.decode("utf-8")  # so a UTF-8-first decoder must notice the meta
    assert ss.GBK_TITLE in r.content.decode("gbk")


def test_utf8_article_without_charset(site: SampleSite) -> None:
    r = requests.get(f"{site.base_url}/blog/posts/{ss.UTF8_NOCHARSET_ARTICLE}.html", timeout=5)
    assert r.headers["Content-Type"] == "text/html"
    assert b"charset" not in r.content
    assert ss.UTF8_TITLE in r.content.decode("utf-8")


def test_robots_txt(site: SampleSite) -> None:
    r = requests.get(f"{site.base_url}/robots.txt", timeout=5)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    lines = r.text.splitlines()
    assert "User-agent: *" in lines and "Disallow: /blog/private/" in lines


def test_slow_article_and_hits(site: SampleSite) -> None:
    url = f"{site.base_url}/blog/posts/{ss.SLOW_ARTICLE}.html"
    t0 = time.monotonic()
    r = requests.get(url, timeout=5, headers={"User-Agent": "probe/1"})
    assert r.status_code == 200
    assert time.monotonic() - t0 >= 0.5
    assert site.hits[-1].user_agent == "probe/1"
    assert site.hits[-1].path == f"/blog/posts/{ss.SLOW_ARTICLE}.html"


def test_other_paths_404(site: SampleSite) -> None:
    for path in ("/blog/page/6", "/blog/page/0", "/blog/posts/0.html", "/nope"):
        assert requests.get(site.base_url + path, timeout=5).status_code == 404


def test_run_as_process() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "zkcrawl.admin.samplesite", "--port", "0"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY http://127.0.0.1:")
        base = line.split()[1]
        assert requests.get(base + "/robots.txt", timeout=5).status_code == 200
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
