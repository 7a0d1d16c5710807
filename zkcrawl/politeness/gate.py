"""The consumer's politeness front: :class:`HostGate`, for a scheduler whose worker threads
never wait for a host.

It wraps a :class:`~zkcrawl.politeness.local.Politeness` -- this process's
:class:`~zkcrawl.politeness.local.LocalPoliteness`, or the cluster-wide
:class:`~zkcrawl.politeness.cluster.ClusterPoliteness`, which also offers :class:`Turns` --
and keeps no per-host state of its own: what it needs -- when the last request started and
ended, which requests are in flight, the back-off deadlines seen, each host's gap -- lives in
the rows of one :class:`~zkcrawl.politeness.local.LocalPoliteness` table. With the local
politeness that table *is* the inner politeness, and an admission (reserve + check) takes one
lock; with the cluster one it is a table of this process, asked first, and the cluster's turn
is taken only when this process could start the request now.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from zkcrawl.politeness.local import EARLY, MAX_CRAWL_DELAY, LocalPoliteness, Politeness

__all__ = ["DOWN_BACK_OFF", "DOWN_BACK_OFF_CAP", "EARLY", "HostGate", "Turns", "down_back_off"]

HOLD_TICK = 0.5  # longest wait between two looks at a hold (hold_while)
#: A host that does not answer (refused, unreachable, timeout) is left alone for this long
#: after its first failure, twice as long after each further one in a row, up to the cap:
#: 1, 2, 4 ... 512, then 600 s between two tries, for every item of the host.
DOWN_BACK_OFF = 1.0
DOWN_BACK_OFF_CAP = 600.0


@runtime_checkable
class Turns(Protocol):
    """A politeness shared with other processes, taken turn by turn
    (:class:`~zkcrawl.politeness.cluster.ClusterPoliteness`)."""

    def take_turn(self, host: str) -> tuple[float | None, float | None]:
        """``(start, None)``: this process holds the host from ``start`` (monotonic, a few
        ms away at most); ``(None, due)``: another holds it until ``due``, nothing taken."""
        ...

    def request_done(self, host: str) -> None:
        """The request of the latest turn of ``host`` is over (its response time is known)."""
        ...


def _turns_of(inner: Politeness) -> Turns:
    if not isinstance(inner, Turns):
        raise TypeError(f"{type(inner).__name__} is shared with other processes "
                        "but does not take turns (take_turn, request_done)")
    return inner


def down_back_off(failures: int) -> float:
    """Seconds a host is left alone after ``failures`` requests in a row got no answer."""
    return min(DOWN_BACK_OFF_CAP, DOWN_BACK_OFF * 2.0 ** min(max(0, failures - 1), 32))


class HostGate:
    """Politeness for a scheduler whose worker threads never wait for a host.

    ``admit(host, slot)`` is called by a worker thread as it picks an item: with the local
    politeness the first call reserves the host's next slot; if that slot is more than a
    couple of milliseconds away the item goes back to the scheduler's time-ordered heap
    (carrying its slot) instead of idling the thread. Because an item can start a little
    *after* its slot (all threads busy at that moment), the gate also goes by the time of the
    last request per host -- its actual start, then its end -- and the ``Retry-After``
    deadlines seen, and admits an item only when ``now >= last + gap``: the gap holds
    between requests as the server sees them, not just between reservations. With the
    cluster politeness the same checks come first, then the cluster's turn (:meth:`admit`).

    The gate is also the :class:`Politeness` given to the Fetcher: the first ``reserve`` of a
    fetch on a thread that was just admitted is the slot already paid for; later ones (a
    redirect to the same host, robots.txt) reserve and are waited for by the Fetcher.

    A scheduler that can be paused says so with :meth:`hold_while`: every reservation a fetch
    makes (a redirect hop, robots.txt -- each a new request) then waits while the hold is on,
    so no request starts while paused; the first request of an admitted item is the
    scheduler's own check.

    ``table`` is the per-host table (default: ``inner`` when it is a
    :class:`LocalPoliteness`, else a new one with ``domain_delay`` and ``clock``). A robots.txt
    ``Crawl-delay`` is capped at ``crawl_delay_cap`` before anyone sees it.
    """

    def __init__(self, inner: Politeness, domain_delay: float,
                 crawl_delay_cap: float = MAX_CRAWL_DELAY,
                 clock: Callable[[], float] = time.monotonic, *,
                 table: LocalPoliteness | None = None) -> None:
        self.inner = inner
        self.cap = crawl_delay_cap
        if table is None:
            table = inner if isinstance(inner, LocalPoliteness) else LocalPoliteness(
                domain_delay, clock, max_delay=crawl_delay_cap)
        self.table = table
        self._shared = table is inner  # reservations and the rest in one table, one lock
        self._clock = table.clock
        self._paid = threading.local()
        self._turns: Turns | None = None if self._shared else _turns_of(inner)
        self._hold: Callable[[], bool] | None = None
        self._hold_wait: Callable[[float], object] = time.sleep

    @property
    def delay(self) -> float:
        """The default gap between two requests to one host."""
        return self.table.delay

    def hold_while(self, hold: Callable[[], bool], wait: Callable[[float], object]) -> None:
        """From now on :meth:`reserve` waits while ``hold()`` is true, calling ``wait(HOLD_TICK)``
        (which returns early when the hold may be over: an Event's ``wait``) between looks."""
        self._hold_wait = wait
        self._hold = hold

    # -- Politeness protocol (the Fetcher's side) -----------------------------------------
    def reserve(self, host: str) -> float:
        if getattr(self._paid, "host", None) == host:
            self._paid.host = None
            return self._clock()
        hold = self._hold
        while hold is not None and hold():  # paused: no new request until resumed
            self._hold_wait(HOLD_TICK)
        start = self.inner.reserve(host)
        self.table.started(host, start)
        return start

    def back_off(self, host: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        self.inner.back_off(host, seconds)
        if not self._shared:
            self.table.back_off(host, seconds)

    def host_down(self, host: str) -> float:
        """A request to ``host`` got no answer: hold all of the host's requests for
        :func:`down_back_off` of its failures in a row (shared like any back-off: by every
        item of the host here, and through ZooKeeper with cluster politeness). Returns the
        seconds."""
        seconds = down_back_off(self.table.unreachable(host))
        self.back_off(host, seconds)
        return seconds

    def host_up(self, host: str) -> None:
        """``host`` answered: its next failure starts the back-off from the bottom again."""
        self.table.answered(host)

    def set_min_delay(self, host: str, seconds: float) -> None:
        seconds = min(seconds, self.cap)
        self.inner.set_min_delay(host, seconds)
        if not self._shared:
            self.table.set_min_delay(host, seconds)

    # -- scheduler side -------------------------------------------------------------------
    def admit(self, host: str, slot: float | None) -> tuple[float | None, float | None]:
        """Decide whether an item for ``host`` may start now.

        ``slot`` is what the item got from its last call (None the first time). Returns
        ``(start, None)`` when it may go -- the caller sleeps until ``start``, a few
        milliseconds at most -- or ``(slot, due)``: queue the item until ``due`` and call
        again with ``slot``.

        With the cluster politeness nothing is reserved ahead: once this process's own table
        lets the request start (the gap since its last request here, back-offs, one request
        at a time), the cluster's turn is taken *now* (:meth:`Turns.take_turn`, one
        conditional write); if another consumer holds the host the admission is withdrawn
        and the item waits until that turn ends. A slot booked ahead would have to be used
        within a few milliseconds of its time -- the next consumer's comes a gap after it --
        and an item picked up late (every thread busy, the process short of CPU, this
        consumer's previous request to the host still running) had to give it up: measured,
        4 % of the pages of 500 hosts with 4 consumers, a whole slot of the host each.
        """
        if self._shared:
            return self._admitted(host, *self.table.admit(host, slot, EARLY))
        assert self._turns is not None
        start, due = self.table.admit(host, -math.inf, EARLY)  # no slot of its own
        if due is not None:
            return None, due  # this process's own gap first: nothing asked of the cluster
        assert start is not None
        turn, wait = self._turns.take_turn(host)
        if turn is None:
            self.table.withdraw(host, start)
            return None, wait
        self.table.started(host, turn)
        return self._admitted(host, max(start, turn), None)

    def _admitted(self, host: str, start: float | None, due: float | None
                  ) -> tuple[float | None, float | None]:
        if due is None:
            self._paid.host = host
        return start, due

    def finished(self, host: str) -> None:
        """A request to ``host`` is over: the next one waits a gap from *now*.

        Counting the gap from the end of the previous request, not only from its start, is
        what makes it hold where the server measures it: a request that had to open a new
        connection reaches the server late, and the next one must not arrive early."""
        self._paid.host = None  # an unused prepaid slot (robots said no) is not kept
        self.table.finished(host)
        if self._turns is not None:
            self._turns.request_done(host)  # its turns of the host last what requests take
