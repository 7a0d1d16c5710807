"""The libcurl transport (pycurl), ``--http curl``, the default: :class:`CurlTransport`, one
curl easy handle per thread, with the :class:`~zkcrawl.web.transports.base.Transport`
contract (one GET, never a redirect, bounded time and size, the body policy of
:class:`~zkcrawl.web.transports.base.BodySink`).

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
import ipaddress
import math
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import pycurl

from zkcrawl.web.addresses import BLOCK_PRIVATE, BLOCKED_ADDRESS, AddressGuard, active
from zkcrawl.web.transports.base import ACCEPT, PROTOCOL, BodySink, Response, ascii_url, ca_bundle

__all__ = ["CurlTransport", "curl_proxy"]

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


class CurlTransport:
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
        self._extra: tuple[str, ...] = ()  # extra header lines set on the handle now
        self._limits: tuple[int, int, int] = (0, 0, 0)  # connect ms, budget ms, idle s set now
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

    def _open_socket(self, purpose: int, address: tuple[Any, ...]) -> object:
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
            accept: tuple[str, ...], headers: Sequence[str] = ()) -> Response:
        """GET ``url``; never raises for network trouble (see :class:`Response`)."""
        c = self._curl
        if tuple(headers) != self._extra:  # set only on a change: most fetches have none
            self._extra = tuple(headers)
            c.setopt(pycurl.HTTPHEADER, [f"Accept: {ACCEPT}", *self._extra])
        sink = BodySink(limit, accept)
        try:
            target = ascii_url(url)
            c.setopt(pycurl.URL, target)
        except (pycurl.error, UnicodeError, ValueError) as exc:
            return Response(error="bad-url", detail=str(exc))
        self._blocked = None
        if self._guard is not None and (blocked := self._check_proxied(target)) is not None:
            return Response(error=BLOCKED_ADDRESS, detail=f"through a proxy, {blocked}")
        limits = (max(1, int(connect * 1000)), max(1, int(budget * 1000)),
                  max(1, math.ceil(idle)))
        if limits != self._limits:  # set only on a change: a first hop's are the same
            self._limits = limits
            c.setopt(pycurl.CONNECTTIMEOUT_MS, limits[0])
            c.setopt(pycurl.TIMEOUT_MS, limits[1])
            c.setopt(pycurl.LOW_SPEED_TIME, limits[2])
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
        if self._blocked is not None and status is None:  # refused by _open_socket
            error, detail = BLOCKED_ADDRESS, f"the address guard refused {self._blocked}"
        if error is None and sink.verdict is not None:
            error = sink.verdict  # a body cut by us while libcurl saw no error
        if status is None and error is None:
            error = "connection"  # no response at all (HTTP/0.9, an empty reply)
        return Response(status, head, sink.body(), error, detail)

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
    if code in _PROTOCOL_CODES:
        return PROTOCOL
    return "connection"
