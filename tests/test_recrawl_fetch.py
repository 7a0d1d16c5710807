"""Conditional re-crawls over HTTP (issue #23 item 3): validators cleaned, If-None-Match /
If-Modified-Since sent by both transports against a real server, a 304 is ``not_modified``
with no body, and hostile ETag / Last-Modified values never reach a request header."""

from __future__ import annotations

import email.utils
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.httpd import TestServer
from zkcrawl.web.fetch import Fetcher, FetchSettings
from zkcrawl.web.transports import TRANSPORTS
from zkcrawl.web.validators import (
    EARLIEST,
    ETAG_LIMIT,
    Validators,
    clean_etag,
    clean_last_modified,
    clean_signature,
    content_signature,
)

FAST = FetchSettings(guard=None, robots=False, timeout=2.0, backoff=0.05)
BODY = b"<html><head><title>A</title></head><body>" + b"x" * 20_000 + b"</body></html>"
ETAG = '"v1-abc"'
LAST = "Tue, 01 Dec 2026 10:00:00 GMT"
NOW = 1_796_000_000.0  # 2026-11-30


def _conditional(h: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
    head = {"ETag": ETAG, "Last-Modified": LAST, "Content-Type": "text/html"}
    if h.headers.get("If-None-Match") == ETAG:
        return 304, {"ETag": ETAG}, b""
    if h.headers.get("If-Modified-Since") == LAST:
        return 304, {}, b""
    return 200, head, BODY


@pytest.fixture
def srv() -> Iterator[TestServer]:
    with TestServer({"/a": _conditional, "/plain": (304, {}, b"")}) as server:
        yield server


@pytest.fixture(params=TRANSPORTS)
def fetcher(request: pytest.FixtureRequest) -> Iterator[Fetcher]:
    with Fetcher(FAST, http=request.param) as f:
        yield f


def test_first_fetch_sends_no_validator_then_304_has_no_body(srv: TestServer,
                                                             fetcher: Fetcher) -> None:
    first = fetcher.fetch(srv.url("/a"))
    assert (first.status, first.error, first.not_modified) == (200, None, False)
    assert first.headers["etag"] == ETAG and len(first.body) == len(BODY)
    assert "If-None-Match" not in srv.requests_for("/a")[0].headers
    again = fetcher.fetch(srv.url("/a"), Validators(etag=ETAG, last_modified=LAST))
    assert (again.status, again.error, again.not_modified, again.body) == (304, None, True, b"")
    sent = srv.requests_for("/a")[1].headers
    assert (sent["If-None-Match"], sent["If-Modified-Since"]) == (ETAG, LAST)
    # The handle forgets them: the next plain fetch sends none (curl keeps options).
    third = fetcher.fetch(srv.url("/a"))
    assert third.status == 200 and "If-None-Match" not in srv.requests_for("/a")[2].headers


def test_if_modified_since_alone(srv: TestServer, fetcher: Fetcher) -> None:
    res = fetcher.fetch(srv.url("/a"), Validators(last_modified=LAST))
    assert res.not_modified and res.status == 304
    assert "If-None-Match" not in srv.requests_for("/a")[0].headers


def test_304_without_validators_is_still_an_error(srv: TestServer, fetcher: Fetcher) -> None:
    res = fetcher.fetch(srv.url("/plain"))
    assert (res.error, res.not_modified) == ("http-304", False)
    sig_only = fetcher.fetch(srv.url("/plain"), Validators(signature="0" * 32))
    assert sig_only.error == "http-304"  # a signature alone sends no header


def test_hostile_meta_never_reaches_a_header(srv: TestServer, fetcher: Fetcher) -> None:
    meta = {"etag": '"x"\r\nX-Injected: 1', "last_modified": "Fri, 31 Dec 9999 23:59:59 GMT",
            "signature": "zz"}
    v = Validators.from_meta(meta, now=NOW)
    assert v is not None and v.etag is None and v.signature is None
    res = fetcher.fetch(srv.url("/a"), v)
    sent = srv.requests_for("/a")[0].headers
    assert "X-Injected" not in sent and "If-None-Match" not in sent
    when = email.utils.parsedate_to_datetime(sent["If-Modified-Since"]).timestamp()
    assert when == NOW  # the year 9999 clamped to now
    assert res.status == 200


@given(st.text(max_size=400))
def test_clean_etag_only_visible_ascii(value: str) -> None:
    out = clean_etag(value)
    if out is not None:
        assert out == value and 1 <= len(out) <= ETAG_LIMIT
        assert all("!" <= ch <= "~" for ch in out)


@given(st.one_of(st.text(max_size=80), st.integers(), st.floats(allow_nan=True),
                 st.none(), st.booleans(), st.lists(st.integers(), max_size=2)))
def test_clean_last_modified_never_raises_and_is_clamped(value: object) -> None:
    out = clean_last_modified(value, now=NOW)
    if out is not None:
        assert out.isascii() and "\r" not in out and "\n" not in out and out.endswith("GMT")
        ts = email.utils.parsedate_to_datetime(out).timestamp()
        assert EARLIEST <= ts <= NOW


@given(st.dictionaries(st.sampled_from(["etag", "last_modified", "signature", "x"]),
                       st.one_of(st.text(max_size=50), st.integers(), st.none()), max_size=4))
def test_validators_from_any_meta(doc: dict[str, object]) -> None:
    v = Validators.from_meta(doc, now=NOW)
    assert v is not None
    for line in v.headers():
        assert line.isascii() and "\r" not in line and "\n" not in line
    assert v.signature is None or clean_signature(v.signature) == v.signature


def test_signature_ignores_whitespace_only() -> None:
    assert content_signature(b"<p>a  b</p>\n") == content_signature(b"<p>a b</p>")
    assert content_signature(b"<p>a b</p>") != content_signature(b"<p>a c</p>")
    assert clean_signature(content_signature(b"x")) is not None
    assert Validators.from_meta("not an object") is None
