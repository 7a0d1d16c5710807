"""Per-host caps in front of the backlog: :class:`Parking` (SPEC §3, no host holds back
another). A host may hold at most what it can serve within a short horizon, and at least
four hosts share the table::

    cap = max(1, min(ceil(HORIZON_S / --domain-delay), capacity // 4))   (none at delay 0)

A claimed item whose host is at its cap, or owned by another consumer, is *parked*: given
back at once and skipped by the claim loop (the queue's ``skip``) while the host is full.

* **Bounded per host**; the rest of a host's items wait in ZooKeeper, claimable by anyone.
* **Nothing held for nothing**: a parked item holds nothing, so no attempt is charged.
* **Claimable again within a tick** of a free place; at most ``limit`` names remembered.
* With ``--delivery at-most-once`` nothing can be given back: items are never parked.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

# Seconds of one host's work a consumer holds at most: two turns at the default 1 s gap. A
# longer horizon only lengthens the queue of items that wait; a shorter one than a turn
# would leave the host idle while the next item is claimed.
HORIZON_S = 2.0
MAX_PARKED = 200_000  # names remembered (about 100 bytes each)


class HostTask(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def host(self) -> str: ...


T = TypeVar("T", bound=HostTask)


class Parking:
    """Decides which claimed tasks go to the backlog and which are given back (module
    docstring); ``load(host)`` is the backlog's count of that host's tasks."""

    def __init__(self, load: Callable[[str], int], gap: float, capacity: int, *,
                 enabled: bool = True, limit: int = MAX_PARKED,
                 foreign: Callable[[str], bool] | None = None) -> None:
        self._load = load
        self._cap = (max(1, min(math.ceil(HORIZON_S / gap), capacity // 4))
                     if enabled and gap > 0 else 0)
        # --politeness owner: a host another consumer owns is given back whatever its load
        self._foreign = foreign if self._cap else None
        self._limit = max(1, limit)
        self._parked: OrderedDict[str, str] = OrderedDict()  # item name -> host
        self._lock = threading.Lock()  # the claim loop splits, a pool thread may remember
        self.parked_total = 0  # items given back so far (a counter for stats)

    @property
    def cap(self) -> int:
        """Tasks one host may hold (0: no cap)."""
        return self._cap

    def split(self, tasks: Sequence[T]) -> tuple[list[T], list[T]]:
        """``(keep, park)``: the tasks whose host has room (counting the ones kept before
        them in ``tasks``), and the others. Parked names are remembered; a kept one is
        forgotten."""
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
                with self._lock:
                    self._parked.pop(t.name, None)
            else:
                park.append(t)
                self._remember(t.name, host)
        self.parked_total += len(park)
        return keep, park

    def remember(self, tasks: Sequence[HostTask]) -> None:
        """Tasks given back elsewhere (their host became another consumer's): skipped like
        parked ones."""
        for t in tasks:
            if t.host:
                self._remember(t.name, t.host)

    def skip(self, name: str) -> bool:
        """For the claim loop: is ``name`` parked and its host still at its cap (or
        another consumer's)?"""
        host = self._parked.get(name)
        if host is None:
            return False
        return self._load(host) >= self._cap or bool(self._foreign and self._foreign(host))

    def __len__(self) -> int:
        return len(self._parked)

    def _remember(self, name: str, host: str) -> None:
        with self._lock:
            self._parked[name] = host
            self._parked.move_to_end(name)
            while len(self._parked) > self._limit:
                self._parked.popitem(last=False)
