"""Issue #26, item 4: attempts mean fetches -- a real ``kill -9`` of a consumer in the middle
of a fetch, a real ZooKeeper, a second real consumer: the records keep the tries apart from
the redelivery (``attempt 2 = 1 fetched before + 1 holder died``), and the retry carries the
death along in the item."""

from __future__ import annotations

import json
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.httpd import TestServer, html, sequence
from tests.test_consumer_support import offer, records, spawn
from zkcrawl.admin.cluster import list_dead
from zkcrawl.consumer.pipeline import holder_deaths
from zkcrawl.queue.claims import Claimed, attempts_text
from zkcrawl.queue.items import Item


def argv(zk_hosts: str, zk_root: str, out, *extra: str) -> list[str]:
    return ["--zk", zk_hosts, "--root", zk_root, "--out", str(out), "--log-format", "json",
            "--no-robots", "--allow-private-addresses", "--session-timeout", "2",
            "--domain-delay", "0", "--threads", "1", "--backlog", "0", "--max-attempts", "3",
            *extra]


def hang(srv: TestServer):
    def handle(_h):
        srv.sleep(60)  # the first holder is killed while it waits here
        return html("<title>late</title>")
    return handle


@pytest.mark.slow
def test_a_holder_killed_mid_fetch_is_told_apart_from_fetches(zk, zk_hosts, zk_root,
                                                              tmp_path, procs):
    with TestServer() as srv:
        srv.route("/p", sequence(hang(srv), html("down", status=503),
                                 html("<title>ok</title>")))
        offer(zk, zk_root, [srv.url("/p")])
        first = spawn(argv(zk_hosts, zk_root, tmp_path / "a.jsonl"), tmp_path / "a.log")
        procs.append(first)
        srv.wait_for_requests(1, "/p", timeout=30)  # fetching it now
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = spawn(argv(zk_hosts, zk_root, tmp_path / "b.jsonl", "--exit-when-idle", "1"),
                       tmp_path / "b.log")
        procs.append(second)
        assert second.wait(90) == 0
        assert len(srv.requests_for("/p")) == 3
    [rec] = records(tmp_path / "b.jsonl")  # the 503 was a retry, no record; then the page
    assert rec["error"] is None and rec["title"] == "ok"
    # 2 earlier attempts: the killed holder's claim and the 503. Fetches are the tries that
    # came to an outcome (the 503, this page); the death came back through the retried
    # item's meta (the page's own claim saw no death).
    assert (rec["attempt"], rec["holder_deaths"], rec["fetches"]) == (2, 1, 2)
    assert attempts_text(rec["attempt"], rec["holder_deaths"]) == "2 (1 fetched, 1 holder died)"
    assert list_dead(zk, zk_root) == []
    errs = [json.loads(x) for x in (tmp_path / "b.log").read_text().splitlines()
            if x.startswith("{")]
    assert not [e for e in errs if e.get("level") == "error"]


def claimed(attempt: int, deaths: int, meta: dict[str, object]) -> Claimed:
    return Claimed(name="qn-0000000001", seq=1, data=b"", error=None, ctime=0.0,
                   item=Item(url="http://example.org/", attempt=attempt, meta=meta),
                   deaths=deaths)


@given(st.integers(0, 50), st.integers(0, 5),
       st.one_of(st.none(), st.integers(-5, 100), st.text(max_size=5), st.booleans(),
                 st.floats(allow_nan=True), st.lists(st.integers(), max_size=2)))
def test_property_holder_deaths_from_hostile_meta_stay_within_the_attempts(
        attempt: int, deaths: int, carried: object):
    meta = {} if carried is None else {"holder_deaths": carried}
    c = claimed(attempt, deaths, meta)
    n = holder_deaths(c)
    assert 0 <= n <= c.attempt and n >= min(deaths, c.attempt)
    text = attempts_text(c.attempt, n)
    assert text.startswith(str(c.attempt))
