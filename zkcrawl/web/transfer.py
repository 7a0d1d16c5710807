"""One HTTP GET on the wire, with libcurl (pycurl): the part of fetching that moves bytes.

Policy -- robots.txt, politeness, redirects, retries, what an outcome means -- lives in
:mod:`zkcrawl.web.fetch`; this module only sends a GET and brings back the status, the headers and
a body that never exceeds its limit. Redirects are never followed here (the caller follows them,
so each hop passes robots.txt and politeness again).

Why libcurl and not requests or urllib3: against the bench site (32 threads, 5-15 KB pages,
50 ms per response) a ``requests.Session`` per thread costs ~1.4 ms of CPU per page here and a
urllib3 pool ~0.7 ms -- mostly Python building requests and parsing headers while holding
the GIL, which the other 31 threads then wait for. libcurl does the whole exchange (headers,
chunked framing, gzip) in C with the GIL released: ~0.3 ms per page, and the threads stop
queueing behind each other. One :class:`Wire` (a curl easy handle, which keeps its own
keep-alive connections and DNS cache) per thread, as with one Session per thread.

Limits: ``budget`` bounds the whole transfer (a server trickling bytes is cut there),
``idle`` the time without a byte (whole seconds: libcurl's low-speed check), ``connect``
the connection set-up; the decoded body is cut at ``limit`` bytes (a gzip bomb inflates
no further than that). Proxies come from the environment the way libcurl reads it
(``http_proxy``, ``https_proxy``, ``all_proxy``, ``no_proxy``; ``HTTP_PROXY`` in capitals is
ignored, as libcurl does against httpoxy). HTTPS peers are verified against certifi's CA bundle,
or the one named by ``SSL_CERT_FILE`` / ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE``.

The interface every transport implements is :class:`Transport` (a GET that never raises for
network trouble, returning a :class:`Response`; ``close``); :func:`transport_factory` maps
``--http curl|requests`` to one: :class:`Wire` here, or ``SessionWire``
(:mod:`zkcrawl.web.transfer_requests`, one ``requests.Session`` per thread), which keeps
every guarantee above through :class:`BodySink`, the same body policy.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote, urlsplit, urlunsplit

import pycurl

try:  # the CA bundle requests would use; without it, libcurl's built-in default
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

__all__ = ["ACCEPT", "DRAIN_BYTES", "TRANSPORTS", "BodySink", "Response", "Transport",
           "TransportFactory", "Wire", "ca_bundle", "parse_head", "transport_factory", "wire_url"]

DRAIN_BYTES = 64 * 1024  # error and redirect bodies up to this are read (connection reuse)
ACCEPT = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.5"
_KEEP, _DRAIN = 1, 2
_TIMEOUT_CODES = frozenset({pycurl.E_OPERATION_TIMEDOUT})
_BAD_URL_CODES = frozenset({pycurl.E_URL_MALFORMAT, pycurl.E_UNSUPPORTED_PROTOCOL})
_SAFE_URL_CHARS = "/?#[]@!$&'()*+,;=:%~"


@dataclass(slots=True)
class Response:
    """What came back. ``status`` is None when no status line arrived. ``headers`` has
    lower-case names (the last value of a repeated header wins). ``body`` is empty for a
    status >= 300 and for a rejected media type. ``error``: None, ``timeout``,
    ``connection``, ``bad-url``, ``too-large`` (``body`` holds the first ``limit`` bytes)
    or ``content-type`` (the media type is not in ``accept``; nothing kept)."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None
    detail: str = ""


class Transport(Protocol):
    """One thread's HTTP transport (not thread-safe: one per thread). ``get`` sends one GET
    and never follows a redirect; it never raises for network trouble (see
    :class:`Response`), cuts the whole exchange at ``budget`` seconds, a silence at ``idle``,
    connecting at ``connect``, and the decoded body at ``limit`` bytes."""

    def get(self, url: str, *, connect: float, idle: float, budget: float, limit: int,
            accept: tuple[str, ...]) -> Response: ...

    def close(self) -> None: ...


#: Builds one thread's transport from the User-Agent it sends.
TransportFactory = Callable[[str], Transport]
#: The names ``--http`` accepts; the first is the default.
TRANSPORTS = ("curl", "requests")


def transport_factory(http: str | TransportFactory) -> TransportFactory:
    """The transport named by ``--http`` (``curl`` or ``requests``), or ``http`` itself when
    it is already a factory (a library user's own Session, say). Raises ValueError for an
    unknown name."""
    if callable(http):
        return http
    if http == "curl":
        return Wire
    if http == "requests":  # imported on demand: a curl consumer never loads requests
        from zkcrawl.web.transfer_requests import SessionWire

        return SessionWire
    raise ValueError(f"unknown HTTP transport {http!r}; one of {', '.join(TRANSPORTS)}")


class BodySink:
    """Receives one transfer's header lines and body (from libcurl in the perform call, on the
    same thread; or from a transport that already parsed the head, given as ``head``). The
    body's fate is decided at its first bytes, when the headers are complete: keep it (2xx,
    accepted type), drain it (status >= 300: read a little for connection reuse, keep
    nothing), or refuse it (another media type). ``write`` returns 0 when the transfer must
    stop there (the connection is not worth keeping, or the kept body is over ``limit``)."""

    __slots__ = ("accept", "chunks", "head", "limit", "mode", "parsed", "size", "verdict")

    def __init__(self, limit: int, accept: tuple[str, ...],
                 head: tuple[int | None, dict[str, str]] | None = None) -> None:
        self.head: list[bytes] = []
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


def wire_url(url: str) -> str:
    """``url`` as it goes on the wire: non-ASCII host in IDNA, other non-ASCII characters
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


class Wire:
    """One thread's libcurl handle. Not thread-safe: one per thread."""

    def __init__(self, user_agent: str, max_connections: int = 32) -> None:
        c = self._curl = pycurl.Curl()
        c.setopt(pycurl.NOSIGNAL, 1)  # threads: no SIGALRM for DNS timeouts
        c.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        c.setopt(pycurl.FOLLOWLOCATION, 0)
        c.setopt(pycurl.ACCEPT_ENCODING, "gzip, deflate")
        c.setopt(pycurl.USERAGENT, user_agent)
        c.setopt(pycurl.HTTPHEADER, [f"Accept: {ACCEPT}"])
        c.setopt(pycurl.MAXCONNECTS, max_connections)
        c.setopt(pycurl.LOW_SPEED_LIMIT, 1)
        if cafile := ca_bundle():
            c.setopt(pycurl.CAINFO, cafile)

    def get(self, url: str, *, connect: float, idle: float, budget: float, limit: int,
            accept: tuple[str, ...]) -> Response:
        """GET ``url``; never raises for network trouble (see :class:`Response`)."""
        c = self._curl
        sink = BodySink(limit, accept)
        try:
            c.setopt(pycurl.URL, wire_url(url))
        except (pycurl.error, UnicodeError, ValueError) as exc:
            return Response(error="bad-url", detail=str(exc))
        c.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, int(connect * 1000)))
        c.setopt(pycurl.TIMEOUT_MS, max(1, int(budget * 1000)))
        c.setopt(pycurl.LOW_SPEED_TIME, max(1, math.ceil(idle)))
        c.setopt(pycurl.HEADERFUNCTION, sink.head.append)
        c.setopt(pycurl.WRITEFUNCTION, sink.write)
        error, detail = None, ""
        try:
            c.perform()
        except pycurl.error as exc:
            code = exc.args[0] if exc.args else 0
            error, detail = _classify(code, sink), str(exc.args[-1] if exc.args else exc)
        status, headers = sink.status_and_headers()
        if error is None and sink.verdict is not None:
            error = sink.verdict  # a body cut by us while libcurl saw no error
        if status is None and error is None:
            error = "connection"  # no response at all (HTTP/0.9, an empty reply)
        return Response(status, headers, sink.body(), error, detail)

    def close(self) -> None:
        """Close the handle and its connections; a handle in the middle of a transfer is
        left to finish (libcurl refuses to close it) and goes with its thread."""
        with contextlib.suppress(pycurl.error):
            self._curl.close()


def _classify(code: int, sink: BodySink) -> str | None:
    if code == pycurl.E_WRITE_ERROR:
        # We stopped it: a kept body over the limit, or a drained one not worth finishing.
        return sink.verdict if sink.verdict is not None else None
    if code in _TIMEOUT_CODES:
        return "timeout"
    if code in _BAD_URL_CODES:
        return "bad-url"
    return "connection"
