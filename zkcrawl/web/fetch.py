"""The fetcher shared by producer and consumer.

:meth:`Fetcher.fetch` never raises for network or HTTP problems: every outcome is a
:class:`FetchResult` whose ``error`` is ``None`` or a short reason (SPEC §4 record ``error``):

==================  ===========  =================================================
error               retryable    meaning
==================  ===========  =================================================
``robots``          no           robots.txt disallows
``http-NNN``        408/429/5xx  final status >= 400 (or a 3xx without Location)
``content-type``    no           media type not in ``accept_types``
``too-large``       no           more than ``max_bytes`` (body holds the first max_bytes)
``timeout``         yes          connect/read timeout, or the total budget ran out
``connection``      yes          refused, reset, DNS, TLS, truncated or undecodable body
``redirects``       no           more than ``max_redirects`` hops, or a loop
``bad-url``         no           not an http(s) URL, or an unusable redirect target
``cancelled``       yes          :meth:`Fetcher.close` was called meanwhile
``blocked-address`` no           the SSRF guard refused to connect: the address (after
                                 DNS, on this hop or robots.txt's) is not public
==================  ===========  =================================================

An unreachable robots.txt (RFC 9309: "try later", not a disallow) gives the reason it could
not be fetched -- ``connection``, ``timeout``, ``http-503`` -- retryable, with
``from_robots`` set: a down host is a ``connection`` error whichever request met it first.
A fetch at least :data:`ROBOTS_RECHECK` seconds after robots.txt was found unreachable asks
for it again (the host's back-off paces those fetches), instead of failing for the 60 s the
cache keeps the verdict.

Bounds: connecting is bounded by ``connect_timeout``, a silence by ``timeout`` (in whole
seconds with libcurl), and the whole request+body by ``total_timeout`` (default
``2 * timeout``), so a server trickling one byte at a time is cut at the budget (with
requests, the head is bounded per read only: :mod:`zkcrawl.web.transfer_requests`).  The
body never exceeds ``max_bytes`` in memory, decompressed or not.  The bytes are moved by a
transport (:class:`~zkcrawl.web.transfer.Transport`, one per thread): libcurl by default
(:mod:`zkcrawl.web.transfer`), or a ``requests.Session`` with ``http="requests"``
(:mod:`zkcrawl.web.transfer_requests`). This module is the policy around it and the same
code for either, so every outcome above means the same whatever the transport.

``FetchSettings.guard`` (:class:`~zkcrawl.web.addresses.AddressGuard`, on by default) is the
SSRF guard: the transport checks the address of every connection it opens -- after DNS, so
on every redirect hop, each hop being a new ``Transport.get`` -- and refuses loopback,
private, link-local, multicast, reserved... addresses (``blocked-address``). ``guard=None``
or ``AddressGuard.off()`` is ``--allow-private-addresses``; ``AddressGuard(allow=...)``
exempts networks. A transport factory of your own must build transports with
``set_guard`` (both built-in ones have it) unless the guard is off.
"""

from __future__ import annotations

import email.utils
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from urllib.parse import urljoin

import structlog

from zkcrawl.politeness.local import Politeness, wait_for_slot
from zkcrawl.web.addresses import (
    BLOCK_PRIVATE,
    BLOCKED_ADDRESS,
    AddressGuard,
    BlockedAddress,
    active,
)
from zkcrawl.web.robots import RobotsCache, RobotsUnreachable
from zkcrawl.web.transfer import Response, Transport, TransportFactory, transport_factory
from zkcrawl.web.urls import host_key, host_of

__all__ = ["FetchResult", "FetchSettings", "Fetcher", "parse_retry_after"]

log = structlog.get_logger(__name__)

ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309 §2.5: parse at least the first 500 KiB
ROBOTS_RECHECK = 1.0  # seconds: an unreachable robots.txt is asked again by a later fetch
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_FAILED = frozenset({"timeout", "connection", "bad-url", BLOCKED_ADDRESS})  # no usable response
_PERMANENT = frozenset({"bad-url", BLOCKED_ADDRESS})
_ROBOTS_REDIRECTS = 5  # RFC 9309 §2.3.1.2: follow at least five


@dataclass(frozen=True)
class FetchSettings:
    """Fetcher configuration; see the module docstring for how the limits apply. ``guard``:
    the SSRF guard (default: block every address that is not public; ``None`` or
    ``AddressGuard.off()`` for ``--allow-private-addresses``)."""

    user_agent: str = "zkcrawl/0.1 (+https://github.com/zkcrawl/zkcrawl)"
    connect_timeout: float = 5.0
    timeout: float = 15.0
    total_timeout: float | None = None
    max_bytes: int = 10_000_000
    max_redirects: int = 10
    retries: int = 0
    backoff: float = 0.5
    retry_after_cap: float = 120.0
    robots: bool = True
    accept_types: tuple[str, ...] = ("text/html", "application/xhtml+xml")
    guard: AddressGuard | None = BLOCK_PRIVATE

    @property
    def budget(self) -> float:
        """Seconds allowed for one request and its body (``total_timeout`` or 2*timeout)."""
        return self.total_timeout if self.total_timeout is not None else 2 * self.timeout


@dataclass
class FetchResult:
    """Outcome of :meth:`Fetcher.fetch`.  ``elapsed_ms`` is the wall time of the whole call,
    ``waited_ms`` the part of it spent waiting (politeness slots, retry backoff)."""

    url: str
    final_url: str
    status: int | None = None
    content_type: str | None = None
    body: bytes = b""
    elapsed_ms: float = 0.0
    error: str | None = None
    retryable: bool = False
    retry_after: float | None = None
    redirects: int = 0
    attempts: int = 1
    waited_ms: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names (page processors)
    from_robots: bool = False  # the error is robots.txt's (unreachable), not the page's

    @property
    def ok(self) -> bool:
        return self.error is None


def parse_retry_after(value: str | None, cap: float, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or HTTP-date), clamped to
    ``[0, cap]``; ``None`` when absent or unparseable.  ``now`` is a Unix time (tests)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), cap)


def _is_http(url: str) -> bool:
    # A prefix test, not urlsplit (this runs on every fetch): anything else wrong with the
    # URL is the transport's to refuse, which comes back as "bad-url" too.
    head = url[:8].lower()
    rest = url[7:] if head.startswith("http://") else url[8:] if head == "https://" else ""
    return bool(rest) and rest[0] not in "/?#"


class Fetcher:
    """HTTP GET with robots.txt, politeness, redirects, limits and retries.

    Thread-safe: one transport per thread (``http``: ``"curl"``, a libcurl handle, the
    default; ``"requests"``, a ``requests.Session``; or a factory of your own, see
    :data:`~zkcrawl.web.transfer.TransportFactory`), each with its own keep-alive connections,
    so connections are reused across the fetches of that thread and no lock is shared between
    threads on the request path. An unknown ``http`` name raises ValueError.
    """

    def __init__(
        self,
        settings: FetchSettings,
        politeness: Politeness | None = None,
        robots: RobotsCache | None = None,
        http: str | TransportFactory = "curl",
    ) -> None:
        self.settings = settings
        self._new_wire = transport_factory(http)
        self._politeness = politeness
        if not settings.robots:
            robots = None
        elif robots is None:
            robots = RobotsCache(self._fetch_robots, settings.user_agent)
        self._robots = robots
        self._local = threading.local()
        self._wires: list[Transport] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()

    # -- public API -------------------------------------------------------------------------

    def robots_allowed(self, url: str) -> bool:
        """True when robots.txt is off or allows ``url``."""
        return self._robots is None or self._robots.allowed(url)

    def robots_unreachable(self, url: str) -> bool:
        """True when robots.txt for ``url`` could not be fetched lately (no verdict: the
        page is tried later, robots.txt asked again then)."""
        return self._robots is not None and self._robots.decide(url).temporary

    def crawl_delay(self, url: str) -> float | None:
        """robots.txt Crawl-delay for ``url``'s host, or None (also when robots is off)."""
        return None if self._robots is None else self._robots.crawl_delay(url)

    def close(self) -> None:
        """Close the threads' connections; waits in progress end with error ``cancelled``
        (a transfer already running ends within its own time budget)."""
        self._closed.set()
        with self._lock:
            wires, self._wires = self._wires, []
        for wire in wires:
            wire.close()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(self, url: str) -> FetchResult:
        """GET ``url`` with up to ``settings.retries`` in-fetch retries.  Never raises for
        network/HTTP problems (see the module docstring for the outcomes)."""
        started = time.monotonic()
        waited = 0.0
        attempt = 0
        while True:
            attempt += 1
            try:
                result = self._attempt(url)
            except Exception:  # a bug here must not take the worker down
                log.error("fetch.unexpected", url=url, exc_info=True)
                result = FetchResult(url, url, error="connection", retryable=True)
            waited += result.waited_ms / 1000
            if (
                not result.retryable
                or attempt > self.settings.retries
                or self._closed.is_set()
            ):
                break
            # Honours Retry-After with our own cap, goes through robots/politeness again
            # and counts attempts.
            delay = result.retry_after
            if delay is None:
                delay = self.settings.backoff * 2 ** (attempt - 1)
            delay = min(delay, self.settings.retry_after_cap)
            log.info("fetch.retry", url=url, attempt=attempt, error=result.error, delay_s=delay)
            if self._closed.wait(delay):
                break
            waited += delay
        result.attempts = attempt
        result.waited_ms = waited * 1000
        result.elapsed_ms = (time.monotonic() - started) * 1000
        return result

    # -- internals ----------------------------------------------------------------------------

    def _wire(self) -> Transport:
        wire: Transport | None = getattr(self._local, "wire", None)
        if wire is None:
            wire = self._new_wire(self.settings.user_agent)
            guard = active(self.settings.guard)
            set_guard = getattr(wire, "set_guard", None)
            if set_guard is not None:
                set_guard(guard)
            elif guard is not None:
                wire.close()
                raise TypeError(f"{type(wire).__name__} cannot check the addresses it connects "
                                "to (no set_guard): FetchSettings(guard=None) to use it")
            self._local.wire = wire
            with self._lock:
                self._wires.append(wire)
        return wire

    def _get(self, url: str, remaining: float, limit: int, accept: tuple[str, ...]
             ) -> Response:
        s = self.settings
        return self._wire().get(url, connect=min(s.connect_timeout, remaining),
                                idle=min(s.timeout, remaining), budget=remaining,
                                limit=limit, accept=accept)

    def _wait_slot(self, host: str) -> float:
        if self._politeness is None:
            return 0.0
        return wait_for_slot(self._politeness, host, self._closed)

    def _attempt(self, url: str) -> FetchResult:
        s = self.settings
        current, redirects, waited = url, 0, 0.0
        seen = {url}
        remaining = s.budget

        def done(**kw: object) -> FetchResult:
            kw.setdefault("redirects", redirects)
            return FetchResult(url, current, waited_ms=waited * 1000, **kw)  # type: ignore[arg-type]

        while True:
            if self._closed.is_set():
                return done(error="cancelled", retryable=True)
            if not _is_http(current):
                return done(error="bad-url")
            host = host_key(current)
            if self._robots is not None:
                verdict = self._robots.decide(current, retry_after=ROBOTS_RECHECK)
                if not verdict.allowed:
                    if verdict.blocked is not None:  # robots.txt's origin: the same address
                        return done(error=BLOCKED_ADDRESS)
                    if verdict.temporary:  # unreachable: try later, with the real reason
                        return done(error=verdict.error or "connection", retryable=True,
                                    from_robots=True)
                    return done(error="robots")
                if verdict.crawl_delay and self._politeness is not None:
                    self._politeness.set_min_delay(host, verdict.crawl_delay)
            waited += self._wait_slot(host)
            if self._closed.is_set():
                return done(error="cancelled", retryable=True)
            hop_start = time.monotonic()
            resp = self._get(current, remaining, s.max_bytes, s.accept_types)
            location = resp.headers.get("location")
            if resp.status in _REDIRECT_STATUSES and location and resp.error is None:
                try:
                    target = urljoin(current, location)
                except ValueError:
                    return done(error="bad-url", status=resp.status)
                redirects += 1
                if redirects > s.max_redirects or target in seen:
                    return done(error="redirects", status=resp.status)
                log.debug("fetch.redirect", url=current, to=target, status=resp.status)
                seen.add(target)
                current = target
                remaining -= time.monotonic() - hop_start
                if remaining <= 0:
                    return done(error="timeout", status=resp.status, retryable=True)
                continue
            return self._final(resp, host, done)

    def _final(self, resp: Response, host: str, done: Callable[..., FetchResult]
               ) -> FetchResult:
        s = self.settings
        status, ctype = resp.status, resp.headers.get("content-type")
        if status is None or resp.error in _FAILED:
            log.debug("fetch.error", url=done().final_url, error=resp.error, detail=resp.detail)
            error = resp.error or "connection"
            # A body cut short by time or a broken connection is worth another try.
            return done(error=error, status=status, content_type=ctype, body=resp.body,
                        retryable=error not in _PERMANENT)
        retry_after = parse_retry_after(resp.headers.get("retry-after"), s.retry_after_cap)
        if status >= 300 or status < 200:
            retryable = status in (408, 429) or status >= 500
            if self._politeness is not None and retryable and (status == 429 or retry_after):
                # The host asked us to slow down: hold every request to it, not just this one.
                self._politeness.back_off(host, retry_after or max(s.backoff, 1.0))
            return done(
                error=f"http-{status}",
                status=status,
                content_type=ctype,
                retryable=retryable,
                retry_after=retry_after if retryable else None,
            )
        return done(status=status, content_type=ctype, body=resp.body, error=resp.error,
                    headers=resp.headers)

    def _fetch_robots(self, robots_url: str) -> tuple[int, bytes]:
        """Fetch robots.txt through this thread's wire (up to 5 redirects, RFC 9309
        §2.3.1.2; 500 KiB cap). Raises on network errors, which the cache treats as
        "unreachable". The guard refusing the origin itself raises BlockedAddress (the page
        is blocked too); refusing a redirect target is a robots.txt not found (allow all)."""
        url = robots_url
        for hop in range(_ROBOTS_REDIRECTS + 1):
            self._wait_slot(host_of(url))
            resp = self._get(url, self.settings.budget, ROBOTS_MAX_BYTES, ())
            if resp.error == BLOCKED_ADDRESS:
                if hop == 0:
                    raise BlockedAddress(resp.detail)
                return 404, b""
            if resp.status is None or resp.error in _FAILED:
                raise RobotsUnreachable(resp.error or "connection", resp.detail)
            location = resp.headers.get("location")
            if resp.status in _REDIRECT_STATUSES and location:
                url = urljoin(url, location)
                if not _is_http(url):
                    raise OSError(f"robots.txt: redirect to {url!r}")
                continue
            return resp.status, resp.body
        # Too many redirects may be treated as "unavailable", i.e. like a 4xx (RFC 9309).
        return 310, b""
