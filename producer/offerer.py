"""The producer's offers (SPEC §4): :class:`Offerer` takes normalized URLs, skips the ones
seen before (this run, or earlier runs with ``--seen``) and commits the rest straight into
the root's partitions as batches (:class:`zkcrawl.queue.partition_offers.PartitionOffers`:
protected transactions, a lost answer never doubled). Back-pressure: docs/guide/producer.md.

* One committer thread groups the URLs by partition and commits while the caller reads
  on (a listing walk too: :meth:`Offerer.push` after each page); at most ``_IN_FLIGHT``
  handoffs wait, so a caller that gets ahead blocks.
* ``--max-depth N`` bounds everything queued (the ingress and every partition),
  ``--max-partition-depth M`` one partition. Items of a full partition wait in memory while
  the others go on, offered again on a children watch; only past ``--max-held`` does the
  producer wait (state ``waiting``). Several producers may overshoot by a transaction each.
* A URL enters the seen state only once its batch committed: a held item, or one a stop or
  a crash left un-offered (counted), is offered again by the next run -- duplicates at
  worst, never losses. The seen state is saved every ``CHECKPOINT_EVERY`` s meanwhile.
"""

from __future__ import annotations

import heapq
import queue as stdqueue
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import structlog

from zkcrawl.errors import UsageError
from zkcrawl.producer.summary import HELD_TOP, Counts
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.items import Item
from zkcrawl.queue.partition_offers import PartitionOffers
from zkcrawl.queue.untrusted import url_too_long
from zkcrawl.seen import SeenSet

log = structlog.get_logger(__name__)  # lazy: bound after logs.configure()

# How often a held committer wakes to look at the stop flag; the wait itself is a watch.
_WAIT_SLICE = 2.0
# Batches handed over but not yet committed: enough to overlap, little to lose on a stop.
_IN_FLIGHT = 2
# The checkpoint window: the seen state is saved this often while offers commit, also while
# the producer waits (and always at the end). A SIGKILL re-offers at most what committed in
# the last window (docs/operations/reliability.md).
CHECKPOINT_EVERY = 0.5
_IDLE_LOOK = 0.2  # between handoffs, how often a committer holding items looks at the watch flag

Origin = tuple[str, int | None]  # (meta.source, meta.depth: a --follow link's crawl depth)
Batch = list[tuple[str, Origin]]  # (url, origin)
Committed = Callable[[list[object]], None]
_FLUSH: Batch = []  # handoffs known by identity: offer what has room now,
_DRAIN: Batch = []  # and offer everything, waiting for room


def partition_bound(max_depth: int, partitions: int, wanted: int = 0) -> int:
    """``--max-partition-depth``: ``wanted``, or a quarter of ``max_depth`` but at least
    ``2 * max_depth / partitions`` (so that a root with few partitions is not throttled
    below its share), never above ``max_depth``."""
    if wanted > 0:
        return min(wanted, max_depth)
    share = -(-2 * max_depth // max(1, partitions))
    return max(1, min(max_depth, max(-(-max_depth // 4), share)))


def held_bound(max_depth: int, batch: int, wanted: int = 0) -> int:
    """``--max-held``: ``wanted``, or half of ``max_depth`` but at least one ``batch``."""
    return wanted if wanted > 0 else max(batch, max_depth // 2)


class Offerer:
    """Buffer, de-duplicate and offer URLs into partitions (module docstring).

    ``add``, ``offer_item``, ``flush`` and ``drain`` are called from one thread (the
    producer's); :meth:`close` must be called at the end, it stops the committer thread.
    """

    def __init__(self, feed: PartitionOffers, seen: SeenSet, counts: Counts, *,
                 producer_id: str, batch: int, max_depth: int, max_partition_depth: int,
                 max_held: int, stop: threading.Event,
                 on_state: Callable[[str], None] | None = None,
                 meta: dict[str, object] | None = None,
                 on_offered: Callable[[list[str]], None] | None = None) -> None:
        self.feed = feed
        self.seen = seen
        self.counts = counts
        self.producer_id = producer_id
        self.batch = batch
        self.fill = max(1, min(batch, pb.MAX_ITEMS))  # a partition's batch is ripe
        self.max_depth = max_depth
        self.max_partition_depth = max_partition_depth
        self.max_held = max_held
        self.stop = stop
        self.on_state = on_state or (lambda _s: None)
        self.meta = meta or {}  # added to every item's meta (--recrawl: {"recrawl": {}})
        self.on_offered = on_offered  # committed URLs, after the seen state (--recrawl)
        self._pending: dict[str, Origin] = {}  # url -> origin, not yet handed over
        # Handed to the committer, not yet in ``seen``. A URL leaves this set only after it
        # entered ``seen``, so checking here first, then ``seen``, never misses it.
        self._inflight: set[str] = set()
        # offer_item's URLs: url -> (meta, key, callback); not de-duplicated by the seen state
        self._extra: dict[str, tuple[dict[str, object], object, Committed]] = {}
        self._held: dict[int, Batch] = {}  # p -> items buffered (committer thread writes)
        self._held_n = 0
        self._full: set[int] = set()  # partitions whose last offer found no room for all
        self._waiting = False
        self._looked = 0.0  # monotonic time of the last look between handoffs
        self._hold_lock = threading.Lock()
        self._handoff: stdqueue.Queue[Batch | None] = stdqueue.Queue(maxsize=_IN_FLIGHT)
        self._failure: BaseException | None = None
        self._closing = threading.Event()
        counts.held_back = self.held_back()
        self._committer = threading.Thread(target=self._commit_loop, name="committer",
                                           daemon=True)
        self._committer.start()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop,
                                              name="checkpointer", daemon=True)
        if seen.path is not None:
            self._checkpointer.start()

    @property
    def pending(self) -> int:
        """URLs accepted but not yet offered (buffered, held back or in flight)."""
        return len(self._pending) + len(self._inflight)

    @property
    def held(self) -> int:
        """Items buffered in memory, not yet offered (held back or waiting for a batch)."""
        return self._held_n

    def held_back(self) -> dict[str, Any]:
        """What the status node shows: items held back for partitions without room, in how
        many partitions, the fullest ones."""
        with self._hold_lock:
            sizes = [(len(v), p) for p, v in self._held.items() if v and p in self._full]
        top = heapq.nlargest(HELD_TOP, sizes)
        return {"items": sum(n for n, _ in sizes), "partitions": len(sizes),
                "top": [{"partition": p, "items": n} for n, p in top]}

    # -- producer thread -------------------------------------------------------------
    def add(self, url: str, source: str, depth: int | None = None) -> bool:
        """Accept ``url`` unless seen before or too long; True if new. Hands over full
        batches. ``depth`` (a followed link's) goes to the item's ``meta.depth``."""
        if url_too_long(url):
            self.counts.dropped["too-long"] += 1  # SPEC §2: a URL is at most 8 KiB
            return False
        if url in self._pending or url in self._inflight or url in self.seen:
            self.counts.duplicates += 1
            return False
        self._accept(url, (source, depth))
        return True

    def offer_item(self, url: str, meta: dict[str, object], key: object,
                   on_committed: Committed) -> bool:
        """Offer ``url`` with its own ``meta`` whether seen or not (a --recrawl re-offer);
        ``on_committed([key, ...])`` is called (committer thread) once its batch committed.
        False when the URL is already on its way (accepted, not yet committed)."""
        if self.on_its_way(url):
            return False
        self._extra[url] = (meta, key, on_committed)
        self._accept(url, (str(meta.get("source", "")), None))
        return True

    def on_its_way(self, url: str) -> bool:
        """``url`` was accepted and is not committed yet (buffered, held back, in flight)."""
        return url in self._pending or url in self._inflight

    def flush(self) -> None:
        """Offer everything accepted so far that has room; returns once it is committed
        (or abandoned). Items of a partition without room stay held back."""
        self._ask(_FLUSH)

    def push(self) -> None:
        """Have everything accepted so far offered now, as :meth:`flush` does, without
        waiting for the commit: a listing walk fetches its next page while this page's
        transaction goes (waiting for it cost ~6-8 ms a page, 12-15 % of a 50 ms page's walk,
        bench e2e). At most ``_IN_FLIGHT`` handoffs wait, so a caller that gets ahead of
        ZooKeeper blocks here; a failure is raised at the next call. :meth:`flush` and
        :meth:`drain` still return only once everything before them is committed."""
        self._ask(_FLUSH, wait=False)

    def drain(self) -> None:
        """:meth:`flush`, then wait until every held item is committed too (state
        ``waiting`` meanwhile); a stop ends the wait, the held items count as unoffered."""
        self._ask(_DRAIN)

    def close(self) -> None:
        """Stop the committer; what was never committed is counted and logged."""
        self._closing.set()  # a committer held by back-pressure gives up now
        self._put(None)
        self._committer.join()
        if self._checkpointer.is_alive():
            self._checkpointer.join()
        self._abandon(list(self._pending.items()))
        self._pending.clear()

    def _accept(self, url: str, origin: Origin) -> None:
        self._pending[url] = origin
        if len(self._pending) >= self.batch:
            self._hand_over()

    def _hand_over(self) -> None:
        batch = list(self._pending.items())
        self._inflight.update(self._pending)
        self._pending.clear()
        self._put(batch)
        self._raise_failure()

    def _ask(self, what: Batch, wait: bool = True) -> None:
        if self._pending:
            self._hand_over()
        self._put(what)
        if wait:
            self._handoff.join()
        self._raise_failure()

    def _put(self, item: Batch | None) -> None:
        # Bounded waits: the committer may be gone and never take it.
        while self._committer.is_alive():
            try:
                self._handoff.put(item, timeout=0.5)
                return
            except stdqueue.Full:
                continue

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    # -- committer thread ------------------------------------------------------------
    def _commit_loop(self) -> None:
        # The depths first, while the producer reads its first page: listing every partition
        # takes ~70 ms at the default P, and at the first commit it delayed the first items
        # of a crawl by as much (bench e2e). A failure here is raised at the next hand-over.
        self._guarded(self._measure_once)
        while True:
            try:  # items held: offer them as soon as a partition changed, between handoffs
                batch = self._handoff.get(timeout=_IDLE_LOOK if self._full else None)
            except stdqueue.Empty:
                if self._failure is None:
                    self._look_again()
                continue
            if batch is None:
                self._abandon_held()
                self._handoff.task_done()
                return
            if self._failure is not None:
                self._abandon([] if batch is _DRAIN or batch is _FLUSH else batch)
            elif batch is _FLUSH:
                self._guarded(lambda: self._offer(everything=True))
            elif batch is _DRAIN:
                self._guarded(lambda: self._offer_until(0))
            else:
                self._guarded(partial(self._take, batch))
            self._handoff.task_done()

    def _measure_once(self) -> None:
        if not self.feed.measured:
            self.feed.measure()

    def _look_again(self) -> None:
        """Between handoffs, with items held: offer them once a partition changed; after a
        slice without news, list the full ones again (a watch lost with a session)."""
        now = time.monotonic()
        if self.feed.changed.is_set():
            self.feed.changed.clear()
        elif now - self._looked < _WAIT_SLICE:
            return
        else:
            self.feed.mark_all_dirty(sorted(self._full))
        self._looked = now
        self._guarded(lambda: self._offer(everything=True))

    def _guarded(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # raised again in the producer thread
            if self._failure is None:
                self._failure = exc
            self._abandon_held()
        self.counts.held_back = self.held_back()
        self.counts.listings = self.feed.listings

    def _take(self, batch: Batch) -> None:
        """Buffer ``batch`` per partition, offer the ripe batches, and wait while more than
        ``max_held`` items are buffered."""
        with self._hold_lock:
            for entry in batch:
                self._held.setdefault(self.feed.partition_of(entry[0]), []).append(entry)
        self._held_n += len(batch)
        self._offer_until(self.max_held)

    def _offer_until(self, most: int) -> None:
        """Offer; then, while more than ``most`` items are buffered, wait for a partition to
        change and offer again."""
        self._offer(everything=most == 0)
        while self._held_n > most:
            if not self._await_change():
                break
            self._offer(everything=most == 0)
        if self._waiting and self._held_n <= most:
            self._waiting = False
            log.info("producer.resumed", held=self._held_n, depth=self.feed.total())
            self.on_state("offering")

    def _offer(self, everything: bool) -> None:
        """One commit of what is to go and has room. To go: ``everything`` -- also when more
        than ``max_held`` items are buffered -- else the ripe partitions (a batch's worth,
        ``fill``: small ones wait for more items). Room: the total, then each partition's
        bound; depths listed again only where the known ones say no."""
        feed = self.feed
        self._measure_once()  # done at the start unless that failed
        want = {p: len(v) for p, v in self._held.items() if v}
        everything = everything or sum(want.values()) > self.max_held
        cands = want if everything else {p: n for p, n in want.items() if n >= self.fill}
        if not cands:
            return
        self._measure_stale(cands)
        room = self.max_depth - feed.total()
        bound = self.max_partition_depth
        groups: dict[int, Batch] = {}
        for p in sorted(cands, key=lambda q: -cands[q]):  # the largest first
            k = max(0, min(cands[p], bound - feed.depth(p), room))
            if k:
                groups[p] = self._held[p][:k]
                room -= k
            if k < cands[p]:
                self._full.add(p)
            else:
                self._full.discard(p)
        if groups:
            self._commit_groups(groups)
        unwatched = sorted(p for p in self._full if not feed.armed(p))
        if unwatched:  # a partition made full by this very commit: its watch tells of room
            feed.measure(unwatched)

    def _measure_stale(self, cands: dict[int, int]) -> None:
        """List again the partitions whose known depth says no but may be lower now (their
        watch fired); every such one, and the ingress, when the total says no."""
        feed = self.feed
        bound = self.max_partition_depth
        stale = {p for p, n in cands.items() if feed.depth(p) + n > bound and feed.dirty(p)}
        if feed.total() + sum(cands.values()) > self.max_depth:
            stale |= {p for p in range(feed.partitions) if feed.dirty(p)}
            feed.measure_ingress()
        if stale:
            feed.measure(sorted(stale))

    def _commit_groups(self, groups: dict[int, Batch]) -> None:
        items = {p: self._items(entries) for p, entries in groups.items()}
        complete = False
        try:
            for c in self.feed.commit(items):
                self._offered([groups[c.partition][i] for i in c.indices])
            complete = True
        finally:
            self._release(groups, complete)

    def _release(self, groups: dict[int, Batch], complete: bool) -> None:
        """Take what the commit settled out of the buffer. Each group is the head of its
        partition's buffer; after a complete commit, its items still in flight were refused
        (too large for a batch: logged by the queue, counted as dropped here)."""
        with self._hold_lock:
            for p, entries in groups.items():
                if complete:
                    rest = self._held[p][len(entries):]
                    for url, _ in entries:
                        if url in self._inflight:
                            self._inflight.discard(url)
                            self.counts.dropped["too-large"] += 1
                else:  # a failure: what committed is out, the rest is abandoned by the caller
                    rest = [e for e in self._held[p] if e[0] in self._inflight]
                if rest:
                    self._held[p] = rest
                else:
                    del self._held[p]
                    self._full.discard(p)
        self._held_n = sum(len(v) for v in self._held.values())

    def _await_change(self) -> bool:
        """Wait (a watch, in slices that look at the stop flag) for a listed partition to
        change; False once stopped."""
        if not self._waiting:
            self._waiting = True
            self.counts.waits += 1
            held = self.held_back()
            self.counts.held_back = held
            log.info("producer.backpressure", held=held["items"], partitions=held["partitions"],
                     top=held["top"], depth=self.feed.total(), max_depth=self.max_depth,
                     max_partition_depth=self.max_partition_depth)
            self.on_state("waiting")
        if self._given_up():
            return False
        if self.feed.changed.wait(_WAIT_SLICE):
            self.feed.changed.clear()
        else:
            self.feed.mark_all_dirty()  # a slice without news: list again (bounded)
        return not self._given_up()

    def _given_up(self) -> bool:
        return self.stop.is_set() or self._closing.is_set()

    def _items(self, part: Batch) -> list[Item]:
        now = time.time()
        return [Item(url=url, producer=self.producer_id, enqueued_at=now,
                     meta=self._meta(url, origin)) for url, origin in part]

    def _meta(self, url: str, origin: Origin) -> dict[str, object]:
        extra = self._extra.get(url)
        if extra is not None:
            return dict(extra[0])
        source, depth = origin
        return ({**self.meta, "source": source} if depth is None
                else {**self.meta, "source": source, "depth": depth})

    def _offered(self, part: Batch) -> None:
        """``part`` committed: its URLs enter the seen state (offer_item's: their callback)."""
        urls: list[str] = []
        calls: dict[int, tuple[Committed, list[object]]] = {}
        for url, _ in part:
            extra = self._extra.pop(url, None)
            if extra is None:
                urls.append(url)
            else:
                self._inflight.discard(url)
                calls.setdefault(id(extra[2]), (extra[2], []))[1].append(extra[1])
        for callback, keys in calls.values():
            callback(keys)
        self.seen.add_many(urls)  # only now are they in the queue
        if self.on_offered is not None and urls:
            self.on_offered(urls)
        self._inflight.difference_update(urls)
        self.counts.offered += len(urls)

    def _abandon_held(self) -> None:
        with self._hold_lock:
            entries = [e for v in self._held.values() for e in v]
            self._held.clear()
            self._full.clear()
        self._held_n = 0
        self._abandon(entries)
        self.counts.held_back = self.held_back()

    def _abandon(self, batch: Batch) -> None:
        if not batch:
            return
        for url, _ in batch:
            self._extra.pop(url, None)
            self._inflight.discard(url)
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


__all__ = ["CHECKPOINT_EVERY", "Offerer", "Origin", "held_bound", "partition_bound"]
