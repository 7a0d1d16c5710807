"""robots.txt cache (zkcrawl.web.robots): pure units with a fake fetch and clock."""

from __future__ import annotations

import threading

import pytest

from zkcrawl.web.robots import RobotsCache, RobotsDecision, RobotsUnreachable, robots_url

UA = "zkcrawl/0.1 (+https://github.com/zkcrawl/zkcrawl)"
ROBOTS = b"""
User-agent: *
Disallow: /private
Crawl-delay: 3

User-agent: zkcrawl
Disallow: /no-zkcrawl
Allow: /no-zkcrawl/except
Crawl-delay: 1.5
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeFetch:
    """Answers robots.txt requests from a table; counts calls per URL."""

    def __init__(self, answers: dict[str, tuple[int, bytes] | Exception]) -> None:
        self.answers = answers
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, url: str) -> tuple[int, bytes]:
        with self._lock:
            self.calls.append(url)
        answer = self.answers.get(url, (404, b""))
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_rules_for_our_user_agent_group() -> None:
    fetch = FakeFetch({"http://a.com/robots.txt": (200, ROBOTS)})
    cache = RobotsCache(fetch, UA)
    assert not cache.allowed("http://a.com/no-zkcrawl/x")
    assert cache.allowed("http://a.com/no-zkcrawl/except/1")
    assert cache.allowed("http://a.com/private")  # the * group does not apply to us
    assert cache.crawl_delay("http://a.com/") == 1.5
    other = RobotsCache(fetch, "otherbot/2.0")
    assert not other.allowed("http://a.com/private/1")
    assert other.crawl_delay("http://a.com/x") == 3.0
    assert fetch.calls == ["http://a.com/robots.txt"] * 2  # one per cache


def test_one_fetch_per_origin_until_ttl() -> None:
    clock = FakeClock()
    fetch = FakeFetch({"http://a.com/robots.txt": (200, ROBOTS)})
    cache = RobotsCache(fetch, UA, ttl=100, clock=clock)
    for path in ("/", "/x", "/no-zkcrawl"):
        cache.allowed("http://a.com" + path)
    cache.allowed("https://a.com/")  # another scheme is another origin
    cache.allowed("http://a.com:8080/")  # and another port
    assert fetch.calls == [
        "http://a.com/robots.txt",
        "https://a.com/robots.txt",
        "http://a.com:8080/robots.txt",
    ]
    clock.now = 101
    cache.allowed("http://a.com/")
    assert fetch.calls[-1] == "http://a.com/robots.txt" and len(fetch.calls) == 4


@pytest.mark.parametrize("status", [401, 403, 404, 410, 301])
def test_4xx_allows_everything(status: int) -> None:
    cache = RobotsCache(FakeFetch({"http://a.com/robots.txt": (status, b"Disallow: /")}), UA)
    assert cache.decide("http://a.com/anything") == RobotsDecision(allowed=True)


@pytest.mark.parametrize(
    "answer", [(500, b""), (503, b"User-agent: *\nAllow: /"), (0, b""), ConnectionError("down")]
)
def test_unreachable_disallows_temporarily_and_retries_after_60s(answer: object) -> None:
    clock = FakeClock()
    fetch = FakeFetch({"http://a.com/robots.txt": answer})  # type: ignore[dict-item]
    cache = RobotsCache(fetch, UA, clock=clock)
    # "Try later", with the reason it could not be fetched -- never a robots verdict.
    reason = f"http-{answer[0]}" if isinstance(answer, tuple) and answer[0] else "connection"
    assert cache.decide("http://a.com/x") == RobotsDecision(allowed=False, temporary=True,
                                                           error=reason)
    clock.now = 59
    assert not cache.allowed("http://a.com/x")
    assert len(fetch.calls) == 1
    fetch.answers["http://a.com/robots.txt"] = (200, b"")
    clock.now = 61
    assert cache.allowed("http://a.com/x")
    assert len(fetch.calls) == 2


def test_non_http_urls_are_not_allowed() -> None:
    cache = RobotsCache(FakeFetch({}), UA)
    assert not cache.allowed("ftp://a.com/x")
    assert not cache.allowed("not a url")
    assert cache.crawl_delay("mailto:x@y") is None


def test_robots_url() -> None:
    assert robots_url("http://A.com/x?y") == "http://a.com/robots.txt"
    assert robots_url("https://a.com:443/x") == "https://a.com/robots.txt"
    assert robots_url("http://a.com:8080/x") == "http://a.com:8080/robots.txt"
    assert robots_url("http://[::1]:81/") == "http://[::1]:81/robots.txt"
    assert robots_url("javascript:x") is None


def test_concurrent_callers_share_one_fetch_and_other_hosts_do_not_wait() -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow_fetch(url: str) -> tuple[int, bytes]:
        calls.append(url)
        if "slow" in url:
            started.set()
            assert release.wait(10)
            return 200, b"User-agent: *\nDisallow: /no\n"
        return 404, b""

    cache = RobotsCache(slow_fetch, UA)
    results: list[bool] = []
    lock = threading.Lock()

    def ask() -> None:
        ok = cache.allowed("http://slow.com/no/1")
        with lock:
            results.append(ok)

    first = threading.Thread(target=ask)
    first.start()
    assert started.wait(5)
    waiters = [threading.Thread(target=ask) for _ in range(7)]
    for t in waiters:
        t.start()
    # another origin is answered while slow.com's fetch is still running
    assert cache.allowed("http://fast.com/no/1")
    release.set()
    for t in [first, *waiters]:
        t.join(timeout=10)
    assert results == [False] * 8
    assert calls.count("http://slow.com/robots.txt") == 1


def test_waiter_gives_up_after_wait_timeout() -> None:
    started, release = threading.Event(), threading.Event()

    def stuck_fetch(url: str) -> tuple[int, bytes]:
        started.set()
        release.wait(10)
        return 200, b""

    cache = RobotsCache(stuck_fetch, UA, wait_timeout=0.2)
    owner = threading.Thread(target=cache.allowed, args=("http://a.com/",))
    owner.start()
    assert started.wait(5)
    assert cache.decide("http://a.com/x") == RobotsDecision(allowed=False, temporary=True,
                                                           error="timeout")
    release.set()
    owner.join(timeout=10)
    assert cache.allowed("http://a.com/x")


def test_lru_bound() -> None:
    fetch = FakeFetch({})
    cache = RobotsCache(fetch, UA, max_entries=2)
    for host in ("a", "b", "c", "a"):
        cache.allowed(f"http://{host}.com/")
    assert len(fetch.calls) == 4  # "a" was evicted by "c"


def test_unreachable_is_asked_again_by_a_caller_that_waited() -> None:
    """A retried page whose host's back-off has passed asks robots.txt again (retry_after);
    other callers keep the cached "try later" for the 60 s; the reason is the fetch's."""
    clock = FakeClock()
    fetch = FakeFetch({"http://a.com/robots.txt": RobotsUnreachable("timeout", "no answer")})
    cache = RobotsCache(fetch, UA, clock=clock)
    assert cache.decide("http://a.com/x").error == "timeout"
    clock.now = 0.5
    assert cache.decide("http://a.com/x", retry_after=1.0).error == "timeout"
    assert len(fetch.calls) == 1  # too soon: the cached verdict
    clock.now = 1.5
    fetch.answers["http://a.com/robots.txt"] = (200, b"User-agent: *\nDisallow: /p\n")
    assert cache.decide("http://a.com/x") == RobotsDecision(allowed=False, temporary=True,
                                                           error="timeout")
    assert cache.decide("http://a.com/x", retry_after=1.0) == RobotsDecision(allowed=True)
    assert not cache.allowed("http://a.com/p") and len(fetch.calls) == 2


def test_cached_gives_a_verdict_from_memory_only_and_never_fetches() -> None:
    """What the claim loop asks before it plans a fresh item's slot: decide's verdict when
    robots.txt is read, fresh and answered -- never a fetch, never a wait."""
    clock = FakeClock()
    fetch = FakeFetch({"http://a.com/robots.txt": (200, ROBOTS),
                       "http://down.com/robots.txt": (503, b"")})
    cache = RobotsCache(fetch, UA, ttl=100, clock=clock)
    assert cache.cached("http://a.com/x") is None and fetch.calls == []
    cache.decide("http://a.com/x")
    assert cache.cached("http://a.com/private") == cache.decide("http://a.com/private")
    assert cache.cached("http://A.com:80/no-zkcrawl") == RobotsDecision(allowed=False,
                                                                       crawl_delay=1.5)
    assert cache.cached("http://a.com/y") == RobotsDecision(allowed=True, crawl_delay=1.5)
    assert cache.cached("https://a.com/x") is None and cache.cached("ftp://a.com/") is None
    cache.decide("http://down.com/x")  # unreachable: no verdict to plan with
    assert cache.cached("http://down.com/x") is None
    clock.now = 101  # expired: decide would fetch again
    assert cache.cached("http://a.com/x") is None
    assert len(fetch.calls) == 2
