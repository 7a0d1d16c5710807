"""The consumer's politeness front: :class:`HostGate`, for a scheduler whose worker threads
never wait for a host.

It is the owner's per-host table in front of the scheduler (hosts have owners, SPEC §4: only
this consumer fetches the hosts of the partitions it owns, so the table is in memory and no
request costs a ZooKeeper write). It keeps no per-host state of its own: what it needs -- when
the last request started and ended, which requests are in flight, the back-off deadlines seen,
each host's gap -- lives in the rows of its :class:`~zkcrawl.politeness.local.LocalPoliteness`
table, and an admission (reserve + check) takes that table's one lock.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from zkcrawl.backoff import HOST_DOWN
from zkcrawl.politeness.local import EARLY, MAX_CRAWL_DELAY, LocalPoliteness

__all__ = ["DOWN_BACK_OFF", "DOWN_BACK_OFF_CAP", "EARLY", "HostGate", "down_back_off",
           "hold_of"]

HOLD_TICK = 0.5  # longest wait between two looks at a hold (hold_while)
#: A host that does not answer (refused, unreachable, timeout) is left alone for this long
#: after its first failure, twice as long after each further one in a row, up to the cap:
#: 1, 2, 4 ... 512, then 600 s between two tries, for every item of the host
#: (:data:`zkcrawl.backoff.HOST_DOWN`).
DOWN_BACK_OFF = HOST_DOWN.first
DOWN_BACK_OFF_CAP = HOST_DOWN.cap


def down_back_off(failures: int) -> float:
    """Seconds a host is left alone after ``failures`` requests in a row got no answer."""
    return HOST_DOWN.delay(failures - 1)


class HostGate:
    """Politeness for a scheduler whose worker threads never wait for a host.

    ``admit(host, slot)`` is called by a worker thread as it picks an item: the first call
    reserves the host's next slot; if that slot is more than a couple of milliseconds away
    the item goes back to the scheduler's time-ordered heap (carrying its slot) instead of
    idling the thread. Because an item can start a little *after* its slot (all threads busy
    at that moment), the gate also goes by the time of the last request per host -- its
    actual start, then its end -- and the ``Retry-After`` deadlines seen, and admits an item
    only when ``now >= last + gap``: the gap holds between requests as the server sees them,
    not just between reservations.

    The gate is also the :class:`~zkcrawl.politeness.local.Politeness` given to the Fetcher:
    the thread that performs an admitted item -- not always the one that admitted it: an
    item admitted waits for its start mark off the thread (:mod:`zkcrawl.consumer.worker`) -- says
    so with :meth:`pay` just before its fetch, and that fetch's first ``reserve`` is the slot
    already paid for; later ones (a redirect to the same host, robots.txt) reserve and are
    waited for by the Fetcher. An admission whose item will not start after all (released or
    dropped while it waited for its mark) is given back with :meth:`withdraw`.

    The host is ``busy`` in the table from its admission to :meth:`finished` (or
    :meth:`withdraw`), and a polite host is admitted only when none of its requests is in
    flight and a gap has passed since the last one's actual start *and end*: time an
    admitted item spends waiting for its mark (or a pool thread) postpones that request and
    the next, and never shortens the gap between them.

    A scheduler that can be paused says so with :meth:`hold_while`: every reservation a fetch
    makes (a redirect hop, robots.txt -- each a new request) then waits while the hold is on,
    so no request starts while paused; the first request of an admitted item is the
    scheduler's own check.

    ``table`` is the per-host table; ``domain_delay`` must be its default gap (checked: one
    gap, said once). A robots.txt ``Crawl-delay`` is capped at ``crawl_delay_cap`` before
    anyone sees it.
    """

    def __init__(self, table: LocalPoliteness, domain_delay: float,
                 crawl_delay_cap: float = MAX_CRAWL_DELAY) -> None:
        if domain_delay != table.delay:
            raise ValueError(f"the gate's --domain-delay {domain_delay!r} is not its table's "
                             f"{table.delay!r}")
        self.cap = crawl_delay_cap
        self.table = table
        self._clock = table.clock
        self._paid = threading.local()
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
        start = self.table.reserve(host)
        self.table.started(host, start)
        return start

    def back_off(self, host: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        self.table.back_off(host, seconds)

    def host_down(self, host: str) -> float:
        """A request to ``host`` got no answer: hold all of the host's requests for
        :func:`down_back_off` of its failures in a row (shared like any back-off: by every
        item of the host here, and kept with the partition's checkpoint for a hand-over).
        Returns the seconds."""
        seconds = down_back_off(self.table.unreachable(host))
        self.back_off(host, seconds)
        return seconds

    def host_up(self, host: str) -> None:
        """``host`` answered: its next failure starts the back-off from the bottom again."""
        self.table.answered(host)

    def set_min_delay(self, host: str, seconds: float) -> None:
        seconds = min(seconds, self.cap)
        self.table.set_min_delay(host, seconds)

    # -- scheduler side -------------------------------------------------------------------
    def admit(self, host: str, slot: float | None, ahead: float = EARLY
              ) -> tuple[float | None, float | None]:
        """Decide whether an item for ``host`` may start now -- or within ``ahead``
        seconds: the scheduler admits a planned item that long before its turn, so that
        its start mark is written by then (``Worker._admit_due``).

        ``slot`` is what the item got from its last call (None the first time). Returns
        ``(start, None)`` when it may go -- at ``start``, at most ``ahead`` away; the host is
        busy from the admission until :meth:`finished` or :meth:`withdraw` (no other request
        to it is admitted meanwhile), and the thread that makes the request calls :meth:`pay`
        first -- or ``(slot, due)``: queue the item until ``due`` and call again with
        ``slot``.
        """
        return self.table.admit(host, slot, ahead)

    def plan(self, host: str) -> tuple[float, float]:
        """The claim loop's look at a fresh item of ``host``: ``(slot, due)``, its slot
        reserved (:meth:`LocalPoliteness.plan`) -- the item is admitted with it at ``due``
        (a pool thread takes it then, not before: no trip through the pool only to queue
        it). Admits nothing."""
        return self.table.plan(host)

    def unreserve(self, host: str, slot: float) -> None:
        """A slot :meth:`plan` or :meth:`admit` reserved will not be used
        (:meth:`LocalPoliteness.unreserve`)."""
        self.table.unreserve(host, slot)

    def ready_at(self, host: str) -> float:
        """When ``host``'s next request could start at the soonest
        (:meth:`LocalPoliteness.ready_at`): the claim loop leaves a host's items in its
        queue until then (Mercator's heap of next-contact times)."""
        return self.table.ready_at(host)

    def pay(self, host: str) -> None:
        """This thread performs an item admitted for ``host`` now: the first ``reserve``
        of its fetch is the admitted slot, and the request counts as started now (the
        admission may be some milliseconds old: its item waited for its mark)."""
        self.table.started(host, self._clock())
        self._paid.host = host

    def withdraw(self, host: str) -> None:
        """An admitted request to ``host`` will not be made (its item was released or
        dropped before it started): the host is no longer busy; the next request waits a
        gap from now, as after a request -- never sooner. Any thread."""
        self.table.finished(host)

    def finished(self, host: str) -> None:
        """A request to ``host`` is over: the next one waits a gap from *now*.

        Counting the gap from the end of the previous request, not only from its start, is
        what makes it hold where the server measures it: a request that had to open a new
        connection reaches the server late, and the next one must not arrive early."""
        self._paid.host = None  # an unused prepaid slot (robots said no) is not kept
        self.table.finished(host)


def hold_of(gate: HostGate, host: str) -> tuple[float, float, int]:
    """What of ``host``'s politeness here must outlive this owner of its partition (SPEC §3,
    a hand-over; :mod:`zkcrawl.consumer.ownership`): ``(seconds until its back-off ends -- <= 0:
    none, its own gap -- 0.0: the default, its failures in a row)``. A snapshot of the
    gate's table read without its lock (for a checkpoint, not for a decision here)."""
    h = gate.table._hosts.get(host)
    if h is None:
        return 0.0, 0.0, 0
    return h.cool - gate.table.clock(), h.gap or 0.0, h.down
