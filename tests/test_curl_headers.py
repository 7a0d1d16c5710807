"""Response heads read through libcurl's header API (zkcrawl.web.transports.curl_headers) are
the heads pycurl's HEADERFUNCTION path parses: same status, same headers, whatever the
server sends; a handle never shows the previous transfer's head; the probe finds the handle
of a live pycurl object only, and the fallback is one variable away."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pycurl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.httpd import TestServer, html, redirect
from zkcrawl.web.transports import curl as curl_mod
from zkcrawl.web.transports.base import Response
from zkcrawl.web.transports.curl import CurlTransport, HandlePool
from zkcrawl.web.transports.curl_headers import header_api


def raw(data: bytes) -> Any:
    """A route that writes ``data`` as the whole response, then closes."""
    def handle(h: BaseHTTPRequestHandler) -> None:
        h.wfile.write(data)
        h.wfile.flush()
        h.close_connection = True
    return handle


@pytest.fixture(scope="module")
def srv() -> Iterator[TestServer]:
    with TestServer({"/": html("<title>a</title>", ETag='"v1"')}) as server:
        yield server


def _get(t: CurlTransport, url: str) -> Response:
    return t.get(url, connect=2, idle=2, budget=3, limit=100_000, accept=())


def _both(url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Response, Response]:
    fast = CurlTransport("t", guard=None)
    try:
        a = _get(fast, url)
    finally:
        fast.close()
    with monkeypatch.context() as m:
        m.setattr(curl_mod, "header_api", lambda: None)  # handles made now: HEADERFUNCTION
        slow = CurlTransport("t", guard=None)
        try:
            b = _get(slow, url)
        finally:
            slow.close()
    return a, b


def test_the_header_api_is_in_use_here() -> None:
    """pycurl 7.x with a libcurl of 7.84 or later (pyproject's pycurl wheel bundles one): the
    fast path is the one the tests and benchmarks measure."""
    api = header_api()
    assert api is not None
    c = pycurl.Curl()
    assert api.handle_of(c) is not None
    c.close()
    assert api.handle_of(c) is None  # closed: its handle is gone, nothing to read


@pytest.mark.parametrize("response", [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Dup: one\r\nx-dup: two\r\n"
    b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 404 Not Found\r\nCONTENT-TYPE:   text/plain  \r\nContent-Length: 4\r\n\r\nnope",
    b"HTTP/1.1 304 Not Modified\r\nETag: \"abc\"\r\nLast-Modified: Sat, 05 Dec 2026 10:00:00 "
    b"GMT\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\nX-Early: yes\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n"
    b"X-Late: \xe9t\xe9\r\n\r\nx",
    b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n<title>eof</title>",
], ids=["repeated", "case-space", "304", "1xx-then-200", "retry-after", "http10-eof"])
def test_both_paths_read_the_same_head(response: bytes, srv: TestServer,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    srv.route("/raw", raw(response))
    a, b = _both(srv.url("/raw"), monkeypatch)
    assert (a.status, a.headers, a.body, a.error) == (b.status, b.headers, b.body, b.error)
    assert a.status is not None and a.headers


def test_a_redirect_keeps_its_location(srv: TestServer, monkeypatch: pytest.MonkeyPatch) -> None:
    srv.route("/moved", redirect("/elsewhere", 301))
    a, b = _both(srv.url("/moved"), monkeypatch)
    assert a.status == b.status == 301
    assert a.headers["location"] == b.headers["location"] == "/elsewhere"


def test_a_handle_never_shows_the_previous_transfers_head(srv: TestServer) -> None:
    """One handle for two origins (a pool of one): a 200 with an ETag, then a refused
    connection -- no status, no headers, not the first response's."""
    pool = HandlePool(idle=1)
    t = CurlTransport("t", guard=None, pool=pool)
    try:
        first = _get(t, srv.url("/"))
        assert first.status == 200 and first.headers["etag"] == '"v1"'
        assert len(pool) == 1
        refused = _get(t, "http://127.0.0.1:1/")
        assert len(pool) == 1  # the same handle came back
    finally:
        t.close()
    assert (refused.status, refused.headers, refused.error) == (None, {}, "connection")


def test_the_variable_turns_the_api_off(monkeypatch: pytest.MonkeyPatch) -> None:
    header_api.cache_clear()
    monkeypatch.setenv("ZKCRAWL_CURL_HEADER_CALLBACK", "1")
    try:
        assert header_api() is None
    finally:
        monkeypatch.delenv("ZKCRAWL_CURL_HEADER_CALLBACK")
        header_api.cache_clear()
    assert header_api() is not None



def test_the_api_is_probed_once_where_the_factory_is_made() -> None:
    """``CurlTransport.factory`` probes the header API before any thread uses it: the
    threads' first handles find it probed (each probed it at once before: ~1.5 ms apiece,
    25 ms of a consumer's first requests)."""
    header_api.cache_clear()
    try:
        CurlTransport.factory()
        assert header_api.cache_info().currsize == 1 and header_api.cache_info().misses == 1
    finally:
        header_api.cache_clear()


_NAME = st.text(st.sampled_from("abcXYZ-_0123456789"), min_size=1, max_size=12)
_VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF,
                               blacklist_characters="\x7f"), max_size=40)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(headers=st.lists(st.tuples(_NAME, _VALUE), max_size=8),
       status=st.sampled_from([200, 204, 404, 500]))
def test_any_head_reads_the_same_both_ways(headers: list[tuple[str, str]], status: int,
                                           srv: TestServer,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile heads (any latin-1 text, repeated and odd names): the API's head is the one
    the callback path parses."""
    lines = b"".join(f"X-{n}: {v}\r\n".encode("latin-1") for n, v in headers)
    srv.route("/any", raw(b"HTTP/1.1 %d X\r\n" % status + lines + b"Content-Length: 0\r\n\r\n"))
    a, b = _both(srv.url("/any"), monkeypatch)
    assert (a.status, a.headers, a.error) == (b.status, b.headers, b.error)
