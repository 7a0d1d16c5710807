"""A holder's death is charged only for the items it had started (SPEC §3, issue 22 item 8),
with real processes, a real ZooKeeper, a real HTTP server and SIGKILL: a consumer whose
backlog holds many items of one slow host (robots.txt ``Crawl-delay: 1``) is killed; the
next owner charges a death only to the items the server saw a request for, and the books
balance. (The page that kills every consumer still ends as a dead letter after
``--max-attempts``: tests/test_hostile.py.)"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.faults.books import check_books
from tests.httpd import TestServer, html, static
from tests.test_consumer_support import offer, records, spawn
from tests.test_hostile import consumer_args

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


def test_a_kill_charges_a_death_only_to_the_items_that_had_a_request(zk, zk_hosts, zk_root,
                                                                     tmp_path):
    routes = {"/robots.txt": static(200, "User-agent: *\nCrawl-delay: 1\n",
                                    {"Content-Type": "text/plain"})}
    routes.update({f"/p/{i}": html(f"<title>{i}</title>") for i in range(PAGES)})
    with TestServer(routes) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(PAGES)]
        path_of = {u: f"/p/{i}" for i, u in enumerate(urls)}
        offer(zk, zk_root, urls)

        def pages() -> int:
            return sum(1 for r in srv.requests if r.path.startswith("/p/"))

        vout = tmp_path / "victim.jsonl"
        verr = tmp_path / "victim.err"
        victim = spawn(consumer_args(zk_hosts, zk_root, vout, "--id", "victim", "--robots",
                                     "--threads", "2", "--backlog", "30",
                                     "--stats-interval", "0.5"), verr)
        try:
            wait_for(lambda: _most_held(verr) >= PAGES - 1 and pages() >= 2, 30,
                     "the victim holding the pages, two of them requested")
            seen = pages()
            # Right after a request: the next one is a second away (its mark not written).
            wait_for(lambda: pages() > seen, 10, "one more request")
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
        finally:
            if victim.poll() is None:
                victim.kill()
        before = Counter(r.path for r in srv.requests if r.path.startswith("/p/"))
        aout = tmp_path / "after.jsonl"
        after = spawn(consumer_args(zk_hosts, zk_root, aout, "--id", "after",
                                    "--exit-when-idle", "2"), tmp_path / "after.err")
        assert after.wait(120) == 0
        assert "Traceback" not in (tmp_path / "after.err").read_text()
    requested = {u for u in urls if before[path_of[u]]}
    assert 2 < len(requested) <= PAGES - 4, before  # most still waited in the backlog
    books = check_books(zk, zk_root, urls, [vout, aout], explained=requested)
    assert books.dead == 0
    by_victim = {r["url"] for r in records(vout, strict=False)}
    final = {r["url"]: r for r in records(vout, strict=False)}
    final.update({r["url"]: r for r in records(aout)})  # the next owner's, where it redid one
    for url in urls:
        r = final[url]
        if url not in requested:  # waited in the victim's backlog: no death charged
            assert (r["attempt"], r["holder_deaths"]) == (0, 0), r
        elif url not in by_victim:  # in flight at the kill: the death is its attempt
            assert (r["attempt"], r["holder_deaths"]) == (1, 1), r
        else:
            assert r["holder_deaths"] <= 1, r
    print(f"FIGURE backlog-kill: {books.line()}, requested before the kill "
          f"{len(requested)} of {PAGES}, charged "
          f"{sum(1 for r in final.values() if r['holder_deaths'])}")
