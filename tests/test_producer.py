"""zkcrawl-producer end to end, in-process: a real HTTP site on 127.0.0.1, a real ZooKeeper.

The site has the traps of real listings: relative, protocol-relative and upper-case links,
``<base href>``, fragments, tracking parameters, duplicates across pages, ``javascript:``,
``mailto:`` and ``data:`` links, another host, a GBK page declared only by ``<meta>``, a
next-page loop, a listing disallowed by robots.txt, a JSON "listing", and a 429 with
Retry-After. The offered set must be exactly the expected one.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog._config import BoundLoggerLazyProxy

from tests.conftest import wait_for
from tests.httpd import TestServer, html, sequence
from tests.queue_view import queued_count, queued_items
from zkcrawl.producer import listing
from zkcrawl.producer.main import main
from zkcrawl.queue import items as item_codec
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.layout import Layout
from zkcrawl.zk.client import ZkClient

NEXT = '//a[@rel="next"]/@href'


def forget_cached_loggers() -> None:
    """Make module-level structlog loggers bind again on their next use.

    ``logs.configure()`` caches each logger on first use together with the stream it
    writes to; in-process runs under pytest get a new capture stream per test, and a
    logger cached in an earlier test would write to that one, closed by now.
    """
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            if isinstance(value, BoundLoggerLazyProxy):
                value.__dict__.pop("bind", None)


@pytest.fixture(autouse=True)
def _fresh_loggers() -> Iterator[None]:
    forget_cached_loggers()
    yield
    forget_cached_loggers()


def site_routes(base: str, port: int) -> dict[str, Any]:
    other = f"http://localhost:{port}"
    list1 = f"""<html><head><title>Listing 1</title></head><body>
<a href="/about">About</a>
<a class="item" href="../item/1">relative</a>
<a class="item" href="//127.0.0.1:{port}/item/2">protocol-relative</a>
<a class="item" href="/item/3#comments">fragment</a>
<a class="item" href="/item/4?utm_source=feed&amp;id=4&amp;utm_medium=rss">tracking</a>
<a class="item" href="HTTP://127.0.0.1:{port}/item/%7e5">case and escapes</a>
<a class="item" href="{base}/item/6?fbclid=abc">fbclid</a>
<a class="item" href="javascript:void(0)">script</a>
<a class="item" href="mailto:editor@example.invalid">mail</a>
<a class="item" href="{other}/item/7">other host</a>
<a class="item" href="/private/item/9">robots applies to listings, not items</a>
<a rel="next" href="/list/2">next</a>
</body></html>"""
    # GBK, declared only in <meta>: a wrong decoding yields other percent-escapes.
    list2 = """<html><head><meta charset="gbk"><title>列表第二页</title></head><body>
<a class="item" href="/item/中文">中文文章</a>
<a class="item" href="/item/1#top">duplicate of 1</a>
<a class="item" href="/item/4?id=4&amp;utm_campaign=x">duplicate of 4</a>
<a class="item" href="data:text/html,hi">data</a>
<a rel="next" href="/list/3">下一页</a>
</body></html>""".encode("gbk")
    list3 = """<html><head><base href="/deep/"><title>3</title></head><body>
<a class="item" href="a">base-relative</a>
<a class="item" href="../item/8">base-relative up</a>
<a class="item" href="./b?x=1&amp;utm_term=z#f">base, tracking, fragment</a>
<a rel="next" href="/list/1">back to the first page: a loop</a>
</body></html>"""
    return {
        "/robots.txt": (200, {"Content-Type": "text/plain"},
                        b"User-agent: *\nDisallow: /private/\n"),
        "/list/1": html(list1),
        "/list/2": sequence((429, {"Retry-After": "1", "Content-Type": "text/plain"}, b"slow"),
                            (200, {"Content-Type": "text/html"}, list2)),
        "/list/3": html(list3),
        "/private/list": html('<a class="item" href="/item/never">x</a>'),
        "/feed.json": (200, {"Content-Type": "application/json"}, b'{"a": "/item/json"}'),
    }


def expected_items(base: str) -> set[str]:
    return {f"{base}{p}" for p in (
        "/item/1", "/item/2", "/item/3", "/item/4?id=4", "/item/~5", "/item/6",
        "/private/item/9", "/item/%E4%B8%AD%E6%96%87", "/deep/a", "/item/8", "/deep/b?x=1")}


def queue_items(zk: ZkClient, root: str) -> list[dict[str, Any]]:
    """What is queued (ingress and partitions), each item as its fields."""
    return [dataclasses.asdict(i) for i in queued_items(zk, root)]


def drain_batches(zk: ZkClient, root: str) -> list[str]:
    """Remove every batch now in the partitions (as consumers settle them): their URLs."""
    lay = Layout.of(root)
    urls: list[str] = []
    parts = zk.get_children(lay.partitions) if zk.exists(lay.partitions) else []
    for p in parts:
        for name in zk.get_children(lay.partition(int(p))):
            if not name.startswith(item_codec.PREFIX):
                continue
            path = f"{lay.partition(int(p))}/{name}"
            batch, why = pb.decode(zk.get(path)[0])
            assert batch is not None, why
            zk.delete(path)
            urls += [batch.items[i].url for i in batch.pending]  # type: ignore[union-attr]
    return urls


def summary(stderr: str) -> dict[str, Any]:
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    found = [e for e in events if e.get("event") == "producer.summary"]
    assert len(found) == 1, stderr[-2000:]
    return found[0]


def common(zk_hosts: str, zk_root: str, *extra: str) -> list[str]:
    # The test sites are on 127.0.0.1: the SSRF guard must let the producer connect there.
    return ["--zk", zk_hosts, "--root", zk_root, "--log-format", "json", "--delay", "0",
            "--session-timeout", "4", "--allow-private-addresses", *extra]


@pytest.fixture
def site():
    with TestServer() as srv:
        srv.routes.update(site_routes(srv.base_url, srv.port))
        yield srv


def test_listing_walk_offers_exactly_the_expected_set_then_nothing_on_restart(
        site, zk, zk_hosts, zk_root, tmp_path, capsys):
    base = site.base_url
    seen_path = tmp_path / "seen.state"
    registered: list[list[str]] = []
    zk.ensure_path(f"{zk_root}/producers")
    zk.watch_children(f"{zk_root}/producers", lambda c: registered.append(list(c)))
    argv = common(zk_hosts, zk_root, "--start", f"{base}/list/1", "--start",
                  f"{base}/private/list", "--start", f"{base}/feed.json",
                  "--links-css", "a.item", "--next", NEXT, "--same-host",
                  "--seen", str(seen_path), "--id", "p1", "--retries", "2")

    assert main(argv, {}) == 0
    got = queue_items(zk, zk_root)
    assert {i["url"] for i in got} == expected_items(base)
    assert len(got) == len(expected_items(base))  # each once
    by_url = {i["url"]: i for i in got}
    assert by_url[f"{base}/item/1"]["meta"]["source"] == f"{base}/list/1"
    assert by_url[f"{base}/item/%E4%B8%AD%E6%96%87"]["meta"]["source"] == f"{base}/list/2"
    assert by_url[f"{base}/deep/a"]["meta"]["source"] == f"{base}/list/3"
    assert all(i["producer"] == "p1" and i["attempt"] == 0 and i["enqueued_at"] > 0
               for i in got)

    s = summary(capsys.readouterr().err)
    assert (s["pages_read"], s["pages_failed"], s["offered"]) == (3, 0, 11)
    assert s["pages_skipped"] == {"loop": 1, "robots": 1, "not-html": 1}
    assert s["dropped"] == {"javascript": 1, "mailto": 1, "data": 1, "other-host": 1}
    assert (s["links_found"], s["duplicates"]) == (17, 2)

    # robots.txt kept the producer off the disallowed listing; the 429 was waited out.
    assert site.requests_for("/private/list") == []
    assert len(site.requests_for("/robots.txt")) == 1
    assert len(site.requests_for("/list/2")) == 2
    assert site.gaps("/list/2")[0] >= 0.9
    assert site.requests_for("/list/1")  # read once; the loop back to it was not followed
    assert len(site.requests_for("/list/1")) == 1
    # Registered while running, gone afterwards.
    assert ["p1"] in registered
    wait_for(lambda: registered[-1] == [], what="registration removed")

    # Restart over the same listings with the same --seen: nothing new to offer.
    assert main(argv, {}) == 0
    s2 = summary(capsys.readouterr().err)
    assert (s2["offered"], s2["duplicates"]) == (0, 13)
    assert len(queue_items(zk, zk_root)) == 11


def test_pages_template_and_an_unreachable_listing_exit_1(zk, zk_hosts, zk_root, capsys):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]
    with TestServer() as srv:
        for n in (1, 3):
            srv.route(f"/p/{n:02d}", html(f'<ul><li><a href="/a/{n}">x</a></li></ul>'))
        srv.route("/p/02", (503, {"Content-Type": "text/plain"}, b"down"))
        argv = common(zk_hosts, zk_root, "--pages", f"{srv.base_url}/p/{{page:02d}}",
                      "--page-range", "1-3", "--start", f"http://127.0.0.1:{dead}/list",
                      "--links", "//li/a/@href", "--retries", "1", "--no-robots",
                      "--delay", "0.3")
        assert main(argv, {}) == 1
        assert len(srv.requests_for("/p/02")) == 2  # retried once
        assert len(srv.requests) == 4 and min(srv.gaps()) >= 0.28  # --delay, server-side
    assert {i["url"] for i in queue_items(zk, zk_root)} == {
        f"{srv.base_url}/a/1", f"{srv.base_url}/a/3"}
    s = summary(capsys.readouterr().err)
    assert s["pages_failed"] == 2 and s["pages_read"] == 2
    assert any(f"127.0.0.1:{dead}/list (connection)" in f for f in s["failed"])
    assert any("/p/02 (http-503)" in f for f in s["failed"])


def test_backpressure_holds_at_max_depth_until_items_are_removed(
        zk, zk_hosts, zk_root, tmp_path, capsys):
    urls = [f"http://h{i}.example/bp/{i}" for i in range(250)]  # spread over partitions
    src = tmp_path / "urls.txt"
    src.write_text("\n".join(urls) + "\n")
    rc: list[int] = []
    argv = common(zk_hosts, zk_root, "--from-file", str(src), "--max-depth", "100",
                  "--batch", "40", "--id", "bp")
    runner = threading.Thread(target=lambda: rc.append(main(argv, {})))
    runner.start()

    def state() -> str | None:
        stat = zk.exists(f"{zk_root}/producers/bp")
        return json.loads(zk.get(f"{zk_root}/producers/bp")[0])["state"] if stat else None

    wait_for(lambda: state() == "waiting" and queued_count(zk, zk_root) == 100,
             what="held at 100")
    assert runner.is_alive()
    taken: list[str] = []
    depths: list[int] = []
    while runner.is_alive() or queued_count(zk, zk_root):
        depths.append(queued_count(zk, zk_root))
        taken += drain_batches(zk, zk_root)
        assert len(taken) <= 250
        wait_for(lambda: not runner.is_alive() or queued_count(zk, zk_root) > 0,
                 what="more offered after the drain")
    runner.join(10)
    assert rc == [0]
    assert sorted(taken) == sorted(urls)  # every URL once, none lost while held
    assert max(depths) == 100  # never more than --max-depth (ingress + partitions, items)
    # It waited at least once (how often depends on how fast the drain runs).
    assert summary(capsys.readouterr().err)["backpressure_waits"] >= 1


def test_long_url_list_goes_through_worker_processes(zk, zk_hosts, zk_root, tmp_path,
                                                     capsys, monkeypatch):
    monkeypatch.setattr(listing, "POOL_AFTER_LINES", 100)
    monkeypatch.setattr(listing, "_pool_size", lambda: 1)  # also on a one-CPU host
    monkeypatch.setattr(listing, "LINES_PER_CHUNK", 50)
    lines, want = [], set()
    for i in range(600):
        if i % 100 == 7:
            lines.append(f"not a url {i}")
        elif i % 100 == 8:
            lines.append(f"HTTP://Example.COM:80/x/{i - 2}#dup")  # duplicate of line i-2
        else:
            lines.append(f"http://example.com/x/{i}?utm_source=a")
            want.add(f"http://example.com/x/{i}")
    path = tmp_path / "list.txt"
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"http://example.com/\xff\n")
    assert main(common(zk_hosts, zk_root, "--from-file", str(path)), {}) == 0
    got = queue_items(zk, zk_root)
    assert {i["url"] for i in got} == want and len(got) == len(want)
    assert {i["meta"]["source"] for i in got} == {str(path)}
    s = summary(capsys.readouterr().err)
    assert (s["lines_read"], s["rejected"], s["duplicates"]) == (601, 7, 6)


def test_seen_state_is_left_intact_by_a_failed_run(zk_hosts, zk_root, tmp_path: Path, capsys):
    """A run that cannot connect must not touch the state a previous run saved."""
    seen = tmp_path / "seen"
    src = tmp_path / "u.txt"
    src.write_text("http://example.com/1\n")
    assert main(common(zk_hosts, zk_root, "--from-file", str(src), "--seen", str(seen)),
                {}) == 0
    before = seen.read_bytes()
    argv = ["--zk", "127.0.0.1:1", "--zk-timeout", "1", "--from-file", str(src),
            "--seen", str(seen)]
    assert main(argv, {}) == 75  # ZooKeeper unreachable: EX_TEMPFAIL (SPEC §4)
    assert seen.read_bytes() == before
    capsys.readouterr()


def test_url_list_is_still_offered_when_worker_processes_are_unusable(
        zk, zk_hosts, zk_root, tmp_path, capsys, monkeypatch):
    def dead_pool(_filter):
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(1)
        pool.shutdown()  # submit() now raises, as on a host that cannot start processes
        return pool

    monkeypatch.setattr(listing, "POOL_AFTER_LINES", 10)
    monkeypatch.setattr(listing, "LINES_PER_CHUNK", 10)
    monkeypatch.setattr(listing, "_start_pool", dead_pool)
    monkeypatch.setattr(listing, "_pool_size", lambda: 1)
    urls = [f"http://example.com/p/{i}" for i in range(55)]
    path = tmp_path / "list.txt"
    path.write_text("\n".join(urls) + "\n")
    assert main(common(zk_hosts, zk_root, "--from-file", str(path)), {}) == 0
    assert sorted(i["url"] for i in queue_items(zk, zk_root)) == sorted(urls)
    err = capsys.readouterr().err
    assert err.count('"producer.pool_failed"') == 1


def test_a_megabyte_link_is_skipped_with_a_reason_and_the_run_goes_on(zk, zk_hosts, zk_root,
                                                                      capsys):
    """SPEC §2: a URL is at most 8 KiB. A 1.1 MB href used to fail the whole run."""
    with TestServer() as srv:
        huge = "/item/" + "a" * 1_100_000
        body = (f'<a class="item" href="{huge}">x</a><a class="item" href="/item/1">1</a>'
                f'<a class="item" href="/item/2">2</a>')
        srv.route("/list", html(body))
        argv = common(zk_hosts, zk_root, "--start", srv.url("/list"), "--links-css", "a.item",
                      "--no-robots", "--max-bytes", "4000000")
        assert main(argv, {}) == 0
        s = summary(capsys.readouterr().err)
        assert s["offered"] == 2 and s["dropped"] == {"too-long": 1}
        assert sorted(i["url"] for i in queue_items(zk, zk_root)) == [
            srv.url("/item/1"), srv.url("/item/2")]
