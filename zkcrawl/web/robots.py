"""robots.txt cache (RFC 9309) on top of ``protego``.

One entry per origin (``scheme://host:port``), kept ``ttl`` seconds.  What a fetch outcome means
(RFC 9309 §2.3.1):

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

Thread-safe.  Only one fetch per origin runs at a time: other threads asking about that origin
wait for it (bounded by ``wait_timeout``; on timeout they get a temporary disallow).
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

__all__ = ["RobotsCache", "RobotsDecision", "RobotsUnreachable", "robots_url"]

log = structlog.get_logger(__name__)

_DEFAULT_PORTS = {"http": 80, "https": 443}


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
    """Thread-safe robots.txt cache; see the module docstring for the rules."""

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

    # -- public API -------------------------------------------------------------------------

    def allowed(self, url: str) -> bool:
        """True if the user agent may fetch ``url`` (non-http(s) URLs: False)."""
        return self.decide(url).allowed

    def crawl_delay(self, url: str) -> float | None:
        """The Crawl-delay (seconds) robots.txt sets for this user agent on ``url``'s origin."""
        return self.decide(url).crawl_delay

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
        if entry.rules is None:
            return RobotsDecision(allowed=True)
        try:
            ok = bool(entry.rules.can_fetch(norm, self._user_agent))
            delay = _delay(entry.rules.crawl_delay(self._user_agent))
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
        try:
            rules = Protego.parse((body or b"").decode("utf-8", errors="replace"))
        except Exception:  # unparseable rules are no rules
            log.warning("robots.parse_failed", robots_url=robots, exc_info=True)
            rules = None
        return _Entry(rules, False, now + self._ttl, loaded=now)
