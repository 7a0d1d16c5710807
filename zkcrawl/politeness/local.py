"""Per-host politeness: the minimum gap between two requests to one host (SPEC §4
``--domain-delay``), behind the small non-blocking :class:`Politeness` protocol (reserve a
slot, back off, a host's minimum delay).

* The gap holds for the whole cluster because hosts have owners: the owning consumer's
  :class:`LocalPoliteness` is the only table that schedules a host -- in memory, no
  ZooKeeper write per request; what must outlive the owner rides the partition's checkpoint.
* One :class:`HostState` per host, read and written by the consumer's
  :class:`~zkcrawl.politeness.gate.HostGate` under the same lock (no copies).
* Two caps, named here: :data:`MAX_CRAWL_DELAY` (the longest gap a host may ask for) and
  :data:`MAX_BACK_OFF` (the longest one back-off may hold a host).
* Times are ``time.monotonic()`` values of the calling process.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["EARLY", "MAX_BACK_OFF", "MAX_CRAWL_DELAY", "HostState", "LocalPoliteness", "Politeness",
           "wait_for_slot"]

#: The longest gap between two requests to one host that a robots.txt ``Crawl-delay`` can
#: ask for. 30 s is what the consumer has always enforced (its gate clamped there before any
#: other cap applied): a host still gets 120 requests an hour, while a typo of "3600" -- or a
#: hostile robots.txt -- cannot stall a host for an hour. In a consumer it also bounds how
#: long a cooled item holds one of its ``threads + backlog`` leases per queued request to a
#: slow host. One cap for every path (consumer gate and table, producer).
MAX_CRAWL_DELAY = 30.0
#: The longest one back-off (``Retry-After``, 429/503) holds a host: a bound against absurd
#: values only -- the fetcher caps ``Retry-After`` itself (``FetchSettings.retry_after_cap``,
#: 120 s in the consumer), so this is reached by direct callers only.
MAX_BACK_OFF = 3600.0
#: A request whose time is this close is slept for on the worker thread; farther ones wait in
#: the scheduler's heap (consumer gate).
EARLY = 0.002


@runtime_checkable
class Politeness(Protocol):
    """Scheduling of requests per host key (``zkcrawl.web.urls.host_of``: ``host[:port]``)."""

    def reserve(self, host: str) -> float:
        """Reserve this host's next slot and return the monotonic time at which the caller may
        start its request (now, or later).  Non-blocking.  Each call reserves a new slot: two
        reservations for one host are at least the host's delay apart."""
        ...

    def back_off(self, host: str, seconds: float) -> None:
        """The host said "back off" (Retry-After, 429, 503): no slot starts before
        ``now + seconds``.  Never shortens a wait already scheduled."""
        ...

    def set_min_delay(self, host: str, seconds: float) -> None:
        """Use at least ``seconds`` between requests to this host from now on (e.g. robots.txt
        Crawl-delay larger than the default).  Implementations cap it."""
        ...


class HostState:
    """What this process knows about one host (a row of :class:`LocalPoliteness`'s table)."""

    __slots__ = ("busy", "cool", "down", "gap", "last", "next_free")

    def __init__(self) -> None:
        self.next_free = -math.inf  # earliest start of the host's next reserved slot
        self.gap: float | None = None  # the host's own gap when above the default
        self.cool = -math.inf  # back-off deadline: nothing starts before it
        self.last = -math.inf  # start, then end, of the latest request (the gate's)
        self.busy = 0  # requests in flight (the gate's)
        self.down = 0  # requests in a row that got no answer (refused, unreachable, timeout)


class LocalPoliteness:
    """In-process :class:`Politeness`: thread-safe, O(1) per call, no thread of its own.

    Guarantee: for one host, the start times returned by successive :meth:`reserve` calls are
    at least ``max(delay, min_delay(host))`` apart, and none is earlier than a :meth:`back_off`
    deadline.  Different hosts never wait for each other.  ``max_delay`` caps the per-host
    minimum delay (default :data:`MAX_CRAWL_DELAY`); a single back-off is capped at
    :data:`MAX_BACK_OFF` (the fetcher caps Retry-After itself, at ``retry_after_cap``).
    """

    # Past this many hosts, idle entries (no pending slot, default delay) are dropped: a long
    # crawl over many hosts must not grow memory without bound.
    _PRUNE_AT = 10_000

    def __init__(
        self,
        delay: float,
        clock: Callable[[], float] = time.monotonic,
        max_delay: float = MAX_CRAWL_DELAY,
    ) -> None:
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"delay must be a finite number >= 0, got {delay!r}")
        self._delay = delay
        self._clock = clock
        self._max_delay = max(max_delay, delay)
        self._lock = threading.Lock()
        self._hosts: dict[str, HostState] = {}
        self._prune_at = self._PRUNE_AT

    @property
    def delay(self) -> float:
        """The default gap between two requests to one host."""
        return self._delay

    @property
    def clock(self) -> Callable[[], float]:
        """The clock every time of this table is read from."""
        return self._clock

    @property
    def _next_free(self) -> dict[str, HostState]:
        """The hosts in the table (the name its pruning test reads)."""
        return self._hosts

    def delay_for(self, host: str) -> float:
        """The gap currently enforced for ``host``."""
        with self._lock:
            h = self._hosts.get(host)
            return self._delay if h is None or h.gap is None else h.gap

    # -- Politeness -----------------------------------------------------------------------
    def reserve(self, host: str) -> float:
        with self._lock:
            now = self._clock()
            h = self._hosts.get(host)
            if h is None:
                h = self._hosts[host] = HostState()
            start = now if h.next_free < now else h.next_free
            h.next_free = start + (self._delay if h.gap is None else h.gap)
            if len(self._hosts) > self._prune_at:
                self._prune(now)
            return start

    def back_off(self, host: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        with self._lock:
            until = self._clock() + min(seconds, MAX_BACK_OFF)
            h = self._hosts.get(host)
            if h is None:
                h = self._hosts[host] = HostState()
            if until > h.next_free:
                h.next_free = until
            if until > h.cool:
                h.cool = until

    def unreachable(self, host: str) -> int:
        """A request to ``host`` got no answer: its failures in a row, this one included."""
        with self._lock:
            h = self._hosts.get(host)
            if h is None:
                h = self._hosts[host] = HostState()
            h.down += 1
            return h.down

    def answered(self, host: str) -> None:
        """``host`` answered (any status): it is up, its failures in a row start again."""
        h = self._hosts.get(host)
        if h is None or not h.down:  # the common case (a host up), read without the lock:
            return  # a failure counted meanwhile is one that came after this answer
        with self._lock:
            h = self._hosts.get(host)
            if h is not None:
                h.down = 0

    def set_min_delay(self, host: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        with self._lock:
            seconds = min(seconds, self._max_delay)
            h = self._hosts.get(host)
            if seconds > self._delay:
                if h is None:
                    h = self._hosts[host] = HostState()
                h.gap = seconds
            elif h is not None:
                h.gap = None

    # -- requests as the server sees them (zkcrawl.politeness.gate.HostGate) ---------------
    def admit(self, host: str, slot: float | None, early: float
              ) -> tuple[float | None, float | None]:
        """May a request to ``host`` start now? ``slot``: the reservation the caller holds
        (None: reserve one here, in the same lock). The request may start when its slot has
        come, a gap has passed since the last request's start *and end*, no back-off holds
        and -- for a host with a gap -- no other request to it is in flight.

        Returns ``(start, None)`` when it may -- at ``start``, at most ``early`` seconds away
        -- counted in flight from now until :meth:`finished`; or
        ``(slot, due)``: ask again at ``due`` with that ``slot``."""
        with self._lock:
            now = self._clock()
            h, slot, due = self._turn(host, slot, now)
            if due - now > early:
                return slot, due
            start = max(now, due)
            h.last = start
            h.busy += 1
            if len(self._hosts) > self._prune_at:
                self._prune(now)
            return start, None

    def plan(self, host: str) -> tuple[float, float]:
        """For an item of ``host`` not asked about yet: its slot reserved as :meth:`admit`
        reserves one (each call the next), and when :meth:`admit` with that slot would let
        it start, by what the table knows now: ``(slot, due)``. Nothing is admitted: the
        host is not counted busy."""
        with self._lock:
            now = self._clock()
            _h, slot, due = self._turn(host, None, now)
            if len(self._hosts) > self._prune_at:
                self._prune(now)
            return slot, due

    def _turn(self, host: str, slot: float | None, now: float
              ) -> tuple[HostState, float, float]:
        """Under the lock: the host's row, its slot (reserved now when None) and when a
        request in it may start -- the one home of the rule :meth:`admit` and :meth:`plan`
        apply: the slot, a gap after the last request's start and end, the back-off, and one
        request at a time to a polite host."""
        h = self._hosts.get(host)
        if h is None:
            h = self._hosts[host] = HostState()
        gap = self._delay if h.gap is None else h.gap
        if slot is None:
            slot = now if h.next_free < now else h.next_free
            h.next_free = slot + gap
        due = self._due(h, slot)
        if gap > 0 and h.busy:
            # One request at a time to a polite host: the gap counts from its end, which is
            # at least a gap from now.
            due = max(due, now + gap)
        return h, slot, due

    def unreserve(self, host: str, slot: float) -> None:
        """A slot reserved by :meth:`plan` or :meth:`admit` will not be used (its item went
        back to the queue): if it is the host's latest reservation, the next one may take
        it -- else the host's next items would wait a gap for each item given back."""
        with self._lock:
            h = self._hosts.get(host)
            if h is not None and h.next_free == slot + (self._delay if h.gap is None
                                                          else h.gap):
                h.next_free = slot

    def ready_at(self, host: str) -> float:
        """The soonest a new request to ``host`` could start by what the table knows now
        (``-inf``: at once): its next free slot, a gap after its last request's start and
        end, its back-off. Requests in flight are not counted (the caller counts its own).
        Read without the lock, for the claim loop's pick on every item it looks at: a row
        changed meanwhile is read again at the next pick, and :meth:`admit` decides."""
        h = self._hosts.get(host)
        return -math.inf if h is None else self._due(h, h.next_free)

    def _due(self, h: HostState, slot: float) -> float:
        """When a request in ``slot`` may start by the row ``h``: the slot, a gap after the
        last request's start and end, the back-off (:meth:`_turn` and :meth:`ready_at`)."""
        return max(slot, h.last + (self._delay if h.gap is None else h.gap), h.cool)

    def started(self, host: str, start: float) -> None:
        """A request to ``host`` reserved elsewhere (the fetcher's own) starts at ``start``."""
        with self._lock:
            h = self._hosts.get(host)
            if h is None:
                h = self._hosts[host] = HostState()
            if start > h.last:
                h.last = start

    def finished(self, host: str) -> None:
        """A request admitted for ``host`` is over: the next one waits a gap from *now*."""
        with self._lock:
            now = self._clock()
            h = self._hosts.get(host)
            if h is None:
                h = self._hosts[host] = HostState()
            if now > h.last:
                h.last = now
            if h.busy > 0:
                h.busy -= 1

    def _prune(self, now: float) -> None:
        delay = self._delay
        stale = [host for host, h in self._hosts.items()
                 if h.next_free <= now and h.gap is None and not h.busy and h.cool <= now
                 and h.last + delay <= now and not h.down]
        for host in stale:
            del self._hosts[host]
        # If most hosts are still busy, wait for the map to double before scanning again, so
        # pruning stays O(1) amortized per reservation.
        self._prune_at = max(self._PRUNE_AT, 2 * len(self._hosts))


def wait_for_slot(
    politeness: Politeness,
    host: str,
    cancel: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> float:
    """Reserve a slot for ``host`` and block until it starts; returns the seconds waited.

    The wait is bounded by the reservation itself (waiting for a *time*, not for another
    thread).  If ``cancel`` is set meanwhile, returns early: the caller must then check
    ``cancel`` and not send the request.
    """
    start = politeness.reserve(host)
    waited = max(0.0, start - clock())
    if waited > 0:
        if cancel is not None:
            cancel.wait(waited)
        else:
            time.sleep(waited)
    return waited
