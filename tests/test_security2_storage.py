"""Issue #27 item 3: ZooKeeper storage bounded through discovered links.

A hostile page whose processor hands over 1,000 links of 8 KiB wrote 8.1 MB of persistent
``discovered/`` nodes; nothing bounded what ``discovered/`` held. Now a page hands over at
most ``--max-page-links`` links and ``--max-page-link-bytes`` bytes, and ``discovered/``
holds at most its cap: consumers wait (bounded), then retry the item with the reason
``discovered-full`` (a dead letter after ``--max-attempts``). Real ZooKeeper, real
consumer processes, real HTTP site on 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import structlog.testing
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import wait_for
from tests.httpd import TestServer, html
from tests.queue_view import held, queued_urls
from tests.test_consumer_support import offer, records, spawn
from tests.test_producer import forget_cached_loggers
from zkcrawl.admin.cluster import list_dead
from zkcrawl.queue.capped import CappedDir, DirLimits
from zkcrawl.queue.discovered import (
    DISCOVERED_FULL,
    MAX_BYTES,
    MAX_NODES,
    MAX_PAGE_LINK_BYTES,
    NODE_BYTES,
    DiscoveredReader,
    cap_page,
)
from zkcrawl.zk.client import ZkClient

HOSTILE_LINKS = 1000
LINK_BYTES = 8000


def _discovered_bytes(zk: ZkClient, root: str) -> tuple[int, int]:
    path = f"{root}/discovered"
    names = zk.get_children(path)
    return len(names), sum(len(zk.get(f"{path}/{n}")[0]) for n in names)


def _consumer(zk_hosts: str, root: str, out: Path, log: Path, *extra: str):  # type: ignore[no-untyped-def]
    return spawn(["--zk", zk_hosts, "--root", root, "--out", str(out), "--threads", "2",
                  "--domain-delay", "0", "--no-robots", "--allow-private-addresses",
                  "--log-format", "json", "--exit-when-idle", "1",
                  "--processor", "tests.plugins.procs:links", *extra], log)


def _finish(proc) -> None:  # type: ignore[no-untyped-def]
    try:
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_a_hostile_page_writes_at_most_the_page_cap(zk, zk_hosts, zk_root, tmp_path):
    page = "<title>h</title>" + "".join(f'<a href="/x/{i}?{"a" * LINK_BYTES}">x</a>'
                                        for i in range(HOSTILE_LINKS))
    out, log = tmp_path / "o.jsonl", tmp_path / "c.log"
    with TestServer({"/hostile": html(page)}) as srv:
        offer(zk, zk_root, [srv.url("/hostile")])
        _finish(_consumer(zk_hosts, zk_root, out, log))
    nodes, stored = _discovered_bytes(zk, zk_root)
    assert nodes <= 8  # before: 130 nodes
    # Before: 8.1 MB in 130 nodes. Now: the page's byte cap, plus the entries' envelope.
    assert 0 < stored <= 2 * MAX_PAGE_LINK_BYTES + 64 * 1024, stored
    assert [r["error"] for r in records(out)] == [None]  # the page itself is recorded
    capped = [json.loads(line) for line in log.read_text().splitlines()
              if '"discovered.page_capped"' in line]
    assert capped and capped[0]["kept"] + capped[0]["dropped"] >= HOSTILE_LINKS
    assert capped[0]["kept"] <= MAX_PAGE_LINK_BYTES // LINK_BYTES


@pytest.mark.slow
def test_a_full_directory_makes_items_wait_then_retry_with_a_reason(zk, zk_hosts, zk_root,
                                                                    tmp_path):
    pages = 6
    routes = {f"/l/{i}": html(f'<title>l{i}</title><a href="/next/{i}">n</a>')
              for i in range(pages)}
    out, log = tmp_path / "o.jsonl", tmp_path / "c.log"
    with TestServer(routes) as srv:
        urls = [srv.url(f"/l/{i}") for i in range(pages)]
        # No producer drains discovered/, which holds its cap of 2 nodes already: every
        # page with links waits 0.5 s, then its item is retried, then dead.
        zk.ensure_path(f"{zk_root}/discovered")
        for _ in range(2):
            zk.create(f"{zk_root}/discovered/dn-", b'{"links":[]}', sequence=True)
        offer(zk, zk_root, urls)
        _finish(_consumer(zk_hosts, zk_root, out, log, "--discovered-max-nodes", "2",
                          "--discovered-wait", "0.5", "--max-attempts", "2",
                          "--threads", "1"))
    nodes, _ = _discovered_bytes(zk, zk_root)
    assert nodes == 2  # nothing written past the cap
    dead = list_dead(zk, zk_root)
    assert sorted(d.url or "" for d in dead) == sorted(urls)  # none lost, none dropped
    assert {(d.error, d.attempts) for d in dead} == {(DISCOVERED_FULL, 2)}
    assert {r["error"] for r in records(out)} == {DISCOVERED_FULL}  # the dead letters' records
    full = [json.loads(line) for line in log.read_text().splitlines()
            if '"capped.full"' in line]
    assert len(full) == 2 * pages  # each try waited
    assert queued_urls(zk, zk_root) == [] == held(zk, zk_root)  # ingress, partitions, marks


def test_a_waiting_writer_goes_on_when_the_reader_drains(zk, zk_root):
    path = f"{zk_root}/discovered"
    zk.ensure_path(path)
    for _ in range(3):
        zk.create(f"{path}/dn-", b"{}", sequence=True)
    capped = CappedDir(zk, path, DirLimits(3, MAX_BYTES, NODE_BYTES), wait=30.0)
    assert capped.held() == (3, 3 * NODE_BYTES)
    answer: list[bool] = []
    writer = threading.Thread(target=lambda: answer.append(capped.room(1)))
    writer.start()
    wait_for(lambda: capped.full_waits == 1, what="the writer waiting")
    started = time.monotonic()
    zk.delete(f"{path}/{sorted(zk.get_children(path))[0]}")  # the producer drains one
    writer.join(20)
    assert answer == [True]
    assert time.monotonic() - started < 10  # on the watch, not at the 30 s bound
    # And a writer that finds it full with nobody draining says no after its wait.
    zk.create(f"{path}/dn-", b"{}", sequence=True)
    assert CappedDir(zk, path, DirLimits(3, MAX_BYTES, NODE_BYTES), wait=0.3).room(1) is False


def test_the_producer_reports_the_backlog(zk, zk_root):
    reader = DiscoveredReader(zk, zk_root)
    tx = zk.transaction()
    for _ in range(reader.cap // 2):
        tx.create(f"{reader.path}/dn-", b"{}", sequence=True)
    tx.commit()
    forget_cached_loggers()  # a logger bound by an earlier test is past capture_logs' reach
    with structlog.testing.capture_logs() as logs:
        assert len(reader.names()) == reader.cap // 2
        reader.names()  # at most one report per 30 s
    backlog = [e for e in logs if e["event"] == "discovered.backlog"]
    assert [(e["nodes"], e["bytes_at_most"]) for e in backlog] == [
        (reader.cap // 2, reader.cap // 2 * NODE_BYTES)]
    assert reader.cap == min(MAX_NODES, MAX_BYTES // NODE_BYTES)


@given(st.lists(st.text(max_size=300), max_size=80), st.integers(0, 50),
       st.integers(0, 5000))
def test_cap_page_keeps_a_prefix_within_both_bounds(links, max_links, max_bytes):
    kept, dropped = cap_page(links, max_links, max_bytes)
    assert len(kept) + dropped == len(links)
    assert len(kept) <= max_links
    assert sum(len(u.encode("utf-8", "surrogatepass")) + 1 for u in kept) <= max_bytes
    it = iter(links)
    assert all(any(u == v for v in it) for u in kept)  # in page order


@given(st.integers(1, 10**7), st.integers(0, 10**10), st.integers(1, 10**6))
def test_the_node_cap_bounds_nodes_and_bytes(max_nodes, max_bytes, node_bytes):
    cap = DirLimits(max_nodes, max_bytes, node_bytes).node_cap
    assert 1 <= cap <= max_nodes
    assert cap == 1 or cap * node_bytes <= max_bytes
