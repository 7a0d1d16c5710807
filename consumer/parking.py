"""Per-host caps on what the worker holds: :class:`Parking` (SPEC §3, no host holds back
another). A host may hold at most what it can serve within a short horizon, and at least
four hosts share the table::

    cap = max(1, min(ceil(HORIZON_S / --domain-delay), capacity // 4))   (none at delay 0)

Every item a claim hands out is checked against it: one whose host is at its cap, or owned
by another consumer now (the partitions changed hands since the pick), is *parked* -- given
back to its batch at once (the queue's ``release``: in memory, no ZooKeeper write), where it
waits, unmarked, for its host to have room or for its partition's next owner.

* **Bounded per host**; the rest of a host's items wait in their partition.
* **Nothing charged for nothing**: a parked item was never marked started, so a holder's
  death charges it no attempt.
* With ``--delivery at-most-once`` nothing can be given back: items are never parked.

The owner's pick already hands out no more of a host than a smaller cap
(:func:`zkcrawl.consumer.main._cap_hosts`: half a second of its gap), so in practice only the
second case parks an item.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

# Seconds of one host's work a consumer holds at most: two turns at the default 1 s gap. A
# longer horizon only lengthens the queue of items that wait; a shorter one than a turn
# would leave the host idle while the next item is claimed.
HORIZON_S = 2.0


class HostTask(Protocol):
    @property
    def host(self) -> str: ...


T = TypeVar("T", bound=HostTask)


class Parking:
    """Decides which claimed tasks go to the backlog and which are given back (module
    docstring); ``load(host)`` is the backlog's count of that host's tasks."""

    def __init__(self, load: Callable[[str], int], gap: float, capacity: int, *,
                 enabled: bool = True, foreign: Callable[[str], bool] | None = None) -> None:
        self._load = load
        self._cap = (max(1, min(math.ceil(HORIZON_S / gap), capacity // 4))
                     if enabled and gap > 0 else 0)
        # a host another consumer owns is given back whatever its load
        self._foreign = foreign if self._cap else None
        self.parked_total = 0  # items given back so far (a counter for stats)

    @property
    def cap(self) -> int:
        """Tasks one host may hold (0: no cap)."""
        return self._cap

    def split(self, tasks: Sequence[T]) -> tuple[list[T], list[T]]:
        """``(keep, park)``: the tasks whose host has room (counting the ones kept before
        them in ``tasks``), and the others."""
        if not self._cap:
            return list(tasks), []
        keep: list[T] = []
        park: list[T] = []
        batch: dict[str, int] = {}
        for t in tasks:
            host = t.host
            if not host:
                keep.append(t)  # no request: nothing to be polite about
                continue
            n = batch.get(host, 0)
            if self._load(host) + n < self._cap and not (self._foreign and self._foreign(host)):
                batch[host] = n + 1
                keep.append(t)
            else:
                park.append(t)
        self.parked_total += len(park)
        return keep, park
