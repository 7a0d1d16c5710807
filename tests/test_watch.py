"""``zkcrawl-producer --watch``: passes, the page count of a pass that finds nothing new, a
new article offered on the next pass, the last pass in the status node, ``zkcrawl status``
and the exporter, and SIGTERM between passes and inside a pass's wait. A real producer
process, a real HTTP site on 127.0.0.1 and a real ZooKeeper."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import wait_for
from tests.httpd import TestServer
from tests.test_producer import queue_items
from zkcrawl.admin.cluster import cluster_status
from zkcrawl.admin.exporter import cluster_families
from zkcrawl.cli import main as admin_main
from zkcrawl.errors import UsageError
from zkcrawl.producer.watch import last_pass, parse_duration, parse_since

REPO = Path(__file__).resolve().parent.parent
PER_PAGE = 3


# -- the decoders -------------------------------------------------------------------------

def test_durations_and_since() -> None:
    assert [parse_duration(t) for t in ("30s", "10m", "1h", "2d", "1w", "45", "1.5m")] == [
        30, 600, 3600, 172800, 604800, 45, 90]
    for bad in ("", "0s", "10 parsecs", "-5m", "1e9", "400d", "m"):
        with pytest.raises(UsageError):
            parse_duration(bad)
    assert parse_since("2026-01-31", now=1.8e9) == 1769817600.0
    assert parse_since("2026-01-31T08:00:00+01:00", now=1.8e9) == 1769842800.0
    assert parse_since("7d", now=1.8e9) == 1.8e9 - 7 * 86400
    for bad in ("1890-01-01", "2999-01-01", "soon", "12"):
        with pytest.raises(UsageError):
            parse_since(bad, now=1.8e9)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_duration_and_since_parsers_only_raise_usage_errors(text: str) -> None:
    for parse in (parse_duration, parse_since):
        try:
            value = parse(text)
        except UsageError:
            continue
        assert value == value and value > 0  # finite and positive: no NaN slips through


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=10), inner, max_size=6), max_leaves=20)
_pass = st.fixed_dictionaries({k: st.integers(-2, 2**60) | _json for k in (
    "number", "pages", "sitemaps", "new", "failed")} | {
    "started_at": st.floats(allow_nan=True) | _json, "duration_s": st.floats() | _json})


@settings(max_examples=150, deadline=None)
@given(st.one_of(_json, st.fixed_dictionaries({
    "id": st.text(max_size=300),
    "watch": st.one_of(_json, st.fixed_dictionaries({"interval_s": st.floats() | _json,
                                                     "last_pass": _pass | _json}))})))
def test_any_producer_node_decodes_to_a_valid_pass_or_none_and_a_parsable_scrape(doc: Any
                                                                                  ) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client.registry import Collector

    lp = last_pass(doc)
    if lp is not None:
        assert all(isinstance(lp[k], int) and 0 <= lp[k] <= 2**53
                   for k in ("number", "pages", "sitemaps", "new", "failed"))
        assert all(0 <= lp[k] <= 1e11 for k in ("started_at", "duration_s", "interval_s"))
    producers = [doc] if isinstance(doc, dict) else []
    status = {"queue": {"depth": 0, "claimable": 0, "oldest_age_s": None},
              "leases": {"count": 0, "by_consumer": {}}, "dead": {"count": 0},
              "consumers": [], "producers": producers, "control": "running",
              "control_pending": [], "hosts": {"tracked": 0, "held_back": 0}}

    class One(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            return cluster_families(status, "/zkcrawl")

    reg = CollectorRegistry()
    reg.register(One())
    families = list(text_string_to_metric_families(generate_latest(reg).decode()))
    pages = [s for f in families for s in f.samples
             if s.name == "zkcrawl_cluster_producer_last_pass_pages"]
    assert len(pages) == (lp is not None)


# -- a watching producer ------------------------------------------------------------------

class Blog:
    """A blog whose listing shows the newest articles first, PER_PAGE a page."""

    def __init__(self, srv: TestServer, articles: int) -> None:
        self.srv = srv
        self.articles = list(range(articles, 0, -1))
        self.lock = threading.Lock()
        srv.routes["/robots.txt"] = (404, {}, b"")
        srv.routes["/list/*"] = self.listing

    def publish(self) -> str:
        with self.lock:
            self.articles.insert(0, self.articles[0] + 1)
            return f"{self.srv.base_url}/post/{self.articles[0]}"

    def listing(self, h: Any) -> tuple[int, dict[str, str], bytes]:
        page = int(h.path.rsplit("/", 1)[-1])
        with self.lock:
            shown = self.articles[(page - 1) * PER_PAGE:page * PER_PAGE]
            more = len(self.articles) > page * PER_PAGE
        links = "".join(f'<a class="post" href="/post/{n}">{n}</a>' for n in shown)
        nxt = f'<a rel="next" href="/list/{page + 1}">older</a>' if more else ""
        body = f"<html><body>{links}{nxt}</body></html>".encode()
        return 200, {"Content-Type": "text/html"}, body

    def reads(self, page: int) -> int:
        return len(self.srv.requests_for(f"/list/{page}"))


def producer_node(zk: Any, root: str, pid: str) -> dict[str, Any] | None:
    try:
        return json.loads(zk.get(f"{root}/producers/{pid}")[0])
    except Exception:  # not there yet
        return None


def passes(zk: Any, root: str, pid: str) -> int:
    node = producer_node(zk, root, pid) or {}
    return int((node.get("watch") or {}).get("passes") or 0)


def start_producer(procs: list[subprocess.Popen[bytes]], zk_hosts: str, zk_root: str,
                   base: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "zkcrawl.producer.main", "--zk", zk_hosts, "--root", zk_root,
            "--log-format", "json", "--delay", "0", "--session-timeout", "4",
            "--allow-private-addresses", "--id", "w1", "--start", f"{base}/list/1",
            "--next", '//a[@rel="next"]/@href', "--links", '//a[@class="post"]/@href',
            *extra]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    procs.append(proc)
    return proc


def events(stderr: bytes, name: str) -> list[dict[str, Any]]:
    found = []
    for line in stderr.decode(errors="replace").splitlines():
        if line.startswith("{"):
            doc = json.loads(line)
            if doc.get("event") == name:
                found.append(doc)
    return found


@pytest.mark.slow
def test_watch_reads_one_page_per_quiet_pass_and_offers_a_new_article(
        zk, zk_hosts, zk_root, procs, capsys) -> None:
    with TestServer() as srv:
        blog = Blog(srv, articles=8)  # 3 listing pages
        proc = start_producer(procs, zk_hosts, zk_root, srv.base_url,
                              "--watch", "1s", "--watch-depth", "3")
        wait_for(lambda: passes(zk, zk_root, "w1") >= 3, 60, "three passes")
        # the first pass walked all three pages; each quiet pass after it read page 1 only
        assert blog.reads(2) == blog.reads(3) == 1
        assert blog.reads(1) in (passes(zk, zk_root, "w1"), passes(zk, zk_root, "w1") + 1)
        assert len(queue_items(zk, zk_root)) == 8

        node = producer_node(zk, zk_root, "w1")
        lp = last_pass(node)
        assert lp is not None and lp["pages"] == 1 and lp["new"] == 0 and lp["interval_s"] == 1
        seen_before = passes(zk, zk_root, "w1")
        url = blog.publish()
        published = time.monotonic()
        wait_for(lambda: url in {i["url"] for i in queue_items(zk, zk_root)}, 30, "new article")
        offered_after = time.monotonic() - published  # reported, not asserted: the bench's
        wait_for(lambda: passes(zk, zk_root, "w1") > seen_before, 30, "the pass that found it")
        assert len(queue_items(zk, zk_root)) == 9

        # zkcrawl status and the exporter show the last pass
        def quiet_again() -> bool:
            lp = last_pass(producer_node(zk, zk_root, "w1")) or {}
            return lp.get("number", 0) > seen_before + 1 and lp.get("new") == 0

        wait_for(quiet_again, 30, "a quiet pass after the one that found it")
        capsys.readouterr()
        assert admin_main(["status", "--zk", zk_hosts, "--root", zk_root,
                           "--log-format", "json"], {}) == 0
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith("w1 "))
        assert "1 pages, 0 sitemaps, 0 new" in row and "LAST PASS" in out
        doc = cluster_status(zk, zk_root)
        fams = {f.name: f for f in cluster_families(doc, zk_root)}
        [sample] = fams["zkcrawl_cluster_producer_last_pass_pages"].samples
        assert sample.labels["producer"] == "w1" and sample.value == 1
        assert fams["zkcrawl_cluster_producer_last_pass_timestamp_seconds"].samples[0].value \
            > time.time() - 30

        # SIGTERM while it waits between passes: it ends at once, exit 0, node gone
        os.kill(proc.pid, signal.SIGTERM)
        stopped = time.monotonic()
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err[-3000:]
        assert time.monotonic() - stopped < 10
        assert producer_node(zk, zk_root, "w1") is None

    done = events(err, "watch.pass")
    pages = [e["pages"] for e in done]
    assert [e["new"] for e in done].count(1) == 1 and sum(e["new"] for e in done[1:]) == 1
    assert done[0]["new"] == 8
    # first pass: 3 pages; the pass that found the article: page 1 (new) and page 2 (not);
    # every other pass: page 1 only
    assert pages[0] == 3 and sorted(pages[1:]).count(2) == 1
    assert set(pages[1:]) <= {1, 2}
    print(f"new article offered {offered_after:.2f} s after it was published (--watch 1s)")


@pytest.mark.slow
def test_sigterm_cuts_a_wait_inside_a_pass_short(zk, zk_hosts, zk_root, procs) -> None:
    """A pass waiting out a listing's Retry-After (50 s) ends at once on SIGTERM. (A transfer
    already running is bounded by --timeout instead, as in any producer run.)"""
    with TestServer() as srv:
        Blog(srv, articles=2)
        entered = threading.Event()

        def busy(h: Any) -> tuple[int, dict[str, str], bytes]:
            entered.set()
            return 429, {"Retry-After": "50"}, b""

        proc = start_producer(procs, zk_hosts, zk_root, srv.base_url, "--watch", "1s")
        wait_for(lambda: passes(zk, zk_root, "w1") >= 1, 60, "the first pass")
        srv.routes["/list/*"] = busy
        assert entered.wait(30)
        os.kill(proc.pid, signal.SIGTERM)
        stopped = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]
        assert time.monotonic() - stopped < 10
        assert events(err, "producer.summary")
        assert len(srv.requests_for("/list/1")) == 2  # the first pass, then the 429 only



def test_sigusr1_dumps_a_watching_producers_threads_and_it_goes_on(zk, zk_hosts, zk_root,
                                                                   procs) -> None:
    """kill -USR1 on a long-running producer: every thread's stack on stderr, and it keeps
    watching (another pass comes) and stops cleanly on SIGTERM."""
    with TestServer() as srv:
        Blog(srv, articles=2)
        proc = start_producer(procs, zk_hosts, zk_root, srv.base_url, "--watch", "1s")
        wait_for(lambda: passes(zk, zk_root, "w1") >= 1, 60, "the first pass")
        before = passes(zk, zk_root, "w1")
        os.kill(proc.pid, signal.SIGUSR1)
        wait_for(lambda: passes(zk, zk_root, "w1") > before, 30, "a pass after the dump")
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]
        text = err.decode(errors="replace")
        assert "most recent call first" in text and "watch.py" in text
        assert "Traceback" not in text

@pytest.mark.slow
def test_watch_a_sitemap_index_offers_what_a_changed_child_adds(zk, zk_hosts, zk_root,
                                                               procs) -> None:
    with TestServer() as srv:
        base = srv.base_url
        state = {"mod": "2026-01-01", "urls": [f"{base}/post/1"]}

        def index(h: Any) -> tuple[int, dict[str, str], bytes]:
            return 200, {"Content-Type": "application/xml"}, (
                f"<sitemapindex><sitemap><loc>{base}/posts.xml</loc><lastmod>{state['mod']}"
                "</lastmod></sitemap></sitemapindex>").encode()

        def posts(h: Any) -> tuple[int, dict[str, str], bytes]:
            rows = "".join(f"<url><loc>{u}</loc></url>" for u in state["urls"])
            return 200, {"Content-Type": "application/xml"}, f"<urlset>{rows}</urlset>".encode()

        srv.routes.update({"/robots.txt": (404, {}, b""), "/index.xml": index,
                           "/posts.xml": posts})
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "zkcrawl.producer.main", "--zk", zk_hosts, "--root", zk_root,
             "--log-format", "json", "--delay", "0", "--session-timeout", "4",
             "--allow-private-addresses", "--id", "w1", "--sitemap", f"{base}/index.xml",
             "--watch", "1s"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(proc)
        wait_for(lambda: passes(zk, zk_root, "w1") >= 2, 60, "two passes")
        lp = last_pass(producer_node(zk, zk_root, "w1"))
        assert lp is not None and lp["sitemaps"] == 1 and lp["pages"] == 0  # index only
        assert len(srv.requests_for("/posts.xml")) == 1
        state["urls"].append(f"{base}/post/2")
        state["mod"] = "2026-01-02"  # the index dates the child anew: it is read again
        wait_for(lambda: len(queue_items(zk, zk_root)) == 2, 30, "the added post")
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]
    assert {i["url"] for i in queue_items(zk, zk_root)} == {f"{base}/post/1",
                                                            f"{base}/post/2"}
