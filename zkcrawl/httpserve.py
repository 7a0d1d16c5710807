"""A small HTTP/1.x server on one thread that slow clients cannot take down: the consumer's and
the exporter's ``/metrics``, ``/livez`` and ``/readyz``
(:class:`~zkcrawl.consumer.metrics.MetricsServer`).

* **No request thread**: an event loop (``selectors``); ``respond`` must not block.
* **A total deadline per connection**: the request within :data:`REQUEST_TIMEOUT` of the
  accept, the answer taken within as much again, whatever the client trickles.
* **Bounded memory**: at most :data:`MAX_OPEN` connections (the oldest shed), a head of at
  most :data:`MAX_HEAD` bytes (431), bodies never read, ``Connection: close``.
* **One answer for anything**: 405, 400, or 500 for a ``respond`` that raises; the thread
  never dies of a client. So a probe is answered within one turn of the loop.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["MAX_HEAD", "MAX_OPEN", "REQUEST_TIMEOUT", "Answer", "EventServer", "Respond",
           "parse_head", "render"]

REQUEST_TIMEOUT = 5.0  # seconds for the whole request head; as many for the whole answer
MAX_OPEN = 128  # connections held at once; one more sheds the oldest
MAX_HEAD = 8192  # bytes of request line + headers
BACKLOG = 128  # the kernel's accept queue (the default of 5 drops a probe's SYN under load)
POLL = 0.2  # the loop's longest wait: reaction time to stop() and to deadlines

#: An answer: status, content type, body.
Answer = tuple[int, str, bytes]
#: What the server asks for a request's path (query removed): must not block.
Respond = Callable[[str], Answer]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    inbuf: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None  # the answer being written


def parse_head(head: bytes) -> tuple[int, str, str]:
    """``(0, method, path)`` for a request head (its line and headers, without the blank
    line), or ``(status, "", "")`` for one we refuse to answer (400); never raises."""
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not parts[1]:
        return 400, "", ""
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        return 400, "", ""
    if not method.isalpha() or not target.isprintable():
        return 400, "", ""
    return 0, method, target.split("?", 1)[0]


def render(status: int, ctype: str, body: bytes, head_only: bool = False) -> bytes:
    """The bytes of one HTTP/1.0-style answer that closes the connection."""
    lines = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
             f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
             "Connection: close\r\n\r\n")
    return lines.encode("ascii") + (b"" if head_only else body)


class EventServer:
    """Listens on ``(host, port)`` at construction (``OSError`` when it cannot) and serves
    ``respond`` from :meth:`start` to :meth:`stop` on one thread named ``name``."""

    def __init__(self, host: str, port: int, respond: Respond, name: str = "httpserve") -> None:
        self.respond = respond
        self._listener = socket.create_server((host, port), backlog=BACKLOG)
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._stop = threading.Event()
        self._open: dict[socket.socket, _Conn] = {}  # in accept order: oldest first
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.shed = 0  # connections closed to make room, or past their deadline

    def start(self) -> EventServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        with contextlib.suppress(OSError):
            self._listener.close()

    # -- the loop ---------------------------------------------------------------------------
    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ, None)
            try:
                while not self._stop.is_set():
                    for key, events in sel.select(POLL):
                        if key.data is None:
                            self._accept(sel)
                        else:
                            self._ready(sel, key.data, events)
                    self._expire(sel)
            finally:
                for conn in list(self._open.values()):
                    self._close(sel, conn)

    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(BACKLOG):  # bounded: the loop's other connections get their turn
            try:
                sock, _addr = self._listener.accept()
            except OSError:  # nothing waiting; or EMFILE and the like: next turn
                return
            if len(self._open) >= MAX_OPEN:
                self.shed += 1
                self._close(sel, next(iter(self._open.values())))
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + REQUEST_TIMEOUT)
            self._open[sock] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _ready(self, sel: selectors.BaseSelector, conn: _Conn, events: int) -> None:
        try:
            if conn.out is None and events & selectors.EVENT_READ:
                self._read(sel, conn)
            elif conn.out is not None and events & selectors.EVENT_WRITE:
                self._write(sel, conn)
        except OSError:  # reset, broken pipe: that client is gone
            self._close(sel, conn)

    def _read(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        data = conn.sock.recv(MAX_HEAD + 1 - len(conn.inbuf))
        if not data:
            self._close(sel, conn)
            return
        conn.inbuf += data
        end = conn.inbuf.find(b"\r\n\r\n")
        if end < 0:
            end = conn.inbuf.find(b"\n\n")
        if end >= 0:
            self._answer(sel, conn, self._response(bytes(conn.inbuf[:end])))
        elif len(conn.inbuf) > MAX_HEAD:
            self._answer(sel, conn, render(431, "text/plain", b"request head too large\n"))

    def _response(self, head: bytes) -> bytes:
        status, method, path = parse_head(head)
        if status:
            return render(status, "text/plain", b"bad request\n")
        if method not in ("GET", "HEAD"):
            return render(405, "text/plain", b"GET or HEAD only\n")
        try:
            code, ctype, body = self.respond(path)
        except Exception:  # a broken respond() is a 500, never a dead server thread
            code, ctype, body = 500, "text/plain", b"internal error\n"
        return render(code, ctype, body, head_only=method == "HEAD")

    def _answer(self, sel: selectors.BaseSelector, conn: _Conn, raw: bytes) -> None:
        conn.out = memoryview(raw)
        conn.inbuf.clear()
        conn.deadline = time.monotonic() + REQUEST_TIMEOUT
        sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(sel, conn)  # most answers fit the socket buffer: done at once

    def _write(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self._close(sel, conn, finished=True)

    def _expire(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for conn in [c for c in self._open.values() if c.deadline <= now]:
            self.shed += 1
            self._close(sel, conn)

    def _close(self, sel: selectors.BaseSelector, conn: _Conn, finished: bool = False) -> None:
        self._open.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            sel.unregister(conn.sock)
        if finished:  # a graceful end: the client reads the answer, then EOF
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            conn.sock.close()
