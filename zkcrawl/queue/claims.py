"""What a claim hands out: a held item (:class:`Claimed`) and the results of settling held
items -- the vocabulary shared by the queue recipe (:mod:`zkcrawl.queue.leases`) and its callers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from zkcrawl.queue.items import Item

__all__ = ["AT_LEAST_ONCE", "AT_MOST_ONCE", "Claimed", "CompleteResult", "Delivery",
           "QueueStats"]


class Delivery(StrEnum):
    """A queue's delivery guarantee (a ``str``: equal to its value, e.g. ``--delivery``'s)."""

    AT_LEAST_ONCE = "at-least-once"  # a lease per claim, deleted on completion: none lost
    AT_MOST_ONCE = "at-most-once"  # delete on take (the seed's): in flight at a crash, lost

    def __repr__(self) -> str:  # the plain string it replaced, e.g. in argparse's messages
        return repr(self.value)


AT_LEAST_ONCE = Delivery.AT_LEAST_ONCE  # the names callers have always used
AT_MOST_ONCE = Delivery.AT_MOST_ONCE


@dataclass
class Claimed:
    """An item this process holds (a lease, or already taken in at-most-once mode)."""

    name: str
    seq: int
    data: bytes
    item: Item | None
    error: str | None  # "malformed: ..." when the data is not an item
    ctime: float  # znode creation, unix seconds (server clock)
    claimed_at: float = field(default_factory=time.time)
    claimed_mono: float = field(default_factory=time.monotonic)
    session: int | None = None
    bare: bool = False
    # Earlier claims of this znode whose holder died or lost its session (SPEC §3: a
    # holder's death is an attempt); see zkcrawl.queue.leases, "Counting claims".
    deaths: int = 0

    @property
    def url(self) -> str | None:
        return self.item.url if self.item else None

    @property
    def attempt(self) -> int:
        """Attempts so far: failed tries recorded in the item plus holders that died."""
        return (self.item.attempt if self.item else 0) + self.deaths

    def abandoned(self, max_attempts: int) -> bool:
        """Dead holders used up the attempts: dead-letter it (``abandoned``), no fetch."""
        return self.deaths > 0 and self.attempt >= max_attempts

    @property
    def queue_ms(self) -> float:
        return max(0.0, (self.claimed_at - self.ctime) * 1000.0)


@dataclass
class QueueStats:
    """Counters for benchmarks and ``consumer.stats``."""

    claimed: int = 0
    requests: int = 0  # claim-side requests (transactions, creates, listings)
    wasted: int = 0  # claim-side requests that won nothing
    listings: int = 0
    completed: int = 0


@dataclass
class CompleteResult:
    done: list[Claimed]
    lost: list[Claimed]  # the lease was gone: another consumer may be on it
