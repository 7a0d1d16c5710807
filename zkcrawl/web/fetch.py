"""The fetcher shared by producer and consumer: :class:`Fetcher` is the HTTP policy --
robots.txt, politeness, redirects, limits, conditional re-crawls, the SSRF guard -- around
a per-thread transport (:mod:`zkcrawl.web.transports`), the same for every transport.

* :meth:`Fetcher.fetch` never raises for a network or HTTP problem: every outcome is a
  :class:`FetchResult` whose ``error`` is None or a short reason (SPEC §4; the table is
  :class:`Fetcher`'s docstring), retryable or not the same way on either transport.
* Bounded: ``connect_timeout``, ``timeout`` of silence and ``total_timeout`` for the whole
  request and body; the body never holds more than ``max_bytes``.
* The SSRF guard (``FetchSettings.guard``, on by default) checks the address of every
  connection, on every redirect hop; an unreachable robots.txt is "try later", never a
  disallow; a "try later" answer backs the host off once, here (``backed_off``).
"""

from __future__ import annotations

import email.utils
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC
from urllib.parse import urljoin

import structlog

from zkcrawl.backoff import HOST_RETRY, Backoff
from zkcrawl.politeness.local import Politeness, wait_for_slot
from zkcrawl.web.addresses import (
    BLOCK_PRIVATE,
    BLOCKED_ADDRESS,
    AddressGuard,
    BlockedAddress,
    active,
)
from zkcrawl.web.robots import ALLOWED, RobotsCache, RobotsDecision, RobotsUnreachable
from zkcrawl.web.transports import Response, Transport, TransportFactory, transport_factory
from zkcrawl.web.urls import host_key, host_of
from zkcrawl.web.validators import Validators

__all__ = ["FetchResult", "FetchSettings", "Fetcher", "parse_retry_after"]

log = structlog.get_logger(__name__)

ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309 §2.5: parse at least the first 500 KiB
ROBOTS_RECHECK = 1.0  # seconds: an unreachable robots.txt is asked again by a later fetch
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
PROTOCOL = "protocol"  # a permanent protocol violation (issue #27: it was retried)
_FAILED = frozenset({"timeout", "connection", "bad-url", PROTOCOL, BLOCKED_ADDRESS})
_PERMANENT = frozenset({"bad-url", PROTOCOL, BLOCKED_ADDRESS})
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
    not_modified: bool = False  # a 304 to our validators: unchanged, no body (issue #23)
    backed_off: bool = False  # the fetcher held the host (HOST_RETRY): nobody else does

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
    :data:`~zkcrawl.web.transports.base.TransportFactory`), each with its own keep-alive
    connections, so connections are reused across the fetches of that thread and no lock is
    shared between threads on the request path. An unknown ``http`` name raises ValueError.

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
    ``connection``      yes          refused, reset, DNS, TLS, truncated body, no answer
    ``protocol``        no           the server broke HTTP in a way it will again: a status
                                     line or header that does not parse, a header over the
                                     transport's limit, an unknown Content-Encoding
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
    cache keeps the verdict. robots.txt is read once per fetch -- or once per item for a caller
    that asks first (:meth:`Fetcher.robots`: its verdict serves the fetch of the same URL that
    follows on the same thread within :data:`ROBOTS_RECHECK`).

    A "try later" answer (408, 429, 5xx) holds the host in the fetcher's politeness for
    :data:`zkcrawl.backoff.HOST_RETRY` -- its ``Retry-After``, else 1 s doubling with the item's
    ``attempt`` up to 60 s -- once, here: ``FetchResult.backed_off`` tells the caller it is done.

    Bounds: connecting is bounded by ``connect_timeout``, a silence by ``timeout`` (in whole
    seconds with libcurl), and the whole request+body by ``total_timeout`` (default
    ``2 * timeout``), so a server trickling one byte at a time is cut at the budget (the
    head included, on both transports).  The
    body never exceeds ``max_bytes`` in memory, decompressed or not.  The bytes are moved by a
    transport (:class:`~zkcrawl.web.transports.base.Transport`, one per thread): libcurl by
    default (:mod:`zkcrawl.web.transports.curl`), or a ``requests.Session`` with
    ``http="requests"`` (:mod:`zkcrawl.web.transports.requests`). This module is the policy
    around it and the same code for either, so every outcome above means the same whatever the
    transport.

    ``FetchSettings.guard`` (:class:`~zkcrawl.web.addresses.AddressGuard`, on by default) is the
    SSRF guard: the transport checks the address of every connection it opens -- after DNS, so
    on every redirect hop, each hop being a new ``Transport.get`` -- and refuses loopback,
    private, link-local, multicast, reserved... addresses (``blocked-address``). ``guard=None``
    or ``AddressGuard.off()`` is ``--allow-private-addresses``; ``AddressGuard(allow=...)``
    exempts networks. A transport factory of your own must build transports with
    ``set_guard`` (both built-in ones have it) unless the guard is off.

    Conditional re-crawls (issue #23): ``fetch(url, validators)`` sends ``If-None-Match`` /
    ``If-Modified-Since`` from :class:`~zkcrawl.web.validators.Validators` (cleaned there: no
    header value the server chose is sent back unchecked) on every hop; a final ``304`` to such a
    request is a success with ``not_modified`` set and an empty body -- never an ``http-304``
    error. A 304 to a request that sent no validator stays ``http-304``. The transports get the
    lines as ``headers=`` only when there are any, so a transport of your own without that
    keyword still serves first fetches.
    """

    def __init__(
        self,
        settings: FetchSettings,
        politeness: Politeness | None = None,
        robots: RobotsCache | None = None,
        http: str | TransportFactory = "curl",
    ) -> None:
        self.settings = settings
        self._new_transport = transport_factory(http)
        self._politeness = politeness
        if not settings.robots:
            robots = None
        elif robots is None:
            robots = RobotsCache(self._fetch_robots, settings.user_agent)
        self._robots = robots
        self._local = threading.local()
        self._transports: list[Transport] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()

    # -- public API -------------------------------------------------------------------------

    def robots(self, url: str) -> RobotsDecision:
        """robots.txt's verdict on ``url`` (allowed, Crawl-delay, unreachable...), read once:
        a :meth:`fetch` of the same URL on this thread within :data:`ROBOTS_RECHECK` seconds
        uses it instead of reading robots.txt again (robots off: always allowed)."""
        if self._robots is None:
            return ALLOWED
        decision = self._robots.decide(url)
        self._local.robots = (url, decision, time.monotonic())
        return decision

    def robots_read(self) -> tuple[str, RobotsDecision, float] | None:
        """The verdict :meth:`robots` read last on this thread, taken away: an item that
        will be fetched on another thread carries it there (:meth:`robots_use`)."""
        read: tuple[str, RobotsDecision, float] | None = getattr(self._local, "robots", None)
        self._local.robots = None
        return read

    def robots_use(self, read: tuple[str, RobotsDecision, float] | None) -> None:
        """The next :meth:`fetch` on this thread takes ``read`` (from :meth:`robots_read`)
        as the verdict it would read again -- if it is for its URL and fresh, as ever."""
        self._local.robots = read

    def robots_cached(self, url: str) -> RobotsDecision | None:
        """:meth:`robots` when it answers from memory (robots off, or the origin's
        robots.txt cached and fresh), else None: no request, no wait. Robots off: nothing
        is kept for the fetch (it reads no verdict)."""
        if self._robots is None:
            return ALLOWED
        decision = self._robots.cached(url)
        if decision is not None:
            self._local.robots = (url, decision, time.monotonic())
        return decision

    def robots_allowed(self, url: str) -> bool:
        """True when robots.txt is off or allows ``url``."""
        return self.robots(url).allowed

    def crawl_delay(self, url: str) -> float | None:
        """robots.txt Crawl-delay for ``url``'s host, or None (also when robots is off)."""
        return self.robots(url).crawl_delay

    def _verdict(self, url: str, first_hop: bool) -> RobotsDecision:
        """The verdict :meth:`robots` just read for ``url`` on this thread (the first hop of
        a fetch only, an allowing one, fresh), else robots.txt's now -- with
        :data:`ROBOTS_RECHECK`, so an unreachable one is asked again."""
        assert self._robots is not None
        read: tuple[str, RobotsDecision, float] | None = getattr(self._local, "robots", None)
        self._local.robots = None
        if first_hop and read is not None and read[0] == url and read[1].allowed \
                and time.monotonic() - read[2] < ROBOTS_RECHECK:
            return replace(read[1], crawl_delay=None)  # its Crawl-delay was applied already
        return self._robots.decide(url, retry_after=ROBOTS_RECHECK)

    def close(self) -> None:
        """Close the threads' connections; waits in progress end with error ``cancelled``
        (a transfer already running ends within its own time budget)."""
        self._closed.set()
        with self._lock:
            transports, self._transports = self._transports, []
        for transport in transports:
            transport.close()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(self, url: str, validators: Validators | None = None, *, attempt: int = 0
              ) -> FetchResult:
        """GET ``url`` with up to ``settings.retries`` in-fetch retries.  Never raises for
        network/HTTP problems (see the module docstring for the outcomes). ``validators``:
        what a previous fetch returned, for a conditional GET; ``attempt``: the item's
        earlier tries (the host's back-off on a "try later" answer grows with them,
        :data:`zkcrawl.backoff.HOST_RETRY`)."""
        extra = validators.headers() if validators is not None else ()
        started = time.monotonic()
        waited = 0.0
        first, attempt = attempt, 0
        pause: Backoff | None = None  # made on a first retry: most fetches have none
        while True:
            attempt += 1
            try:
                result = self._attempt(url, extra, first + attempt - 1)
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
            if pause is None:
                pause = Backoff(self.settings.backoff, self.settings.retry_after_cap)
            delay = pause.after(attempt - 1, result.retry_after)
            log.info("fetch.retry", url=url, attempt=attempt, error=result.error, delay_s=delay)
            if self._closed.wait(delay):
                break
            waited += delay
        result.attempts = attempt
        result.waited_ms = waited * 1000
        result.elapsed_ms = (time.monotonic() - started) * 1000
        return result

    # -- internals ----------------------------------------------------------------------------

    def _transport(self) -> Transport:
        t: Transport | None = getattr(self._local, "transport", None)
        if t is None:
            t = self._new_transport(self.settings.user_agent)
            guard = active(self.settings.guard)
            set_guard = getattr(t, "set_guard", None)
            if set_guard is not None:
                set_guard(guard)
            elif guard is not None:
                t.close()
                raise TypeError(f"{type(t).__name__} cannot check the addresses it connects "
                                "to (no set_guard): FetchSettings(guard=None) to use it")
            self._local.transport = t
            with self._lock:
                self._transports.append(t)
        return t

    def _get(self, url: str, remaining: float, limit: int, accept: tuple[str, ...],
             extra: tuple[str, ...] = ()) -> Response:
        s = self.settings
        if extra:  # only then: a transport of one's own may not take headers=
            return self._transport().get(url, connect=min(s.connect_timeout, remaining),
                                    idle=min(s.timeout, remaining), budget=remaining,
                                    limit=limit, accept=accept, headers=extra)
        return self._transport().get(url, connect=min(s.connect_timeout, remaining),
                                idle=min(s.timeout, remaining), budget=remaining,
                                limit=limit, accept=accept)

    def _wait_slot(self, host: str) -> float:
        if self._politeness is None:
            return 0.0
        return wait_for_slot(self._politeness, host, self._closed)

    def _attempt(self, url: str, extra: tuple[str, ...] = (), tries: int = 0) -> FetchResult:
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
                verdict = self._verdict(current, current == url)
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
            resp = self._get(current, remaining, s.max_bytes, s.accept_types, extra)
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
            if resp.status == 304 and extra and resp.error in (None, "content-type"):
                return done(status=304, not_modified=True, headers=resp.headers)
            return self._final(resp, host, done, tries)

    def _final(self, resp: Response, host: str, done: Callable[..., FetchResult],
               tries: int = 0) -> FetchResult:
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
            held = self._politeness is not None and retryable
            if held:  # "try later": hold every request to the host, once, here
                assert self._politeness is not None
                self._politeness.back_off(host, HOST_RETRY.after(tries, retry_after))
            return done(
                backed_off=held,
                error=f"http-{status}",
                status=status,
                content_type=ctype,
                retryable=retryable,
                retry_after=retry_after if retryable else None,
            )
        return done(status=status, content_type=ctype, body=resp.body, error=resp.error,
                    headers=resp.headers)

    def _fetch_robots(self, robots_url: str) -> tuple[int, bytes]:
        """Fetch robots.txt through this thread's transport (up to 5 redirects, RFC 9309
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
