"""The transport seam: one HTTP GET, and what every transport shares. A transport moves bytes;
the policy is :mod:`zkcrawl.web.fetch`'s. The implementations (:mod:`.curl`,
:mod:`.requests`) import this module; it imports neither.

The contract (:class:`Transport`), kept by both:

* **One GET, never a redirect** (the caller follows them), ``http`` and ``https`` only.
* **Never raises for network trouble**: a :class:`Response` whose ``error`` is one of
  :data:`ERRORS` or None.
* **Limits**: ``connect``, ``idle`` and ``budget`` bound the time, ``limit`` the decoded
  body; the body policy is :class:`BodySink` (an accepted 2xx kept, other bodies drained up
  to :data:`DRAIN_BYTES` or refused).
* **Conventions**: :data:`ACCEPT`, :func:`ascii_url`, HTTPS verified against
  :func:`ca_bundle`; ``set_guard`` for the SSRF guard; one transport per thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote, urlsplit, urlunsplit

from zkcrawl.web.addresses import BLOCKED_ADDRESS

__all__ = [
    "ACCEPT",
    "DRAIN_BYTES",
    "ERRORS",
    "PROTOCOL",
    "BodySink",
    "Response",
    "Transport",
    "TransportFactory",
    "ascii_url",
    "ca_bundle",
    "parse_head",
]

try:  # the CA bundle requests would use; without it, the library's default
    import certifi

    _CERTIFI: str | None = certifi.where()
except ImportError:  # pragma: no cover - certifi is a dependency
    _CERTIFI = None
# Where operators name their own CA bundle (a private CA): the variables OpenSSL, requests
# and curl read, in that order.
_CA_ENV = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def ca_bundle() -> str | None:
    """The CA bundle HTTPS peers are verified against: the first of ``SSL_CERT_FILE``,
    ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE`` that is set, else certifi's."""
    return next((os.environ[n] for n in _CA_ENV if os.environ.get(n)), _CERTIFI)


DRAIN_BYTES = 64 * 1024  # error and redirect bodies up to this are read (connection reuse)
ACCEPT = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.5"
PROTOCOL = "protocol"  # the server broke HTTP (and will again): permanent, not retried
#: What :attr:`Response.error` may say (None: a whole response).
ERRORS = ("timeout", "connection", "bad-url", "too-large", "content-type", PROTOCOL,
          BLOCKED_ADDRESS)
_KEEP, _DRAIN = 1, 2
_SAFE_URL_CHARS = "/?#[]@!$&'()*+,;=:%~"


@dataclass(slots=True)
class Response:
    """What came back. ``status`` is None when no status line arrived. ``headers`` has
    lower-case names (the last value of a repeated header wins). ``body`` is empty for a
    status >= 300 and for a rejected media type. ``error``: None, ``timeout``,
    ``connection``, ``bad-url``, ``too-large`` (``body`` holds the first ``limit`` bytes),
    ``content-type`` (the media type is not in ``accept``; nothing kept), ``protocol`` (the
    server broke HTTP: a bad head, a body its coding does not inflate) or
    ``blocked-address`` (the SSRF guard refused the connection; nothing was sent)."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None
    detail: str = ""


class Transport(Protocol):
    """One thread's HTTP transport (not thread-safe: one per thread), as the module
    docstring says: ``get`` sends one GET (never a redirect) and returns a
    :class:`Response` whatever happens on the network, within ``connect``, ``idle`` and
    ``budget`` seconds and ``limit`` decoded body bytes; ``accept`` lists the media types
    whose body is kept (empty: any). ``close`` drops its connections.

    A transport that can check the addresses it connects to also has
    ``set_guard(guard: AddressGuard | None)`` (called once, before the first ``get``); the
    :class:`~zkcrawl.web.fetch.Fetcher` refuses a transport without it unless the guard is
    off (``--allow-private-addresses``).

    ``headers``: extra request header lines (``Name: value``, already checked by the caller:
    the conditional-GET validators of :mod:`zkcrawl.web.validators`); the Fetcher passes the
    keyword only when there are any."""

    def get(self, url: str, *, connect: float, idle: float, budget: float, limit: int,
            accept: tuple[str, ...], headers: Sequence[str] = ()) -> Response: ...

    def close(self) -> None: ...


#: Builds one thread's transport from the User-Agent it sends.
TransportFactory = Callable[[str], Transport]


class BodySink:
    """Receives one transfer's header lines and body (from libcurl in the perform call, on the
    same thread; or from a transport that already parsed the head, given as ``head``). The
    body's fate is decided at its first bytes, when the headers are complete: keep it (2xx,
    accepted type), drain it (status >= 300: read a little for connection reuse, keep
    nothing), or refuse it (another media type). ``write`` returns 0 when the transfer must
    stop there (the connection is not worth keeping, or the kept body is over ``limit``)."""

    __slots__ = ("accept", "chunks", "head", "limit", "mode", "parsed", "reader", "size",
                 "verdict")

    def __init__(self, limit: int, accept: tuple[str, ...],
                 head: tuple[int | None, dict[str, str]] | None = None,
                 reader: Callable[[], tuple[int | None, dict[str, str]]] | None = None
                 ) -> None:
        self.head: list[bytes] = []
        # reader: asked for the status and headers instead of parsing head lines (libcurl's
        # header API, zkcrawl.web.transports.curl_headers): once, at the first body bytes or
        # after the transfer, whichever comes first.
        self.reader = reader
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = limit
        self.accept = accept
        self.mode = 0
        self.verdict: str | None = None  # why the transfer was cut short by us
        self.parsed: tuple[int, tuple[int | None, dict[str, str]]] | None = (
            None if head is None else (0, head))  # parsed from zero lines: never re-parsed

    def status_and_headers(self) -> tuple[int | None, dict[str, str]]:
        """The head parsed (once, unless more header lines came since)."""
        if self.reader is not None:
            if self.parsed is None:
                self.parsed = (0, self.reader())
            return self.parsed[1]
        if self.parsed is None or self.parsed[0] != len(self.head):
            self.parsed = (len(self.head), parse_head(self.head))
        return self.parsed[1]

    def body(self) -> bytes:
        """The kept body: empty unless the response was a 2xx of an accepted type."""
        return b"".join(self.chunks) if self.mode == _KEEP else b""

    def write(self, chunk: bytes) -> int | None:
        if not self.mode:
            self._decide()
        self.size += len(chunk)
        if self.mode == _KEEP:
            if self.size <= self.limit:
                self.chunks.append(chunk)
                return None
            self.chunks.append(chunk[: len(chunk) - (self.size - self.limit)])
            self.verdict = "too-large"
            return 0  # stops the transfer (libcurl's write error)
        if self.size > DRAIN_BYTES:
            return 0  # not worth reading to the end: the connection is dropped instead
        return None

    def _decide(self) -> None:
        status, headers = self.status_and_headers()
        self.mode = _KEEP if status is not None and 200 <= status < 300 else _DRAIN
        media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if self.mode == _KEEP and self.accept and media and media not in self.accept:
            self.mode = _DRAIN
            self.verdict = "content-type"


def parse_head(lines: list[bytes]) -> tuple[int | None, dict[str, str]]:
    """Status and headers of the last response in ``lines`` (libcurl hands over every
    response's head, e.g. a proxy's ``200 Connection established`` before the real one)."""
    status: int | None = None
    headers: dict[str, str] = {}
    for raw in lines:
        line = raw.decode("latin-1").rstrip("\r\n")
        if line.startswith("HTTP/"):
            parts = line.split(None, 2)
            status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
            headers = {}
        elif ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers


def ascii_url(url: str) -> str:
    """``url`` as it goes in the request: non-ASCII host in IDNA, other non-ASCII characters
    (and spaces) percent-encoded. ASCII URLs pass unchanged (the common case, cheap)."""
    if url.isascii() and " " not in url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        host = quote(host, safe="")
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    if "@" in parts.netloc:
        netloc = quote(parts.netloc.rsplit("@", 1)[0], safe=":%") + "@" + netloc
    return urlunsplit((parts.scheme, netloc, quote(parts.path, safe=_SAFE_URL_CHARS),
                       quote(parts.query, safe=_SAFE_URL_CHARS), ""))
