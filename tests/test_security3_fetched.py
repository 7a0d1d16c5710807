"""Issue #27 item 3, the gap left: ``<root>/fetched/`` is capped like ``discovered/``.

Before, nothing bounded what consumers wrote to ``<root>/fetched/`` (re-crawl reports) while
no ``--recrawl`` producer drained it. Now it holds at most its cap (``--fetched-max-nodes``,
``--fetched-max-bytes``: the rule of :class:`~zkcrawl.queue.capped.CappedDir`): a flush that
finds it full waits on a watch (``--fetched-wait``, on the buffer's thread, never the
committer's), then drops its reports with the reason ``fetched-full`` and one warning;
the items complete all the same. The producer's drain goes on and frees the waiting
writer. Real ZooKeeper, a real consumer process, a real HTTP site on 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import structlog.testing

from tests.conftest import wait_for
from tests.httpd import TestServer, html
from tests.test_consumer_support import records, spawn
from tests.test_producer import forget_cached_loggers
from zkcrawl.admin.cluster import list_dead
from zkcrawl.producer.recrawl import RecrawlStore, Schedule
from zkcrawl.queue.capped import DirLimits
from zkcrawl.queue.fetched import (
    FETCHED_FULL,
    FLUSH_ENTRIES,
    FLUSH_S,
    MAX_BYTES,
    MAX_NODES,
    NODE_BYTES,
    Fetched,
    FetchedBuffer,
    FetchedReader,
    FetchedWriter,
)
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.zk.client import ZkClient


def _fill(zk: ZkClient, root: str, nodes: int) -> str:
    """``nodes`` well-formed reports already in ``<root>/fetched/`` (nobody drains them)."""
    path = f"{root}/fetched"
    zk.ensure_path(path)
    for i in range(nodes):
        doc = {"fetched": [{"url": f"https://old.example/{i}", "status": 200}], "consumer": "x"}
        zk.create(f"{path}/fn-", json.dumps(doc).encode(), sequence=True)
    return path


def _report(i: int) -> Fetched:
    return Fetched(f"https://h.example/{i}", 200, None, '"e"', None, None, time.time())


def test_a_full_fetched_directory_holds_its_cap_and_the_items_complete(zk, zk_hosts, zk_root,
                                                                      tmp_path: Path):
    pages = 8
    routes = {f"/r/{i}": html(f"<title>r{i}</title>") for i in range(pages)}
    path = _fill(zk, zk_root, 2)
    out, log = tmp_path / "o.jsonl", tmp_path / "c.log"
    with TestServer(routes) as srv:
        urls = [srv.url(f"/r/{i}") for i in range(pages)]
        IngressQueue(zk, zk_root).offer_many(
            Item(url=u, meta={"recrawl": {}}) for u in urls)  # a --recrawl producer's items
        proc = spawn(["--zk", zk_hosts, "--root", zk_root, "--out", str(out), "--threads", "2",
                      "--domain-delay", "0", "--no-robots", "--allow-private-addresses",
                      "--log-format", "json", "--exit-when-idle", "1",
                      "--fetched-max-nodes", "2", "--fetched-wait", "0.5"], log)
        try:
            assert proc.wait(timeout=90) == 0, log.read_text()[-2000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    assert len(zk.get_children(path)) == 2  # nothing written past the cap
    assert sorted(r["url"] for r in records(out)) == sorted(urls)  # every page stored
    assert {r.get("error") for r in records(out)} == {None}
    assert list_dead(zk, zk_root) == [] and zk.get_children(f"{zk_root}/queue") == []
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    full = [e for e in events if e.get("event") == "fetched.full"]
    assert len(full) == 1, full  # one warning for the episode, not one per flush
    assert full[0]["reason"] == FETCHED_FULL and full[0]["path"] == path
    assert full[0]["cap_nodes"] == 2
    assert any(e.get("event") == "capped.full" and e.get("path") == path for e in events)
    assert not [e for e in events if e.get("level") in ("error", "critical")]


def test_the_byte_cap_bounds_the_nodes_as_for_discovered(zk, zk_root):
    writer = FetchedWriter(zk, zk_root, "c1", max_nodes=MAX_NODES, max_bytes=3 * NODE_BYTES,
                           wait=0.2)
    assert writer.directory.limits.node_cap == 3
    for i in range(5):
        writer.report([_report(i)])
    assert len(zk.get_children(f"{zk_root}/fetched")) == 3
    assert writer.full == 2 and writer.nodes == 3


def test_a_waiting_flush_goes_on_when_the_producer_drains(zk, zk_root, tmp_path: Path):
    """The producer's --recrawl drain (its Recrawler) empties a full directory: the flush
    that waited on the watch writes, and the producer learns those reports."""
    from tests.test_recrawl import NoOffers
    from zkcrawl.producer.recrawl import Recrawler

    path = _fill(zk, zk_root, 3)
    writer = FetchedWriter(zk, zk_root, "c1", max_nodes=3, wait=30.0)
    buffer = FetchedBuffer(writer)
    committer_free = threading.Event()
    try:
        started = time.monotonic()
        buffer.add([_report(i) for i in range(5)])  # the committer's call
        committer_free.set()
        assert time.monotonic() - started < 1.0  # add() never waits for room
        wait_for(lambda: writer.directory.full_waits >= 1, what="the flush waiting for room")
        assert len(zk.get_children(path)) == 3
        store = RecrawlStore(str(tmp_path / "s"), Schedule(3600.0, 86400.0))
        store.add_new([_report(i).url for i in range(5)], time.time())
        recrawler = Recrawler(store, FetchedReader(zk, zk_root), NoOffers(), batch=10,
                              stop=threading.Event())
        drained = time.monotonic()
        assert recrawler.drain_once()  # the three old nodes
        wait_for(lambda: writer.nodes == 1, timeout=10, what="the waiting flush written")
        assert time.monotonic() - drained < 10  # on the watch, not at the 30 s bound
        while recrawler.drain_once():
            pass
        learnt = recrawler.counts.learnt
        assert sum(learnt.kinds.values()) == 5 and learnt.unknown == 3  # old nodes: unknown
        assert zk.get_children(path) == [] and writer.full == 0
        store.close()
    finally:
        buffer.close()
    assert committer_free.is_set()


def test_past_half_the_cap_the_reports_go_out_in_full_nodes(zk, zk_root):
    """A node per second would spend the node count on small nodes: past half the cap the
    buffer packs full nodes, so the cap holds as many reports as its bytes allow."""
    path = _fill(zk, zk_root, 2)
    writer = FetchedWriter(zk, zk_root, "c1", max_nodes=4, wait=0.2)
    assert writer.directory.held()[0] == 2  # half the cap, as the writer last read it
    buffer = FetchedBuffer(writer)
    try:
        buffer.add([_report(i) for i in range(10)])
        time.sleep(FLUSH_S + 0.5)  # an absence: no node for 10 reports while packing
        assert len(zk.get_children(path)) == 2
        buffer.add([_report(i) for i in range(10, FLUSH_ENTRIES)])
        wait_for(lambda: writer.nodes == 1, timeout=10, what="one full node")
        reader = FetchedReader(zk, zk_root)
        (new,) = reader.read(reader.names()[2:])
        assert len(new.decoded.entries) == FLUSH_ENTRIES
    finally:
        buffer.close()


def test_the_shutdown_flush_does_not_wait_for_a_full_directory(zk, zk_root):
    _fill(zk, zk_root, 2)
    writer = FetchedWriter(zk, zk_root, "c1", max_nodes=2, wait=30.0)
    buffer = FetchedBuffer(writer)
    buffer.add([_report(0)])
    wait_for(lambda: writer.directory.full_waits >= 1, what="the flush waiting for room")
    buffer.add([_report(1)])
    started = time.monotonic()
    buffer.close()
    buffer._thread.join(5)
    assert time.monotonic() - started < 5  # not the 30 s --fetched-wait
    assert not buffer._thread.is_alive()  # the waiting flush gave up too
    assert writer.full == 2 and writer.nodes == 0  # both reports dropped, counted
    assert len(zk.get_children(f"{zk_root}/fetched")) == 2


def test_the_producer_reports_the_fetched_backlog(zk, zk_root):
    reader = FetchedReader(zk, zk_root)
    cap = DirLimits(MAX_NODES, MAX_BYTES, NODE_BYTES).node_cap
    tx = zk.transaction()
    for _ in range(cap // 2):
        tx.create(f"{reader.path}/fn-", b"{}", sequence=True)
    tx.commit()
    forget_cached_loggers()  # a logger bound by an earlier test is past capture_logs' reach
    with structlog.testing.capture_logs() as logs:
        assert len(reader.names()) == cap // 2
        reader.names()  # at most one report per 30 s
    backlog = [e for e in logs if e["event"] == "fetched.backlog"]
    assert [(e["nodes"], e["bytes_at_most"]) for e in backlog] == [
        (cap // 2, cap // 2 * NODE_BYTES)]
    reader.delete(reader.names())
    assert reader.names() == []
