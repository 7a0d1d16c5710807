"""The worker's queue seam: what the consumer's worker and committer ask of a queue.

Implemented, structurally (it does not import this module), by
:class:`zkcrawl.consumer.owned_queue.OwnedQueue` (the partitions this consumer owns), and by test
doubles. Guarantees every implementation gives:

* :meth:`~WorkerQueue.claim` returns items this process holds until it completes,
  retries, dead-letters or releases them -- or until its session is lost: then they come
  back once from :meth:`~WorkerQueue.drain_lost` and any completion of them is refused
  (``CompleteResult.lost``);
* every call is bounded (``timeout``, or ``--zk-timeout`` per ZooKeeper call); with
  ZooKeeper away the completions raise :class:`~zkcrawl.queue.claims.QueueSuspended` (the
  committer keeps the group and retries once reconnected);
* what :meth:`~WorkerQueue.release` cannot give back (ZooKeeper away) goes with the session;
* :meth:`~WorkerQueue.mark` is asked when an item is admitted to start: True, start it
  now; False, its start mark is being written, and ``on_marked`` gets it once it is (or
  :meth:`~WorkerQueue.drain_lost`, if its partition or session is lost first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from zkcrawl.queue.claims import Claimed, CompleteResult

__all__ = ["WorkerQueue"]


class WorkerQueue(Protocol):
    """The queue surface :class:`zkcrawl.consumer.worker.Worker` and its committer use."""

    @property
    def delivery(self) -> str: ...

    @property
    def claim_batch(self) -> int: ...

    @property
    def held(self) -> int: ...

    @property
    def mark_lead(self) -> float:
        """How long before an item's start its mark should be asked so that it is
        written by then (0: :meth:`mark` needs no write)."""

    #: called with items whose start marks are written (by the queue's own thread)
    on_marked: Callable[[Sequence[Claimed]], None] | None

    def mark(self, claimed: Claimed, by: float | None = None) -> bool:
        """``claimed`` is admitted to start (at the monotonic time ``by``, when it was
        admitted ahead of its turn: its mark is needed by then): True, start it now; False,
        not before ``on_marked`` has it."""

    def mark_soon(self) -> None:
        """A pool thread is idle while marks wait: write them without waiting for company
        (still at most one checkpoint per ``MARK_MIN_S``)."""

    def claim(self, max_items: int = 1, timeout: float | None = None) -> list[Claimed]: ...

    def room_freed(self) -> None:
        """A task left the pool: its host may take another item (a waiting claim looks
        again soon instead of at its next tick)."""

    def complete(self, claimed: Sequence[Claimed]) -> CompleteResult: ...

    def retry(self, c: Claimed, error: str) -> CompleteResult: ...

    def dead_letter(self, c: Claimed, error: str) -> CompleteResult: ...

    def release(self, claimed: Sequence[Claimed]) -> None: ...

    def drain_lost(self) -> list[Claimed]: ...

    def depth(self) -> int: ...

    def wait_connected(self, timeout: float | None) -> bool: ...

    def close(self) -> None: ...
