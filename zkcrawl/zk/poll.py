"""kazoo's threading handler with a ``select`` that costs one system call, not five.

kazoo's :class:`~kazoo.handlers.threading.SequentialThreadingHandler` answers every
``select`` of its connection loop (several per ZooKeeper answer) by building and closing a
new ``selectors.DefaultSelector`` -- an epoll instance on Linux. :func:`poll_select` gives
the same answer with one ``poll(2)`` and no kernel object: no limit on descriptor numbers,
readiness as the selectors module reports it (a hang-up or error counts as readable for a
socket waited on for reading, and as writable for one waited on for writing), a socket in
both lists reported readable only (kazoo's ``elif``), and the same errors for a bad timeout
or descriptor (``TypeError``/``ValueError``).
"""

from __future__ import annotations

import math
import select
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import fileobj_to_fd, selector_select

__all__ = ["PollHandler", "poll_select", "selector_select"]  # kazoo's: what it replaces

_IN, _OUT = select.POLLIN, select.POLLOUT
_READ, _WRITE = 1, 2  # selectors.EVENT_READ, EVENT_WRITE


def poll_select(rlist: list[Any], wlist: list[Any], xlist: list[Any],
                timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """:func:`kazoo.handlers.utils.selector_select`'s answer, with one ``poll(2)``;
    ``xlist`` is ignored, as kazoo does."""
    del xlist
    if timeout is not None:
        if not isinstance(timeout, int | float):
            raise TypeError("timeout must be a number")
        if timeout < 0:
            raise ValueError("timeout must be non-negative")
    wanted: dict[int, int] = {}
    objects: dict[int, list[Any]] = {}
    for event, fileobjs in ((_READ, rlist), (_WRITE, wlist)):
        for fileobj in fileobjs:
            fd = fileobj_to_fd(fileobj)
            wanted[fd] = wanted.get(fd, 0) | event
            objects.setdefault(fd, []).append(fileobj)
    poller = select.poll()
    for fd, event in wanted.items():
        poller.register(fd, (_IN if event & _READ else 0) | (_OUT if event & _WRITE else 0))
    ms = None if timeout is None else (0 if timeout <= 0 else math.ceil(timeout * 1e3))
    readable: list[Any] = []
    writable: list[Any] = []
    for fd, revents in poller.poll(ms):
        if revents & select.POLLNVAL:  # not an open descriptor: epoll_ctl refuses it
            raise ValueError("Invalid event mask or fd")
        ready = ((_READ if revents & ~_OUT else 0) | (_WRITE if revents & ~_IN else 0)) \
            & wanted[fd]
        if ready & _READ:
            readable.extend(objects[fd])
        elif ready & _WRITE:
            writable.extend(objects[fd])
    return readable, writable, []


class PollHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's threading handler, its ``select`` by :func:`poll_select`."""

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return poll_select(*args, **kwargs)
