"""A down host: a real closed port on 127.0.0.1, a real consumer, a real ZooKeeper.

Its items are recorded and dead-lettered as ``connection`` -- not ``robots``, though
robots.txt is the first request to meet the closed port (RFC 9309: unreachable means "try
later") -- only after the host's back-off, which doubles with each failure in a row and holds
every item of the host, while another host's item goes through at once."""

from __future__ import annotations

import json
import time

import pytest

from tests.httpd import TestServer, html
from tests.test_consumer_support import Running, left, offer, records, settings_for
from zkcrawl.admin.localzk import free_port
from zkcrawl.web.fetch import Fetcher, FetchSettings
from zkcrawl.web.urls import host_of


def test_fetch_from_a_closed_port_is_a_connection_error_even_via_robots() -> None:
    url = f"http://127.0.0.1:{free_port()}/page"
    with Fetcher(FetchSettings(guard=None, robots=True)) as fetcher:
        res = fetcher.fetch(url)
    assert (res.error, res.retryable, res.from_robots, res.status) == (
        "connection", True, True, None)


@pytest.mark.slow
def test_a_down_host_backs_off_shared_then_dead_letters_as_connection(zk, zk_hosts, zk_root,
                                                                    tmp_path) -> None:
    port = free_port()  # nobody listens there
    down = [f"http://127.0.0.1:{port}/item/{i}" for i in range(2)]
    with TestServer({"/ok": html("<title>up</title>")}) as srv:
        live = srv.url("/ok", host="localhost")
        offer(zk, zk_root, [*down, live])
        out = tmp_path / "o.jsonl"
        started = time.monotonic()
        run = Running(settings_for(zk_hosts, zk_root, out, "--robots", "--max-attempts", "2",
                                   "--threads", "2", "--backlog", "2", "--domain-delay", "0.1",
                                   "--exit-when-idle", "1"))
        run.join(60)
        elapsed = time.monotonic() - started
        run.close()
    recs = {r["url"]: r for r in records(out)}
    assert set(recs) == {*down, live}  # the books: one record each, nothing else
    assert recs[live]["error"] is None and recs[live]["attempt"] == 0
    for url in down:
        assert recs[url]["error"] == "connection" and recs[url]["attempt"] == 1
    dead = [json.loads(zk.get(f"{zk_root}/dead/{n}")[0])
            for n in zk.get_children(f"{zk_root}/dead")]
    assert sorted(d["url"] for d in dead) == sorted(down)
    assert {d["error"] for d in dead} == {"connection"}
    assert left(zk, zk_root) == []
    # Four tries of one host, one at a time, each after the back-off of the failures before
    # it (1 s, 2 s, 4 s): not four tries in the first second.
    assert elapsed >= 1 + 2 + 4 - 0.5
    assert run.worker.item_handler.gate.table.unreachable(host_of(down[0])) == 5  # 4 in a row + 1
