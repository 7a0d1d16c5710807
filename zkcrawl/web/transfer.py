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

The SSRF guard (:mod:`zkcrawl.web.addresses`, ``set_guard``): libcurl calls
``CURLOPT_OPENSOCKETFUNCTION`` with the address it is about to connect to -- after DNS, for
every new connection (a keep-alive connection is reused without a call: it was checked when
it was opened) -- and :class:`Wire` refuses a blocked one (``CURL_SOCKET_BAD``: libcurl tries
the host's next address, if any), so the GET ends with ``error="blocked-address"``. Nothing
runs per request unless a proxy is configured: then the connection is the proxy's (not
checked: the operator chose it) and the target host is resolved and checked before the
request instead (:meth:`~zkcrawl.web.addresses.AddressGuard.check_host`, best effort). Which
URLs go through the proxy is decided as libcurl does, from ``http_proxy``, ``https_proxy``,
``all_proxy`` and ``no_proxy`` read when the guard is set; where the two disagree, the
check fails closed (a proxy it did not expect is checked like any address).
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote, urlsplit, urlunsplit

import pycurl

from zkcrawl.web.addresses import BLOCK_PRIVATE, BLOCKED_ADDRESS, AddressGuard, active

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
           "TransportFactory", "Wire", "ca_bundle", "curl_proxy", "parse_head",
           "transport_factory", "wire_url"]

DRAIN_BYTES = 64 * 1024  # error and redirect bodies up to this are read (connection reuse)
ACCEPT = "text/html,application/xhtml+xml;q=0.9,*/*;q=0.5"
_KEEP, _DRAIN = 1, 2
_TIMEOUT_CODES = frozenset({pycurl.E_OPERATION_TIMEDOUT})
_BAD_URL_CODES = frozenset({pycurl.E_URL_MALFORMAT, pycurl.E_UNSUPPORTED_PROTOCOL})
_SAFE_URL_CHARS = "/?#[]@!$&'()*+,;=:%~"
_DEFAULT_PORTS = {"http": 80, "https": 443}
# The variables libcurl takes a proxy from (``HTTP_PROXY`` in capitals is not one of them).
_PROXY_VARS = ("http_proxy", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


@dataclass(slots=True)
class Response:
    """What came back. ``status`` is None when no status line arrived. ``headers`` has
    lower-case names (the last value of a repeated header wins). ``body`` is empty for a
    status >= 300 and for a rejected media type. ``error``: None, ``timeout``,
    ``connection``, ``bad-url``, ``too-large`` (``body`` holds the first ``limit`` bytes),
    ``content-type`` (the media type is not in ``accept``; nothing kept) or
    ``blocked-address`` (the SSRF guard refused the connection; nothing was sent)."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str | None = None
    detail: str = ""


class Transport(Protocol):
    """One thread's HTTP transport (not thread-safe: one per thread). ``get`` sends one GET
    and never follows a redirect; it never raises for network trouble (see
    :class:`Response`), cuts the whole exchange at ``budget`` seconds, a silence at ``idle``,
    connecting at ``connect``, and the decoded body at ``limit`` bytes.

    A transport that can check the addresses it connects to also has
    ``set_guard(guard: AddressGuard | None)`` (called once, before the first ``get``); the
    :class:`~zkcrawl.web.fetch.Fetcher` refuses a transport without it unless the guard is
    off (``--allow-private-addresses``)."""

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


def curl_proxy(url: str, env: Mapping[str, str] | None = None) -> str | None:
    """The proxy libcurl takes from the environment for ``url``, or None (direct): the
    scheme's ``<scheme>_proxy`` (``HTTPS_PROXY`` too, but never ``HTTP_PROXY``), else
    ``all_proxy``/``ALL_PROXY``; none for a host ``no_proxy``/``NO_PROXY`` names. An
    approximation of libcurl's rules, for the SSRF guard only."""
    env = os.environ if env is None else env
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    proxy = (env.get(f"{scheme}_proxy") or (scheme != "http" and env.get(f"{scheme.upper()}_PROXY"))
             or env.get("all_proxy") or env.get("ALL_PROXY"))
    if not proxy:
        return None
    no_proxy = env.get("no_proxy") or env.get("NO_PROXY")
    if no_proxy and _no_proxy(parts.hostname or "", no_proxy):
        return None
    return proxy


def _no_proxy(host: str, value: str) -> bool:
    """Whether ``no_proxy`` names ``host``, as libcurl reads it: ``*``; a name that is the
    host or one of its domains (a leading dot or not); an address or a CIDR network."""
    host = host.lower().strip("[]").rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = (
            ipaddress.ip_address(host))
    except ValueError:
        address = None
    for raw in value.split(","):
        entry = raw.strip().lower().strip("[]").lstrip(".").rstrip(".")
        if raw.strip() == "*":
            return True
        if not entry:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        if host == entry or host.endswith("." + entry):
            return True
    return False


class Wire:
    """One thread's libcurl handle. Not thread-safe: one per thread.

    ``guard``: the SSRF guard checked on every new connection (default: block every address
    that is not public; see :meth:`set_guard`). ``resolve``: ``HOST:PORT:ADDRESS`` entries
    that pin a name to an address (libcurl's ``CURLOPT_RESOLVE``, ``curl --resolve``), for
    tests of what the guard does with a name that resolves to an internal address."""

    def __init__(self, user_agent: str, max_connections: int = 32,
                 guard: AddressGuard | None = BLOCK_PRIVATE, resolve: Sequence[str] = ()
                 ) -> None:
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
        if resolve:
            c.setopt(pycurl.RESOLVE, list(resolve))
        self._guard: AddressGuard | None = None
        self._proxy_env = False  # any proxy variable set (read with the guard)
        self._proxied = False  # this transfer goes through a proxy: its address is trusted
        self._blocked: str | None = None  # what the guard refused during this transfer
        self.set_guard(guard)

    def set_guard(self, guard: AddressGuard | None) -> None:
        """Check every connection this handle opens from now on against ``guard`` (None or
        ``AddressGuard.off()``: no check, and no callback at all). Call it before the first
        ``get``: connections already open are not checked again."""
        self._guard = active(guard)
        if self._guard is None:
            self._curl.unsetopt(pycurl.OPENSOCKETFUNCTION)
            return
        self._proxy_env = any(os.environ.get(name) for name in _PROXY_VARS)
        self._curl.setopt(pycurl.OPENSOCKETFUNCTION, self._open_socket)

    def _open_socket(self, purpose: int, address: tuple) -> object:
        """libcurl's ``CURLOPT_OPENSOCKETFUNCTION``: called (only when a guard is set) with the
        address a new connection is about to be opened to, after DNS; refuses a blocked
        one. pycurl duplicates the descriptor of the socket returned, so it may be freed."""
        family, socktype, protocol, addr = address
        if self._guard is not None and not self._proxied:
            ip = addr[0] if isinstance(addr, tuple) and addr else addr
            reason = self._guard.blocked(ip)
            if reason is not None:
                self._blocked = f"{ip}: {reason}"
                return pycurl.SOCKET_BAD
        try:
            return socket.socket(family, socktype, protocol)
        except OSError:
            return pycurl.SOCKET_BAD

    def _check_proxied(self, url: str) -> str | None:
        """With a proxy configured for ``url``: resolve and check the target host here (the
        connection itself goes to the proxy); sets whether this transfer is proxied."""
        self._proxied = False
        if not self._proxy_env or curl_proxy(url) is None:
            return None
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
        except ValueError:
            return None  # libcurl refuses it; a proxy libcurl still used gets checked
        self._proxied = True
        assert self._guard is not None
        return self._guard.check_host(host, port)

    def get(self, url: str, *, connect: float, idle: float, budget: float, limit: int,
            accept: tuple[str, ...]) -> Response:
        """GET ``url``; never raises for network trouble (see :class:`Response`)."""
        c = self._curl
        sink = BodySink(limit, accept)
        try:
            wire = wire_url(url)
            c.setopt(pycurl.URL, wire)
        except (pycurl.error, UnicodeError, ValueError) as exc:
            return Response(error="bad-url", detail=str(exc))
        self._blocked = None
        if self._guard is not None and (blocked := self._check_proxied(wire)) is not None:
            return Response(error=BLOCKED_ADDRESS, detail=f"through a proxy, {blocked}")
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
        if self._blocked is not None and status is None:  # refused by _open_socket
            error, detail = BLOCKED_ADDRESS, f"the address guard refused {self._blocked}"
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
