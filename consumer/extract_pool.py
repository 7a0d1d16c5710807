"""A small pool of extraction processes (``--extract-workers N``): the pool threads hand each
page to one of N child processes (``python -m zkcrawl.consumer.extract_pool``, a socket pair per
child) so article extraction, pure Python for the most part, does not hold the fetch
threads' GIL.

* :meth:`ExtractPool.extract` returns the fields or raises :class:`ArticleError`, nothing
  else: ``extract: timeout`` (the child replaced), ``extract: crashed``, ``extract: busy``,
  or the page's own refusal.
* A child never outlives the consumer for long: it exits at EOF on its socket, an alarm
  ends it ``timeout + 5`` s into a page, it ignores SIGINT/SIGTERM (the consumer's to
  handle), and it is retired past :data:`MAX_RSS_MB`.
* Replacements start on a background thread, backing off up to 30 s, never on a fetch thread.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import structlog

from zkcrawl.backoff import POOL_RESTART
from zkcrawl.web.article import ArticleError, extract_article, require, set_runner

__all__ = ["DEFAULT_TIMEOUT", "ExtractPool", "default_workers", "extraction"]

log = structlog.get_logger(__name__)

DEFAULT_TIMEOUT = 10.0  # seconds per page in a child (the worst page under the caps: ~5 s)
START_TIMEOUT = 60.0  # a child's interpreter start and imports, under load
MAX_RSS_MB = 768  # a child that grew past this is replaced after its answer
_READY = "ready"


def default_workers() -> int:
    """One extraction process per core this process may run on (its CPU affinity, as a
    container's cpuset sets it), at most 8: ``--extract-workers``' default."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(8, cores))


class _Child:
    """One child process and the parent's end of its socket."""

    def __init__(self, timeout: float) -> None:
        parent, child = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "zkcrawl.consumer.extract_pool", str(child.fileno()),
             str(timeout)],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, close_fds=True)
        child.close()
        self.conn = Connection(parent.detach())

    def wait_ready(self, timeout: float) -> bool:
        try:
            return bool(self.conn.poll(timeout)) and self.conn.recv() == _READY
        except (EOFError, OSError):
            return False

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


class ExtractPool:
    """N extraction processes shared by the consumer's pool threads; thread-safe."""

    def __init__(self, workers: int, timeout: float = DEFAULT_TIMEOUT,
                 wait: float | None = None) -> None:
        self.workers = workers
        self.timeout = timeout
        # A page waits for a free child at most this long: every child busy on a page
        # that ends in a timeout frees within ``timeout``, plus a restart.
        self.wait = wait if wait is not None else 2 * timeout + START_TIMEOUT
        self._idle: queue.Queue[_Child] = queue.Queue()
        self._wanted: queue.Queue[int | None] = queue.Queue()
        self._lock = threading.Lock()
        self._children: set[_Child] = set()
        self._closed = False
        self._stopped = threading.Event()
        self.replaced = 0
        self._starter = threading.Thread(target=self._start_loop, name="extract-pool",
                                         daemon=True)
        self._starter.start()
        for _ in range(workers):
            self._wanted.put(1)

    def ready(self, timeout: float) -> bool:
        """True once every child has started (tests, the bench); bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._idle.qsize() >= self.workers:
                return True
            time.sleep(0.02)
        return False

    def pids(self) -> list[int]:
        with self._lock:
            return [c.proc.pid for c in self._children]

    def _start_loop(self) -> None:
        failures = 0
        while self._wanted.get() is not None:
            child = _Child(self.timeout)
            if not child.wait_ready(START_TIMEOUT):
                child.kill()
                failures += 1
                log.error("extract_pool.start_failed", failures=failures,
                          returncode=child.proc.poll())
                self._wanted.put(1)  # tried again, a little later each time
                if self._stopped.wait(POOL_RESTART.delay(failures)):
                    return
                continue
            failures = 0
            with self._lock:
                if self._closed:
                    child.kill()
                    return
                self._children.add(child)
            self._idle.put(child)

    def _replace(self, child: _Child) -> None:
        child.kill()
        with self._lock:
            self._children.discard(child)
            closed = self._closed
        if not closed:
            self.replaced += 1
            self._wanted.put(1)

    def extract(self, body: bytes, url: str, content_type: str | None) -> dict[str, Any]:
        """The article fields of one page, from a child; see the module docstring."""
        try:
            child = self._idle.get(timeout=self.wait)
        except queue.Empty:
            raise ArticleError("busy") from None
        try:
            child.conn.send((body, url, content_type))
            if not child.conn.poll(self.timeout):
                log.warning("extract_pool.timeout", url=url, pid=child.proc.pid,
                            timeout_s=self.timeout)
                self._replace(child)
                raise ArticleError("timeout")
            kind, value, retire = child.conn.recv()
        except ArticleError:
            raise
        except Exception as exc:  # EOF, a broken pipe, an answer cut or garbled: gone
            log.warning("extract_pool.crashed", url=url, pid=child.proc.pid,
                        returncode=child.proc.poll(), error=type(exc).__name__)
            self._replace(child)
            raise ArticleError("crashed") from None
        if retire:
            self._replace(child)
        else:
            self._idle.put(child)
        if kind == "ok":
            return value  # type: ignore[no-any-return]
        raise ArticleError(str(value))

    def close(self) -> None:
        """Stop every child (idempotent)."""
        with self._lock:
            self._closed = True
            children = list(self._children)
            self._children.clear()
        self._stopped.set()
        self._wanted.put(None)
        for child in children:
            child.kill()


@contextlib.contextmanager
def extraction(extract: str, workers: int | None) -> Iterator[ExtractPool | None]:
    """``--extract article`` with ``--extract-workers`` > 0: a pool, its children started
    (at most :data:`START_TIMEOUT` s), made the runner of
    :meth:`zkcrawl.page.Page.article` while the consumer runs, closed after. Checks that
    the ``article`` extra is installed (a :class:`UsageError` line, exit 2)."""
    if extract != "article":
        yield None
        return
    require()
    workers = default_workers() if workers is None else workers
    if workers == 0:
        yield None
        return
    pool = ExtractPool(workers)
    # Before the consumer registers and claims: its first pages do not wait for the
    # children's imports (~1 s each). Bounded; past it pages wait for them (or are busy).
    ready = pool.ready(START_TIMEOUT)
    set_runner(pool.extract)
    log.info("extract_pool.started", workers=workers, timeout_s=pool.timeout, ready=ready,
             pids=pool.pids())
    try:
        yield pool
    finally:
        set_runner(None)
        pool.close()


# -- the child ---------------------------------------------------------------------------
def _serve(fd: int, timeout: float) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):  # the consumer's to handle: it stops us
        signal.signal(signum, signal.SIG_IGN)
    conn = Connection(fd)
    conn.send(_READY)
    alarm = math.ceil(timeout) + 5  # SIGALRM's default action ends the process
    while True:
        try:
            body, url, content_type = conn.recv()
        except (EOFError, OSError):
            return
        signal.alarm(alarm)
        try:
            answer: tuple[str, Any] = ("ok", extract_article(body, url, content_type))
        except ArticleError as exc:
            answer = ("error", str(exc))
        signal.alarm(0)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        conn.send((*answer, peak_mb > MAX_RSS_MB))


if __name__ == "__main__":
    import trafilatura  # noqa: F401 - imported before "ready": the first page is not slower

    _serve(int(sys.argv[1]), float(sys.argv[2]))
