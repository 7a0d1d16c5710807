"""The consumer's politeness front: :class:`HostGate`, for a scheduler whose worker threads
never wait for a host.

It wraps a :class:`~zkcrawl.politeness.local.Politeness` (where slots are reserved: this
process's :class:`~zkcrawl.politeness.local.LocalPoliteness`, or the cluster-wide
:class:`~zkcrawl.politeness.cluster.ClusterPoliteness`) and keeps no per-host state of its own:
what it needs beyond a reservation -- when the last request started and ended, which
requests are in flight, the back-off deadlines seen, each host's gap -- lives in the rows of
one :class:`~zkcrawl.politeness.local.LocalPoliteness` table. With the local politeness that
table *is* the inner politeness, and an admission (reserve + check) takes one lock; with the
cluster one it is a table of this process next to the shared slots.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from zkcrawl.politeness.local import MAX_CRAWL_DELAY, SLOT_SLACK, LocalPoliteness, Politeness

__all__ = ["DOWN_BACK_OFF", "DOWN_BACK_OFF_CAP", "EARLY", "HostGate", "down_back_off"]

EARLY = 0.002  # a slot this close is slept for on the worker thread; farther ones are queued
_LIMITS = 100_000  # slots waiting in the heap whose latest start is remembered
HOLD_TICK = 0.5  # longest wait between two looks at a hold (hold_while)
#: A host that does not answer (refused, unreachable, timeout) is left alone for this long
#: after its first failure, twice as long after each further one in a row, up to the cap:
#: 1, 2, 4 ... 512, then 600 s between two tries, for every item of the host.
DOWN_BACK_OFF = 1.0
DOWN_BACK_OFF_CAP = 600.0


def down_back_off(failures: int) -> float:
    """Seconds a host is left alone after ``failures`` requests in a row got no answer."""
    return min(DOWN_BACK_OFF_CAP, DOWN_BACK_OFF * 2.0 ** min(max(0, failures - 1), 32))


class HostGate:
    """Politeness for a scheduler whose worker threads never wait for a host.

    ``admit(host, slot)`` is called by a worker thread as it picks an item: the first call
    reserves the host's next slot from the wrapped :class:`Politeness`; if that slot is
    more than a couple of milliseconds away the item goes back to the scheduler's time-ordered
    heap (carrying its slot) instead of idling the thread. Because an item can start a little
    *after* its slot (all threads busy at that moment), the gate also goes by the time of the
    last request per host -- its actual start, then its end -- and the ``Retry-After``
    deadlines seen, and admits an item only when ``now >= last + gap``: the gap holds
    between requests as the server sees them, not just between reservations.

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
        self._limits: dict[tuple[str, float], float] = {}  # (host, slot) -> latest start
        self._limits_lock = threading.Lock()
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

        ``slot`` is the reservation the item already holds (None the first time). Returns
        ``(start, None)`` when it may go -- the caller sleeps until ``start``, at most
        ``EARLY`` seconds -- or ``(slot, due)``: queue the item until ``due``, keeping ``slot``
        (None: the slot passed before the item could start; it reserves a new one then).

        A slot reserved in ZooKeeper is used only until the latest start the cluster
        politeness gives for it (``latest(host, slot)``: a gap before the next consumer's
        slot of the host; else :data:`SLOT_SLACK` after the slot): a later start -- this
        consumer's previous request to the host still running, or every thread busy -- would
        reach the server early for the other consumer.
        """
        if self._shared:
            return self._admitted(host, *self.table.admit(host, slot, EARLY))
        if slot is None:
            slot = self.inner.reserve(host)
            latest = getattr(self.inner, "latest", None)
            limit = latest(host, slot) if latest is not None else None
            with self._limits_lock:
                self._limits[(host, slot)] = slot + SLOT_SLACK if limit is None else limit
                if len(self._limits) > _LIMITS:  # items dropped from the heap meanwhile
                    del self._limits[next(iter(self._limits))]
        with self._limits_lock:
            limit = self._limits.get((host, slot), slot + SLOT_SLACK)
        start, due = self.table.admit(host, slot, EARLY, max(0.0, limit - slot))
        if due is None or start is None:
            with self._limits_lock:
                self._limits.pop((host, slot), None)  # started, or given up
        return self._admitted(host, start, due)

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
        if not self._shared and (done := getattr(self.inner, "request_done", None)):
            done(host)  # ClusterPoliteness spaces its own next slots by what requests take
