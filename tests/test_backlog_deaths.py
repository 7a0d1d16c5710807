"""A holder's death is charged only for the items it had started (SPEC §3, issue 22 item 8),
with real processes, a real ZooKeeper, a real HTTP server and SIGKILL: a consumer whose
backlog holds many items of one slow host (2 threads, pages that take 1.5 s) is killed; the
next owner charges a death only to the items marked started in ZooKeeper -- every one the
server saw a request for, and at most the pool's marks ahead (2 x ``--threads``) beside them
-- never to the ones still waiting in the backlog, and the books balance. (The page that
kills every consumer still ends as a dead letter after ``--max-attempts``:
tests/test_hostile.py.)

Until session 18 the victim's backlog was filled by a host in its ``Crawl-delay``; a host
that must wait now keeps its items in ZooKeeper (the owner's pick), so slow pages fill it."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.faults.books import check_books
from tests.httpd import TestServer, delayed, html
from tests.test_consumer_support import offer, records, spawn
from tests.test_hostile import consumer_args
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.layout import Layout
from zkcrawl.zk.client import ZkClient

pytestmark = pytest.mark.slow

PAGES = 12  # of the one slow host: the victim's table holds them all


def _most_held(err: Path) -> int:
    """The most leases a consumer's ``consumer.stats`` lines (stderr, JSON) showed."""
    most = 0
    for line in err.read_text(errors="replace").splitlines():
        if '"consumer.stats"' in line:
            try:
                most = max(most, int(json.loads(line).get("leases", 0)))
            except ValueError:
                continue  # a line being written
    return most


def _marked(zk: ZkClient, root: str) -> set[str]:
    """The URLs marked started in the partitions' batch nodes (a dead holder's, read before
    its partitions have a new owner): what its death is charged to."""
    layout = Layout.of(root)
    out: set[str] = set()
    for p in zk.get_children(layout.partitions):
        path = layout.partition(int(p))
        for n in zk.get_children(path):
            if n.startswith("qn-"):
                batch, why = pb.decode(zk.get(f"{path}/{n}")[0])
                assert batch is not None, why
                out |= {it.url for i, it in enumerate(batch.items)
                        if it is not None and i in batch.started and i not in batch.done}
    return out


def test_a_kill_charges_a_death_only_to_the_items_that_had_a_request(zk, zk_hosts, zk_root,
                                                                     tmp_path):
    threads = 2
    routes = {f"/p/{i}": delayed(1.5, html(f"<title>{i}</title>")) for i in range(PAGES)}
    with TestServer(routes) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(PAGES)]
        path_of = {u: f"/p/{i}" for i, u in enumerate(urls)}
        offer(zk, zk_root, urls)

        def pages() -> int:
            return sum(1 for r in srv.requests if r.path.startswith("/p/"))

        vout = tmp_path / "victim.jsonl"
        verr = tmp_path / "victim.err"
        victim = spawn(consumer_args(zk_hosts, zk_root, vout, "--id", "victim",
                                     "--threads", str(threads), "--backlog", "30",
                                     "--session-timeout", "4", "--stats-interval", "0.5"),
                       verr)
        try:
            wait_for(lambda: _most_held(verr) >= PAGES - 1 and pages() >= threads, 30,
                     "the victim holding the pages, two of them requested")
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
        finally:
            if victim.poll() is None:
                victim.kill()
        before = Counter(r.path for r in srv.requests if r.path.startswith("/p/"))
        marked = _marked(zk, zk_root)  # its session lives on for --session-timeout: no owner
        aout = tmp_path / "after.jsonl"
        after = spawn(consumer_args(zk_hosts, zk_root, aout, "--id", "after",
                                    "--exit-when-idle", "2"), tmp_path / "after.err")
        assert after.wait(120) == 0
        assert "Traceback" not in (tmp_path / "after.err").read_text()
    requested = {u for u in urls if before[path_of[u]]}
    by_victim = {r["url"] for r in records(vout, strict=False)}
    assert requested - by_victim <= marked  # a request only after its mark
    assert len(marked - requested) <= 2 * threads  # the marks ahead, at most
    assert len(requested | marked) <= PAGES - 4, (before, marked)  # most waited unmarked
    books = check_books(zk, zk_root, urls, [vout, aout], explained=requested | marked)
    assert books.dead == 0
    final = {r["url"]: r for r in records(vout, strict=False)}
    final.update({r["url"]: r for r in records(aout)})  # the next owner's, where it redid one
    for url in urls:
        r = final[url]
        if url in by_victim:  # recorded before the kill (and maybe redone)
            assert r["holder_deaths"] <= 1, r
        elif url in marked:  # marked started at the kill: the death is its attempt
            assert (r["attempt"], r["holder_deaths"]) == (1, 1), r
        else:  # waited in the victim's backlog, unmarked: no death charged
            assert (r["attempt"], r["holder_deaths"]) == (0, 0), r
    print(f"FIGURE backlog-kill: {books.line()}, requested before the kill "
          f"{len(requested)} of {PAGES}, marked {len(marked)}, charged "
          f"{sum(1 for r in final.values() if r['holder_deaths'])}")
