"""One HTTP GET on the wire with a ``requests.Session``: the ``--http requests`` transport.

The same :class:`~zkcrawl.web.transfer.Transport` as libcurl's :class:`~zkcrawl.web.transfer.Wire`,
so :mod:`zkcrawl.web.fetch` runs the same policy over either, with the same outcomes. It is for
library users who extend ``requests``: auth plugins, mounted adapters, a Session of their own
(``Fetcher(settings, http=lambda ua: SessionWire(ua, session=make_session()))``). It costs more
CPU per page than libcurl (see the README's HTTP section for the measured figures).

Guarantees, matching the libcurl transport:

* **One GET, never a redirect** (``allow_redirects=False``): the caller follows them, so each
  hop passes robots.txt and politeness again. Only ``http`` and ``https`` are sent.
* **The body** is streamed (``stream=True``) in chunks through
  :class:`~zkcrawl.web.transfer.BodySink`, the libcurl transport's own body policy: a 2xx of
  an accepted media type is kept up to ``limit`` decoded bytes (gzip and deflate are inflated
  one bounded chunk at a time, so a gzip bomb inflates no further than ``limit``), then the
  transfer stops with ``too-large``; an error or redirect body is drained up to
  :data:`~zkcrawl.web.transfer.DRAIN_BYTES` for connection reuse; anything cut short closes
  its connection. A content coding urllib3 cannot inflate is a ``connection`` error, as one
  libcurl cannot inflate is (both do gzip and deflate; br and zstd depend on the build).
* **Time**: connecting within ``connect``; the head within ``min(idle, budget)`` of silence;
  each body read within the smaller of ``idle`` and what is left of ``budget`` (the socket
  timeout is set before every read), so a server trickling bytes is cut at the budget. The
  head itself is bounded per read, not as a whole: a server dripping header bytes could hold
  it for longer than ``budget`` (libcurl's budget covers the head too).
* **Connections**: one Session per transport, one transport per thread (the Fetcher keeps
  them thread-local), keep-alive connections reused across that thread's fetches. No cookie
  is kept or sent back (as with libcurl, whose cookie engine is off), so a long crawl does not
  grow a cookie jar.
* **Environment**: proxies as requests reads them (``trust_env``: ``http_proxy``,
  ``https_proxy``, ``all_proxy``, ``no_proxy``, in either case -- unlike libcurl, which ignores
  ``HTTP_PROXY`` in capitals -- and ``~/.netrc`` credentials); HTTPS peers verified against
  :func:`~zkcrawl.web.transfer.ca_bundle` (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``,
  ``CURL_CA_BUNDLE``, else certifi), in that order.
* **The SSRF guard** (:mod:`zkcrawl.web.addresses`, ``guard``/:meth:`SessionWire.set_guard`):
  the Session's adapters get connection pools whose connections resolve the host and check
  every address before connecting to it (a blocked one is skipped, as libcurl does, and when
  none is left the GET ends with ``error="blocked-address"`` -- nothing was sent, not even a
  SYN); a keep-alive connection was checked when it was opened. Per adapter instance, never
  urllib3's globals. A request that goes through a proxy (as requests chooses one:
  ``select_proxy`` over the Session's and the environment's proxies) connects to the proxy,
  which is not checked (the operator chose it); its target host is resolved and checked here
  before the request instead, best effort. A Session of your own must have only
  ``HTTPAdapter`` instances mounted (subclasses too, as long as they use ``poolmanager``),
  and adapters mounted after the guard is set are not checked; otherwise pass ``guard=None``.
"""

from __future__ import annotations

import contextlib
import functools
import http.cookiejar
import socket
import sys
import time
import urllib.request
from typing import Any

import requests
import requests.adapters
import requests.utils
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.poolmanager
from urllib3.util.connection import allowed_gai_family

from zkcrawl.web.addresses import (
    BLOCK_PRIVATE,
    BLOCKED_ADDRESS,
    AddressGuard,
    BlockedAddress,
    active,
)
from zkcrawl.web.transfer import ACCEPT, BodySink, Response, ca_bundle, wire_url

__all__ = ["SessionWire"]

CHUNK = 64 * 1024  # decoded bytes per read: a bound on what one read inflates
# What urllib3 inflates here (gzip, deflate; br and zstd when their modules are installed).
_CODINGS = frozenset({*urllib3.HTTPResponse.CONTENT_DECODERS, "identity", ""})


def _checked_connection(guard: AddressGuard, address: tuple[str, int], timeout: Any,
                        source_address: tuple[str, int] | None,
                        socket_options: Any) -> socket.socket:
    """urllib3's ``create_connection`` with the guard: every address the host resolves to is
    checked before a socket is connected to it; blocked ones are skipped. Raises
    :class:`BlockedAddress` when every address was blocked or the allowed ones failed."""
    host, port = address
    if host.startswith("["):
        host = host.strip("[]")
    blocked: str | None = None
    err: OSError | None = None
    for family, socktype, proto, _, sockaddr in socket.getaddrinfo(
            host, port, allowed_gai_family(), socket.SOCK_STREAM):
        reason = guard.blocked(sockaddr[0])
        if reason is not None:
            blocked = blocked or f"{sockaddr[0]}: {reason}"
            continue
        sock = None
        try:
            sock = socket.socket(family, socktype, proto)
            for option in socket_options or ():
                sock.setsockopt(*option)
            if timeout is None or isinstance(timeout, int | float):  # else urllib3's default
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            err = exc
            if sock is not None:
                sock.close()
    if blocked is not None:
        raise BlockedAddress(blocked)
    if err is not None:
        raise err
    raise OSError("getaddrinfo returns an empty list")


class _Guarded:
    """Mixed into urllib3's HTTP(S)Connection: ``_new_conn`` through
    :func:`_checked_connection` (with urllib3's own error mapping)."""

    guard: AddressGuard = BLOCK_PRIVATE
    host: str
    port: int
    timeout: Any
    source_address: tuple[str, int] | None
    socket_options: Any

    def _new_conn(self) -> socket.socket:
        try:
            sock = _checked_connection(self.guard, (getattr(self, "_dns_host", self.host),
                                                    self.port),
                                       self.timeout, self.source_address, self.socket_options)
        except socket.gaierror as exc:
            raise urllib3.exceptions.NameResolutionError(
                self.host, self, exc) from exc  # type: ignore[arg-type]
        except TimeoutError as exc:
            raise urllib3.exceptions.ConnectTimeoutError(
                self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})"
            ) from exc
        except OSError as exc:
            raise urllib3.exceptions.NewConnectionError(
                self, f"Failed to establish a new connection: {exc}") from exc  # type: ignore[arg-type]
        sys.audit("http.client.connect", self, self.host, self.port)
        return sock


@functools.cache
def _pool_classes(guard: AddressGuard) -> dict[str, type]:
    """urllib3 pool classes whose connections check ``guard`` (one set per guard)."""
    conns = {scheme: type(f"Guarded{base.__name__}", (_Guarded, base), {"guard": guard})
             for scheme, base in (("http", urllib3.connection.HTTPConnection),
                                  ("https", urllib3.connection.HTTPSConnection))}
    return {scheme: type(f"Guarded{pool.__name__}", (pool,), {"ConnectionCls": conns[scheme]})
            for scheme, pool in urllib3.poolmanager.pool_classes_by_scheme.items()}


def _guard_session(session: requests.Session, guard: AddressGuard | None) -> None:
    """Make every adapter of ``session`` check ``guard`` (None: stop checking)."""
    classes = urllib3.poolmanager.pool_classes_by_scheme if guard is None else _pool_classes(
        guard)
    for prefix, adapter in session.adapters.items():
        manager = getattr(adapter, "poolmanager", None)
        if not isinstance(manager, urllib3.PoolManager):
            if guard is None:
                continue
            raise TypeError(f"the adapter mounted at {prefix!r} ({type(adapter).__name__}) "
                            "has no urllib3 PoolManager, so the addresses it connects to "
                            "cannot be checked; pass guard=None (--allow-private-addresses)")
        manager.clear()  # pools made before the guard was set are not reused
        manager.pool_classes_by_scheme = classes


class SessionWire:
    """One thread's ``requests.Session``. Not thread-safe: one per thread. ``session``: a
    Session of your own (auth, adapters, cookies as you set them); the User-Agent and Accept
    headers are set on it, everything else is left as given. ``guard``: the SSRF guard
    (default: every non-public address blocked; see :meth:`set_guard`)."""

    def __init__(self, user_agent: str, max_connections: int = 32,
                 session: requests.Session | None = None,
                 guard: AddressGuard | None = BLOCK_PRIVATE) -> None:
        if session is None:
            session = requests.Session()
            session.cookies = requests.cookies.RequestsCookieJar(
                policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
            adapter = requests.adapters.HTTPAdapter(pool_connections=max_connections,
                                                    pool_maxsize=1)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
        session.headers.update({"User-Agent": user_agent, "Accept": ACCEPT,
                                "Accept-Encoding": "gzip, deflate"})
        self._session = session
        self._verify: str | bool = ca_bundle() or True
        self._guard: AddressGuard | None = None
        self._proxy_env = False
        self.set_guard(guard)

    def set_guard(self, guard: AddressGuard | None) -> None:
        """Check every connection the Session's adapters open from now on against ``guard``
        (None or ``AddressGuard.off()``: no check). Raises TypeError when an adapter cannot be
        checked (not urllib3-based) and the guard is on."""
        self._guard = active(guard)
        _guard_session(self._session, self._guard)
        self._proxy_env = bool(self._session.proxies) or (
            self._session.trust_env and bool(urllib.request.getproxies()))

    def _check_proxied(self, url: str) -> str | None:
        """When ``url`` goes through a proxy: resolve and check its host here."""
        if self._guard is None or not self._proxy_env:
            return None
        proxies = self._session.merge_environment_settings(url, {}, None, None, None)
        if requests.utils.select_proxy(url, proxies["proxies"]) is None:
            return None
        parts = urllib3.util.parse_url(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return self._guard.check_host(parts.host or "", port)

    def get(self, url: str, *, connect: float, idle: float, budget: float, limit: int,
            accept: tuple[str, ...]) -> Response:
        """GET ``url``; never raises for network trouble (see :class:`Response`)."""
        deadline = time.monotonic() + budget
        try:
            target = wire_url(url)
            if (blocked := self._check_proxied(target)) is not None:
                return Response(error=BLOCKED_ADDRESS, detail=f"through a proxy, {blocked}")
            resp = self._session.get(target, allow_redirects=False, stream=True,
                                     timeout=(connect, min(idle, budget)), verify=self._verify)
        except BlockedAddress as exc:
            return Response(error=BLOCKED_ADDRESS,
                            detail=f"the address guard refused {exc.reason}")
        except requests.Timeout as exc:
            return Response(error="timeout", detail=str(exc))
        except requests.ConnectionError as exc:
            return Response(error="connection", detail=str(exc))
        except (ValueError, UnicodeError) as exc:  # InvalidURL, InvalidSchema, MissingSchema
            return Response(error="bad-url", detail=str(exc))
        except requests.RequestException as exc:
            return Response(error="connection", detail=str(exc))
        with contextlib.closing(resp):  # after a whole body: back to the pool; else dropped
            return _read(resp, BodySink(limit, accept, _head(resp)), deadline, idle)

    def close(self) -> None:
        """Close the Session's connections (a transfer running on its thread finishes with
        the connection it holds, then that connection is dropped)."""
        self._session.close()


def _head(resp: requests.Response) -> tuple[int | None, dict[str, str]]:
    """Status and lower-case headers; the last value of a repeated header wins (as libcurl's
    head parsing has it, where requests would join them with commas)."""
    return resp.status_code, {name.lower(): value for name, value in resp.raw.headers.items()}


def _read(resp: requests.Response, sink: BodySink, deadline: float, idle: float) -> Response:
    status, headers = sink.status_and_headers()
    error, detail = _stream(resp, sink, deadline, idle)
    if error is None and sink.verdict is not None:
        error = sink.verdict  # a body cut by us (too-large) or refused (content-type)
    return Response(status, headers, sink.body(), error, detail)


def _stream(resp: requests.Response, sink: BodySink, deadline: float, idle: float
            ) -> tuple[str | None, str]:
    """Feed the body to ``sink`` until it ends, the sink stops it, or time runs out."""
    coding = _unsupported_coding(sink.status_and_headers()[1])
    raw = resp.raw
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", "the whole transfer took longer than its budget"
            _set_timeout(raw, min(idle, left))
            chunk = raw.read1(CHUNK, decode_content=coding is None)
            if not chunk:
                return None, ""
            if coding is not None:
                return "connection", f"unsupported Content-Encoding {coding!r}"
            if sink.write(chunk) == 0:
                return None, ""  # sink.verdict says why, when it matters
    except urllib3.exceptions.ReadTimeoutError as exc:
        return "timeout", str(exc)
    except (urllib3.exceptions.HTTPError, requests.RequestException, OSError) as exc:
        return "connection", str(exc)  # reset, truncated (IncompleteRead), undecodable


def _unsupported_coding(headers: dict[str, str]) -> str | None:
    value = headers.get("content-encoding", "").lower()
    bad = [c for c in (part.strip() for part in value.split(",")) if c not in _CODINGS]
    return bad[0] if bad else None


def _set_timeout(raw: urllib3.HTTPResponse, seconds: float) -> None:
    """The timeout of the next socket read of ``raw`` (a read blocks at most that long)."""
    conn = raw.connection
    sock = getattr(conn, "sock", None) if conn is not None else None
    if sock is not None:
        sock.settimeout(seconds)
