"""The libcurl transport (pycurl), ``--http curl``, the default: :class:`CurlTransport`, with
the :class:`~zkcrawl.web.transports.base.Transport` contract (one GET, never a redirect,
bounded time and size, the body policy of :class:`~zkcrawl.web.transports.base.BodySink`).

* Connections: a :class:`HandlePool` of libcurl easy handles keyed by origin, shared by the
  threads of one :class:`~zkcrawl.web.fetch.Fetcher`; a thread takes its origin's idle handle
  for one transfer and gives it back, so a host's next request -- on whichever thread --
  reuses its kept-alive connection. A handle is used by one thread at a time (libcurl does
  not support a connection cache shared by concurrent threads, ``CURLSHOPT_SHARE``).
* Limits: ``budget`` is ``CURLOPT_TIMEOUT``, ``idle`` the low-speed check (whole seconds),
  ``connect`` ``CURLOPT_CONNECTTIMEOUT``; the write callback stops at ``limit``. Errors map
  to ``timeout``, ``bad-url``, ``protocol`` (a broken reply) or ``connection``.
* Proxies come from the environment as libcurl reads it (``HTTP_PROXY`` in capitals ignored).
* The SSRF guard (:meth:`CurlTransport.set_guard`): ``CURLOPT_OPENSOCKETFUNCTION`` refuses a
  blocked address of every new connection (``error="blocked-address"``); through a proxy the
  target host is resolved and checked first, best effort, failing closed where
  :func:`curl_proxy` and libcurl could disagree.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import math
import os
import resource
import socket
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import pycurl

from zkcrawl.web.addresses import BLOCK_PRIVATE, BLOCKED_ADDRESS, AddressGuard, active
from zkcrawl.web.transports.base import ACCEPT, PROTOCOL, BodySink, Response, ascii_url, ca_bundle
from zkcrawl.web.transports.curl_headers import header_api

__all__ = ["CurlTransport", "HandlePool", "curl_proxy", "idle_handles_default"]

_TIMEOUT_CODES = frozenset({pycurl.E_OPERATION_TIMEDOUT})
_BAD_URL_CODES = frozenset({pycurl.E_URL_MALFORMAT, pycurl.E_UNSUPPORTED_PROTOCOL})
# The server broke HTTP, and will again (issue #27): CURLE_WEIRD_SERVER_REPLY (8: a bad
# Content-Length...), CURLE_BAD_CONTENT_ENCODING (61), CURLE_TOO_LARGE (100: a header over
# libcurl's limit). "protocol": permanent, as fetch.py has it.
_PROTOCOL_CODES = frozenset({8, pycurl.E_BAD_CONTENT_ENCODING, 100})
_DEFAULT_PORTS = {"http": 80, "https": 443}
# The variables libcurl takes a proxy from (``HTTP_PROXY`` in capitals is not one of them).
_PROXY_VARS = ("http_proxy", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


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


def idle_handles_default() -> int:
    """How many idle handles (each with at most one open connection) a pool keeps by default:
    a quarter of the process's descriptor limit, between 32 and 4,096."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        soft = 1024
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(32, min(4096, soft // 4))


class _Handle:
    """One libcurl easy handle and what one transfer on it sets and reads. The guard's
    callback is bound here, so it sees this transfer's state whichever thread runs it."""

    __slots__ = ("blocked", "config", "curl", "extra", "guard", "limits", "proxied", "reader")

    def __init__(self, config: tuple[str, tuple[str, ...]], guard: AddressGuard | None) -> None:
        user_agent, resolve = config
        c = self.curl = pycurl.Curl()
        c.setopt(pycurl.NOSIGNAL, 1)  # threads: no SIGALRM for DNS timeouts
        c.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        c.setopt(pycurl.FOLLOWLOCATION, 0)
        c.setopt(pycurl.ACCEPT_ENCODING, "gzip, deflate")
        c.setopt(pycurl.USERAGENT, user_agent)
        c.setopt(pycurl.HTTPHEADER, [f"Accept: {ACCEPT}"])
        c.setopt(pycurl.MAXCONNECTS, 1)  # one origin a handle: the pool keys them
        c.setopt(pycurl.LOW_SPEED_LIMIT, 1)
        if cafile := ca_bundle():
            c.setopt(pycurl.CAINFO, cafile)
        if resolve:
            c.setopt(pycurl.RESOLVE, list(resolve))
        self.config = config
        self.guard = guard
        self.proxied = False  # this transfer goes through a proxy: its address is trusted
        self.blocked: str | None = None  # what the guard refused during this transfer
        self.extra: tuple[str, ...] = ()  # extra header lines set on the handle now
        self.limits: tuple[int, int, int] = (0, 0, 0)  # connect ms, budget ms, idle s set now
        if guard is not None:
            c.setopt(pycurl.OPENSOCKETFUNCTION, self.open_socket)
        # The response's head from libcurl's header API when it can be read (no callback
        # per header line: zkcrawl.web.transports.curl_headers), else HEADERFUNCTION.
        self.reader: functools.partial[tuple[int | None, dict[str, str]]] | None = None
        api = header_api()
        if api is not None and (handle := api.handle_of(c)) is not None:
            self.reader = functools.partial(api.head, handle)

    def open_socket(self, purpose: int, address: tuple[Any, ...]) -> object:
        """libcurl's ``CURLOPT_OPENSOCKETFUNCTION``: called (only when a guard is set) with the
        address a new connection is about to be opened to, after DNS; refuses a blocked
        one. pycurl duplicates the descriptor of the socket returned, so it may be freed."""
        family, socktype, protocol, addr = address
        if self.guard is not None and not self.proxied:
            ip = addr[0] if isinstance(addr, tuple) and addr else addr
            reason = self.guard.blocked(ip)
            if reason is not None:
                self.blocked = f"{ip}: {reason}"
                return pycurl.SOCKET_BAD
        try:
            return socket.socket(family, socktype, protocol)
        except OSError:
            return pycurl.SOCKET_BAD

    def close(self) -> None:
        """Close the handle and its connection; one in the middle of a transfer is left to
        finish (libcurl refuses to close it)."""
        with contextlib.suppress(pycurl.error):
            self.curl.close()


_Key = tuple[str, tuple[str, tuple[str, ...]], int]


class HandlePool:
    """Idle easy handles by origin (scheme, host and port, the transport's settings, its
    guard), least recently used first; thread-safe. ``idle``: the most kept idle, each with
    at most one open connection (default :func:`idle_handles_default`). A take that finds
    none for its origin while the pool is full takes the least recently used handle of
    another origin (its connection is replaced); a give over the bound closes that one.
    After :meth:`close` nothing is kept: each transfer then has a handle of its own."""

    def __init__(self, idle: int | None = None) -> None:
        self.idle = idle if idle is not None else idle_handles_default()
        self._handles: OrderedDict[_Key, list[_Handle]] = OrderedDict()
        self._count = 0
        self._lock = threading.Lock()
        self._closed = False

    def take(self, key: _Key) -> _Handle | None:
        """The idle handle kept for ``key``, else another origin's least recent one when the
        pool is full (the caller checks its settings), else None."""
        with self._lock:
            handles = self._handles.get(key)
            if handles is None:
                if self._count < self.idle or not self._handles:
                    return None
                key, handles = next(iter(self._handles.items()))
            handle = handles.pop()
            if not handles:
                del self._handles[key]
            self._count -= 1
            return handle

    def give(self, key: _Key, handle: _Handle) -> None:
        """Keep ``handle`` for ``key`` (closing the least recent one when over the bound)."""
        with self._lock:
            if self._closed:
                excess: _Handle | None = handle
            else:
                self._handles.setdefault(key, []).append(handle)
                self._handles.move_to_end(key)
                self._count += 1
                excess = None
                if self._count > self.idle:
                    old_key, handles = next(iter(self._handles.items()))
                    excess = handles.pop(0)
                    if not handles:
                        del self._handles[old_key]
                    self._count -= 1
        if excess is not None:
            excess.close()

    def __len__(self) -> int:
        return self._count

    def close(self) -> None:
        """Close every idle handle; handles given back later are closed too."""
        with self._lock:
            self._closed = True
            handles = [h for hs in self._handles.values() for h in hs]
            self._handles.clear()
            self._count = 0
        for handle in handles:
            handle.close()


class CurlTransport:
    """One thread's libcurl transport: its transfers run on handles taken from ``pool``
    (shared by the transports :meth:`factory` makes; default: a pool of this transport's
    own of ``max_connections`` handles). Not thread-safe: one per thread.

    ``guard``: the SSRF guard checked on every new connection (default: block every address
    that is not public; see :meth:`set_guard`). ``resolve``: ``HOST:PORT:ADDRESS`` entries
    that pin a name to an address (libcurl's ``CURLOPT_RESOLVE``, ``curl --resolve``), for
    tests of what the guard does with a name that resolves to an internal address."""

    def __init__(self, user_agent: str, max_connections: int = 32,
                 guard: AddressGuard | None = BLOCK_PRIVATE, resolve: Sequence[str] = (),
                 pool: HandlePool | None = None) -> None:
        self._pool = pool if pool is not None else HandlePool(max_connections)
        self._config = (user_agent, tuple(resolve))
        self._guard: AddressGuard | None = None
        self._proxy_env = False  # any proxy variable set (read with the guard)
        self.set_guard(guard)

    @classmethod
    def factory(cls, idle: int | None = None) -> functools.partial[CurlTransport]:
        """A transport factory whose transports share one :class:`HandlePool` (``idle``
        handles at most; default :func:`idle_handles_default`). Probes the header API here,
        once, where it is made (before the threads that use it start): probed on the
        threads' first handles, every thread probed it at once (~1.5 ms each, reading
        ``/proc/self/maps``) and a consumer's first requests started over 25 ms, not 1."""
        header_api()
        return functools.partial(cls, pool=HandlePool(idle))

    def set_guard(self, guard: AddressGuard | None) -> None:
        """Check every connection this transport opens from now on against ``guard`` (None
        or ``AddressGuard.off()``: no check, and no callback at all). Call it before the
        first ``get``: handles are kept per guard, and a kept connection was checked when
        it was opened."""
        self._guard = active(guard)
        if self._guard is not None:
            self._proxy_env = any(os.environ.get(name) for name in _PROXY_VARS)

    def _check_proxied(self, handle: _Handle, url: str) -> str | None:
        """With a proxy configured for ``url``: resolve and check the target host here (the
        connection itself goes to the proxy); sets whether this transfer is proxied."""
        handle.proxied = False
        if not self._proxy_env or curl_proxy(url) is None:
            return None
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
        except ValueError:
            return None  # libcurl refuses it; a proxy libcurl still used gets checked
        handle.proxied = True
        assert self._guard is not None
        return self._guard.check_host(host, port)

    def _take(self, key: _Key) -> _Handle:
        handle = self._pool.take(key)
        if handle is not None and handle.config == self._config and handle.guard is self._guard:
            return handle
        if handle is not None:  # another origin's, made with other settings
            handle.close()
        return _Handle(self._config, self._guard)

    def get(self, url: str, *, connect: float, idle: float, budget: float, limit: int,
            accept: tuple[str, ...], headers: Sequence[str] = ()) -> Response:
        """GET ``url``; never raises for network trouble (see :class:`Response`)."""
        try:
            target = ascii_url(url)
        except (UnicodeError, ValueError) as exc:
            return Response(error="bad-url", detail=str(exc))
        slash = target.find("/", target.find("://") + 3)
        key = (target if slash < 0 else target[:slash], self._config, id(self._guard))
        handle = self._take(key)
        try:
            return self._transfer(handle, target, connect, idle, budget, limit, accept,
                                  tuple(headers))
        finally:
            self._pool.give(key, handle)

    def _transfer(self, h: _Handle, target: str, connect: float, idle: float, budget: float,
                  limit: int, accept: tuple[str, ...], headers: tuple[str, ...]) -> Response:
        c = h.curl
        if headers != h.extra:  # set only on a change: most fetches have none
            h.extra = headers
            c.setopt(pycurl.HTTPHEADER, [f"Accept: {ACCEPT}", *headers])
        sink = BodySink(limit, accept, reader=h.reader)
        try:
            c.setopt(pycurl.URL, target)
        except (pycurl.error, UnicodeError, ValueError) as exc:
            return Response(error="bad-url", detail=str(exc))
        h.blocked = None
        if self._guard is not None and (blocked := self._check_proxied(h, target)) is not None:
            return Response(error=BLOCKED_ADDRESS, detail=f"through a proxy, {blocked}")
        limits = (max(1, int(connect * 1000)), max(1, int(budget * 1000)),
                  max(1, math.ceil(idle)))
        if limits != h.limits:  # set only on a change: a first hop's are the same
            h.limits = limits
            c.setopt(pycurl.CONNECTTIMEOUT_MS, limits[0])
            c.setopt(pycurl.TIMEOUT_MS, limits[1])
            c.setopt(pycurl.LOW_SPEED_TIME, limits[2])
        if h.reader is None:
            c.setopt(pycurl.HEADERFUNCTION, sink.head.append)
        c.setopt(pycurl.WRITEFUNCTION, sink.write)
        error, detail = None, ""
        try:
            c.perform()
        except pycurl.error as exc:
            code = exc.args[0] if exc.args else 0
            error, detail = _classify(code, sink), str(exc.args[-1] if exc.args else exc)
            if code == pycurl.E_UNSUPPORTED_PROTOCOL and target[:8].lower().startswith(
                    ("http://", "https://")):
                error = PROTOCOL  # an http(s) URL: the server's answer (HTTP/0.9...)
        status, head = sink.status_and_headers()
        if h.blocked is not None and status is None:  # refused by open_socket
            error, detail = BLOCKED_ADDRESS, f"the address guard refused {h.blocked}"
        if error is None and sink.verdict is not None:
            error = sink.verdict  # a body cut by us while libcurl saw no error
        if status is None and error is None:
            error = "connection"  # no response at all (HTTP/0.9, an empty reply)
        return Response(status, head, sink.body(), error, detail)

    def close(self) -> None:
        """Close the pool's idle handles and their connections (a shared pool's too: the
        Fetcher closes all its transports at once); a transfer in progress finishes and its
        handle is closed when given back."""
        self._pool.close()


def _classify(code: int, sink: BodySink) -> str | None:
    if code == pycurl.E_WRITE_ERROR:
        # We stopped it: a kept body over the limit, or a drained one not worth finishing.
        return sink.verdict if sink.verdict is not None else None
    if code in _TIMEOUT_CODES:
        return "timeout"
    if code in _BAD_URL_CODES:
        return "bad-url"
    if code in _PROTOCOL_CODES:
        return PROTOCOL
    return "connection"
