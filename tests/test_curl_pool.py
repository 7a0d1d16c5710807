"""The libcurl transport's pool of handles by origin (:class:`HandlePool`): a host's kept-alive
connection serves its next request on whichever thread, the pool stays within its bound, and
a handle made under one SSRF guard never serves a transport with another."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.httpd import TestServer, html
from zkcrawl.web.addresses import BLOCK_PRIVATE, BLOCKED_ADDRESS
from zkcrawl.web.fetch import Fetcher, FetchSettings
from zkcrawl.web.transports.curl import CurlTransport, HandlePool, _Handle

FAST = FetchSettings(guard=None, robots=False, timeout=2.0, backoff=0.05)
CONFIG = ("t", ())


@pytest.fixture
def srv() -> Iterator[TestServer]:
    with TestServer({"/": html("<title>a</title>")}) as server:
        yield server


def _get(transport: CurlTransport, url: str) -> tuple[int | None, str | None]:
    res = transport.get(url, connect=2, idle=2, budget=2, limit=10_000, accept=())
    return res.status, res.error


def test_threads_taking_turns_on_a_host_share_its_one_connection(srv: TestServer) -> None:
    """Four threads fetch the same host one at a time: one TCP connection in all (with one
    handle per thread, as before the pool, the server saw four)."""
    fetcher = Fetcher(FAST, http="curl")
    turn = threading.Lock()
    statuses: list[int | None] = []

    def work() -> None:
        for _ in range(5):
            with turn:
                statuses.append(fetcher.fetch(srv.url("/")).status)

    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        fetcher.close()
    assert statuses == [200] * 20
    assert len({r.client_port for r in srv.requests}) == 1


def test_concurrent_requests_to_one_host_never_share_a_handle(srv: TestServer) -> None:
    """Two transfers at once to one origin take two handles: two connections, both answered."""
    from tests.httpd import delayed

    srv.route("/slow", delayed(0.3, html("<title>s</title>")))
    pool = HandlePool(8)
    transports = [CurlTransport("t", guard=None, pool=pool) for _ in range(2)]
    results: list[tuple[int | None, str | None]] = []
    threads = [threading.Thread(target=lambda t=t: results.append(_get(t, srv.url("/slow"))))
               for t in transports]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    pool.close()
    assert results == [(200, None)] * 2
    assert len({r.client_port for r in srv.requests}) == 2


def test_the_pool_keeps_at_most_its_bound_least_recent_first() -> None:
    pool = HandlePool(2)
    handles = [_Handle(CONFIG, None) for _ in range(3)]
    keys = [(f"http://h{i}", CONFIG, 0) for i in range(3)]
    for key, handle in zip(keys, handles, strict=True):
        pool.give(key, handle)
    assert len(pool) == 2  # h0's handle, the least recent, was closed
    assert pool.take(keys[0]) is handles[1]  # full: another origin's least recent one
    assert pool.take(keys[2]) is handles[2]
    assert pool.take(keys[2]) is None and len(pool) == 0
    pool.close()
    pool.give(keys[0], handles[1])  # after close: closed, not kept
    assert len(pool) == 0


def test_a_handle_made_without_the_guard_never_serves_a_guarded_transport(
        srv: TestServer) -> None:
    """An open connection to a loopback server, kept by an unguarded transport, is not
    reused by a guarded one sharing the pool: the guarded one opens its own, and refuses it."""
    pool = HandlePool(8)
    open_ = CurlTransport("t", guard=None, pool=pool)
    guarded = CurlTransport("t", guard=BLOCK_PRIVATE, pool=pool)
    try:
        assert _get(open_, srv.url("/")) == (200, None)
        assert len(pool) == 1
        assert _get(guarded, srv.url("/")) == (None, BLOCKED_ADDRESS)
        assert len(srv.requests) == 1
    finally:
        pool.close()


def test_a_full_pool_hands_another_origins_handle_over_and_it_connects_anew() -> None:
    """With room for one idle handle, fetches alternating between two servers keep working;
    each server sees a new connection per request (the one handle's connection moves)."""
    with TestServer({"/": html("<title>a</title>")}) as a, \
            TestServer({"/": html("<title>b</title>")}) as b:
        pool = HandlePool(1)
        transport = CurlTransport("t", guard=None, pool=pool)
        try:
            for _ in range(3):
                assert _get(transport, a.url("/")) == (200, None)
                assert _get(transport, b.url("/")) == (200, None)
            assert len(pool) == 1
        finally:
            transport.close()
        assert len({r.client_port for r in a.requests}) == 3
        assert len({r.client_port for r in b.requests}) == 3
