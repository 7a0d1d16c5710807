"""robots.txt cache (RFC 9309) on top of ``protego``: :class:`RobotsCache`, one entry per
origin, kept ``ttl`` seconds. Thread-safe: one fetch per origin at a time, others wait for it
(at most ``wait_timeout``).

* 2xx: the rules; 4xx (and a 3xx left over): allow all; 5xx, no answer or an exception:
  unreachable, a *temporary* disallow with the real reason in ``error`` (never ``robots``),
  asked again after ``unavailable_ttl``; the SSRF guard refusing the origin: a permanent
  disallow with ``blocked`` set.
* URLs are normalized first (:func:`zkcrawl.web.urls.normalize_url`); one that does not
  normalize is not allowed. :meth:`RobotsCache.decide` never raises; a crawl delay is a
  finite number of seconds >= 0.
* Bounded cost: at most :data:`MAX_RULES` rules per agent, each at most
  :data:`MAX_RULE_BYTES` (one ``robots.rules_capped`` event), and the last :data:`MEMO`
  verdicts are kept.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import structlog
from protego import Protego

from zkcrawl.web.addresses import BlockedAddress
from zkcrawl.web.urls import normalize_url

__all__ = ["ALLOWED", "MAX_RULES", "MAX_RULE_BYTES", "RobotsCache", "RobotsDecision",
           "RobotsUnreachable", "cap_rules", "robots_url"]

log = structlog.get_logger(__name__)

_DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_RULES = 1000  # Allow/Disallow lines kept per user agent
MAX_RULE_BYTES = 2048  # one rule line; a longer one is dropped
MEMO = 4096  # verdicts kept: a URL is checked once per load of its robots.txt


def cap_rules(text: str) -> tuple[str, int]:
    """``text`` without the rule lines past :data:`MAX_RULES` per user agent or longer than
    :data:`MAX_RULE_BYTES`, and how many were dropped. A rule counts against every agent of
    the group it is in (a group: user-agent lines, then the lines up to the next user-agent
    line that follows a rule). Never raises."""
    kept: list[str] = []
    counts: dict[str, int] = {}
    agents: set[str] = set()
    in_rules = dropped = 0
    for line in text.splitlines():
        key, _, value = line.split("#", 1)[0].partition(":")
        key = key.strip().lower()
        if key in ("user-agent", "useragent", "user agent"):
            if in_rules:
                agents, in_rules = set(), 0
            agents.add(value.strip().lower())
        elif key in ("allow", "disallow"):
            in_rules = 1
            if len(line) > MAX_RULE_BYTES or any(counts.get(a, 0) >= MAX_RULES for a in agents):
                dropped += 1
                continue
            for a in agents:
                counts[a] = counts.get(a, 0) + 1
        kept.append(line)
    return "".join(f"{line}\n" for line in kept), dropped


class RobotsUnreachable(OSError):
    """``fetch_robots`` could not get an answer; ``reason`` is the fetch error (``connection``,
    ``timeout``...), what the page's record will say."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"robots.txt: {reason} {detail}".strip())
        self.reason = reason


@dataclass(frozen=True)
class RobotsDecision:
    """Verdict for one URL.  ``temporary`` is True when the disallow only reflects robots.txt
    being unreachable (5xx / connection error): retry later, do not record a permanent
    failure; ``error`` then says why (``connection``, ``timeout``, ``http-503``).
    ``blocked`` is the SSRF guard's reason when it refused to connect to the origin (then
    ``allowed`` is False and not temporary)."""

    allowed: bool
    temporary: bool = False
    crawl_delay: float | None = None
    blocked: str | None = None
    error: str | None = None


ALLOWED = RobotsDecision(allowed=True)  # the verdict without rules (frozen: one for all)


@dataclass
class _Entry:
    rules: Protego | None  # None: no rules (allow all, or disallow all when unavailable)
    unavailable: bool
    expires: float
    blocked: str | None = None
    error: str | None = None  # why unavailable
    loaded: float = 0.0  # when it was fetched (the cache's clock)


def _target(url: str) -> tuple[str, str, str] | None:
    """(normalized URL, origin key, robots.txt URL) for an http(s) URL, else None."""
    norm = normalize_url(url)
    if norm is None:
        return None
    parts = urlsplit(norm)  # cannot fail: normalize_url checked host and port
    scheme, host = parts.scheme, parts.hostname or ""
    port = parts.port or _DEFAULT_PORTS[scheme]
    host = f"[{host}]" if ":" in host else host
    hostport = host if port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
    return norm, f"{scheme}://{host}:{port}", f"{scheme}://{hostport}/robots.txt"


def _delay(value: object) -> float | None:
    """A usable Crawl-delay: finite seconds > 0, else None."""
    try:
        delay = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return delay if math.isfinite(delay) and delay > 0 else None


def robots_url(url: str) -> str | None:
    """The robots.txt URL governing ``url``, or None for a non-http(s)/unparseable URL."""
    target = _target(url)
    return target[2] if target else None


class RobotsCache:
    """Thread-safe robots.txt cache: one entry per origin (``scheme://host:port``), kept
    ``ttl`` seconds. What a fetch outcome of robots.txt means (RFC 9309 §2.3.1):

    * 2xx: the rules in the body (the caller caps the body at 500 KiB, as the RFC allows);
    * 4xx (and 3xx left over after the fetcher followed redirects): no usable file, allow all;
    * 5xx, status 0/None, or any exception from ``fetch_robots``: the site is unreachable, treat it
      as a complete disallow *for now* ("try later", not a robots verdict), and try again after
      ``unavailable_ttl`` (60 s) -- or sooner for a caller that asks with ``retry_after``.  Such a
      verdict is marked temporary, with ``error`` saying what happened (``connection``,
      ``timeout``, ``http-503``: a :class:`RobotsUnreachable`'s reason, else ``connection``), so
      callers retry the page later and record the real reason instead of ``robots``;
    * :class:`~zkcrawl.web.addresses.BlockedAddress` from ``fetch_robots`` (the SSRF guard refused
      to connect to the origin): a permanent disallow with ``blocked`` set, kept
      ``unavailable_ttl`` (the host's DNS may change), so the page gets ``blocked-address`` too.

    URLs are normalized first (:func:`zkcrawl.web.urls.normalize_url`): the origin and the rules see
    the same ASCII, percent-encoded, dot-segment-free URL the fetcher asks for, so a lone surrogate
    or an IDN host never reaches ``fetch_robots`` un-encoded, and ``/a/../private`` is checked as
    ``/private``.  A URL that does not normalize (not http(s), over 8 KiB...) is not allowed.
    :meth:`RobotsCache.decide` never raises, whatever the URL, the agent or the robots.txt body;
    a crawl delay it reports is a finite number of seconds >= 0.
    """

    def __init__(
        self,
        fetch_robots: Callable[[str], tuple[int, bytes]],
        user_agent: str,
        ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        unavailable_ttl: float = 60.0,
        wait_timeout: float = 60.0,
        max_entries: int = 10_000,
    ) -> None:
        self._fetch = fetch_robots
        self._user_agent = user_agent
        self._ttl = ttl
        self._clock = clock
        self._unavailable_ttl = unavailable_ttl
        self._wait_timeout = wait_timeout
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # LRU order
        self._inflight: dict[str, threading.Event] = {}
        self._memo: OrderedDict[str, tuple[_Entry, RobotsDecision]] = OrderedDict()
        self.checks = 0  # rules evaluations (the costly part; once per URL and load)

    # -- public API -------------------------------------------------------------------------

    def allowed(self, url: str) -> bool:
        """True if the user agent may fetch ``url`` (non-http(s) URLs: False)."""
        return self.decide(url).allowed

    def crawl_delay(self, url: str) -> float | None:
        """The Crawl-delay (seconds) robots.txt sets for this user agent on ``url``'s origin."""
        return self.decide(url).crawl_delay

    def cached(self, url: str) -> RobotsDecision | None:
        """:meth:`decide`'s verdict when it comes from memory -- robots.txt of ``url``'s
        origin cached, fresh, read and not refused by the address guard -- else None. Never
        fetches, never waits for another thread's fetch."""
        target = _target(url)
        if target is None:
            return None
        with self._lock:
            entry = self._entries.get(target[1])
            if entry is None or entry.expires <= self._clock() or entry.blocked is not None \
                    or entry.unavailable:
                return None
        return self._rules_verdict(target[0], entry)

    def decide(self, url: str, retry_after: float | None = None) -> RobotsDecision:
        """Full verdict for ``url``, fetching robots.txt if needed.  Never raises.
        ``retry_after``: an unreachable robots.txt fetched at least that many seconds ago is
        asked again now (a retried page whose host's back-off has passed), not in 60 s."""
        target = _target(url)
        if target is None:
            return RobotsDecision(allowed=False)
        norm = target[0]
        entry = self._entry(*target[1:], retry_after)
        if entry is None:  # waited too long for another thread's fetch
            return RobotsDecision(allowed=False, temporary=True, error="timeout")
        if entry.blocked is not None:
            return RobotsDecision(allowed=False, blocked=entry.blocked)
        if entry.unavailable:
            return RobotsDecision(allowed=False, temporary=True,
                                  error=entry.error or "connection")
        return self._rules_verdict(norm, entry)

    def _rules_verdict(self, norm: str, entry: _Entry) -> RobotsDecision:
        """The verdict of a read robots.txt on the normalized URL (memoized per entry)."""
        if entry.rules is None:
            return ALLOWED
        with self._lock:
            memo = self._memo.get(norm)
            if memo is not None and memo[0] is entry:
                self._memo.move_to_end(norm)
                return memo[1]
        decision = self._check(entry.rules, norm)
        with self._lock:
            self._memo[norm] = (entry, decision)
            while len(self._memo) > MEMO:
                self._memo.popitem(last=False)
        return decision

    def _check(self, rules: Protego, norm: str) -> RobotsDecision:
        self.checks += 1
        try:
            ok = bool(rules.can_fetch(norm, self._user_agent))
            delay = _delay(rules.crawl_delay(self._user_agent))
        except Exception:  # a parser bug must not stop the crawl
            log.warning("robots.check_failed", url=norm, exc_info=True)
            ok, delay = True, None
        return RobotsDecision(allowed=ok, crawl_delay=delay)


    # -- internals ----------------------------------------------------------------------------

    def _entry(self, key: str, robots: str, retry_after: float | None = None
               ) -> _Entry | None:
        deadline = time.monotonic() + self._wait_timeout
        while True:
            with self._lock:
                entry = self._entries.get(key)
                now = self._clock()
                if entry is not None and entry.unavailable and retry_after is not None \
                        and now - entry.loaded >= retry_after:
                    entry = None  # asked again: this caller waited out the host's back-off
                if entry is not None and entry.expires > now:
                    self._entries.move_to_end(key)
                    return entry
                event = self._inflight.get(key)
                if event is None:
                    event = self._inflight[key] = threading.Event()
                    owner = True
                else:
                    owner = False
            if owner:
                try:
                    entry = self._load(robots)
                    with self._lock:
                        self._entries[key] = entry
                        self._entries.move_to_end(key)
                        while len(self._entries) > self._max_entries:
                            self._entries.popitem(last=False)
                    return entry
                finally:
                    with self._lock:
                        self._inflight.pop(key, None)
                    event.set()  # even if _load raised: waiters re-check instead of hanging
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not event.wait(remaining):
                log.warning("robots.wait_timeout", robots_url=robots)
                return None

    def _load(self, robots: str) -> _Entry:
        now = self._clock()
        try:
            status, body = self._fetch(robots)
        except BlockedAddress as exc:
            log.info("robots.fetch", robots_url=robots, status=None, blocked=exc.reason)
            return _Entry(None, False, now + self._unavailable_ttl, blocked=exc.reason,
                          loaded=now)
        except Exception as exc:  # any failure means "unreachable" (RFC 9309)
            log.info("robots.fetch", robots_url=robots, status=None, error=str(exc))
            reason = exc.reason if isinstance(exc, RobotsUnreachable) else "connection"
            return _Entry(None, True, now + self._unavailable_ttl, error=reason, loaded=now)
        log.info("robots.fetch", robots_url=robots, status=status, bytes=len(body or b""))
        if not status or status >= 500:
            return _Entry(None, True, now + self._unavailable_ttl,
                          error=f"http-{status}" if status else "connection", loaded=now)
        if status >= 300:  # 4xx, or a redirect the fetcher did not resolve: allow all
            return _Entry(None, False, now + self._ttl, loaded=now)
        text, dropped = cap_rules((body or b"").decode("utf-8", errors="replace"))
        if dropped:
            log.warning("robots.rules_capped", robots_url=robots, dropped=dropped,
                        reason=f"more than {MAX_RULES} rules for one agent, or a rule "
                        f"over {MAX_RULE_BYTES} bytes")
        try:
            rules = Protego.parse(text)
        except Exception:  # unparseable rules are no rules
            log.warning("robots.parse_failed", robots_url=robots, exc_info=True)
            rules = None
        return _Entry(rules, False, now + self._ttl, loaded=now)
