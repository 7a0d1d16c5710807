"""A reusable HTTP test server on 127.0.0.1 (real sockets, no mocks).

Usage::

    from tests.httpd import TestServer, html, redirect, trickle, delayed, sequence

    routes = {
        "/": html("<title>home</title>"),                    # a static response
        "/old": redirect("/"),                               # 302 to /
        "/slow": delayed(2.0, html("late")),                 # sleeps, then answers
        "/drip": trickle(b"x" * 100, interval=0.2),          # 1 byte every 0.2 s
        "/flaky": sequence((500, {}, b"oops"), html("ok")),  # 500 first, then 200 forever
        "/items/*": lambda h: (200, {"Content-Type": "text/plain"}, h.path.encode()),
    }
    with TestServer(routes) as srv:
        requests.get(srv.url("/"))
        srv.wait_for_requests(1, path="/")
        srv.gaps("/")          # server-side seconds between successive requests to "/"

A route value is either a static ``(status, headers, body)`` tuple or a callable taking the
:class:`http.server.BaseHTTPRequestHandler`; the callable may write the response itself
(``send_response`` ...) or return a ``(status, headers, body)`` tuple.  Route keys are exact
paths (query ignored; an exact key with the query wins), or prefixes ending in ``*``; a route
keyed ``"*"`` catches everything else.  Unknown paths get 404.  Routes can be changed while the
server runs (``srv.routes[path] = ...``, or :meth:`TestServer.route`).

Every request is logged with a server-side ``time.monotonic()`` stamp taken when its request
line has been parsed, with its ``Host`` header and client port (to see connection reuse).
Handlers that wait use :meth:`TestServer.sleep`, which returns early when the server stops, so
``__exit__`` never hangs on a slow route.
"""

from __future__ import annotations

import gzip as _gzip
import itertools
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

Response = tuple[int, Mapping[str, str], bytes]
Handler = Callable[[BaseHTTPRequestHandler], Response | None]
Route = Response | Handler

__all__ = [
    "LoggedRequest",
    "TestServer",
    "chunked",
    "delayed",
    "gzip_bomb",
    "gzipped",
    "html",
    "redirect",
    "send",
    "sequence",
    "server_of",
    "static",
    "trickle",
]


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server saw it."""

    method: str
    path: str  # path without the query
    target: str  # the raw request target, query included
    host: str  # Host header ("" when absent)
    headers: dict[str, str]
    t: float  # server-side time.monotonic() when the request line was parsed
    client_port: int


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler stuck in a client's slow read never blocks shutdown
    allow_reuse_address = True
    owner: TestServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that hang up early (timeouts, too-large bodies) are what several tests are
        # about; a traceback on stderr for each would only be noise.
        pass


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so tests can check connection reuse
    # Headers and body go out in separate writes; with Nagle on, the client's delayed ACK
    # would add ~40 ms to every response and blur the timings that tests measure.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # silence stderr logging
        pass

    def _dispatch(self) -> None:
        self.server.owner._handle(self)

    do_GET = do_POST = do_PUT = do_DELETE = _dispatch

    def do_HEAD(self) -> None:
        self.server.owner._handle(self, head=True)


def server_of(handler: BaseHTTPRequestHandler) -> TestServer:
    """The :class:`TestServer` a request handler belongs to (for callable routes)."""
    server: _Server = handler.server  # type: ignore[assignment]
    return server.owner


class TestServer:
    """ThreadingHTTPServer on ``127.0.0.1:<free port>`` in a background thread.

    A context manager: ``__enter__`` starts serving, ``__exit__`` stops (bounded: slow handlers
    are woken through :meth:`sleep`, handler threads are daemons).
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, routes: Mapping[str, Route] | None = None, host: str = "127.0.0.1",
                 tls: ssl.SSLContext | None = None):
        self.routes: dict[str, Route] = dict(routes or {})
        self._httpd = _Server((host, 0), _RequestHandler)
        self.scheme = "http"
        if tls is not None:  # HTTPS; the handshake happens in the handler thread
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True,
                                                 do_handshake_on_connect=False)
            self.scheme = "https"
        self._httpd.owner = self
        address = self._httpd.server_address
        self.host: str = str(address[0])
        self.port: int = int(address[1])
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._log: list[LoggedRequest] = []
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def __enter__(self) -> TestServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    # -- addresses ------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def url(self, path: str = "/", host: str | None = None) -> str:
        """Absolute URL of ``path``; ``host="localhost"`` gives a second host name for the same
        server (politeness keys are per host name)."""
        return f"{self.scheme}://{host or self.host}:{self.port}{path}"

    def route(self, path: str, handler: Route) -> None:
        self.routes[path] = handler

    # -- request log ------------------------------------------------------------------------

    @property
    def requests(self) -> list[LoggedRequest]:
        with self._cond:
            return list(self._log)

    def requests_for(self, path: str | None = None, host: str | None = None) -> list[LoggedRequest]:
        """Logged requests, filtered by path and/or ``Host`` header (host name, port ignored)."""
        return [
            r
            for r in self.requests
            if (path is None or r.path == path)
            and (host is None or r.host.rsplit(":", 1)[0] == host)
        ]

    def times(self, path: str | None = None, host: str | None = None) -> list[float]:
        return [r.t for r in self.requests_for(path, host)]

    def gaps(self, path: str | None = None, host: str | None = None) -> list[float]:
        """Seconds between successive matching requests, as measured by the server."""
        ts = self.times(path, host)
        return [b - a for a, b in itertools.pairwise(ts)]

    def wait_for_requests(
        self, n: int, path: str | None = None, host: str | None = None, timeout: float = 5.0
    ) -> list[LoggedRequest]:
        """Block until at least ``n`` matching requests were logged; AssertionError after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                matched = [
                    r
                    for r in self._log
                    if (path is None or r.path == path)
                    and (host is None or r.host.rsplit(":", 1)[0] == host)
                ]
                if len(matched) >= n:
                    return matched
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"expected {n} requests to {path!r}, got {len(matched)}")
                self._cond.wait(remaining)

    def sleep(self, seconds: float) -> bool:
        """Sleep in a handler; returns False (early) if the server is stopping."""
        return not self._stop.wait(seconds)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- dispatch -----------------------------------------------------------------------------

    def _lookup(self, target: str, path: str) -> Route | None:
        routes = self.routes
        if target in routes:
            return routes[target]
        if path in routes:
            return routes[path]
        prefixes = [k for k in routes if k.endswith("*") and path.startswith(k[:-1])]
        if prefixes:
            return routes[max(prefixes, key=len)]
        return None

    def _handle(self, handler: BaseHTTPRequestHandler, head: bool = False) -> None:
        target = handler.path
        path = urlsplit(target).path
        entry = LoggedRequest(
            method=handler.command,
            path=path,
            target=target,
            host=handler.headers.get("Host", ""),
            headers=dict(handler.headers.items()),
            t=time.monotonic(),
            client_port=handler.client_address[1],
        )
        with self._cond:
            self._log.append(entry)
            self._cond.notify_all()
        length = int(handler.headers.get("Content-Length") or 0)
        if length:
            handler.rfile.read(length)
        route = self._lookup(target, path)
        if route is None:
            route = (404, {"Content-Type": "text/plain"}, b"not found")
        response = route if isinstance(route, tuple) else route(handler)
        if response is not None:
            send(handler, *response, head=head)


def send(
    handler: BaseHTTPRequestHandler,
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    head: bool = False,
) -> None:
    """Write a complete response with Content-Length (unless ``headers`` sets it)."""
    handler.send_response(status)
    lower = {k.lower() for k in headers}
    for name, value in headers.items():
        handler.send_header(name, value)
    if "content-length" not in lower:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if not head:
        handler.wfile.write(body)
    handler.wfile.flush()


# -- route factories ------------------------------------------------------------------------


def static(
    status: int = 200, body: bytes | str = b"", headers: Mapping[str, str] | None = None
) -> Response:
    """A fixed response (a plain tuple works too; this one accepts ``str`` bodies)."""
    data = body.encode("utf-8") if isinstance(body, str) else body
    return (status, dict(headers or {}), data)


def html(
    body: bytes | str, status: int = 200, charset: str | None = "utf-8", **headers: str
) -> Response:
    """An HTML response; ``charset=None`` leaves it out of Content-Type."""
    ctype = "text/html" + (f"; charset={charset}" if charset else "")
    hdrs = {"Content-Type": ctype, **{k.replace("_", "-"): v for k, v in headers.items()}}
    data = body.encode(charset or "utf-8") if isinstance(body, str) else body
    return (status, hdrs, data)


def redirect(location: str, status: int = 302) -> Response:
    return (status, {"Location": location, "Content-Type": "text/plain"}, b"moved")


def delayed(seconds: float, then: Route) -> Handler:
    """Wait ``seconds`` before sending the headers of ``then``."""

    def handle(h: BaseHTTPRequestHandler) -> Response | None:
        if not server_of(h).sleep(seconds):
            return None
        return then if isinstance(then, tuple) else then(h)

    return handle


def trickle(
    body: bytes,
    interval: float = 0.2,
    chunk: int = 1,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Handler:
    """Send headers (with the full Content-Length) at once, then ``chunk`` bytes every
    ``interval`` seconds; stops quietly when the client hangs up or the server stops."""

    def handle(h: BaseHTTPRequestHandler) -> None:
        hdrs = {"Content-Type": "text/html", **dict(headers or {})}
        h.send_response(status)
        for name, value in hdrs.items():
            h.send_header(name, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.flush()
        srv = server_of(h)
        try:
            for i in range(0, len(body), chunk):
                h.wfile.write(body[i : i + chunk])
                h.wfile.flush()
                if not srv.sleep(interval):
                    break
        except OSError:
            pass
        h.close_connection = True

    return handle


def sequence(*routes: Route) -> Handler:
    """The n-th request gets the n-th route; the last one repeats (e.g. 500 then 200)."""
    if not routes:
        raise ValueError("sequence() needs at least one route")
    lock = threading.Lock()
    counter = itertools.count()

    def handle(h: BaseHTTPRequestHandler) -> Response | None:
        with lock:
            n = next(counter)
        route = routes[min(n, len(routes) - 1)]
        return route if isinstance(route, tuple) else route(h)

    return handle


def gzipped(body: bytes | str, content_type: str = "text/html; charset=utf-8") -> Response:
    """``body`` sent with ``Content-Encoding: gzip``."""
    data = body.encode("utf-8") if isinstance(body, str) else body
    return (200, {"Content-Type": content_type, "Content-Encoding": "gzip"}, _gzip.compress(data))


def gzip_bomb(decoded_size: int, content_type: str = "text/html") -> Response:
    """A small gzip body that inflates to ``decoded_size`` zero bytes."""
    return (
        200,
        {"Content-Type": content_type, "Content-Encoding": "gzip"},
        _gzip_zeros(decoded_size),
    )


def _gzip_zeros(size: int) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: gzip container
    block = bytes(1 << 20)
    parts: list[bytes] = []
    for start in range(0, size, len(block)):
        parts.append(comp.compress(block[: min(len(block), size - start)]))
    parts.append(comp.flush())
    return b"".join(parts)


def chunked(parts: Iterable[bytes], content_type: str = "text/html") -> Handler:
    """Send ``parts`` with ``Transfer-Encoding: chunked``."""
    parts = list(parts)

    def handle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for part in parts:
            h.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    return handle
