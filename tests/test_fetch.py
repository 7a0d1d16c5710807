"""The fetcher (zkcrawl.web.fetch) against real HTTP servers on 127.0.0.1 (tests/httpd.py).

Every test that fetches runs once per transport (``http``: libcurl, then a requests.Session):
the policy is one code path, so each outcome must be the same whatever moves the bytes.
"""

from __future__ import annotations

import email.utils
import socket
import ssl
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator

import pytest
import requests

from tests.httpd import (
    TestServer,
    chunked,
    delayed,
    gzip_bomb,
    gzipped,
    html,
    redirect,
    sequence,
    trickle,
)
from tests.test_decode import GBK_TEXT, GBK_TITLE
from zkcrawl.errors import UsageError
from zkcrawl.politeness.local import LocalPoliteness
from zkcrawl.settings import parse
from zkcrawl.web.extract import extract_record
from zkcrawl.web.fetch import Fetcher, FetchResult, FetchSettings, parse_retry_after
from zkcrawl.web.transports import TRANSPORTS
from zkcrawl.web.transports.base import ascii_url, parse_head
from zkcrawl.web.urls import host_of

PAGE = "<html><head><title>Hello</title></head><body>hi</body></html>"
# Every server here is on 127.0.0.1: the SSRF guard is off (guard=None, the fetcher's
# --allow-private-addresses) in every FetchSettings below; tests/test_ssrf.py tests it on.
FAST = FetchSettings(guard=None, robots=False, timeout=2.0, backoff=0.05)


@pytest.fixture
def srv() -> Iterator[TestServer]:
    with TestServer({"/": html(PAGE)}) as server:
        yield server


@pytest.fixture(params=TRANSPORTS)
def http(request: pytest.FixtureRequest) -> str:
    """The transport under test: every test asking for it runs once for each."""
    return request.param


Fetch = Callable[..., FetchResult]


@pytest.fixture
def fetch(http: str) -> Fetch:
    """``fetch(settings, url, **fetcher_kw)``: one fetch through a fresh Fetcher on ``http``."""

    def run(settings: FetchSettings, url: str, **kw: object) -> FetchResult:
        fetcher = Fetcher(settings, http=http, **kw)  # type: ignore[arg-type]
        try:
            return fetcher.fetch(url)
        finally:
            fetcher.close()

    return run


def test_200(srv: TestServer, fetch: Fetch) -> None:
    res = fetch(FAST, srv.url("/"))
    assert (res.status, res.error, res.retryable, res.redirects) == (200, None, False, 0)
    assert res.body == PAGE.encode() and res.ok
    assert res.content_type == "text/html; charset=utf-8"
    assert res.final_url == res.url == srv.url("/")
    assert res.elapsed_ms > 0 and res.attempts == 1
    (req,) = srv.requests_for("/")
    assert req.headers["User-Agent"] == FAST.user_agent
    assert "text/html" in req.headers["Accept"]
    assert "gzip" in req.headers["Accept-Encoding"]


def test_404_is_not_retried(srv: TestServer, fetch: Fetch) -> None:
    res = fetch(FetchSettings(guard=None, robots=False, retries=3, backoff=0.05),
                srv.url("/missing"))
    assert (res.status, res.error, res.retryable, res.retry_after) == (404, "http-404", False, None)
    assert res.attempts == 1 and len(srv.requests_for("/missing")) == 1


def test_500_then_200_with_one_retry(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/flaky", sequence((500, {}, b"oops"), html(PAGE)))
    res = fetch(FetchSettings(guard=None, robots=False, retries=1, backoff=0.05), srv.url("/flaky"))
    assert (res.status, res.error, res.attempts) == (200, None, 2)
    assert len(srv.requests_for("/flaky")) == 2


def test_5xx_retries_are_bounded(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/down", (503, {}, b"down"))
    res = fetch(FetchSettings(guard=None, robots=False, retries=2, backoff=0.01), srv.url("/down"))
    assert (res.error, res.retryable, res.attempts) == ("http-503", True, 3)
    assert len(srv.requests_for("/down")) == 3


def test_429_retry_after_is_parsed_and_capped(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/busy", (429, {"Retry-After": "3600"}, b""))
    pol = LocalPoliteness(0.0)
    settings = FetchSettings(guard=None, robots=False, retry_after_cap=5.0)
    res = fetch(settings, srv.url("/busy"), politeness=pol)
    assert (res.error, res.retryable, res.retry_after) == ("http-429", True, 5.0)
    # the host is held back for everyone, not just this request
    assert pol.reserve(host_of(srv.url("/"))) - time.monotonic() > 4.0


def test_429_retry_after_honoured_between_attempts(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/busy", sequence((429, {"Retry-After": "1"}, b""), html(PAGE)))
    res = fetch(FetchSettings(guard=None, robots=False, retries=1), srv.url("/busy"))
    assert (res.status, res.error, res.attempts) == (200, None, 2)
    (gap,) = srv.gaps("/busy")
    assert 1.0 <= gap < 3.0  # waited Retry-After, not the 0.5 s default backoff
    assert res.waited_ms >= 1000


def test_parse_retry_after() -> None:
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, cap=120, now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), 120, now) == 0
    assert parse_retry_after("7", cap=120) == 7
    assert parse_retry_after("99999", cap=120) == 120
    assert parse_retry_after("-3", cap=120) == 0
    for bad in (None, "", "soon", "nan", "inf"):
        assert parse_retry_after(bad, cap=120) is None


def test_timeout_when_server_is_slow_to_answer(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/slow", delayed(5.0, html(PAGE)))
    started = time.monotonic()
    res = fetch(FetchSettings(guard=None, robots=False, timeout=0.3), srv.url("/slow"))
    assert (res.error, res.retryable, res.status) == ("timeout", True, None)
    assert time.monotonic() - started < 2.0  # not the 5 s the server takes


def test_trickling_server_is_cut_at_total_budget(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/drip", trickle(b"x" * 1000, interval=0.2, chunk=1))
    settings = FetchSettings(guard=None, robots=False, timeout=1.0, total_timeout=1.0)
    started = time.monotonic()
    res = fetch(settings, srv.url("/drip"))
    elapsed = time.monotonic() - started
    assert (res.error, res.retryable, res.status) == ("timeout", True, 200)
    assert 0.9 <= elapsed < 2.5  # the budget, not the 200 s the whole body would take
    assert 0 < len(res.body) < 10


def test_stalled_body_is_cut_at_budget_not_at_read_timeout(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/stall", trickle(b"xy", interval=10.0))  # one byte, then silence
    settings = FetchSettings(guard=None, robots=False, timeout=10.0, total_timeout=0.5)
    started = time.monotonic()
    res = fetch(settings, srv.url("/stall"))
    assert res.error == "timeout" and res.body == b"x"
    assert time.monotonic() - started < 3.0  # the 0.5 s budget, not the 10 s read timeout


def test_max_bytes(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/big", html(b"<p>" + b"a" * 200_000))
    res = fetch(FetchSettings(guard=None, robots=False, max_bytes=50_000), srv.url("/big"))
    assert (res.error, res.retryable, res.status) == ("too-large", False, 200)
    assert len(res.body) == 50_000


def test_gzip_is_decoded_and_bomb_is_capped(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/gz", gzipped(PAGE))
    srv.route("/bomb", gzip_bomb(20_000_000))
    assert fetch(FAST, srv.url("/gz")).body == PAGE.encode()
    started = time.monotonic()
    res = fetch(FetchSettings(guard=None, robots=False, max_bytes=1_000_000), srv.url("/bomb"))
    assert res.error == "too-large" and len(res.body) == 1_000_000
    assert time.monotonic() - started < 5.0


def test_chunked_body(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/chunked", chunked([b"<title>", b"chunks", b"</title>"]))
    assert fetch(FAST, srv.url("/chunked")).body == b"<title>chunks</title>"


def test_redirect_chain(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/a", redirect("/b", 301))
    srv.route("/b", redirect(srv.url("/c", host="localhost"), 302))  # absolute, other host
    srv.route("/c", redirect("/", 307))
    res = fetch(FAST, srv.url("/a"))
    assert (res.status, res.error, res.redirects) == (200, None, 3)
    assert res.final_url == srv.url("/", host="localhost")
    assert res.url == srv.url("/a")


def test_redirect_loop_and_too_many(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/loop1", redirect("/loop2"))
    srv.route("/loop2", redirect("/loop1"))
    res = fetch(FAST, srv.url("/loop1"))
    assert (res.error, res.retryable, res.status) == ("redirects", False, 302)
    for i in range(5):
        srv.route(f"/hop{i}", redirect(f"/hop{i + 1}"))
    srv.route("/hop5", html(PAGE))
    assert fetch(FetchSettings(guard=None, robots=False, max_redirects=5), srv.url("/hop0")).ok
    res = fetch(FetchSettings(guard=None, robots=False, max_redirects=4), srv.url("/hop0"))
    assert res.error == "redirects" and res.redirects == 5


def test_content_type(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/img", (200, {"Content-Type": "image/png"}, b"\x89PNG" * 1000))
    srv.route("/xhtml", (200, {"Content-Type": "application/xhtml+xml"}, PAGE.encode()))
    srv.route("/untyped", (200, {}, PAGE.encode()))
    res = fetch(FAST, srv.url("/img"))
    assert (res.error, res.retryable, res.body, res.content_type) == (
        "content-type",
        False,
        b"",
        "image/png",
    )
    assert fetch(FAST, srv.url("/xhtml")).ok
    assert fetch(FAST, srv.url("/untyped")).ok


@pytest.mark.parametrize("url", ["mailto:a@b.c", "ftp://example.com/", "not a url", "http://"])
def test_bad_url(url: str, fetch: Fetch) -> None:
    res = fetch(FAST, url)
    assert (res.error, res.retryable) == ("bad-url", False)


def test_redirect_to_non_http_is_bad_url(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/ftp", redirect("ftp://example.com/file"))
    assert fetch(FAST, srv.url("/ftp")).error == "bad-url"


def test_connection_refused(fetch: Fetch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    res = fetch(FetchSettings(guard=None, robots=False, retries=1, backoff=0.01),
                f"http://127.0.0.1:{port}/")
    assert (res.error, res.retryable, res.status) == ("connection", True, None)
    assert res.attempts == 2  # one retry, as configured


def test_connections_are_reused(srv: TestServer, http: str) -> None:
    srv.route("/404", (404, {}, b"small error body"))
    fetcher = Fetcher(FAST, http=http)
    for path in ("/", "/404", "/", "/"):
        fetcher.fetch(srv.url(path))
    fetcher.close()
    assert len({r.client_port for r in srv.requests}) == 1


def test_robots_disallow_and_crawl_delay(http: str) -> None:
    routes = {
        "/robots.txt": (
            200,
            {"Content-Type": "text/plain"},
            b"User-agent: *\nDisallow: /private\nCrawl-delay: 0.3\n",
        ),
        "/*": html(PAGE),
    }
    with TestServer(routes) as srv:
        pol = LocalPoliteness(0.0)
        fetcher = Fetcher(FetchSettings(guard=None), politeness=pol, http=http)
        res = fetcher.fetch(srv.url("/private/page"))
        assert (res.error, res.retryable, res.status) == ("robots", False, None)
        assert not srv.requests_for("/private/page")
        assert fetcher.crawl_delay(srv.url("/")) == 0.3
        assert fetcher.robots_allowed(srv.url("/public"))
        assert not fetcher.robots_allowed(srv.url("/private"))
        # Crawl-delay becomes the host's minimum gap
        assert fetcher.fetch(srv.url("/a")).ok and fetcher.fetch(srv.url("/b")).ok
        gap = srv.times("/b")[0] - srv.times("/a")[0]
        assert gap >= 0.3 - 0.05  # scheduling jitter, see test_politeness
        # a redirect into a disallowed path is stopped too
        srv.route("/go", redirect("/private/x"))
        assert fetcher.fetch(srv.url("/go")).error == "robots"
        fetcher.close()
        assert len(srv.requests_for("/robots.txt")) == 1


def test_robots_5xx_is_a_temporary_disallow(fetch: Fetch) -> None:
    with TestServer({"/robots.txt": (503, {}, b""), "/": html(PAGE)}) as srv:
        res = fetch(FetchSettings(guard=None), srv.url("/"))
        assert (res.error, res.retryable, res.from_robots) == ("http-503", True, True)
        assert not srv.requests_for("/")


def test_robots_redirect_is_followed_and_missing_robots_allows(fetch: Fetch) -> None:
    routes = {
        "/robots.txt": redirect("/real-robots.txt", 301),
        "/real-robots.txt": (200, {}, b"User-agent: *\nDisallow: /x\n"),
        "/*": html(PAGE),
    }
    with TestServer(routes) as srv:
        assert fetch(FetchSettings(guard=None), srv.url("/x")).error == "robots"
    with TestServer({"/": html(PAGE)}) as srv:  # robots.txt -> 404
        assert fetch(FetchSettings(guard=None), srv.url("/")).ok


def test_close_cancels_a_politeness_wait(srv: TestServer, http: str) -> None:
    pol = LocalPoliteness(0.0)
    pol.back_off(host_of(srv.url("/")), 30)
    fetcher = Fetcher(FAST, http=http, politeness=pol)
    results = []
    worker = threading.Thread(target=lambda: results.append(fetcher.fetch(srv.url("/"))))
    started = time.monotonic()
    worker.start()
    threading.Timer(0.2, fetcher.close).start()
    worker.join(timeout=10)
    assert results[0].error == "cancelled" and results[0].retryable
    assert time.monotonic() - started < 5
    assert not srv.requests_for("/")


def test_fetch_then_extract_gbk_page_without_declared_charset(srv: TestServer, fetch: Fetch
                                                              ) -> None:
    title = GBK_TITLE
    page = f"<html><head><title>{title}</title></head><body><p>{GBK_TEXT}</p></body></html>"
    srv.route("/gbk", (200, {"Content-Type": "text/html"}, page.encode("gbk")))
    res = fetch(FAST, srv.url("/gbk"))
    assert extract_record(res.body, res.final_url, content_type=res.content_type).title == title


def test_deflate_is_decoded(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/deflate", (200, {"Content-Type": "text/html", "Content-Encoding": "deflate"},
                           zlib.compress(PAGE.encode())))
    res = fetch(FAST, srv.url("/deflate"))
    assert (res.error, res.body) == (None, PAGE.encode())


def test_robots_redirect_loop_counts_as_unavailable_and_allows(fetch: Fetch) -> None:
    # RFC 9309 §2.3.1.2: after too many redirects robots.txt may be treated as a 4xx.
    routes = {"/robots.txt": redirect("/r2.txt"), "/r2.txt": redirect("/robots.txt"),
              "/*": html(PAGE)}
    with TestServer(routes) as srv:
        assert fetch(FetchSettings(guard=None), srv.url("/page")).ok
        hops = len(srv.requests_for("/robots.txt")) + len(srv.requests_for("/r2.txt"))
        assert hops == 6  # the first request and five redirects, then it stops


def test_proxy_from_environment_and_no_proxy(srv: TestServer, monkeypatch: pytest.MonkeyPatch,
                                             fetch: Fetch) -> None:
    # The test server plays the forward proxy: it receives the absolute URL.
    srv.route("/via-proxy", html(PAGE))
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", srv.url(""))
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.2")
    res = fetch(FAST, "http://site.invalid/via-proxy")
    assert (res.status, res.error, res.body) == (200, None, PAGE.encode())
    (req,) = srv.requests_for("/via-proxy")
    assert req.target == "http://site.invalid/via-proxy" and req.host == "site.invalid"
    # no_proxy is honoured: this one goes direct, to a loopback address nobody listens on.
    port = srv.url("").rsplit(":", 1)[1]
    assert fetch(FAST, f"http://127.0.0.2:{port}/via-proxy").error == "connection"
    assert len(srv.requests_for("/via-proxy")) == 1


@pytest.fixture(scope="module")
def tls_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (Debian's openssl), as (cert, key) files."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
    return cert, key


def test_https_is_verified_and_a_ca_bundle_can_be_named(tls_cert: tuple[str, str],
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        fetch: Fetch) -> None:
    cert, key = tls_cert
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    with TestServer({"/": html(PAGE)}, tls=ctx) as srv:
        assert srv.url("/").startswith("https://")
        # Not signed by a CA we trust: refused, as a connection failure worth a retry.
        res = fetch(FAST, srv.url("/"))
        assert (res.error, res.retryable, res.status) == ("connection", True, None)
        monkeypatch.setenv("SSL_CERT_FILE", cert)  # the operator trusts it
        res = fetch(FAST, srv.url("/"))
        assert (res.status, res.error, res.body) == (200, None, PAGE.encode())


def test_ascii_url_and_parse_head() -> None:
    assert ascii_url("http://example.com/a?b=c") == "http://example.com/a?b=c"  # as is
    assert ascii_url("http://bücher.example/päth q?x=ü#frag") == \
        "http://xn--bcher-kva.example/p%C3%A4th%20q?x=%C3%BC"
    assert ascii_url("http://127.0.0.1:8080/ä") == "http://127.0.0.1:8080/%C3%A4"
    head = [b"HTTP/1.1 200 Connection established\r\n", b"\r\n",
            b"HTTP/1.1 404 Not Found\r\n", b"Content-Type: text/html\r\n",
            b"X-Long:  a: b \r\n", b"\r\n"]
    assert parse_head(head) == (404, {"content-type": "text/html", "x-long": "a: b"})
    assert parse_head([]) == (None, {})


def test_non_ascii_url_goes_out_percent_encoded(srv: TestServer, fetch: Fetch) -> None:
    srv.route("/p%C3%A4ge", html(PAGE))
    res = fetch(FAST, srv.url("/päge"))
    assert (res.status, res.error) == (200, None)
    assert srv.requests_for("/p%C3%A4ge")[0].target == "/p%C3%A4ge"


def _truncated(h) -> None:  # type: ignore[no-untyped-def]
    h.send_response(200)
    h.send_header("Content-Type", "text/html")
    h.send_header("Content-Length", "1000")
    h.end_headers()
    h.wfile.write(b"<title>cut")
    h.close_connection = True  # the server hangs up 990 bytes short


def _nothing(h) -> None:  # type: ignore[no-untyped-def]
    h.close_connection = True  # not even a status line


def test_a_truncated_body_or_an_empty_reply_is_a_retryable_connection_error(srv: TestServer,
                                                                           fetch: Fetch) -> None:
    srv.route("/cut", _truncated)
    srv.route("/empty", _nothing)
    res = fetch(FAST, srv.url("/cut"))
    assert (res.error, res.retryable, res.status, res.body) == ("connection", True, 200,
                                                                 b"<title>cut")
    res = fetch(FAST, srv.url("/empty"))
    assert (res.error, res.retryable, res.status) == ("connection", True, None)
    assert fetch(FAST, srv.url("/")).ok  # and the next fetch on that thread is fine


def _two_types(h) -> None:  # type: ignore[no-untyped-def]
    h.send_response(200)
    h.send_header("Content-Type", "text/plain")
    h.send_header("Content-Type", "text/html")  # a repeated header: the last one counts
    h.send_header("Set-Cookie", "session=abc; Path=/")
    h.send_header("Content-Length", str(len(PAGE)))
    h.end_headers()
    h.wfile.write(PAGE.encode())


def test_a_repeated_header_counts_once_and_cookies_are_not_kept(srv: TestServer,
                                                                 http: str) -> None:
    # requests would join repeated headers with commas and keep the cookie in its Session:
    # the requests transport takes the last value and keeps no cookie, as libcurl does.
    srv.route("/two", _two_types)
    fetcher = Fetcher(FAST, http=http)
    res = fetcher.fetch(srv.url("/two"))
    assert (res.status, res.error, res.content_type) == (200, None, "text/html")
    assert fetcher.fetch(srv.url("/")).ok
    fetcher.close()
    assert "Cookie" not in srv.requests_for("/")[0].headers


def test_an_unsupported_content_coding_is_a_protocol_error(srv: TestServer,
                                                           fetch: Fetch) -> None:
    srv.route("/lzw", (200, {"Content-Type": "text/html", "Content-Encoding": "compress"},
                       b"\x1f\x9d\x90<p>"))  # LZW: neither libcurl nor urllib3 inflates it
    srv.route("/bad-gzip", (200, {"Content-Type": "text/html", "Content-Encoding": "gzip"},
                            b"not gzip at all"))
    for path in ("/lzw", "/bad-gzip"):
        res = fetch(FAST, srv.url(path))
        # issue #27: permanent, not retried (it was "connection", retried)
        assert (res.error, res.retryable, res.status, res.body) == ("protocol", False, 200,
                                                                     b""), path


def test_a_cut_transfer_drops_its_connection_and_the_next_fetch_is_fine(srv: TestServer,
                                                                        http: str) -> None:
    srv.route("/big", html(b"<p>" + b"a" * 200_000))
    srv.route("/big-error", (500, {}, b"e" * 200_000))  # more than is worth draining
    fetcher = Fetcher(FetchSettings(guard=None, robots=False, max_bytes=1000), http=http)
    assert fetcher.fetch(srv.url("/big")).error == "too-large"
    assert fetcher.fetch(srv.url("/")).ok
    assert fetcher.fetch(srv.url("/big-error")).error == "http-500"
    assert fetcher.fetch(srv.url("/")).ok
    fetcher.close()
    ports = [r.client_port for r in srv.requests]
    assert ports[0] != ports[1] and ports[2] == ports[1] and ports[3] != ports[2]


def test_unknown_transport_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown HTTP transport 'urllib'"):
        Fetcher(FAST, http="urllib")


def test_requests_transport_takes_a_session_of_your_own(srv: TestServer) -> None:
    # requests-only by nature: what the requests transport is for (auth plugins, adapters).
    from zkcrawl.web.transports.requests import RequestsTransport

    def transport(user_agent: str) -> RequestsTransport:
        session = requests.Session()
        session.auth = ("crawler", "secret")
        return RequestsTransport(user_agent, session=session)

    with Fetcher(FAST, http=transport) as fetcher:
        assert fetcher.fetch(srv.url("/")).ok
    (req,) = srv.requests_for("/")
    assert req.headers["Authorization"].startswith("Basic ")
    assert req.headers["User-Agent"] == FAST.user_agent


@pytest.mark.parametrize("argv", [[], ["--start", "http://example.com/"]],
                         ids=["consumer", "producer"])
def test_http_flag_takes_curl_or_requests(argv: list[str]) -> None:
    # Imported here: the commands pull in the queue and ZooKeeper layers, which the fetch
    # tests above do not need.
    from zkcrawl.consumer.main import build_parser as consumer_parser
    from zkcrawl.consumer.settings import ConsumerSettings
    from zkcrawl.producer.main import build_parser as producer_parser
    from zkcrawl.producer.settings import ProducerSettings

    cls, parser = ((ConsumerSettings, consumer_parser()) if not argv
                   else (ProducerSettings, producer_parser()))
    assert parse(cls, parser, argv, {})[0].http == "curl"
    assert parse(cls, parser, [*argv, "--http", "requests"], {})[0].http == "requests"
    var = "ZKCRAWL_PRODUCER_HTTP" if argv else "ZKCRAWL_CONSUMER_HTTP"
    assert parse(cls, parser, argv, {var: "requests"})[0].http == "requests"
    with pytest.raises(UsageError):
        parse(cls, parser, [*argv, "--http", "urllib"], {})
    with pytest.raises(UsageError, match="--http"):
        parse(cls, parser, argv, {var: "urllib"})


def test_curl_handle_takes_each_gets_limits_though_it_sets_them_only_on_a_change(
        srv: TestServer) -> None:
    """The libcurl handle keeps its timeouts between GETs (set only when they change): a
    GET with a short budget after one with a long budget is cut at the short one, and the
    next long one is not cut at it."""
    from zkcrawl.web.transports.curl import CurlTransport
    srv.route("/slow", delayed(0.6, html(PAGE)))
    transport = CurlTransport("t", guard=None)
    try:
        def get(budget: float) -> tuple[str | None, int | None]:
            res = transport.get(srv.url("/slow"), connect=budget, idle=budget, budget=budget,
                           limit=10_000, accept=())
            return res.error, res.status
        assert get(10.0) == (None, 200)
        assert get(0.2) == ("timeout", None)  # its own budget (the first's: a 200)
        assert get(10.0) == (None, 200)  # and not the short one
    finally:
        transport.close()
