"""The SSRF guard (zkcrawl.web.addresses) through the fetcher, on both transports.

Servers run on 127.0.0.1 (tests/httpd.py), which the guard blocks by default; a server on
127.0.0.2 stands for a public site, with a guard whose allow-list holds 127.0.0.2/32 only (on
Linux all of 127.0.0.0/8 is loopback). A blocked fetch must never reach the server: the guard
checks the address before connecting, so not even a connection is accepted.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.httpd import TestServer, html, redirect
from zkcrawl.web.addresses import BLOCK_PRIVATE, AddressGuard
from zkcrawl.web.fetch import Fetcher, FetchResult, FetchSettings
from zkcrawl.web.transports import TRANSPORTS, CurlTransport
from zkcrawl.web.urls import normalize_url

PAGE = "<html><head><title>Hello</title></head><body>hi</body></html>"
PUBLIC = AddressGuard(allow=(ipaddress.ip_network("127.0.0.2/32"),))  # 127.0.0.2 "is public"
# retries=2: a blocked address must not be retried however many retries are allowed.
BASE = FetchSettings(robots=False, timeout=2.0, retries=2, backoff=0.01)
PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
              "ALL_PROXY", "no_proxy", "NO_PROXY")


@pytest.fixture(params=TRANSPORTS)
def http(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARS:  # the tests choose their proxies themselves
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def srv() -> Iterator[TestServer]:
    with TestServer({"/": html(PAGE), "/robots.txt": (404, {}, b"")}) as server:
        yield server


def fetch(url: str, http: Any, guard: AddressGuard | None = BLOCK_PRIVATE,
          **kw: Any) -> FetchResult:
    settings = FetchSettings(**{**BASE.__dict__, "guard": guard, **kw})
    with Fetcher(settings, http=http) as fetcher:
        return fetcher.fetch(url)


def assert_blocked(res: FetchResult) -> None:
    assert (res.error, res.retryable, res.status, res.attempts) == (
        "blocked-address", False, None, 1), res


# -- the guard on -----------------------------------------------------------------------------


def test_loopback_is_blocked_and_never_contacted(http: str) -> None:
    with socket.socket() as listener:  # a bare listener: sees even a connection that sends nothing
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        assert_blocked(fetch(f"http://127.0.0.1:{port}/", http))
        with pytest.raises(TimeoutError):
            listener.accept()


def test_blocked_with_robots_on_fetches_nothing_at_all(srv: TestServer, http: str) -> None:
    res = fetch(srv.url("/"), http, robots=True)  # robots.txt's origin is refused first
    assert_blocked(res)
    assert srv.requests == []


def test_default_settings_block(srv: TestServer, http: str) -> None:
    assert FetchSettings().guard == BLOCK_PRIVATE
    with Fetcher(FetchSettings(robots=False), http=http) as fetcher:
        assert_blocked(fetcher.fetch(srv.url("/")))
    assert srv.requests == []


def test_allow_list_exempts_a_network(http: str) -> None:
    with TestServer({"/": html(PAGE)}, host="127.0.0.2") as site:
        res = fetch(site.url("/"), http, guard=PUBLIC)
        assert (res.status, res.error) == (200, None)
        assert res.body == PAGE.encode()


@pytest.mark.parametrize("robots", [False, True], ids=["no-robots", "robots"])
def test_redirect_to_a_blocked_address_is_blocked_at_the_hop(srv: TestServer, http: str,
                                                             robots: bool) -> None:
    # With robots.txt on, the hop's robots.txt (same origin) is what is refused first.
    with TestServer({"/": html(PAGE)}, host="127.0.0.2") as site:
        site.route("/go", redirect(srv.url("/")))
        res = fetch(site.url("/go"), http, guard=PUBLIC, robots=robots)
        assert_blocked(res)
        assert res.redirects == 1 and res.final_url == srv.url("/")
        assert len(site.requests_for("/go")) == 1
    assert srv.requests == []


def test_a_kept_alive_connection_does_not_carry_over_to_a_blocked_host(
        srv: TestServer, http: str) -> None:
    # The first fetch opens a connection to the allowed 127.0.0.2; the second, to 127.0.0.1,
    # must open (and check) its own -- in the same thread, through the same transport.
    with TestServer({"/": html(PAGE)}, host="127.0.0.2") as site:
        settings = FetchSettings(**{**BASE.__dict__, "guard": PUBLIC})
        with Fetcher(settings, http=http) as fetcher:
            assert fetcher.fetch(site.url("/")).ok
            assert_blocked(fetcher.fetch(srv.url("/")))
            assert fetcher.fetch(site.url("/")).ok
        assert len({r.client_port for r in site.requests}) == 1  # reused meanwhile
    assert srv.requests == []


Resolving = Callable[[int], Any]


@pytest.fixture
def resolving(http: str, monkeypatch: pytest.MonkeyPatch) -> Resolving:
    """``resolving(port)``: the ``http`` argument of a Fetcher whose transport resolves
    ``internal.test`` to 127.0.0.1 -- libcurl through CURLOPT_RESOLVE (CurlTransport's ``resolve``),
    requests through ``socket.getaddrinfo`` (what urllib3 calls), patched for this test."""

    def make(port: int) -> Any:
        if http == "curl":
            return lambda ua: CurlTransport(ua, resolve=[f"internal.test:{port}:127.0.0.1"])
        real = socket.getaddrinfo

        def getaddrinfo(host: Any, *args: Any, **kw: Any) -> Any:
            return real("127.0.0.1" if host == "internal.test" else host, *args, **kw)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        return "requests"

    return make


def test_a_name_resolving_to_a_private_address_is_blocked(
        srv: TestServer, resolving: Resolving) -> None:
    url = f"http://internal.test:{srv.port}/"
    assert_blocked(fetch(url, resolving(srv.port)))
    assert srv.requests == []
    res = fetch(url, resolving(srv.port), guard=None)  # the same name, the guard off
    assert (res.status, res.error) == (200, None)
    assert [r.host for r in srv.requests] == [f"internal.test:{srv.port}"]


SPELLINGS = ["http://2130706433:{port}/", "http://0x7f.1:{port}/", "http://127.1:{port}/",
             "http://0177.0.0.1:{port}/", "http://[::ffff:127.0.0.1]:{port}/"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_odd_spellings_of_loopback_are_blocked(srv: TestServer, http: str,
                                               spelling: str) -> None:
    url = spelling.format(port=srv.port)
    normalized = normalize_url(url)  # what the producer would offer, if it lets it through
    for candidate in {url, normalized} - {None}:
        assert candidate is not None
        assert_blocked(fetch(candidate, http))
    assert srv.requests == []


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_odd_spellings_are_fetched_with_the_guard_off(srv: TestServer, http: str,
                                                      spelling: str) -> None:
    url = spelling.format(port=srv.port)
    for guard in (None, AddressGuard.off()):
        res = fetch(url, http, guard=guard)
        if "::ffff:" in url and res.error == "connection":
            pytest.skip("no IPv4-mapped IPv6 connections here")
        assert (res.status, res.error) == (200, None), res


def test_the_guard_off_fetches_loopback(srv: TestServer, http: str) -> None:
    res = fetch(srv.url("/"), http, guard=None, robots=True)
    assert (res.status, res.error, res.body) == (200, None, PAGE.encode())


def test_a_transport_without_set_guard_is_refused_unless_the_guard_is_off(
        srv: TestServer) -> None:
    class Plain:  # only the Transport protocol: it cannot check what it connects to
        def __init__(self, user_agent: str) -> None:
            self.transport = CurlTransport(user_agent, guard=None)

        def get(self, url: str, **kw: Any) -> Any:
            return self.transport.get(url, **kw)

        def close(self) -> None:
            self.transport.close()

    res = fetch(srv.url("/"), Plain)
    assert res.error == "connection" and srv.requests == []  # TypeError, logged
    assert fetch(srv.url("/"), Plain, guard=None).ok


# -- proxies ----------------------------------------------------------------------------------


@pytest.fixture
def proxy() -> Iterator[TestServer]:
    """A forward proxy on 127.0.0.1 (it answers every absolute-form request itself)."""
    with TestServer({"*": html(PAGE)}) as server:
        yield server


def test_through_a_proxy_the_proxy_address_is_allowed_and_the_target_checked(
        proxy: TestServer, http: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("http_proxy", proxy.base_url)
    # The proxy is on 127.0.0.1, which the operator chose: connecting to it is fine. A target
    # that does not resolve here is the proxy's to resolve (best effort: let through).
    res = fetch("http://public.invalid/page", http)
    assert (res.status, res.error) == (200, None), res
    assert [r.target for r in proxy.requests] == ["http://public.invalid/page"]
    # A target that is (or resolves to) an internal address is refused before the request.
    for url in ("http://127.0.0.1:9/", "http://localhost:9/", "http://0x7f.1:9/"):
        assert_blocked(fetch(url, http))
    assert len(proxy.requests) == 1


# -- AddressGuard.blocked ---------------------------------------------------------------------

BLOCKED = ["127.0.0.1", "127.255.255.254", "10.0.0.1", "172.16.0.1", "192.168.1.1",
           "169.254.169.254", "100.64.0.1", "0.0.0.0", "0.1.2.3", "224.0.0.1", "224.0.1.1",
           "239.255.255.250", "240.0.0.1", "255.255.255.255", "192.0.0.9", "192.0.2.1",
           "198.51.100.1", "203.0.113.1", "198.18.0.1", "198.19.255.255", "192.88.99.1",
           "::", "::1", "fe80::1", "fe80::1%lo", "fec0::1", "fc00::1", "fd12:3456::1",
           "ff02::1", "ff0e::1", "::ffff:127.0.0.1", "::ffff:10.1.2.3", "::ffff:169.254.1.1",
           "::127.0.0.1", "::8.8.8.8", "64:ff9b::127.0.0.1", "64:ff9b::10.0.0.1",
           "64:ff9b:1::8.8.8.8", "2002:7f00:1::1", "2002:a00:1::", "2002:c0a8:101::1",
           "2001::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:db8::1", "3fff::1",
           "100::1", "5f00::1", "[::1]", "not-an-ip", "", "127.0.0.1:80", "1.2.3"]
ALLOWED = ["8.8.8.8", "1.1.1.1", "93.184.215.14", "2606:4700:4700::1111", "2a00:1450::1",
           "::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2002:808:808::1", "[2606:4700::1]"]


@pytest.mark.parametrize("ip", BLOCKED)
def test_blocked_addresses(ip: str) -> None:
    reason = BLOCK_PRIVATE.blocked(ip)
    assert isinstance(reason, str) and reason
    assert AddressGuard.off().blocked(ip) is None


@pytest.mark.parametrize("ip", ALLOWED)
def test_public_addresses(ip: str) -> None:
    assert BLOCK_PRIVATE.blocked(ip) is None


def test_allow_list() -> None:
    guard = AddressGuard(allow=("10.1.0.0/16", ipaddress.ip_network("fd00::/8")))
    assert guard.blocked("10.1.2.3") is None and guard.blocked("::ffff:10.1.2.3") is None
    assert guard.blocked("fd00::5") is None
    assert guard.blocked("10.2.0.1") and guard.blocked("127.0.0.1")
    assert guard == AddressGuard(allow=("10.1.0.0/16", "fd00::/8"))
    assert hash(guard) == hash(AddressGuard(allow=("10.1.0.0/16", "fd00::/8")))
    assert AddressGuard.off() != BLOCK_PRIVATE and not AddressGuard.off().enabled


def test_check_host() -> None:
    assert BLOCK_PRIVATE.check_host("localhost", 80)
    assert BLOCK_PRIVATE.check_host("[::1]", 80)
    assert BLOCK_PRIVATE.check_host("2130706433", 80)
    assert BLOCK_PRIVATE.check_host("name.invalid", 80) is None  # the proxy's to resolve
    assert AddressGuard.off().check_host("localhost", 80) is None


props = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@props
@given(st.ip_addresses())
@example(ipaddress.ip_address("::ffff:127.0.0.1"))
@example(ipaddress.ip_address("64:ff9b::a00:1"))
@example(ipaddress.ip_address("224.0.1.1"))
def test_property_every_non_global_address_is_blocked(
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    reason = BLOCK_PRIVATE.blocked(str(addr))
    assert reason is None or isinstance(reason, str)
    if not addr.is_global or addr.is_multicast:
        assert reason is not None, addr
    assert BLOCK_PRIVATE.blocked(f"[{addr}]") == reason
    if isinstance(addr, ipaddress.IPv4Address):  # IPv4-mapped: the same verdict as the IPv4
        mapped = BLOCK_PRIVATE.blocked(f"::ffff:{addr}")
        assert (mapped is None) == (reason is None), (addr, mapped, reason)
    assert AddressGuard.off().blocked(str(addr)) is None
    assert AddressGuard(allow=(ipaddress.ip_network(addr),)).blocked(str(addr)) is None


@props
@given(st.one_of(st.text(), st.binary(), st.integers(), st.none()))
def test_property_never_raises(value: object) -> None:
    reason = BLOCK_PRIVATE.blocked(value)
    assert reason is None or isinstance(reason, str)


def test_producer_flag() -> None:
    from zkcrawl.producer.main import _fetcher, build_parser
    from zkcrawl.producer.settings import ProducerSettings
    from zkcrawl.settings import parse

    argv = ["--start", "http://example.com/"]
    on, _ = parse(ProducerSettings, build_parser(), argv, {})
    off, _ = parse(ProducerSettings, build_parser(), [*argv, "--allow-private-addresses"], {})
    env, _ = parse(ProducerSettings, build_parser(), argv,
                   {"ZKCRAWL_PRODUCER_ALLOW_PRIVATE_ADDRESSES": "true"})
    assert (on.allow_private_addresses, off.allow_private_addresses,
            env.allow_private_addresses) == (False, True, True)
    for parsed, guard in ((on, BLOCK_PRIVATE), (off, None)):
        fetcher = _fetcher(parsed)
        try:
            assert fetcher.settings.guard == guard
        finally:
            fetcher.close()
