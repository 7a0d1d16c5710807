"""SIGTERM and SIGINT for the long-running programs, ``zkcrawl-consumer`` and
``zkcrawl-producer``: one rule, one place (:class:`StopSignals`).

* The **first** signal asks to **drain**: ``request_stop(False)`` -- no new work, finish or
  hand back what is in hand, exit 0.
* The **second** asks to **stop now**: ``request_stop(True)``; with ``hard_second=True`` (the
  producer) the signal's default action instead.
* **The handler only sets flags** (a Python handler may run while the main thread holds a
  lock the callback would take): no lock, no I/O, no logging in there. The program acts on
  the flag outside it -- its loop polls it, or :meth:`StopSignals.join` runs ``on_stop``.
* Handlers are installed only from the main thread (elsewhere nothing is installed), and the
  previous ones are restored on exit.
* **SIGUSR1 dumps every thread's stack** to stderr and the program goes on
  (:func:`thread_dump_on_sigusr1`), as a JVM's SIGQUIT does: where a stuck process is,
  without a debugger. A Python handler on the main thread, holding the GIL, so every other
  thread is at a bytecode boundary and its frames are whole; written with one ``os.write``
  per thread, never through ``sys.stderr`` (whose lock the interrupted code may hold).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["POLL", "STOP_SIGNALS", "StopSignals", "thread_dump_on_sigusr1"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
POLL = 0.1  # seconds between two looks at the flags in :meth:`StopSignals.join`


class StopSignals:
    """Context manager routing SIGTERM/SIGINT to ``request_stop(force)`` (module docstring).

    ``request_stop`` is called with ``False`` for the first signal and ``True`` for every
    later one (never with ``hard_second``: the second signal no longer reaches us).
    """

    def __init__(self, request_stop: Callable[[bool], object] | None = None, *,
                 hard_second: bool = False, linger: bool = False) -> None:
        """``linger``: after the block, signals are only counted until :meth:`restore`
        (the consumer's teardown, which a second SIGTERM must not kill: exit 0)."""
        self._request_stop = request_stop
        self._hard_second = hard_second
        self._linger = linger
        self._saved: dict[int, Any] = {}
        self.received = 0  # signals received so far
        self.signum: int | None = None  # the first one

    @property
    def stopping(self) -> bool:
        """A stop was asked for (at least one signal)."""
        return self.received > 0

    @property
    def forced(self) -> bool:
        """"Stop now" was asked for (a second signal)."""
        return self.received > 1

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received += 1
        if self.signum is None:
            self.signum = signum
        if self._hard_second:
            for sig in self._saved:  # the next one gets the default action
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                              else signal.SIG_DFL)
        if self._request_stop is not None:
            self._request_stop(self.received > 1)

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._linger:
            # The teardown after the run (bounded: every ZooKeeper call by --zk-timeout) is
            # not cut by a late signal's default action; :meth:`restore` ends it.
            for sig in self._saved:
                signal.signal(sig, self._late)
            return
        self.restore()

    def _late(self, _signum: int, _frame: FrameType | None) -> None:
        self.received += 1  # stopping already: nothing more to ask

    def restore(self) -> None:
        """Put the previous handlers back (at exit; again: a no-op)."""
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved = {}

    def join(self, thread: threading.Thread, on_stop: Callable[[int], object],
             poll: float = POLL) -> None:
        """Wait for ``thread`` to end (in the main thread, where signals are handled); at the
        first signal call ``on_stop(signum)`` -- here, outside the handler -- once."""
        called = False
        while True:
            thread.join(poll)
            if not called and self.signum is not None:
                called = True
                on_stop(self.signum)
            if not thread.is_alive():
                return


@contextlib.contextmanager
def thread_dump_on_sigusr1() -> Iterator[bool]:
    """While the block runs, ``kill -USR1 PID`` writes every thread's stack to stderr (the
    process goes on). Yields whether it is installed: only from the main thread, and only
    when stderr is a real file descriptor (a test's captured stream is not).

    Why not :mod:`faulthandler` (which session 13 used): its handler runs in C in whatever
    thread the signal lands on and walks the other threads' frames without the GIL, while
    they run -- its documentation calls that unsafe, and here it left dumps cut off in the
    middle of a thread (twice in one day's CI). This handler runs on the main thread between
    two bytecodes (a wait there is interrupted for it) with the GIL held
    (``sys._current_frames``, CPython's documented debugging hook); the cost is that a main
    thread stuck inside one C call answers only when that call returns."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        fd = -1
    if fd < 0 or threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.signal(signal.SIGUSR1, lambda _s, _f: _dump_threads(fd))
    try:
        yield True
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _dump_threads(fd: int) -> None:
    """Every thread's stack, most recent call first, in faulthandler's format, to ``fd``."""
    names = {t.ident: t.name for t in threading.enumerate()}
    current = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        head = "Current thread" if ident == current else "Thread"
        lines = [f"{head} {ident:#018x} ({names.get(ident, '?')}) (most recent call first):\n"]
        lines += [f'  File "{f.f_code.co_filename}", line {lineno} in {f.f_code.co_name}\n'
                  for f, lineno in traceback.walk_stack(frame)]  # no source read
        try:
            os.write(fd, ("".join(lines) + "\n").encode("utf-8", "replace"))
        except OSError:
            return  # stderr gone: nothing to tell
