"""Per-host politeness: the minimum gap between two requests to one host (SPEC §4
``--domain-delay``).

The contract is the small :class:`Politeness` protocol: *reserve* a slot, be told to *back off*,
be told a host's *minimum delay*.  The design goal is a gap that holds for the whole cluster;
:class:`LocalPoliteness` only holds it inside one process, and a ZooKeeper-backed implementation
replaces it behind the same three methods — which is why the interface is kept this small and
non-blocking (a cluster-wide reservation is one round trip; the caller does the waiting).

Times are ``time.monotonic()`` values of the calling process.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["LocalPoliteness", "Politeness", "wait_for_slot"]


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


class LocalPoliteness:
    """In-process :class:`Politeness`: thread-safe, O(1) per call, no thread of its own.

    Guarantee: for one host, the start times returned by successive :meth:`reserve` calls are
    at least ``max(delay, min_delay(host))`` apart, and none is earlier than a :meth:`back_off`
    deadline.  Different hosts never wait for each other.  ``max_delay`` caps the per-host
    minimum delay; a single back-off is capped at one hour (the fetcher caps Retry-After
    itself, at ``retry_after_cap``).
    """

    # Past this many hosts, idle entries (no pending slot, default delay) are dropped: a long
    # crawl over many hosts must not grow memory without bound.
    _PRUNE_AT = 10_000
    _MAX_BACK_OFF = 3600.0

    def __init__(
        self,
        delay: float,
        clock: Callable[[], float] = time.monotonic,
        max_delay: float = 60.0,
    ) -> None:
        if not math.isfinite(delay) or delay < 0:
            raise ValueError(f"delay must be a finite number >= 0, got {delay!r}")
        self._delay = delay
        self._clock = clock
        self._max_delay = max(max_delay, delay)
        self._lock = threading.Lock()
        self._next_free: dict[str, float] = {}  # earliest start of the host's next slot
        self._min_delay: dict[str, float] = {}
        self._prune_at = self._PRUNE_AT

    @property
    def delay(self) -> float:
        """The default gap between two requests to one host."""
        return self._delay

    def delay_for(self, host: str) -> float:
        """The gap currently enforced for ``host``."""
        with self._lock:
            return self._min_delay.get(host, self._delay)

    def reserve(self, host: str) -> float:
        with self._lock:
            now = self._clock()
            start = max(now, self._next_free.get(host, now))
            self._next_free[host] = start + self._min_delay.get(host, self._delay)
            if len(self._next_free) > self._prune_at:
                self._prune(now)
            return start

    def back_off(self, host: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        with self._lock:
            until = self._clock() + min(seconds, self._MAX_BACK_OFF)
            if until > self._next_free.get(host, -math.inf):
                self._next_free[host] = until

    def set_min_delay(self, host: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        with self._lock:
            seconds = min(seconds, self._max_delay)
            if seconds > self._delay:
                self._min_delay[host] = seconds
            else:
                self._min_delay.pop(host, None)

    def _prune(self, now: float) -> None:
        stale = [h for h, t in self._next_free.items() if t <= now and h not in self._min_delay]
        for host in stale:
            del self._next_free[host]
        # If most hosts are still busy, wait for the map to double before scanning again, so
        # pruning stays O(1) amortized per reservation.
        self._prune_at = max(self._PRUNE_AT, 2 * len(self._next_free))


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
