"""Synthetic site for the benches: many small pages, fixed latency, one asyncio event loop.
Run it in its own process so its CPU does not compete with the crawler's::

    python -m zkcrawl.bench.site --port 0 --latency-ms 50 --articles 2000
    READY http://127.0.0.1:PORT

Pages: ``/`` (the listings), ``/list/<p>`` (``--per-list`` article links and a ``next``
link), ``/a/<n>.html`` (a deterministic 5-15 KB article; ``--page-kb`` to change),
``/robots.txt`` (allow all) and ``/stats`` (JSON counters, per host the smallest gap
between two request arrivals). Every counted response is delayed by ``--latency-ms`` on a
timer, so the latency models a remote server, not a busy one. ``--hosts N`` listens on N
loopback addresses (``127.77.x.y``), one host each, and measures politeness on arrival.
``--request-log N`` (tests: which client sent what, when) also keeps the last N arrivals --
host, time, User-Agent -- in ``/stats``; without it ``/stats`` is as it was.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import json
import math
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

PER_LIST = 100
HOSTS_NET = "127.77"  # the many-hosts addresses: 127.77.x.y
MAX_HOSTS = 250 * 256
MAX_REQUEST_LOG = 1_000_000  # arrivals a request log may keep (~100 B each)
_MAX_HEAD = 16 * 1024
_MAX_AGENT = 200  # characters of a User-Agent a request log keeps
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 304: "Not Modified"}
_WORDS = ("crawl", "queue", "znode", "lease", "consumer", "producer", "latency", "throughput",
          "bloom", "filter", "session", "watch", "ephemeral", "sequential", "backoff", "retry",
          "robots", "politeness", "host", "delay", "thread", "pool", "backlog", "dispatch",
          "process", "record", "sink", "flush")


@functools.cache
def _paragraphs() -> tuple[str, ...]:
    rng = random.Random(42)
    return tuple(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(30, 80)))
                 for _ in range(64))


@functools.lru_cache(maxsize=4096)
def article_body(n: int, per_list: int = PER_LIST, page_kb: int = 0) -> bytes:
    """HTML of article ``n``: 5-15 KB (``page_kb`` > 0: 0.5-1.5 times that many KB), the
    same bytes on every call and in every process."""
    rng = random.Random(n)
    # Paragraphs are < 900 bytes and the frame ~250, so the page lands in 5-15 KB.
    target = rng.randint(4_800, 13_800) if page_kb <= 0 else \
        rng.randint(512 * page_kb, 1536 * page_kb) - 1100
    paras, size = [], 0
    pool = _paragraphs()
    while size < target:
        p = f"<p>{pool[rng.randrange(len(pool))]}</p>\n"
        paras.append(p)
        size += len(p)
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>Article {n}</title>'
            f'</head><body><h1 class="headline">Article {n}</h1>'
            f'<span class="author">Author {n % 17}</span>\n{"".join(paras)}'
            f'<p><a href="/list/{(n - 1) // per_list + 1}">back</a></p></body></html>\n'
            ).encode()


def list_pages(articles: int, per_list: int = PER_LIST) -> int:
    """Number of listing pages for ``articles`` articles."""
    return max(1, math.ceil(articles / per_list))


def listing_body(page: int, articles: int, per_list: int = PER_LIST) -> bytes:
    """HTML of listing ``page``."""
    first = (page - 1) * per_list + 1
    last = min(articles, page * per_list)
    links = "".join(f'<li><a class="item" href="/a/{n}.html">Article {n}</a></li>\n'
                    for n in range(first, last + 1))
    nxt = (f'<a rel="next" class="next" href="/list/{page + 1}">next</a>'
           if page < list_pages(articles, per_list) else "")
    return (f"<!doctype html>\n<html><head><title>List {page}</title></head><body>\n"
            f"<ul>\n{links}</ul>\n{nxt}\n</body></html>\n").encode()


def host_address(i: int) -> str:
    """The loopback address of host ``i`` (0-based) of a many-hosts site."""
    if not 0 <= i < MAX_HOSTS:
        raise ValueError(f"host index {i} out of range")
    return f"{HOSTS_NET}.{i // 250}.{i % 250 + 1}"


class BenchSite:
    """The asyncio server.  One instance per event loop."""

    def __init__(self, latency_ms: float, articles: int, per_list: int = PER_LIST,
                 page_kb: int = 0, request_log: int = 0) -> None:
        """Configure; nothing listens until :meth:`start`. ``request_log`` > 0: keep the
        last that many arrivals (:meth:`arrived`) for ``/stats``."""
        self.latency_s = max(0.0, latency_ms / 1000.0)
        self.articles = articles
        self.per_list = per_list
        self.page_kb = page_kb  # article size: 0 = 5-15 KB, else 0.5-1.5 x this
        self.servers: list[asyncio.Server] = []
        self.base_urls: list[str] = []
        # per host (its base URL): requests, arrival of the last one, smallest gap seen
        self.host_requests: dict[str, int] = {}
        self.host_last: dict[str, float] = {}
        self.host_min_gap: dict[str, float] = {}
        # ... and, with a request log, each arrival: (the same monotonic time -- the
        # machine's CLOCK_MONOTONIC, which other processes there read too -- host, User-Agent)
        self.request_log: collections.deque[tuple[float, str, str]] | None = (
            collections.deque(maxlen=request_log) if request_log > 0 else None)
        self.request_log_dropped = 0  # arrivals the bound pushed out of it
        self.first_at: float | None = None  # wall clock of the first counted request
        self.last_at: float | None = None
        self.requests = 0
        self.bytes_sent = 0  # response bytes written, heads included (/stats too)
        self.by_kind: dict[str, int] = {"list": 0, "article": 0, "other": 0}
        self.in_flight = 0
        self.max_in_flight = 0
        # How late the delayed responses left (their timers fire after the latency, never
        # before: the event loop's poll has millisecond resolution and other callbacks run
        # first): the site's own share of a client's fetch time, for the benches' bounds.
        self.late_s = 0.0
        self.late_n = 0
        self.connections = 0
        self.open_connections = 0
        self.started = time.monotonic()
        self.server: asyncio.Server | None = None
        self.base_url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen; return the base URL."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self.protocol, host, port, backlog=4096)
        bound = self.server.sockets[0].getsockname()
        self.base_url = f"http://{bound[0]}:{bound[1]}"
        self.servers, self.base_urls = [self.server], [self.base_url]
        return self.base_url

    async def start_hosts(self, n: int) -> list[str]:
        """Listen on ``n`` loopback addresses (:func:`host_address`); return their base URLs."""
        loop = asyncio.get_running_loop()
        for i in range(n):
            server = await loop.create_server(self.protocol, host_address(i), 0, backlog=1024)
            bound = server.sockets[0].getsockname()
            self.servers.append(server)
            self.base_urls.append(f"http://{bound[0]}:{bound[1]}")
        self.server, self.base_url = self.servers[0], self.base_urls[0]
        return self.base_urls

    def arrived(self, host: str, agent: str = "") -> None:
        """Count a request to ``host`` and the gap since the previous one (and log it, with
        its User-Agent ``agent``, when the site keeps a request log)."""
        now = time.monotonic()
        log = self.request_log
        if log is not None:
            if len(log) == log.maxlen:
                self.request_log_dropped += 1
            log.append((now, host, agent[:_MAX_AGENT]))
        last = self.host_last.get(host)
        if last is not None:
            gap = now - last
            if gap < self.host_min_gap.get(host, math.inf):
                self.host_min_gap[host] = gap
        self.host_last[host] = now
        self.host_requests[host] = self.host_requests.get(host, 0) + 1
        self.last_at = time.time()
        if self.first_at is None:
            self.first_at = self.last_at

    def stats(self) -> dict[str, object]:
        """Counters since start (``requests`` excludes ``/stats`` itself)."""
        return {"requests": self.requests, "bytes_sent": self.bytes_sent,
                "by_kind": dict(self.by_kind),
                "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                "late_ms_mean": round(self.late_s * 1000 / self.late_n, 3) if self.late_n
                else 0.0,
                "connections": self.connections, "open_connections": self.open_connections,
                "uptime_s": round(time.monotonic() - self.started, 3),
                "latency_ms": self.latency_s * 1000, "articles": self.articles,
                "per_list": self.per_list, "hosts": len(self.base_urls),
                "first_request_at": self.first_at, "last_request_at": self.last_at,
                "host_requests": dict(self.host_requests),
                "host_min_gap_s": {h: round(self.host_min_gap[h], 6) if h in self.host_min_gap
                                   else None for h in self.host_requests},
                **({} if self.request_log is None else {
                    "request_log": [[round(t, 6), h, a] for t, h, a in self.request_log],
                    "request_log_dropped": self.request_log_dropped})}

    def route(self, path: str) -> tuple[int, str, bytes, str]:
        """(status, content type, body, kind) for ``path``."""
        html = "text/html; charset=utf-8"
        if path.startswith("/a/") and path.endswith(".html"):
            stem = path[3:-5]
            if stem.isdigit() and 1 <= int(stem) <= self.articles:
                return 200, html, article_body(int(stem), self.per_list, self.page_kb), "article"
        elif path.startswith("/list/"):
            stem = path[6:]
            pages = list_pages(self.articles, self.per_list)
            if stem.isdigit() and 1 <= int(stem) <= pages:
                return 200, html, listing_body(int(stem), self.articles, self.per_list), "list"
        elif path == "/robots.txt":
            return 200, "text/plain", b"User-agent: *\nAllow: /\n", "other"
        elif path == "/":
            links = "".join(f'<a href="/list/{p}">{p}</a>\n'
                            for p in range(1, list_pages(self.articles, self.per_list) + 1))
            return 200, html, f"<html><body>{links}</body></html>".encode(), "other"
        return 404, html, b"<html><title>Not found</title></html>", "other"

    def protocol(self) -> _Connection:
        """A protocol instance for one accepted connection."""
        return _Connection(self)

    def handle(self, head: bytes, host: str = "") -> tuple[int, str, bytes, bool, bool, bool]:
        """Parse one request head (arrived at ``host``, the base URL it was accepted on);
        return (status, content type, body, keep-alive, head-only, delayed)."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, "text/plain", b"bad request line\n", False, False, False
        method, target, version = parts
        connection = match = agent = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "connection":
                connection = value.strip().lower()
            elif name.strip().lower() == "if-none-match":  # bench recrawl: a 304 for it
                match = value.strip()
            elif self.request_log is not None and name.strip().lower() == "user-agent":
                agent = value.strip()
        keep = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        path = target.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"GET only\n", keep, False, False
        if path == "/stats":
            body = json.dumps(self.stats()).encode()
            return 200, "application/json", body, keep, method == "HEAD", False
        status, ctype, body, kind = self.route(path)
        if match and status == 200 and match == etag(body):
            status, body = 304, b""
        self.arrived(host, agent)
        self.requests += 1
        self.by_kind[kind] += 1
        return status, ctype, body, keep, method == "HEAD", True


class _Connection(asyncio.Protocol):
    """One client connection. A plain Protocol (no StreamReader, no task per request):
    the site must cost its clients' machine as little CPU as a remote server would.
    Responses leave in request order: each one is a timer ``latency`` after its request,
    and the timers of one connection fire in the order they were set."""

    def __init__(self, site: BenchSite) -> None:
        self.site = site
        self.buf = b""
        self.discard = 0  # request body bytes still to skip
        self.transport: asyncio.Transport | None = None
        self.closing = False
        self.host = ""  # the base URL this connection was accepted on

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's protocol is given a Transport (asyncio's base class is declared).
        self.transport = cast(asyncio.Transport, transport)
        local = transport.get_extra_info("sockname")
        if local:
            self.host = f"http://{local[0]}:{local[1]}"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Small responses must not wait for Nagle's algorithm.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.site.connections += 1
        self.site.open_connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.site.open_connections -= 1
        self.closing = True

    def pause_writing(self) -> None:  # only a slow reader gets back-pressure
        assert self.transport is not None
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        assert self.transport is not None
        if not self.closing:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.closing:
            if self.discard:
                skip = min(self.discard, len(self.buf))
                self.buf, self.discard = self.buf[skip:], self.discard - skip
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > _MAX_HEAD:
                    self._send(431, "text/plain", b"headers too large\n", False, False)
                return
            head, self.buf = self.buf[:end], self.buf[end + 4:]
            self.discard = _content_length(head)
            status, ctype, body, keep, head_only, delayed = self.site.handle(head, self.host)
            if not keep:
                self.closing = True  # answer this one, read no further
                assert self.transport is not None
                self.transport.pause_reading()
            if delayed and self.site.latency_s:
                self.site.in_flight += 1
                self.site.max_in_flight = max(self.site.max_in_flight, self.site.in_flight)
                loop = asyncio.get_running_loop()
                loop.call_later(self.site.latency_s, self._late, status, ctype, body, keep,
                                head_only, loop.time() + self.site.latency_s)
            else:
                self._send(status, ctype, body, keep, head_only)

    def _late(self, status: int, ctype: str, body: bytes, keep: bool, head_only: bool,
              due: float) -> None:
        self.site.in_flight -= 1
        self.site.late_s += max(0.0, asyncio.get_running_loop().time() - due)  # the timer's
        self.site.late_n += 1  # lateness only: the write that follows is any server's
        self._send(status, ctype, body, keep, head_only)

    def _send(self, status: int, ctype: str, body: bytes, keep: bool, head_only: bool
              ) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        header = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                  f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                  + (f"ETag: {etag(body)}\r\n" if status == 200 else "") +
                  f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n").encode()
        self.transport.write(header if head_only else header + body)
        self.site.bytes_sent += len(header) + (0 if head_only else len(body))
        if not keep:
            self.closing = True
            self.transport.close()


def etag(body: bytes) -> str:
    """The ETag of a 200 response (a GET with it in If-None-Match gets a 304)."""
    return f'"{zlib.crc32(body):08x}-{len(body)}"'


def _content_length(head: bytes) -> int:
    at = head.lower().find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    value = head[at + 17:].split(b"\r\n", 1)[0].strip()
    return int(value) if value.isdigit() else 0


async def _serve(host: str, port: int, latency_ms: float, articles: int,
                 parent_watch: bool, hosts: int = 0, per_list: int = PER_LIST,
                 page_kb: int = 0, request_log: int = 0) -> None:
    site = BenchSite(latency_ms, articles, per_list, page_kb, request_log)
    base = " ".join(await site.start_hosts(hosts)) if hosts else await site.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if parent_watch:
        # The parent holds our stdin open; EOF means it died without stopping us.
        fd = sys.stdin.fileno()

        def on_stdin() -> None:
            if not os.read(fd, 4096):
                loop.remove_reader(fd)
                stop.set()

        loop.add_reader(fd, on_stdin)
    print(f"READY {base}", flush=True)
    await stop.wait()
    for server in site.servers:
        server.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m zkcrawl.bench.site``."""
    ap = argparse.ArgumentParser(prog="python -m zkcrawl.bench.site",
                                 description="Synthetic crawl target for zkcrawl bench.",
                                 allow_abbrev=False)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--articles", type=int, default=2000)
    ap.add_argument("--per-list", type=int, default=PER_LIST,
                    help="articles linked from one listing page")
    ap.add_argument("--hosts", type=int, default=0,
                    help=f"listen on N addresses {HOSTS_NET}.x.y (port 0 each) instead of --host")
    ap.add_argument("--page-kb", type=int, default=0,
                    help="articles of 0.5-1.5 times this many KB (0: 5-15 KB)")
    ap.add_argument("--request-log", type=int, default=0, metavar="N",
                    help="keep the last N arrivals (time, host, User-Agent) in /stats "
                         "(0: none)")
    ap.add_argument("--parent-watch", action="store_true",
                    help="exit when stdin reaches EOF (the parent died)")
    args = ap.parse_args(argv)
    if args.articles < 1 or args.latency_ms < 0 or args.per_list < 1:
        ap.error("--articles and --per-list must be >= 1 and --latency-ms >= 0")
    if not 0 <= args.page_kb <= 4096:
        ap.error("--page-kb must be within 0..4096")
    if not 0 <= args.hosts <= MAX_HOSTS:
        ap.error(f"--hosts must be within 0..{MAX_HOSTS}")
    if not 0 <= args.request_log <= MAX_REQUEST_LOG:
        ap.error(f"--request-log must be within 0..{MAX_REQUEST_LOG}")
    with asyncio.Runner(loop_factory=_loop_factory) as runner:
        runner.run(_serve(args.host, args.port, args.latency_ms, args.articles,
                          args.parent_watch, args.hosts, args.per_list, args.page_kb,
                          args.request_log))
    return 0


class _PreciseSelector(selectors.BaseSelector):
    """``select`` -- it waits to the microsecond -- while every descriptor is below
    ``FD_SETSIZE``; epoll (asyncio's default) from the first one that is not, every
    registration moved over. epoll waits in whole milliseconds, rounded up: every response
    timer of the site fired ~0.6 ms late on average (``late_ms_mean``), a latency the benches'
    bounds do not count. A crawl of the one-host site holds a few dozen connections; the
    many-hosts site, a listening socket a host, moves to epoll as it starts.

    Written here because the standard library has no selector with sub-millisecond waits
    for many descriptors (``epoll_pwait2`` is not bound)."""

    LIMIT = 1000  # FD_SETSIZE is 1,024 on Linux

    def __init__(self) -> None:
        self._inner: selectors.BaseSelector = selectors.SelectSelector()

    def register(self, fileobj: FileDescriptorLike, events: int,
                 data: object = None) -> selectors.SelectorKey:
        key = self._inner.register(fileobj, events, data)
        if key.fd >= self.LIMIT and isinstance(self._inner, selectors.SelectSelector):
            old, self._inner = self._inner, selectors.DefaultSelector()
            for k in list(old.get_map().values()):
                self._inner.register(k.fileobj, k.events, k.data)
            old.close()
            key = self._inner.get_key(fileobj)
        return key

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: FileDescriptorLike, events: int,
               data: object = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None
               ) -> list[tuple[selectors.SelectorKey, int]]:
        return self._inner.select(timeout)

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Mapping[FileDescriptorLike, selectors.SelectorKey]:
        return self._inner.get_map()


def _loop_factory() -> asyncio.AbstractEventLoop:
    """The site's event loop, on :class:`_PreciseSelector`."""
    return asyncio.SelectorEventLoop(_PreciseSelector())


def start_benchsite(latency_ms: float = 50.0, articles: int = 2000, *,
                    timeout: float = 15.0, per_list: int = PER_LIST, page_kb: int = 0
                    ) -> tuple[subprocess.Popen[bytes], str]:
    """Start the site in a child process; return ``(process, base_url)`` once it listens.

    The child exits when :func:`stop_benchsite` is called or when this process dies
    (it watches its stdin).  Raises RuntimeError if it does not become ready in time.
    """
    proc, bases = start_site(latency_ms, articles, timeout=timeout, per_list=per_list,
                             page_kb=page_kb)
    return proc, bases[0]


def start_site(latency_ms: float = 50.0, articles: int = 2000, *, hosts: int = 0,
               per_list: int = PER_LIST, timeout: float = 15.0, page_kb: int = 0,
               request_log: int = 0) -> tuple[subprocess.Popen[bytes], list[str]]:
    """:func:`start_benchsite` with every option: ``hosts`` > 0 listens on that many
    loopback addresses, ``page_kb`` > 0 sizes the articles, ``request_log`` > 0 keeps that
    many arrivals in ``/stats`` (``--request-log``); returns ``(process, base URLs)``."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "zkcrawl.bench.site", "--port", "0", "--latency-ms",
         str(latency_ms), "--articles", str(articles), "--parent-watch",
         "--hosts", str(hosts), "--per-list", str(per_list), "--page-kb", str(page_kb),
         *(["--request-log", str(request_log)] if request_log else [])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                stop_benchsite(proc)
                raise RuntimeError(f"benchsite did not start within {timeout:g} s")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                code = proc.wait()
                raise RuntimeError(f"benchsite exited with status {code} before READY")
            buf += chunk
    line = buf.split(b"\n", 1)[0].decode()
    if not line.startswith("READY "):
        stop_benchsite(proc)
        raise RuntimeError(f"benchsite said {line!r} instead of READY")
    return proc, line.split()[1:]


def stop_benchsite(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> int:
    """Stop a site from :func:`start_benchsite` (SIGTERM, then SIGKILL); return its status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
