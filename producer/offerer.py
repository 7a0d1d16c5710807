"""De-duplicated, batched offers with back-pressure: :class:`Offerer` takes normalized URLs,
skips the ones seen before (this run, or earlier runs with ``--seen``) and offers the rest
into the ingress ``<root>/queue`` in transactions of ``batch`` items
(:class:`producer.partition_offerer.PartitionOfferer` offers into partitions instead).

* One committer thread offers while the caller normalizes the next URLs; at most
  ``_IN_FLIGHT`` batches wait, so a caller that gets ahead blocks (back-pressure to the
  reader), and the batches keep their order.
* The queue never grows past ``max_depth`` because of this producer: a full queue is waited
  on with a watch down to 90 % (several producers may overshoot by a transaction each).
* A URL enters the seen state only *after* its offer committed: a crash or stop leaves URLs
  un-offered (counted) for the next run, and at worst offers a tail twice -- duplicates,
  never losses (at-least-once).
"""

from __future__ import annotations

import queue as stdqueue
import threading
import time
from collections.abc import Callable
from functools import partial

import structlog

from producer.summary import Counts
from zkcrawl.errors import UsageError
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.queue.untrusted import URL_LIMIT
from zkcrawl.seen import SeenSet

log = structlog.get_logger(__name__)  # lazy: bound after logs.configure()

LOW_WATER = 0.9
# How often a held committer wakes to look at the stop flag; the wait itself is a watch.
_WAIT_SLICE = 2.0
# Batches handed over but not yet committed: enough to overlap, little to lose on a stop.
_IN_FLIGHT = 2
_WINDOW = 2  # offer transactions in flight (the OfferWindow's depth)
# How long the committer waits for another batch before it settles those in flight: long
# enough for a producer that feeds it continuously to keep two transactions in the air.
_SETTLE_AFTER = 0.005
# The checkpoint window: the seen state is saved this often while offers commit, also while
# the producer waits at --max-depth (and always at the end). A SIGKILL re-offers at most
# what committed in the last window (docs/operations/reliability.md).
CHECKPOINT_EVERY = 0.5

Origin = tuple[str, int | None]  # (meta.source, meta.depth: a --follow link's crawl depth)
Batch = list[tuple[str, Origin]]  # (url, origin)


def low_water(max_depth: int) -> int:
    """Resume offering once the depth is below this (at least 1, below ``max_depth``)."""
    return max(1, min(max_depth - 1, int(max_depth * LOW_WATER))) if max_depth > 1 else 1


class Offerer:
    """Buffer, de-duplicate and offer URLs; see the module docstring for the guarantees.

    ``add`` and ``flush`` are called from one thread (the producer's); :meth:`close` must
    be called at the end, it stops the committer thread.
    """

    def __init__(self, queue: IngressQueue, seen: SeenSet, counts: Counts, *,
                 producer_id: str, batch: int, max_depth: int, stop: threading.Event,
                 on_state: Callable[[str], None] | None = None,
                 meta: dict[str, object] | None = None,
                 on_offered: Callable[[list[str]], None] | None = None) -> None:
        self.queue = queue
        self.seen = seen
        self.counts = counts
        self.producer_id = producer_id
        self.batch = batch
        self.max_depth = max_depth
        self.low = low_water(max_depth)
        self.stop = stop
        self.on_state = on_state or (lambda _s: None)
        self.meta = meta or {}  # added to every item's meta (--recrawl: {"recrawl": {}})
        self.on_offered = on_offered  # committed URLs, after the seen state (--recrawl)
        self._pending: dict[str, Origin] = {}  # url -> origin, not yet handed over
        # Handed to the committer, not yet in ``seen``. A URL leaves this set only after it
        # entered ``seen``, so checking here first, then ``seen``, never misses it.
        self._inflight: set[str] = set()
        self._handoff: stdqueue.Queue[Batch | None] = stdqueue.Queue(maxsize=_IN_FLIGHT)
        self._failure: BaseException | None = None
        self._known_depth: int | None = None  # queue depth + our reservations
        self._cond = threading.Condition()  # guards the shared counters
        self._closing = threading.Event()
        self._window = queue.offer_window(_WINDOW)
        self._threads = [threading.Thread(target=self._commit_loop, name="committer",
                                          daemon=True)]
        for thread in self._threads:
            thread.start()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop,
                                              name="checkpointer", daemon=True)
        if seen.path is not None:
            self._checkpointer.start()

    @property
    def pending(self) -> int:
        """URLs accepted but not yet offered (buffered or in flight)."""
        return len(self._pending) + len(self._inflight)

    # -- producer thread -------------------------------------------------------
    def add(self, url: str, source: str, depth: int | None = None) -> bool:
        """Accept ``url`` unless seen before or too long; True if new. Hands over full
        batches. ``depth`` (a followed link's) goes to the item's ``meta.depth``."""
        if len(url) > URL_LIMIT // 4 and len(url.encode("utf-8", "surrogatepass")) > URL_LIMIT:
            self.counts.dropped["too-long"] += 1  # SPEC §2: a URL is at most 8 KiB
            return False
        if url in self._pending or url in self._inflight or url in self.seen:
            self.counts.duplicates += 1
            return False
        self._pending[url] = (source, depth)
        if len(self._pending) >= self.batch:
            self._hand_over()
        return True

    def flush(self) -> None:
        """Offer everything accepted so far; returns once it is committed (or abandoned)."""
        if self._pending:
            self._hand_over()
        self._handoff.join()
        self._raise_failure()

    def on_its_way(self, url: str) -> bool:
        """``url`` was accepted and is not committed yet (buffered, held back, in flight)."""
        return url in self._pending or url in self._inflight

    def drain(self) -> None:
        """:meth:`flush`; here nothing is ever held back (the ingress has one bound), so the
        same (:class:`~producer.partition_offerer.PartitionOfferer` waits for its held items)."""
        self.flush()

    def close(self) -> None:
        """Stop the committers; what was never committed is counted and logged."""
        self._closing.set()  # a committer held by back-pressure gives up now
        for _ in self._threads:
            self._put(None)
        for thread in self._threads:
            thread.join()
        if self._checkpointer.is_alive():
            self._checkpointer.join()
        self._abandon(list(self._pending.items()))
        self._pending.clear()
        self.queue.settle_markers()  # a marker delete lost with a connection: again

    def _hand_over(self) -> None:
        batch = list(self._pending.items())
        self._inflight.update(self._pending)
        self._pending.clear()
        self._put(batch)
        self._raise_failure()

    def _put(self, item: Batch | None) -> None:
        # Bounded waits: the committers may be gone and never take it.
        while any(t.is_alive() for t in self._threads):
            try:
                self._handoff.put(item, timeout=0.5)
                return
            except stdqueue.Full:
                continue

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    # -- committer thread --------------------------------------------------------
    def _commit_loop(self) -> None:
        while True:
            try:  # with transactions in flight, wait briefly for the next batch to overlap
                batch = self._handoff.get(timeout=_SETTLE_AFTER if self._window.in_flight
                                          else None)
            except stdqueue.Empty:  # none came: settle what is in flight (flush, seen state)
                self._settle_all()
                continue
            if batch is None:
                self._settle_all()
                self._handoff.task_done()
                return
            if self._failure is None:
                self._commit(batch)
            else:
                self._abandon(batch)
                self._handoff.task_done()

    def _commit(self, batch: Batch) -> None:
        """Offer ``batch`` in parts of what the queue has room for; the handoff's
        ``task_done`` comes once every part settled (committed, or counted unoffered)."""
        parts = [1]  # parts not settled yet; 1 for this loop itself

        def part_done() -> None:
            parts[0] -= 1
            if parts[0] == 0:
                self._handoff.task_done()

        pos = 0
        try:
            while pos < len(batch):
                n = self._reserve(len(batch) - pos)
                if n <= 0:  # stopped while the queue was full
                    break
                part, pos = batch[pos:pos + n], pos + n
                parts[0] += 1
                self._window.submit(self._items(part), partial(self._offered, part, part_done),
                                    partial(self._lost, part, part_done))
        except BaseException as exc:  # raised again in the producer thread
            self._fail(exc)
        self._abandon(batch[pos:])
        part_done()

    def _settle_all(self) -> None:
        try:
            self._window.drain()
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        self._window.abandon()  # calls _lost for every part still in flight

    def _reserve(self, want: int) -> int:
        """Reserve up to ``want`` places in the queue; 0 when stopped while it is full.

        The depth is measured again only once the transactions in flight have settled, so
        it never misses items that are being committed: no overshoot from this producer.
        """
        if self._known_depth is None or self._known_depth + want > self.max_depth:
            self._window.drain()
            self._known_depth = self.queue.depth()  # consumers only ever lower it
        if self._known_depth >= self.max_depth and not self._wait_for_room():
            return 0
        n = min(want, self.max_depth - self._known_depth)
        self._known_depth += n
        return n

    def _wait_for_room(self) -> bool:
        """Block (on a ZooKeeper watch) until the depth is below the low-water mark."""
        if self._given_up():
            return False
        self.counts.waits += 1
        self.on_state("waiting")
        log.info("producer.backpressure", depth=self._known_depth, max_depth=self.max_depth,
                 resume_below=self.low)
        while self._known_depth is None or self._known_depth >= self.low:
            if self._given_up():
                return False
            self._known_depth = self.queue.wait_depth_below(self.low, _WAIT_SLICE)
        log.info("producer.resumed", depth=self._known_depth)
        self.on_state("offering")
        return True

    def _given_up(self) -> bool:
        return self.stop.is_set() or self._closing.is_set()

    def _items(self, part: Batch) -> list[Item]:
        now = time.time()
        return [Item(url=u, producer=self.producer_id, enqueued_at=now,
                     meta={**self.meta, "source": src} if depth is None
                     else {**self.meta, "source": src, "depth": depth})
                for u, (src, depth) in part]

    def _offered(self, part: Batch, part_done: Callable[[], None], _names: list[str]) -> None:
        urls = [u for u, _ in part]
        self.seen.add_many(urls)  # only now are they in the queue
        if self.on_offered is not None:
            self.on_offered(urls)
        self._inflight.difference_update(urls)
        with self._cond:
            self.counts.offered += len(urls)
        part_done()

    def _lost(self, part: Batch, part_done: Callable[[], None]) -> None:
        self._abandon(part)
        part_done()

    def _abandon(self, batch: Batch) -> None:
        if not batch:
            return
        self._inflight.difference_update(u for u, _ in batch)
        with self._cond:
            self.counts.unoffered += len(batch)
        log.warning("producer.unoffered", items=len(batch),
                    reason="stopped while the queue was full" if self._failure is None
                    else f"offer failed: {self._failure!r}",
                    hint="not in the seen state: the next run offers them")

    def _checkpoint_loop(self) -> None:
        """Save the seen state every ``CHECKPOINT_EVERY`` while anything new committed;
        on its own thread, so a producer held by back-pressure or a slow listing still
        checkpoints. A failed save is logged and tried again; the final save (by the
        caller, ``seen.close()``) reports it."""
        failing = False
        while not self._closing.wait(CHECKPOINT_EVERY):
            if not self.seen.dirty:
                continue
            try:
                self.seen.save()
            except UsageError as exc:
                if not failing:
                    log.warning("producer.checkpoint_failed", error=str(exc))
                failing = True
            else:
                failing = False
