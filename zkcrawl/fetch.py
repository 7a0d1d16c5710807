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

import requests
import structlog
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from zkcrawl.politeness import Politeness, wait_for_slot
from zkcrawl.robots import RobotsCache
from zkcrawl.urls import host_of

__all__ = ["FetchResult", "FetchSettings", "Fetcher", "parse_retry_after"]

log = structlog.get_logger(__name__)

ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309 §2.5: parse at least the first 500 KiB
_ERROR_BODY_BYTES = 64 * 1024  # small error bodies are drained so the connection is reused
_CHUNK = 64 * 1024
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_ENV_PROXIES = urllib.request.getproxies()
_ACCEPT = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.5"
_BAD_URL_ERRORS = (
    requests.exceptions.URLRequired,
    ValueError,  # requests' InvalidURL, MissingSchema, InvalidSchema; urllib3 LocationValueError
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


def _is_connect_failure(exc: BaseException) -> bool:
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(
        reason, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError)
    )


def _classify(exc: BaseException) -> str:
    reason = getattr(exc.args[0], "reason", None) if exc.args else None  # MaxRetryError's cause
    if isinstance(reason, urllib3.exceptions.NewConnectionError):
        # refused / DNS failure; urllib3 makes it a ConnectTimeoutError subclass, for history
        return "connection"
    timeouts = (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)
    if isinstance(exc, timeouts) or isinstance(reason, timeouts):
        return "timeout"
    return "bad-url" if isinstance(exc, _BAD_URL_ERRORS) else "connection"


def _set_read_timeout(raw: urllib3.response.BaseHTTPResponse, seconds: float) -> None:
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
    resp: requests.Response, limit: int, deadline: float, read_timeout: float
) -> tuple[bytes, str | None]:
    """Read at most ``limit`` decoded bytes before ``deadline``; returns (body, error)."""
    raw = resp.raw
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


def _drain(resp: requests.Response, deadline: float, read_timeout: float) -> None:
    # Reading a small redirect/error body to its end lets the connection be reused; a big or
    # slow one is not worth waiting for (closing the response then drops the connection).
    _read_body(resp, _ERROR_BODY_BYTES, min(deadline, time.monotonic() + 1.0), read_timeout)


class Fetcher:
    """HTTP GET with robots.txt, politeness, redirects, limits and retries.

    Thread-safe: one ``requests.Session`` per thread (sessions are not thread-safe), each with
    a connection pool so keep-alive connections are reused across fetches of that thread.
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
        self._sessions: list[requests.Session] = []
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
        """Close every thread's session; waits in progress end with error ``cancelled``."""
        self._closed.set()
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()

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

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is not None:
            return session
        session = requests.Session()
        # trust_env makes requests re-read proxy variables and .netrc and evaluate
        # no_proxy on EVERY request: a large share of our CPU per page. Without any
        # proxy configured there is nothing to honour, so skip it; with one, keep
        # requests' full behaviour (no_proxy included).
        session.trust_env = bool(_ENV_PROXIES)
        # urllib3 retries only failed *connects* (nothing reached the server, so neither
        # politeness nor idempotency is at stake); every other retry is the manual loop's.
        retry = Retry(
            total=None,
            connect=self.settings.retries,
            read=False,  # re-raise read errors as they are (a retry would re-send the GET)
            redirect=0,
            status=0,
            other=0,
            backoff_factor=self.settings.backoff,
            backoff_max=min(10.0, self.settings.retry_after_cap),
            raise_on_status=False,
            respect_retry_after_header=False,
        )
        adapter = HTTPAdapter(pool_connections=64, pool_maxsize=4, max_retries=retry)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        session.headers["User-Agent"] = self.settings.user_agent
        session.headers["Accept"] = _ACCEPT
        session.max_redirects = 5  # only robots.txt uses requests' redirects (RFC 9309: 5)
        with self._lock:
            self._sessions.append(session)
        self._local.session = session
        return session

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
                resp = self._session().get(
                    current,
                    stream=True,
                    allow_redirects=False,
                    timeout=(min(s.connect_timeout, remaining), min(s.timeout, remaining)),
                )
            except Exception as exc:  # classified, never propagated
                error = _classify(exc)
                log.debug("fetch.error", url=current, error=error, detail=str(exc))
                return done(
                    error=error,
                    retryable=error in ("timeout", "connection"),
                    _connect_failed=_is_connect_failure(exc) and s.retries > 0,
                )
            try:
                status = resp.status_code
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
                resp.close()

    def _final(
        self, resp: requests.Response, host: str, deadline: float, done: Callable[..., FetchResult]
    ) -> FetchResult:
        s = self.settings
        status = resp.status_code
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
        """Fetch robots.txt through this thread's session (redirects followed, 500 KiB cap);
        raises on network errors, which the cache treats as "unreachable"."""
        s = self.settings
        self._wait_slot(host_of(robots_url))
        deadline = time.monotonic() + s.budget
        try:
            resp = self._session().get(
                robots_url, stream=True, timeout=(s.connect_timeout, s.timeout)
            )
        except requests.exceptions.TooManyRedirects as exc:
            # RFC 9309 §2.3.1.2: too many redirects may be treated as "unavailable" (= 4xx).
            return (exc.response.status_code if exc.response is not None else 310), b""
        try:
            body, error = _read_body(resp, ROBOTS_MAX_BYTES, deadline, s.timeout)
            if error in ("timeout", "connection") and resp.status_code < 300:
                raise requests.exceptions.ConnectionError(f"robots.txt body: {error}")
            return resp.status_code, body
        finally:
            resp.close()
