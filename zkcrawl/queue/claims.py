"""What a claim hands out: a held item (:class:`Claimed`), the results of settling held
items, the delivery modes and :class:`QueueSuspended` -- the vocabulary shared by the
partitioned queue (:mod:`zkcrawl.consumer.owned_queue`), the ingress (:mod:`zkcrawl.queue.ingress`)
and their callers.

The one home of the item's fate after a failed try (SPEC §3):

* **retry or dead** -- :meth:`Claimed.may_retry`: a failed try is retried at the tail while
  the item's attempts, this one included, stay below ``--max-attempts``; else it is a dead
  letter (and an unreadable item is never retried);
* **the retried item** -- :func:`retry_item`: ``attempt + 1``, the short error in
  ``meta.last_error``, never over the item limit (the error dropped first; None when it
  still would not fit: a dead letter instead);
* **the dead letter** -- :func:`dead_letter_body`: its tries are ``attempt + 1``, except
  for ``abandoned`` (no try of this claim: the dead holders' attempts only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import StrEnum

from zkcrawl.errors import ZkCrawlError
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.items import Item

__all__ = ["AT_LEAST_ONCE", "AT_MOST_ONCE", "Claimed", "CompleteResult", "Delivery",
           "QueueStats", "QueueSuspended", "dead_letter_body", "retry_item", "spent",
           "too_large_to_retry"]


class QueueSuspended(ZkCrawlError):
    """Not connected to ZooKeeper right now: hold completions (or offers) and try again
    later -- nothing was lost, nothing was counted twice."""


class Delivery(StrEnum):
    """A queue's delivery guarantee (a ``str``: equal to its value, e.g. ``--delivery``'s)."""

    AT_LEAST_ONCE = "at-least-once"  # settled only once its record is durable: none lost
    AT_MOST_ONCE = "at-most-once"  # delete on take (the seed's): in flight at a crash, lost

    def __repr__(self) -> str:  # the plain string it replaced, e.g. in argparse's messages
        return repr(self.value)


AT_LEAST_ONCE = Delivery.AT_LEAST_ONCE  # the names callers have always used
AT_MOST_ONCE = Delivery.AT_MOST_ONCE


@dataclass
class Claimed:
    """An item this process holds (in a partition it owns, or already taken in at-most-once
    mode)."""

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
    # Holder deaths this claim carries on top of the item's own ``attempt`` (SPEC §3: a
    # holder's death is an attempt). A partition's next owner charges a death into the item
    # itself (attempt + 1, meta.holder_deaths: zkcrawl.queue.partition_queue); 1 here marks
    # an item that charge used up (zkcrawl.consumer.owned_queue: dead-lettered ``abandoned``).
    deaths: int = 0

    @property
    def url(self) -> str | None:
        return self.item.url if self.item else None

    @property
    def attempt(self) -> int:
        """Attempts so far: failed tries recorded in the item plus holders that died."""
        return (self.item.attempt if self.item else 0) + self.deaths

    @property
    def holder_deaths(self) -> int:
        """Of :attr:`attempt`, the claims whose holder died: those a retry carried in the
        item's ``meta.holder_deaths`` (untrusted: a non-negative int, else 0) plus this
        claim's :attr:`deaths`. The rest of the attempts were fetches."""
        raw = self.item.meta.get(DEATHS_META) if self.item is not None else None
        earlier = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0
        return max(0, min(self.attempt, earlier + self.deaths))

    def may_retry(self, max_attempts: int) -> bool:
        """After a failed try: True -- retry it at the tail; False -- it was the last of its
        ``max_attempts`` (or it is no item): a dead letter. The one place this is decided."""
        return self.item is not None and not spent(self.attempt + 1, max_attempts)

    def abandoned(self, max_attempts: int) -> bool:
        """Dead holders used up the attempts: dead-letter it (``abandoned``), no fetch."""
        return self.deaths > 0 and spent(self.attempt, max_attempts)

    @property
    def queue_ms(self) -> float:
        return max(0.0, (self.claimed_at - self.ctime) * 1000.0)


def spent(attempt: int, max_attempts: int) -> bool:
    """An item tried ``attempt`` times (holders' deaths included) has no try left: the one
    rule behind :meth:`Claimed.may_retry`, :meth:`Claimed.abandoned` and a new owner's charge
    of a dead holder's items (:meth:`~zkcrawl.queue.partition_queue.PartitionQueue.adopt`)."""
    return attempt >= max_attempts


DEATHS_META = "holder_deaths"  # the item meta key a retry carries the holder deaths in
ABANDONED = "abandoned"  # SPEC §3: --max-attempts holders died with it


def retry_item(c: Claimed, error: str) -> Item | None:
    """The item to offer again for ``c`` (which holds an item): ``attempt + 1``, its meta
    but the previous ``last_error``, then ``error`` (cut at ERROR_LIMIT) as ``last_error``
    -- dropped if the item would not fit with it. None: it would not fit even so (SPEC §2)."""
    assert c.item is not None
    base = Item(url=c.item.url, attempt=c.attempt + 1, producer=c.item.producer,
                meta={k: v for k, v in c.item.meta.items() if k != "last_error"},
                enqueued_at=c.item.enqueued_at)
    for again in (replace(base, meta={**base.meta, "last_error": error[:item_codec.ERROR_LIMIT]}),
                  base):
        if len(again.encode()) <= item_codec.ITEM_LIMIT:
            return again
    return None


def too_large_to_retry(error: str) -> str:
    """The dead letter's reason for an item :func:`retry_item` could not fit."""
    return f"{error[:80]}; item too large to retry"


def dead_letter_body(c: Claimed, error: str) -> bytes:
    """``c``'s dead letter (:func:`zkcrawl.queue.items.encode_dead_letter`). An ``abandoned`` item
    was not tried by this claim: its attempts are the dead holders'."""
    tries = c.attempt if error == ABANDONED else c.attempt + 1
    return item_codec.encode_dead_letter(c.name, c.url, error, tries, c.data, c.holder_deaths)


def attempts_text(attempts: int, deaths: int) -> str:
    """``3 (2 fetched, 1 holder died)``: an item's tries apart from its redeliveries (SPEC
    §3: a holder's death counts as an attempt, but it fetched nothing)."""
    deaths = max(0, min(attempts, deaths))
    if not deaths:
        return str(attempts)
    return (f"{attempts} ({attempts - deaths} fetched, {deaths} holder"
            f"{'s' if deaths > 1 else ''} died)")


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
