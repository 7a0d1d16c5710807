"""zkcrawl.bench.site: starts, serves with latency, counts, handles many keep-alive clients."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import lxml.html
import pytest
import requests

from zkcrawl.bench.site import article_body, start_benchsite, stop_benchsite


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    proc, base = start_benchsite(latency_ms=100, articles=250)
    try:
        yield base
    finally:
        assert stop_benchsite(proc) == 0


def stats(base: str) -> dict:
    return requests.get(f"{base}/stats", timeout=5).json()


async def keepalive_client(base: str, paths: list[str]) -> list[tuple[int, int]]:
    """GET ``paths`` one after another on ONE connection; return (status, body length)."""
    parts = urlsplit(base)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    out = []
    try:
        for path in paths:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            status = int(head.split()[1])
            length = next(int(h.split(":")[1]) for h in head.split("\r\n")
                          if h.lower().startswith("content-length:"))
            body = await reader.readexactly(length)
            out.append((status, len(body)))
    finally:
        writer.close()
    return out


async def many_clients(base: str, conns: int, per_conn: int) -> list[list[tuple[int, int]]]:
    jobs = [keepalive_client(base, [f"/a/{(c * per_conn + i) % 250 + 1}.html"
                                    for i in range(per_conn)]) for c in range(conns)]
    return await asyncio.gather(*jobs)


def test_pages_and_latency(site: str) -> None:
    before = stats(site)["requests"]
    t0 = time.monotonic()
    r = requests.get(f"{site}/list/1", timeout=5)
    assert time.monotonic() - t0 >= 0.1  # the configured latency is applied
    assert r.status_code == 200
    doc = lxml.html.fromstring(r.content)
    items = doc.xpath('//a[@class="item"]/@href')
    assert len(items) == 100 and items[0] == "/a/1.html"
    assert doc.xpath('//a[@rel="next"]/@href') == ["/list/2"]
    last = lxml.html.fromstring(requests.get(f"{site}/list/3", timeout=5).content)
    assert len(last.xpath('//a[@class="item"]')) == 50 and not last.xpath('//a[@rel="next"]')

    art = requests.get(f"{site}/a/7.html", timeout=5)
    assert art.status_code == 200 and art.headers["Content-Type"].startswith("text/html")
    assert 5_000 <= len(art.content) <= 15_000
    assert art.content == article_body(7)  # deterministic across processes
    assert lxml.html.fromstring(art.content).findtext(".//title") == "Article 7"

    for path in ("/a/0.html", "/a/251.html", "/list/4", "/nope"):
        assert requests.get(site + path, timeout=5).status_code == 404
    assert requests.get(f"{site}/robots.txt", timeout=5).status_code == 200
    after = stats(site)
    assert after["requests"] == before + 3 + 4 + 1  # /stats itself is not counted
    # how late the delayed responses left: never early, so never below zero (its size is
    # the event loop's, never asserted)
    assert isinstance(after["late_ms_mean"], float) and after["late_ms_mean"] >= 0
    assert after["by_kind"]["list"] >= 2 and after["by_kind"]["article"] >= 1


def test_article_sizes() -> None:
    sizes = [len(article_body(n)) for n in range(1, 200)]
    assert min(sizes) >= 5_000 and max(sizes) <= 15_000
    assert len(set(sizes)) > 50  # varied, not one fixed page


def test_keepalive_and_connection_close(site: str) -> None:
    with requests.Session() as s:
        for n in range(1, 6):
            assert s.get(f"{site}/a/{n}.html", timeout=5).status_code == 200
    r = requests.get(f"{site}/a/1.html", headers={"Connection": "close"}, timeout=5)
    assert r.headers["Connection"] == "close"


def test_many_concurrent_keepalive_connections(site: str) -> None:
    """128 connections x 5 requests: all served, and all were in flight together."""
    before = stats(site)
    results = asyncio.run(asyncio.wait_for(many_clients(site, conns=128, per_conn=5), 15))
    assert all(status == 200 and 5_000 <= n <= 15_000 for conn in results for status, n in conn)
    after = stats(site)
    assert after["requests"] - before["requests"] == 128 * 5
    # Keep-alive: one connection per client (+1 for the /stats request that reads it).
    assert after["connections"] - before["connections"] == 128 + 1
    # Served concurrently, not one connection at a time: with a 100 ms latency, the
    # 128 first requests all sit in the server together.
    assert after["max_in_flight"] >= 100
    assert after["in_flight"] == 0


def test_child_exits_when_parent_goes(site: str) -> None:
    proc, base = start_benchsite(latency_ms=0, articles=10)
    assert requests.get(f"{base}/a/1.html", timeout=5).status_code == 200
    assert proc.stdin is not None
    proc.stdin.close()  # what the OS does when the parent dies
    assert proc.wait(timeout=10) == 0
    stop_benchsite(proc)


def test_article_sizes_with_page_kb() -> None:
    """--page-kb KB: 0.5-1.5 x KB per article, deterministic; 0 keeps the 5-15 KB pages."""
    sizes = [len(article_body(n, 100, 50)) for n in range(1, 200)]
    assert min(sizes) >= 24_000 and max(sizes) <= 78_000
    assert 40_000 < sum(sizes) / len(sizes) < 60_000
    assert article_body(7, 100, 50) == article_body(7, 100, 50)
    assert article_body(7, 100, 0) == article_body(7)


def test_the_site_waits_to_the_microsecond_and_moves_to_epoll_past_fd_setsize() -> None:
    """epoll's waits are whole milliseconds, rounded up: every response timer of the site
    fired ~0.6 ms late (a latency bench e2e's bound does not count). The site's selector is
    select (microseconds) while every descriptor fits FD_SETSIZE, and moves every
    registration to epoll at the first that does not (the many-hosts site, a crawl of
    hundreds of connections); the loop serves on either."""
    import selectors
    import socket

    from zkcrawl.bench import site

    sel = site._PreciseSelector()
    a, b = socket.socketpair()
    try:
        sel.register(a, selectors.EVENT_READ, "a")
        assert isinstance(sel._inner, selectors.SelectSelector)
        b.send(b"x")
        assert [(k.data, ev) for k, ev in sel.select(1.0)] == [("a", selectors.EVENT_READ)]
        c, d = socket.socketpair()
        try:
            sel.LIMIT = c.fileno()  # c is past the limit
            key = sel.register(c, selectors.EVENT_READ, "c")
            assert not isinstance(sel._inner, selectors.SelectSelector)
            assert key.data == "c" and sel.get_key(a).data == "a" and len(sel.get_map()) == 2
            d.send(b"y")
            got = sorted(k.data for k, _ in sel.select(1.0))
            assert got == ["a", "c"]  # a's byte is still unread: both ready, moved over
            sel.unregister(c)
        finally:
            c.close()
            d.close()
    finally:
        sel.close()
        a.close()
        b.close()
    loop = site._loop_factory()
    try:
        assert loop.run_until_complete(asyncio.sleep(0.001, "served")) == "served"
    finally:
        loop.close()
