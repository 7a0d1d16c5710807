"""The ``requests`` transport, ``--http requests``: :class:`RequestsTransport`, one
``requests.Session`` per thread, with the contract of :mod:`zkcrawl.web.transports.base` and
the same outcomes as libcurl; for library users who extend ``requests`` (auth plugins,
mounted adapters, a Session of their own). It costs more CPU per page (docs/guide/http.md).

* One GET (``allow_redirects=False``, ``http``/``https`` only); the body streamed in chunks of
  at most :data:`CHUNK` decoded bytes through the body sink; no cookie kept.
* Time: ``connect``, ``idle`` and ``budget`` as with libcurl; while http.client reads the
  head, a :class:`Watchdog` (one thread per process) shuts the socket at the budget.
* Proxies and ``~/.netrc`` as requests reads them (``trust_env``).
* The SSRF guard (:meth:`RequestsTransport.set_guard`): per-adapter connection pools check
  every resolved address before connecting (never urllib3's globals); a proxy's target is
  checked best effort. A Session of your own must mount only ``HTTPAdapter`` instances before
  the guard is set, or pass ``guard=None``.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import http.client
import http.cookiejar
import itertools
import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
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
from zkcrawl.web.transports.base import (
    ACCEPT,
    PROTOCOL,
    BodySink,
    Response,
    ascii_url,
    ca_bundle,
)

__all__ = ["CHUNK", "PROTOCOL", "WATCHDOG", "RequestsTransport", "Watchdog"]

CHUNK = 64 * 1024  # decoded bytes per read: a bound on what one read inflates
# What urllib3 inflates here (gzip, deflate; br and zstd when their modules are installed).
_CODINGS = frozenset({*urllib3.HTTPResponse.CONTENT_DECODERS, "identity", ""})


class Watchdog:
    """Shuts sockets down at their deadlines: one daemon thread, started on first use, a
    heap of armed deadlines. :meth:`arm` and :meth:`disarm` cost a lock and a heap push."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, socket.socket]] = []
        self._armed: dict[int, socket.socket] = {}
        self._fired: set[int] = set()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, sock: socket.socket, deadline: float) -> int:
        with self._cond:
            token = next(self._ids)
            self._armed[token] = sock
            heapq.heappush(self._heap, (deadline, token, sock))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="requests-watchdog",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
            return token

    def disarm(self, token: int) -> bool:
        """Forget ``token``; True when its deadline had fired (its socket was shut down)."""
        with self._cond:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)  # disarmed meanwhile
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, token, sock = heapq.heappop(self._heap)
                self._armed.pop(token, None)
                self._fired.add(token)
                with contextlib.suppress(OSError):  # the blocked read returns at once
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)


WATCHDOG = Watchdog()
_deadline = threading.local()  # the running get()'s deadline and armed token, per thread


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
    :func:`_checked_connection` (with urllib3's own error mapping) unless ``guard`` is None;
    the response's head read under the :data:`WATCHDOG` (the running get()'s deadline)."""

    guard: AddressGuard | None = BLOCK_PRIVATE
    sock: socket.socket | None
    host: str
    port: int
    timeout: Any
    source_address: tuple[str, int] | None
    socket_options: Any

    def getresponse(self) -> Any:
        at = getattr(_deadline, "at", None)
        if at is not None and isinstance(self.sock, socket.socket):  # not a TLS-in-TLS one
            if getattr(_deadline, "token", None) is not None:
                WATCHDOG.disarm(_deadline.token)
            _deadline.token = WATCHDOG.arm(self.sock, at)
        return super().getresponse()  # type: ignore[misc]

    def _new_conn(self) -> socket.socket:
        if self.guard is None:
            return super()._new_conn()  # type: ignore[misc,no-any-return]
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
def _pool_classes(guard: AddressGuard | None) -> dict[str, type]:
    """urllib3 pool classes whose connections check ``guard`` (one set per guard; None:
    no address check, the head's deadline all the same)."""
    conns = {scheme: type(f"Guarded{base.__name__}", (_Guarded, base), {"guard": guard})
             for scheme, base in (("http", urllib3.connection.HTTPConnection),
                                  ("https", urllib3.connection.HTTPSConnection))}
    return {scheme: type(f"Guarded{pool.__name__}", (pool,), {"ConnectionCls": conns[scheme]})
            for scheme, pool in urllib3.poolmanager.pool_classes_by_scheme.items()}


def _guard_session(session: requests.Session, guard: AddressGuard | None) -> None:
    """Make every adapter of ``session`` check ``guard`` (None: stop checking)."""
    classes = _pool_classes(guard)
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


class RequestsTransport:
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
            accept: tuple[str, ...], headers: Sequence[str] = ()) -> Response:
        """GET ``url``; never raises for network trouble (see :class:`Response`)."""
        deadline = time.monotonic() + budget
        _deadline.at, _deadline.token = deadline, None
        try:
            return self._get(url, deadline, connect, idle, budget, limit, accept, headers)
        finally:
            _deadline.at = None
            token, _deadline.token = _deadline.token, None
            if token is not None:
                WATCHDOG.disarm(token)

    def _get(self, url: str, deadline: float, connect: float, idle: float, budget: float,
             limit: int, accept: tuple[str, ...], headers: Sequence[str] = ()) -> Response:
        try:
            target = ascii_url(url)
            if (blocked := self._check_proxied(target)) is not None:
                return Response(error=BLOCKED_ADDRESS, detail=f"through a proxy, {blocked}")
            extra = dict(line.split(": ", 1) for line in headers) if headers else None
            resp = self._session.get(target, allow_redirects=False, stream=True, headers=extra,
                                     timeout=(connect, min(idle, budget)), verify=self._verify)
            if _deadline.token is not None:  # the head is in: the body has its own bound
                WATCHDOG.disarm(_deadline.token)
                _deadline.token = None
        except BlockedAddress as exc:
            return Response(error=BLOCKED_ADDRESS,
                            detail=f"the address guard refused {exc.reason}")
        except requests.Timeout as exc:
            return Response(error="timeout", detail=str(exc))
        except requests.ConnectionError as exc:
            if _deadline.token is not None and WATCHDOG.disarm(_deadline.token):
                _deadline.token = None
                return Response(error="timeout", detail=f"the response's head took longer "
                                f"than its budget ({budget:g} s)")
            return Response(error=_broken(exc), detail=str(exc))
        except urllib3.exceptions.InvalidHeader as exc:  # the server's (a bad Content-Length)
            return Response(error=PROTOCOL, detail=str(exc))
        except (ValueError, UnicodeError) as exc:  # InvalidURL, InvalidSchema, MissingSchema
            if _caused_by(exc, urllib3.exceptions.InvalidHeader):
                return Response(error=PROTOCOL, detail=str(exc))
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
                return PROTOCOL, f"unsupported Content-Encoding {coding!r}"
            if sink.write(chunk) == 0:
                return None, ""  # sink.verdict says why, when it matters
    except urllib3.exceptions.ReadTimeoutError as exc:
        return "timeout", str(exc)
    except urllib3.exceptions.DecodeError as exc:  # a body its coding does not inflate
        return PROTOCOL, str(exc)
    except (urllib3.exceptions.HTTPError, requests.RequestException, OSError) as exc:
        return "connection", str(exc)  # reset, truncated (IncompleteRead)


def _broken(exc: BaseException) -> str:
    """``protocol`` when http.client found the head broken -- a status line or header that
    does not parse, too long or too many (permanent: not retried) --, else ``connection``
    (a reset, an empty reply, a truncated body: worth another try)."""
    quiet = (http.client.RemoteDisconnected, http.client.IncompleteRead)
    return PROTOCOL if _caused_by(exc, http.client.HTTPException, but=quiet) else "connection"


def _caused_by(exc: BaseException, kind: type[BaseException] | tuple[type[BaseException], ...],
               but: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether ``exc``, its arguments or its causes (the chain urllib3 and requests wrap)
    hold a ``kind`` that is not one of ``but``."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        cur = todo.pop()
        if not isinstance(cur, BaseException) or id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, kind) and not isinstance(cur, but):
            return True
        todo.extend([*cur.args, cur.__cause__, cur.__context__])
    return False


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
