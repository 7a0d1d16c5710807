"""The fetcher shared by producer and consumer.

:meth:`Fetcher.fetch` never raises for network or HTTP problems: every outcome is a
:class:`FetchResult` whose ``error`` is ``None`` or a short reason (SPEC §4 record ``error``):

==================  ===========  =================================================
error               retryable    meaning
==================  ===========  =================================================
``robots``          no (*)       robots.txt disallows (*) yes if robots.txt was unreachable
``http-NNN``        408/429/5xx  final status >= 400 (or a 3xx without Location)
``content-type``    no           media type not in ``accept_types``
``too-large``       no           more than ``max_bytes`` (body holds the first max_bytes)
``timeout``         yes          connect/read timeout, or the total budget ran out
``connection``      yes          refused, reset, DNS, TLS, truncated or undecodable body
``redirects``       no           more than ``max_redirects`` hops, or a loop
``bad-url``         no           not an http(s) URL, or an unusable redirect target
``cancelled``       yes          :meth:`Fetcher.close` was called meanwhile
==================  ===========  =================================================

Bounds: connecting is bounded by ``connect_timeout``, each read by ``timeout``, and the whole
request+body by ``total_timeout`` (default ``2 * timeout``) — enforced between reads *and* by
shrinking the socket timeout to the remaining budget, so a server trickling one byte at a time
is cut at the budget.  The body never exceeds ``max_bytes`` in memory, decompressed or not.
"""

from __future__ import annotations

import email.utils
import math
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC
from urllib.parse import urljoin, urlsplit

import structlog
import urllib3
import urllib3.exceptions
from urllib3.response import BaseHTTPResponse
from urllib3.util.retry import Retry

from zkcrawl.politeness import Politeness, wait_for_slot
from zkcrawl.robots import RobotsCache
from zkcrawl.urls import host_of

try:  # the CA bundle requests would use; without it, the system store
    import certifi

    _CA_CERTS: str | None = certifi.where()
except ImportError:  # pragma: no cover - certifi comes with requests
    _CA_CERTS = None

__all__ = ["FetchResult", "FetchSettings", "Fetcher", "parse_retry_after"]

log = structlog.get_logger(__name__)

ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309 §2.5: parse at least the first 500 KiB
_ERROR_BODY_BYTES = 64 * 1024  # small error bodies are drained so the connection is reused
_CHUNK = 64 * 1024
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_ROBOTS_REDIRECTS = 5  # RFC 9309 §2.3.1.2: follow at least five
_ACCEPT = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.5"
_ACCEPT_ENCODING = "gzip, deflate"  # what urllib3 decodes without optional packages
_BAD_URL_ERRORS = (
    ValueError,  # urllib3's LocationValueError / URLSchemeUnknown, and ours
    urllib3.exceptions.LocationParseError,
    UnicodeError,
)

@dataclass(frozen=True)
class FetchSettings:
    """Fetcher configuration; see the module docstring for how the limits apply."""

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
    # Set when urllib3 already retried a failed connect; the manual loop must not multiply it.
    _connect_failed: bool = field(default=False, repr=False, compare=False)

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


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _is_http(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.netloc)


def _reason(exc: BaseException) -> BaseException | None:
    # urllib3 wraps a connect failure it gave up retrying in MaxRetryError(reason=...)
    return getattr(exc, "reason", None) if isinstance(exc, urllib3.exceptions.MaxRetryError) \
        else None


def _is_connect_failure(exc: BaseException) -> bool:
    return isinstance(_reason(exc) or exc, urllib3.exceptions.ConnectTimeoutError)


def _classify(exc: BaseException) -> str:
    cause = _reason(exc) or exc
    if isinstance(cause, urllib3.exceptions.NewConnectionError):
        # refused / DNS failure; urllib3 makes it a ConnectTimeoutError subclass, for history
        return "connection"
    if isinstance(cause, (urllib3.exceptions.TimeoutError, TimeoutError)):
        return "timeout"
    return "bad-url" if isinstance(cause, _BAD_URL_ERRORS) else "connection"


def _set_read_timeout(raw: BaseHTTPResponse, seconds: float) -> None:
    # urllib3 applies the read timeout once per request; shrinking it to the remaining budget
    # before each read is what bounds a stalled or trickling body.  urllib3 resets the socket
    # timeout for the next request on this pooled connection, so this does not leak.
    try:
        sock = raw.connection.sock  # type: ignore[union-attr]
        if sock is not None:
            sock.settimeout(max(seconds, 0.001))
    except (AttributeError, OSError):
        pass


def _read_body(
    raw: BaseHTTPResponse, limit: int, deadline: float, read_timeout: float
) -> tuple[bytes, str | None]:
    """Read at most ``limit`` decoded bytes before ``deadline``; returns (body, error)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"".join(chunks), "timeout"
        _set_read_timeout(raw, min(read_timeout, remaining))
        try:
            # read1 returns as soon as *some* bytes arrive (read() would block until a whole
            # chunk is there), so the deadline is checked while a server trickles.  Asking for
            # at most limit+1 decoded bytes keeps a decompression bomb out of memory.
            chunk = raw.read1(min(_CHUNK, limit - total + 1), decode_content=True)
        except (urllib3.exceptions.TimeoutError, TimeoutError):
            return b"".join(chunks), "timeout"
        except (urllib3.exceptions.HTTPError, OSError, ValueError, EOFError):
            return b"".join(chunks), "connection"
        if not chunk:
            raw.release_conn()  # fully read: the connection goes back to the pool
            return b"".join(chunks), None
        chunks.append(chunk)
        total += len(chunk)
        if total > limit or raw.tell() > limit:
            return b"".join(chunks)[:limit], "too-large"


def _close(resp: BaseHTTPResponse) -> None:
    # A response read to its end has given its connection back already; otherwise the
    # connection is in mid-body and can only be dropped (its pool slot is returned).
    resp.close()
    resp.release_conn()


class _Client:
    """What one thread sends with: a urllib3 ``PoolManager`` keeping its keep-alive
    connections per origin, plus proxy managers when the environment names a proxy.

    Why not a ``requests.Session``: measured against the bench site (32 threads, 5-15 KB
    pages), requests' per-request machinery (request preparation, cookie jar, hooks,
    Response building) costs ~0.7 ms of CPU per page on top of urllib3's ~0.7 ms -- half
    the consumer's whole budget. Redirects, retries and limits are ours anyway, and urllib3
    is what requests sends with, so nothing it did for us is lost.
    """

    def __init__(self, settings: FetchSettings, proxies: dict[str, str]) -> None:
        # urllib3 retries only failed *connects* (nothing reached the server, so neither
        # politeness nor idempotency is at stake); every other retry is the manual loop's.
        self.retry = Retry(
            total=None,
            connect=settings.retries,
            read=False,  # re-raise read errors as they are (a retry would re-send the GET)
            redirect=False,
            status=0,
            other=0,
            backoff_factor=settings.backoff,
            backoff_max=min(10.0, settings.retry_after_cap),
            raise_on_status=False,
            respect_retry_after_header=False,
        )
        self._kw = {"num_pools": 64, "maxsize": 4, "ca_certs": _CA_CERTS, "headers": {
            "User-Agent": settings.user_agent, "Accept": _ACCEPT,
            "Accept-Encoding": _ACCEPT_ENCODING}}
        self.direct = urllib3.PoolManager(**self._kw)  # type: ignore[arg-type]
        self._proxies = proxies
        self._via: dict[str, urllib3.ProxyManager] = {}

    def get(self, url: str, timeout: urllib3.Timeout) -> BaseHTTPResponse:
        """Send a GET; the body is left unread (streamed) and redirects are not followed."""
        manager = self._manager(url) if self._proxies else self.direct
        return manager.urlopen("GET", url, redirect=False, retries=self.retry,
                               timeout=timeout, preload_content=False, decode_content=True)

    def _manager(self, url: str) -> urllib3.PoolManager:
        parts = urlsplit(url)
        proxy = self._proxies.get(parts.scheme.lower()) or self._proxies.get("all")
        if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
            return self.direct
        if proxy not in self._via:
            self._via[proxy] = urllib3.ProxyManager(proxy, **self._kw)  # type: ignore[arg-type]
        return self._via[proxy]

    def close(self) -> None:
        for manager in (self.direct, *self._via.values()):
            manager.clear()


def _drain(resp: BaseHTTPResponse, deadline: float, read_timeout: float) -> None:
    # Reading a small redirect/error body to its end lets the connection be reused; a big or
    # slow one is not worth waiting for (closing the response then drops the connection).
    _read_body(resp, _ERROR_BODY_BYTES, min(deadline, time.monotonic() + 1.0), read_timeout)


class Fetcher:
    """HTTP GET with robots.txt, politeness, redirects, limits and retries.

    Thread-safe: one client (a urllib3 ``PoolManager``, see :class:`_Client`) per thread,
    so keep-alive connections are reused across the fetches of that thread and no lock is
    shared between threads on the request path.  Proxies come from the environment
    (``http_proxy``, ``https_proxy``, ``no_proxy``), read when the Fetcher is made.
    """

    def __init__(
        self,
        settings: FetchSettings,
        politeness: Politeness | None = None,
        robots: RobotsCache | None = None,
    ) -> None:
        self.settings = settings
        self._politeness = politeness
        if not settings.robots:
            robots = None
        elif robots is None:
            robots = RobotsCache(self._fetch_robots, settings.user_agent)
        self._robots = robots
        self._local = threading.local()
        self._proxies = urllib.request.getproxies()
        self._clients: list[_Client] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()

    # -- public API -------------------------------------------------------------------------

    def robots_allowed(self, url: str) -> bool:
        """True when robots.txt is off or allows ``url``."""
        return self._robots is None or self._robots.allowed(url)

    def crawl_delay(self, url: str) -> float | None:
        """robots.txt Crawl-delay for ``url``'s host, or None (also when robots is off)."""
        return None if self._robots is None else self._robots.crawl_delay(url)

    def close(self) -> None:
        """Close every thread's connections; waits in progress end with error ``cancelled``."""
        self._closed.set()
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

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
                or result._connect_failed  # urllib3 already spent the retries on connecting
                or result.error == "robots"  # robots.txt unreachable: cached for 60 s anyway
                or self._closed.is_set()
            ):
                break
            # A manual loop rather than urllib3's status retries: it honours Retry-After with
            # our own cap, goes through robots/politeness again and counts attempts.
            delay = result.retry_after
            if delay is None:
                delay = self.settings.backoff * 2 ** (attempt - 1)
            delay = min(delay, self.settings.retry_after_cap)
            log.info("fetch.retry", url=url, attempt=attempt, error=result.error, delay_s=delay)
            if self._closed.wait(delay):
                break
            waited += delay
        return replace(
            result,
            attempts=attempt,
            waited_ms=waited * 1000,
            elapsed_ms=(time.monotonic() - started) * 1000,
        )

    # -- internals ----------------------------------------------------------------------------

    def _client(self) -> _Client:
        client: _Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = _Client(self.settings, self._proxies)
            with self._lock:
                self._clients.append(client)
        return client

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
            host = host_of(current)
            if self._robots is not None:
                verdict = self._robots.decide(current)
                if not verdict.allowed:
                    return done(error="robots", retryable=verdict.temporary)
                if verdict.crawl_delay and self._politeness is not None:
                    self._politeness.set_min_delay(host, verdict.crawl_delay)
            waited += self._wait_slot(host)
            if self._closed.is_set():
                return done(error="cancelled", retryable=True)
            hop_start = time.monotonic()
            deadline = hop_start + remaining
            try:
                resp = self._client().get(current, urllib3.Timeout(
                    connect=min(s.connect_timeout, remaining), read=min(s.timeout, remaining)))
            except Exception as exc:  # classified, never propagated
                error = _classify(exc)
                log.debug("fetch.error", url=current, error=error, detail=str(exc))
                return done(
                    error=error,
                    retryable=error in ("timeout", "connection"),
                    _connect_failed=_is_connect_failure(exc) and s.retries > 0,
                )
            try:
                status = resp.status
                location = resp.headers.get("Location")
                if status in _REDIRECT_STATUSES and location:
                    _drain(resp, deadline, s.timeout)
                    try:
                        target = urljoin(current, location.strip())
                    except ValueError:
                        return done(error="bad-url", status=status)
                    redirects += 1
                    if redirects > s.max_redirects or target in seen:
                        return done(error="redirects", status=status)
                    log.debug("fetch.redirect", url=current, to=target, status=status)
                    seen.add(target)
                    current = target
                    remaining -= time.monotonic() - hop_start
                    if remaining <= 0:
                        return done(error="timeout", status=status, retryable=True)
                    continue
                return self._final(resp, host, deadline, done)
            finally:
                _close(resp)

    def _final(
        self, resp: BaseHTTPResponse, host: str, deadline: float, done: Callable[..., FetchResult]
    ) -> FetchResult:
        s = self.settings
        status = resp.status
        ctype = resp.headers.get("Content-Type")
        retry_after = parse_retry_after(resp.headers.get("Retry-After"), s.retry_after_cap)
        if status >= 300 or status < 200:
            _drain(resp, deadline, s.timeout)
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
        media = _media_type(ctype)
        if media and media not in s.accept_types:
            _drain(resp, deadline, s.timeout)
            return done(error="content-type", status=status, content_type=ctype)
        body, error = _read_body(resp, s.max_bytes, deadline, s.timeout)
        return done(
            status=status,
            content_type=ctype,
            body=body,
            error=error,
            retryable=error in ("timeout", "connection"),
        )

    def _fetch_robots(self, robots_url: str) -> tuple[int, bytes]:
        """Fetch robots.txt through this thread's client (up to 5 redirects, RFC 9309
        §2.3.1.2; 500 KiB cap); raises on network errors, which the cache treats as
        "unreachable"."""
        s = self.settings
        url = robots_url
        for _ in range(_ROBOTS_REDIRECTS + 1):
            self._wait_slot(host_of(url))
            deadline = time.monotonic() + s.budget
            resp = self._client().get(url, urllib3.Timeout(connect=s.connect_timeout,
                                                           read=s.timeout))
            try:
                location = resp.headers.get("Location")
                if resp.status in _REDIRECT_STATUSES and location:
                    _drain(resp, deadline, s.timeout)
                    url = urljoin(url, location.strip())
                    if not _is_http(url):
                        raise urllib3.exceptions.LocationValueError(url)
                    continue
                body, error = _read_body(resp, ROBOTS_MAX_BYTES, deadline, s.timeout)
                if error in ("timeout", "connection") and resp.status < 300:
                    raise urllib3.exceptions.ProtocolError(f"robots.txt body: {error}")
                return resp.status, body
            finally:
                _close(resp)
        # Too many redirects may be treated as "unavailable", i.e. like a 4xx (RFC 9309).
        return 310, b""
