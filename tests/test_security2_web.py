"""Issue #27 item 6, the web weak spots: what an attacker's server or page sees.

* cloud platform addresses on public ranges (Azure 168.63.129.16...) refused by the address
  guard and by the shipped NetworkPolicy;
* a server dripping its header bytes cannot hold a requests-transport worker past the total
  per-response deadline;
* robots.txt rules are capped in count and bytes, and checked once per item;
* a listing page keeps at most the cap of links;
* a permanent protocol violation is not retried.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from pathlib import Path

import pytest
import structlog.testing
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import wait_for
from tests.httpd import TestServer, html
from tests.test_consumer_pipeline import claimed, make, run
from zkcrawl.consumer.pipeline import COMPLETE, RETRY
from zkcrawl.producer.listing import MAX_PAGE_LINKS, compile_selectors, read_page
from zkcrawl.web import robots as robots_mod
from zkcrawl.web.addresses import BLOCK_PRIVATE
from zkcrawl.web.fetch import Fetcher, FetchSettings
from zkcrawl.web.robots import MAX_RULE_BYTES, MAX_RULES, cap_rules
from zkcrawl.web.transports.requests import WATCHDOG
from zkcrawl.web.urls import host_of

ROOT = Path(__file__).resolve().parent.parent
# Public addresses that are cloud platform services (and forms that embed them).
CLOUD_PLATFORM = ("168.63.129.16", "::ffff:168.63.129.16", "64:ff9b::a83f:8110",
                  "2002:a83f:8110::1", "161.26.0.10", "166.8.0.1", "166.11.255.254")


@pytest.mark.parametrize("ip", CLOUD_PLATFORM)
def test_cloud_platform_addresses_are_refused_by_the_guard(ip):
    reason = BLOCK_PRIVATE.blocked(ip)
    assert reason is not None and "cloud platform" in reason


def test_neighbours_of_the_cloud_platform_addresses_stay_crawlable():
    for ip in ("168.63.129.15", "168.63.129.17", "161.25.255.255", "161.27.0.0",
               "166.7.255.255", "166.12.0.0"):
        assert BLOCK_PRIVATE.blocked(ip) is None, ip


def _web_rules() -> list[dict]:
    docs = list(yaml.safe_load_all(
        (ROOT / "deploy/kubernetes/base/networkpolicy.yaml").read_text(encoding="utf-8")))
    rules = []
    for doc in docs:
        for rule in doc["spec"]["egress"]:
            if any("ipBlock" in peer for peer in rule["to"]):
                rules.append(rule)
    assert len(rules) == 2  # the consumer's and the producer's
    return rules


@pytest.mark.parametrize("ip", [a for a in CLOUD_PLATFORM if ":" not in a]
                         + ["169.254.169.254", "100.100.100.200", "192.0.0.192"])
def test_cloud_platform_addresses_are_refused_by_the_network_policy(ip):
    addr = ipaddress.ip_address(ip)
    for rule in _web_rules():
        allowed = False
        for peer in rule["to"]:
            block = peer["ipBlock"]
            if addr in ipaddress.ip_network(block["cidr"]) and not any(
                    addr in ipaddress.ip_network(e) for e in block.get("except", [])):
                allowed = True
        assert not allowed, ip


# -- a server dripping its head: the total deadline holds on both transports ----------------

class HeadDripper:
    """A real server on 127.0.0.1 that answers every connection with a status line, then
    one header byte every ``interval`` seconds, for at most ``limit`` seconds."""

    def __init__(self, interval: float = 0.25, limit: float = 30.0) -> None:
        self.interval, self.limit = interval, limit
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.held: list[float] = []  # seconds each connection was held by its client
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        started = time.monotonic()
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Drip: ")
                while not self.stop.wait(self.interval):
                    if time.monotonic() - started > self.limit:
                        break
                    conn.sendall(b"a")
            except OSError:  # the client gave up: what we measure
                pass
        self.held.append(time.monotonic() - started)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()


@pytest.mark.parametrize("http", ["curl", "requests"])
def test_a_server_dripping_its_head_is_cut_at_the_total_budget(http):
    server = HeadDripper()
    try:
        settings = FetchSettings(guard=None, robots=False, timeout=1.0, total_timeout=2.0)
        started = time.monotonic()
        res = Fetcher(settings, http=http).fetch(f"http://127.0.0.1:{server.port}/")
        elapsed = time.monotonic() - started
        assert res.error == "timeout" and res.retryable, (res.error, res.detail)
        assert elapsed < settings.budget + 2.0  # before: the server's 30 s (requests)
        # What the server sees: its connection closed by the client at the budget.
        wait_for(lambda: server.held, what="the client hung up")
        assert server.held[0] < settings.budget + 2.0
    finally:
        server.close()


def test_the_watchdog_leaves_fast_responses_alone():
    with TestServer({"/": html("<title>t</title>")}) as srv:
        fetcher = Fetcher(FetchSettings(guard=None, robots=False, timeout=1.0,
                                        total_timeout=0.5), http="requests")
        for _ in range(20):  # reused keep-alive connections are never shut under us
            res = fetcher.fetch(srv.url("/"))
            assert res.error is None and res.status == 200
        assert not WATCHDOG._armed  # every deadline disarmed: nothing fires on the pool


# -- robots.txt: rules capped per agent, one check per item ---------------------------------

def _rules(n: int, agent: str = "*") -> str:
    return f"User-agent: {agent}\n" + "".join(f"Disallow: /p{i}/\n" for i in range(n))


def test_robots_rules_past_the_cap_are_ignored_but_other_agents_keep_theirs(monkeypatch):
    # a fresh proxy: an in-process command of an earlier test (logs.configure caches each
    # logger on first use) may have bound the module's logger past capture_logs' reach
    monkeypatch.setattr(robots_mod, "log", structlog.get_logger("zkcrawl.web.robots"))
    body = _rules(MAX_RULES + 200) + "User-agent: zkcrawl-test\nDisallow: /mine\n" \
        + "User-agent: other\nDisallow: /x\n"
    robots = (200, {"Content-Type": "text/plain"}, body.encode())
    with TestServer({"/robots.txt": robots}) as srv, structlog.testing.capture_logs() as logs:
        for agent, path, allowed in [("zkcrawl-any", f"/p{MAX_RULES - 1}/a", False),
                                     ("zkcrawl-any", f"/p{MAX_RULES + 100}/a", True),
                                     ("zkcrawl-test", "/mine", False),
                                     ("zkcrawl-test", "/p1/a", True)]:
            fetcher = Fetcher(FetchSettings(guard=None, user_agent=agent), http="curl")
            assert fetcher.robots_allowed(srv.url(path)) is allowed, (agent, path)
    capped = [e for e in logs if e["event"] == "robots.rules_capped"]
    assert capped and capped[0]["dropped"] == 200


def test_a_consumer_item_checks_robots_rules_once():
    body = _rules(50) + "Crawl-delay: 0.01\n"
    with TestServer({"/robots.txt": (200, {"Content-Type": "text/plain"}, body.encode()),
                     "/page*": html("<title>t</title>")}) as srv:
        item_handler = make(robots=True)
        robots = item_handler.fetcher._robots
        assert robots is not None
        for i in range(3):
            url = srv.url(f"/page{i}")
            before = robots.checks
            assert item_handler.prepare(url, host_of(url))  # allowed? Crawl-delay?
            outcome = run(item_handler, claimed(url))  # the fetch asks robots.txt again
            assert outcome.error is None
            assert robots.checks - before == 1  # before: 3 (allowed, delay, the fetch)


@given(st.lists(st.sampled_from(["User-agent: *", "User-agent: a", "Disallow: /x",
                                 "Allow: /y", "Crawl-delay: 1", "", "# c", "Disallow: /"
                                 + "z" * MAX_RULE_BYTES, "junk"]), max_size=60),
       st.integers(1, 5))
def test_capped_rules_keep_order_and_the_per_agent_bound(lines, cap):
    old, robots_mod.MAX_RULES = robots_mod.MAX_RULES, cap
    try:
        text, dropped = cap_rules("\n".join(lines))
    finally:
        robots_mod.MAX_RULES = old
    source = "\n".join(lines).splitlines()
    kept = text.splitlines()
    assert len(kept) + dropped == len(source)
    it = iter(source)
    assert all(any(line == other for other in it) for line in kept)  # a subsequence
    assert all(len(line) <= MAX_RULE_BYTES for line in kept)


# -- a listing page keeps at most MAX_PAGE_LINKS links ---------------------------------------

def test_a_huge_listing_page_keeps_at_most_the_cap_of_links():
    n = MAX_PAGE_LINKS + 500
    body = "<html><body>" + "".join(f'<a href="/item/{i}">x</a>' for i in range(n))
    with TestServer({"/list": html(body)}) as srv, structlog.testing.capture_logs() as logs:
        fetcher = Fetcher(FetchSettings(guard=None, robots=False), http="curl")
        page = read_page(fetcher, srv.url("/list"), compile_selectors(None, None, None))
    assert len(page.links) == MAX_PAGE_LINKS
    assert page.links[0].endswith("/item/0") and page.links[-1].endswith(
        f"/item/{MAX_PAGE_LINKS - 1}")  # document order: the first ones
    capped = [e for e in logs if e["event"] == "listing.links_capped"]
    assert [(e["kept"], e["dropped"]) for e in capped] == [(MAX_PAGE_LINKS, 500)]


# -- permanent protocol violations are not retried -------------------------------------------

class RawServer:
    """A real server on 127.0.0.1 answering every connection with ``raw``, then closing."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.recv(65536)
                conn.sendall(self.raw)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.listener.close()


VIOLATIONS = {
    "unknown-coding": (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: "
                       b"x-weird\r\nContent-Length: 4\r\n\r\nbody", ("curl", "requests")),
    "header-too-long": (b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 200_000 + b"\r\n\r\n",
                        ("curl", "requests")),
    "bad-content-length": (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: "
                           b"3\r\nContent-Length: 5\r\n\r\nabcde", ("curl", "requests")),
    "bad-status-line": (b"HTTP/1.1 abc OK\r\nContent-Length: 0\r\n\r\n",
                        ("curl", "requests")),
    "http-0.9": (b"HELLO WORLD\r\n\r\n", ("curl", "requests")),
    "too-many-headers": (b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: a\r\n" % i for i in
                                                           range(1000))
                         + b"Content-Length: 0\r\n\r\n", ("requests",)),
}


@pytest.mark.parametrize("http", ["curl", "requests"])
@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_a_protocol_violation_is_permanent(case, http):
    raw, transports = VIOLATIONS[case]
    if http not in transports:
        pytest.skip(f"{http} accepts this (libcurl takes 1,000 headers)")
    server = RawServer(raw)
    try:
        res = Fetcher(FetchSettings(guard=None, robots=False, timeout=2.0),
                      http=http).fetch(server.url())
        assert (res.error, res.retryable) == ("protocol", False), res
    finally:
        server.close()


@pytest.mark.parametrize("raw,retried", [(VIOLATIONS["unknown-coding"][0], False),
                                         (b"", True)])  # an empty reply may pass: retried
def test_the_consumer_records_a_protocol_violation_instead_of_retrying(raw, retried):
    server = RawServer(raw)
    try:
        outcome = run(make(), claimed(server.url("/page")))
        assert outcome.kind == (RETRY if retried else COMPLETE), outcome
        assert outcome.error == ("connection" if retried else "protocol")
        assert server.connections == 1  # one request: nothing retried behind our back
    finally:
        server.close()
