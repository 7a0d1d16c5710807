"""The queue of a consumer whose hosts have owners: :class:`OwnedQueue`, the partitions it
owns, batch by batch (its docstring has the guarantees in full and the costs).

* It claims only from partitions whose owner node it holds; every write is fenced on the
  owner's epoch, so a zombie changes nothing.
* **A holder's death is charged only for the items it had started** (SPEC §3): an item is
  marked started only when the worker admits it, and its request waits for the mark.
* Settles are one write per batch touched; a write whose answer was lost raises
  :class:`~zkcrawl.queue.claims.QueueSuspended` and is never applied twice.
* A lost partition gives its items up; a back-off in force rides the checkpoint and survives
  a hand-over.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from zkcrawl.consumer.ownership import Ownership
from zkcrawl.errors import ZkCrawlError
from zkcrawl.logs import get_logger
from zkcrawl.queue import items as item_codec
from zkcrawl.queue import partition_state as ps
from zkcrawl.queue.claims import (
    AT_LEAST_ONCE,
    AT_MOST_ONCE,
    Claimed,
    CompleteResult,
    QueueSuspended,
    dead_letter_body,
    retry_item,
    too_large_to_retry,
)
from zkcrawl.queue.items import Item
from zkcrawl.queue.partition_queue import (
    BatchNode,
    Change,
    Checkpointed,
    Fenced,
    Owned,
    PartitionQueue,
)
from zkcrawl.textsafe import printable
from zkcrawl.web.urls import host_key
from zkcrawl.zk import ConnectionLoss, KazooException, SessionExpiredError, ZkClient, ZkState

log = get_logger(__name__)

CLAIM_BATCH = 100
RELIST_S = 30.0  # a partition is listed again at least this often (its watch, sooner)
RETAKE_S = 5.0  # a partition another session holds: asked again (its owner node's watch, sooner)
# How often a consumer looks for owner nodes its session holds of partitions it neither owns
# nor holds in memory (_sweep): none should exist, and one that does stalls its partition for
# as long as this session lives -- the next owner waits for it.
SWEEP_S = 30.0
# A partition this consumer owns whose owner node another session (or no session: a
# persistent node, which no consumer writes) has held this long: one warning. A previous
# owner lets go within its gap of seeing the change (HANDOVER_S); a node held for longer is
# a zombie's or another client's, and nobody crawls the partition while it stays.
HELD_WARN_S = 30.0
INGRESS_MOVE = 2000  # ingress items one move takes (fewer when they exceed a transaction)
PICK_PER_BATCH = 16  # a claim reads past the items of at most so many full hosts a batch
# Partitions listed and read per claim round at most, in one pipelined read
# (PartitionQueue.read_many). One by one, gaining 90 of them at once stalled a consumer's
# claims for a second (bench rebalance), and 8 a round one after another made a start on
# 128 partitions take ~3 s to read them all (bench hosts, 2,500 hosts: ~20 ms a partition).
PER_ROUND = 64
TAKES_PER_ROUND = 64  # partitions taken per claim round, pipelined (PartitionQueue.take_many:
# one by one, a consumer took a new root's 256 partitions in 3.5 s before its first fetch)
ROOM_S = 0.02  # a claim that found nothing looks again at most this often when woken
FLUSH_S = 0.2  # settles wait at most this long for their checkpoint (one write for all)
# Marks wait at most this long for their checkpoint (an item starting waits for its mark).
# bench hosts (500 hosts, 1 s gap, load ~5): 20 ms doubled the writes per page (owner_1
# 0.111, owner_4 0.200 vs 0.059, 0.099 before, when a claim marked its items); 50 ms 0.085,
# 0.139; 100 ms 0.052, 0.103.
MARK_S = 0.1
# A mark asked with the time its item starts (``mark(c, by=...)``: admitted ahead of its
# host's turn) goes this long before that at the latest: a checkpoint's round trip, with
# room. bench hosts (2,500 hosts at a 1 s gap, 2 x 128 threads) before: a page waited p50 59
# / p90 154 ms for its mark after its turn came, and each host's pages were 1.13 s apart.
MARK_WRITE_S = 0.04
# ... and is asked this long ahead (Worker._admit_due): marks asked in a stream then share
# a checkpoint about every MARK_S, as the others.
MARK_LEAD_S = MARK_S + MARK_WRITE_S
# ... or sooner when a pool thread finds nothing to take while marks wait (mark_soon), but
# at most one checkpoint per MARK_MIN_S. A count (16 marks: at once) wrote a checkpoint per
# 16 pages at a high rate, each rewriting its whole batch node: the soak (one host, 1,400
# pages/s) sent ZooKeeper 3.5 MB/s and ran its 256 MiB heap out.
MARK_MIN_S = 0.02
# A host's items stay in their batch until its next request could start within this long
# (HostCap.ready_at): a claim round (ROOM_S) and the pick, with room to spare. Before, an
# owner took a host's next item as soon as the last one settled and held it for the whole
# gap: bench hosts' default case (500 hosts at a 1 s gap, --backlog 64) ran at 84 pages/s of
# 552, each of the table's 96 places waiting ~1 s for its host's turn.
READY_AHEAD_S = 0.1


class HostCap(NamedTuple):
    """What the pick asks the worker about a host (set by the consumer's wiring,
    :func:`zkcrawl.consumer.main._cap_hosts`): ``cap``, the items a host may have in the
    worker; ``load``, the worker's live count of each host's items (``Backlog.per_host``,
    read without its lock, an estimate); ``take_freed``, the hosts whose load went down since
    it was last called (``Backlog.take_freed``): the pick looks again only at stalled batches
    of theirs; ``ready_at``, when a host's next request could start (the politeness table's
    ``ready_at``; None: at once) -- a host not ready within :data:`READY_AHEAD_S` has no room
    now, and its stalled batches are looked at again when its time comes."""

    cap: int
    load: Mapping[str, int]
    take_freed: Callable[[], set[str]]
    ready_at: Callable[[str], float] | None = None


class _Claim(Claimed):
    """A claim of a batch's item whose ``data`` -- the item's JSON, read only for a dead
    letter or the size in an unfetched item's record -- is made when first read (a JSON
    encode per claim, 4 us, for what few items need), from the item as claimed."""

    _data: bytes | None = None
    _claimed_item: Item | None = None

    def lazy(self, item: Item) -> None:
        self._data, self._claimed_item = None, item

    @property
    def data(self) -> bytes:
        if self._data is None:
            assert self._claimed_item is not None
            self._data = self._claimed_item.encode()
        return self._data

    @data.setter
    def data(self, value: bytes) -> None:
        self._data = value


@dataclass(eq=False)  # identity: a key of per-batch groups
class _Batch:
    p: int
    node: BatchNode
    seq: int
    ctime: float
    queued: list[int] = field(default_factory=list)  # pending, not handed out, in order
    hosts: list[str] = field(default_factory=list)  # per item: its politeness key
    handed: dict[int, Claimed] = field(default_factory=dict)
    # given back after their mark (a forced stop, the sink down): unmark at the next write
    unstart: set[int] = field(default_factory=set)
    # what the next checkpoint writes: marks (items admitted to start: OwnedQueue.mark),
    # settles, and per settled index its retry or dead letter
    want_start: set[int] = field(default_factory=set)
    want_done: set[int] = field(default_factory=set)
    want_retry: dict[int, Item] = field(default_factory=dict)
    want_dead: dict[int, bytes] = field(default_factory=dict)
    unsure: bool = False  # a checkpoint's answer was lost: read the node before the next one
    # per item, when it was offered (OwnedQueue._offered_of), and the items it was made of
    offered: list[float] = field(default_factory=list)
    offered_items: tuple[Item | None, ...] | None = None
    # OwnedQueue._pick found no room for the hosts of its first items: (its queue then,
    # that queue's length, those hosts); None when it may yield
    stall: tuple[list[int], int, set[str]] | None = None

    def wants(self) -> bool:
        return bool(self.want_start or self.want_done or self.unstart)


@dataclass(eq=False)
class _Part:
    owned: Owned
    batches: dict[str, _Batch] = field(default_factory=dict)
    listed: float = 0.0
    dirty: bool = True
    leaving: bool = False
    # the partition's host state (partition_state): what the checkpoint keeps, hosts of
    # items settled since (to look up), and a generation to know what was written
    holds: dict[str, ps.Hold] = field(default_factory=dict)
    touched: set[str] = field(default_factory=set)
    state_gen: int = 0
    written_gen: int = 0

    def in_flight(self) -> int:
        """Items handed out, or settled and not yet checkpointed."""
        return sum(len(b.handed) + len(b.want_done) for b in self.batches.values())


class OwnedQueue:
    """The owned partitions of one consumer as a claimable queue: the worker's queue seam
    (:class:`~zkcrawl.consumer.queue_seam.WorkerQueue`) over :class:`~zkcrawl.queue.partition_queue.
    PartitionQueue`, for the partitions :class:`~zkcrawl.consumer.ownership.Ownership` gives this
    consumer. Guarantees:

    * it claims only from partitions whose owner node it holds (taken with an epoch; the others
      wait until their previous owner lets go or its session ends), so only the owner fetches a
      host, and every write of it is fenced on that epoch: a zombie changes nothing;
    * **a holder's death is charged only for the items it had started** (SPEC §3): a claim
      hands items out unmarked (no write); an item is marked started in its batch only when
      the worker admits it to start now (:meth:`OwnedQueue.mark`), and its request waits until
      the mark is written -- so a page that kills its consumers is charged each time, and an
      item still waiting in the backlog at a ``kill -9`` is not. The marks waiting are written
      together, in one checkpoint with whatever else waits, within ``MARK_S`` (and at once
      when the previous write's answer came later than that); a mark whose answer was lost is
      tried again (the batch read first), one whose partition was lost meanwhile gives its item
      up (never started). An item given back after its mark (a forced stop, the sink down) is
      unmarked with its batch's next write; one given back before needs nothing;
    * settles are one write per batch touched (:meth:`complete` of a committed group); a retry
      or a dead letter is one write with its settle. A write whose answer was lost raises
      :class:`~zkcrawl.queue.claims.QueueSuspended` (the committer holds the group); the batch
      is read again before its next write, and what that write would do again is not done
      twice;
    * a partition lost (another consumer's now, or this session ended) gives its items up: not
      claimed any more, their settles fenced (``lost``), and its owner node is deleted once
      nothing of it is in flight; the owner of partition 0 also moves the ingress
      (``<root>/queue``) into the partitions;
    * **a back-off in force survives a hand-over**: the hosts of a settled item are looked up in
      this consumer's politeness (:meth:`~zkcrawl.consumer.ownership.Ownership.hold`); when one's
      Retry-After, down-host back-off or Crawl-delay changed, the partition's host state
      (:mod:`zkcrawl.queue.partition_state`) rides the next checkpoint as the partition node's
      data -- the setData that is also the transaction's fence, no write of its own. A partition
      taken reads it (untrusted: a state that does not decode is ignored with a warning and
      its reason, the partition crawled as usual) and seeds :meth:`~zkcrawl.consumer.ownership.
      Ownership.taken`, so the first request to such a host waits until its hold ends.

    Costs, in ZooKeeper writes: a checkpoint at most every ``MARK_S`` while items start (their
    marks, with the settles and host state waiting; every ``MARK_MIN_S`` while a pool thread
    has nothing ready), at most every ``FLUSH_S`` otherwise (settles), none for a claim, and
    ownership in a few transactions however many partitions change hands
    (:meth:`~zkcrawl.queue.partition_queue.PartitionQueue.take_many`, ``release_many``).
    """

    claim_batch = CLAIM_BATCH

    def __init__(self, zk: ZkClient, root: str, consumer_id: str, ownership: Ownership,
                 max_attempts: int = 3, delivery: str = AT_LEAST_ONCE) -> None:
        if delivery not in (AT_LEAST_ONCE, AT_MOST_ONCE):
            raise ValueError(f"unknown delivery {delivery!r}")
        self.delivery = delivery
        self._once = delivery == AT_MOST_ONCE  # settled on the take: nothing in flight
        self.zk = zk
        self.consumer_id = consumer_id
        self.ownership = ownership
        self.pq = PartitionQueue(zk, root, ownership.partitions, consumer=consumer_id,
                                 max_attempts=max_attempts)
        # Items a host may take in the worker, and when (HostCap); set by the consumer's
        # wiring; items beyond it stay here, unmarked (no churn of marks).
        self.host_cap: HostCap | None = None
        # Hosts the pick found not ready, by when they will be (a heap; _wake_at has each
        # host's latest entry, older ones are skipped): the claim loop's next-contact times.
        self._waking: list[tuple[float, str]] = []
        self._wake_at: dict[str, float] = {}
        self._clock: Callable[[], float] = time.monotonic  # the politeness table's (tests: a fake)
        self._stalled: dict[str, set[_Batch]] = {}  # host -> batches stalled on it (_pick)
        self._picked_last: list[str] = []  # hosts the last pick took items of
        self._stalled_at = 0.0  # when _restall last ran
        # Told, from the checkpoint thread, of items whose start marks are written (the
        # worker's Backlog.marked): set by the worker.
        self.on_marked: Callable[[Sequence[Claimed]], None] | None = None
        self._lock = threading.RLock()
        self._parts: dict[int, _Part] = {}
        self._asked: dict[int, float] = {}  # partition -> when take() last said "not yet"
        self._held_since: dict[int, float] = {}  # partition -> the first "not yet" in a row
        self._held_warned: set[int] = set()  # partitions warned of (HELD_WARN_S)
        self._swept = time.monotonic()  # the first sweep one SWEEP_S after the start
        self._lost: list[Claimed] = []
        # Entries out of attempts once their dead holder is charged (SPEC §3), kept started
        # in their batch by adopt: handed out first, as claims the item handler settles as
        # ``abandoned`` -- a record in the sink and a dead letter, no fetch.
        self._abandoned: list[tuple[_Batch, int]] = []
        self._wake = threading.Event()
        self._ingress_event = threading.Event()
        self._connected = threading.Event()
        if zk.connected:
            self._connected.set()
        self._session = zk.session_id
        self._session_lost = threading.Event()  # kazoo said LOST: every partition is gone
        self._flushing = threading.Lock()  # one checkpoint at a time
        self._want = threading.Event()  # settles or unmarks wait for a checkpoint
        self._mark_now = threading.Event()  # marks wait for one: within MARK_S
        self._mark_soon = threading.Event()  # ... or sooner: a pool thread is idle
        self._mark_by = math.inf  # ... or by the first start a mark was asked for, less
        # MARK_WRITE_S (under _lock)
        self._mark_wake = threading.Event()  # the moment the marks go moved nearer
        self._stopping = threading.Event()
        ownership.figures = self.host_figures
        zk.add_listener(self._on_state)
        self._flusher = threading.Thread(target=self._flush_loop, name="checkpoint",
                                         daemon=True)
        self._flusher.start()
        self._mover = threading.Thread(target=self._move_loop, name="ingress", daemon=True)
        self._mover.start()

    # -- kazoo's thread ------------------------------------------------------------------
    def _on_state(self, state: str) -> bool:
        if state == ZkState.LOST:
            self._session_lost.set()
        if state == ZkState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        self._wake.set()
        return False

    def _watch_part(self, p: int) -> Callable[[object], None]:
        def changed(_event: object) -> None:
            part = self._parts.get(p)
            if part is not None:
                part.dirty = True  # listed again at the next claim
            self._wake.set()
        return changed

    def _owner_gone(self, _event: object) -> None:
        """An owner node another session held changed (deleted): ask again now."""
        self._asked.clear()
        self._wake.set()

    def _on_ingress(self, _event: object) -> None:
        self._ingress_event.set()

    # -- the claim loop ------------------------------------------------------------------
    def claim(self, max_items: int = 1, timeout: float | None = None) -> list[Claimed]:
        """Up to ``max_items`` items of owned partitions, unmarked (:meth:`mark` marks the
        ones that start); waits up to ``timeout`` for some (bounded waits on a watch, never
        a busy loop)."""
        deadline = time.monotonic() + (timeout or 0.0)
        while True:
            if not self._connected.is_set():
                # ZooKeeper away: no read or mark could be answered, and each would hold the
                # claim loop (its stats, its progress line) until --zk-timeout. Wait for it.
                self._connected.wait(max(0.0, deadline - time.monotonic()))
                if not self._connected.is_set():
                    return []
            self._wake.clear()
            tried = time.monotonic()
            try:
                self._sync()
                got = self._take(max_items)
            except (ConnectionLoss, SessionExpiredError, KazooException):
                got = []
            if got or time.monotonic() >= deadline:
                return got
            now = time.monotonic()
            self._wake.wait(max(0.0, min(deadline - now, 0.5, self.next_ready() - now)))
            # Tasks end hundreds of times a second, each waking this loop (room_freed): a
            # look at most every ROOM_S, and one pick covers every host that got room
            # meanwhile (a rate limit, not a synchronisation; bounded by the deadline).
            self._stopping.wait(max(0.0, min(ROOM_S - (time.monotonic() - tried),
                                             deadline - time.monotonic())))

    def room_freed(self) -> None:
        """A task left the pool, so its host has room for another item: a claim waiting
        for one looks again within ROOM_S (it waited for its next tick: up to 0.5 s, which
        at a 1 s gap left a host idle half the time -- bench hosts, 2,500 hosts). Set only
        when clear: every task's end asked for the event's lock, among the pool's threads,
        for a flag the claim loop had not cleared yet (it clears it before it looks, so a
        room freed before the clear is seen by that look)."""
        if not self._wake.is_set():
            self._wake.set()

    def _sync(self) -> None:
        """Sessions, ownership (take what is ours, let go of what is not), listings, the
        ingress."""
        if self._session_lost.is_set() or self._session is None:
            # Only a LOST session (kazoo's state, not a transient id while reconnecting: the
            # same session comes back after a leader's election) gives the partitions up.
            self._session_lost.clear()
            self._drop_all("session")
            self._session = self.zk.session_id
        owned = self.ownership.owned()
        now = time.monotonic()
        with self._lock:
            for p, part in self._parts.items():
                if p not in owned:
                    part.leaving = True
            done = [(p, part) for p, part in self._parts.items()
                    if part.leaving and not part.in_flight()]
        if done:
            self._let_go(done)
        wanted = [p for p in sorted(owned)
                  if p not in self._parts and now - self._asked.get(p, -RETAKE_S) >= RETAKE_S]
        if len(wanted) > TAKES_PER_ROUND:  # bounded a round: the claim hands out meanwhile
            wanted = wanted[:TAKES_PER_ROUND]
            self._wake.set()  # more to take: the next round comes at once
        if wanted:
            self._take_wanted(wanted, now)
        if now - self._swept >= SWEEP_S:
            self._swept = now
            self._sweep(owned)
            for p in [p for p in self._held_since if p not in owned]:  # no longer ours
                self._held_since.pop(p, None)
                self._held_warned.discard(p)
        fresh = [part for part in list(self._parts.values())
                 if not part.leaving and not part.listed and part.dirty]
        if len(fresh) > 1:
            self._probe(fresh, now)
        due = [part for part in list(self._parts.values())
               if not part.leaving and (part.dirty or now - part.listed >= RELIST_S)]
        if len(due) > PER_ROUND:
            due = due[:PER_ROUND]
            self._wake.set()  # more to list: the next round comes at once
        if due:
            self._list(due, now)

    def _take_wanted(self, wanted: list[int], now: float) -> None:
        """Take the partitions ours and not held. A take ZooKeeper refuses (an ACL on a
        partition, a node edited by hand) is asked again after RETAKE_S -- it must not stop
        the round before the listings of the partitions already held (a take that failed on
        every round once stalled every partition: tests/test_partition_deleted.py)."""
        try:
            taken = self.pq.take_many(wanted, watch=self._owner_gone)
        except (ConnectionLoss, SessionExpiredError):
            raise
        except KazooException as exc:
            for p in wanted:
                self._asked[p] = now
            log.warning("partition.take_failed", consumer=self.consumer_id,
                        partitions=wanted[:20], count=len(wanted), error=repr(exc)[:300],
                        note=f"asked again in {RETAKE_S:g} s")
            return
        for p, got in taken.items():
            self._took(p, got, now)

    def _sweep(self, owned: frozenset[int]) -> None:
        """Defence in depth: delete any owner node this session holds of a partition it
        neither owns nor holds in memory. None should exist; one did, when a release's answer
        was lost (tests/faults/test_owner_faults.py, the leader killed during a rebalance), and
        its partition's items waited for as long as this consumer lived. Its next owner's
        watch fires on the delete."""
        with self._lock:
            others = [p for p in range(self.ownership.partitions)
                      if p not in owned and p not in self._parts]
        try:
            found = self.pq.forgotten_owners(others)
            dropped = [p for p, version in found if self.pq.drop_owner(p, version)]
        except (ConnectionLoss, SessionExpiredError, KazooException):
            return  # no answer: the next sweep
        if dropped:
            log.warning("partition.stale_owner_released", consumer=self.consumer_id,
                        partitions=dropped[:20], count=len(dropped),
                        note="this consumer held the owner node of partitions it does not "
                             "own: deleted, so their owners take them")

    def _probe(self, fresh: list[_Part], now: float) -> None:
        """Partitions never listed (a start, a gain): one pipelined listing sets their watches
        and tells the empty ones, which need no read, from those the rounds read
        (:data:`PER_ROUND` a round: at 8 a round and 20 ms apart, a consumer starting on 256
        partitions had listed them all only 0.6 s later, and a producer's first items could
        wait that long -- bench e2e)."""
        for part in fresh:
            part.dirty = False  # before the listing: a watch that fires meanwhile sets it again
        try:
            found = self.pq.probe_many([part.owned.partition for part in fresh],
                                       self._watch_part)
        except (ConnectionLoss, SessionExpiredError, KazooException):
            found = {}
        for part in fresh:
            if found.get(part.owned.partition) is False:
                part.listed = now
            else:
                part.dirty = True  # batches to read, or no answer: the rounds list it

    def _took(self, p: int, owned: Owned | None, now: float) -> None:
        if owned is None:
            self._asked[p] = now
            if now - self._held_since.setdefault(p, now) >= HELD_WARN_S:
                self._warn_held(p, now - self._held_since[p])
            return
        self._asked.pop(p, None)
        self._held_since.pop(p, None)
        self._held_warned.discard(p)
        state = owned.state
        if state.error is not None or state.dropped:
            log.warning("partition.state_ignored", consumer=self.consumer_id, partition=p,
                        reason=state.error or f"{state.dropped} entries that are no hold",
                        kept=len(state.holds),
                        note="the host state of the partition node is not to be trusted: "
                             "its hosts start one gap after the take")
        self.ownership.taken(p, time.monotonic(), state, first=owned.epoch == 1)
        with self._lock:
            self._parts[p] = _Part(owned, holds={h.host: h for h in state.holds})
        # One line per partition would flood a start (256 at once: ownership.changed says
        # gained=N); a take that inherits holds (a back-off in force) is worth an info line.
        (log.info if state.holds else log.debug)(
            "partition.taken", consumer=self.consumer_id, partition=p, epoch=owned.epoch,
            holds=len(state.holds))

    def _warn_held(self, p: int, held_s: float) -> None:
        """Once per partition (until it is taken): its owner node is not ours and has not
        gone for :data:`HELD_WARN_S` -- who holds it (the name is untrusted: shown cleaned) and
        what to do."""
        if p in self._held_warned:
            return
        self._held_warned.add(p)
        try:
            name, session = self.pq.owner(p)
        except (ConnectionLoss, SessionExpiredError, KazooException):
            name, session = None, None
        log.warning("partition.owner_held", consumer=self.consumer_id, partition=p,
                    owner=printable(name, 128) if name is not None else None,
                    session=f"0x{session:x}" if session else "none (a persistent node)",
                    held_s=round(held_s, 1),
                    note="this consumer owns the partition by the member list, but another "
                         "session holds its owner node (a consumer cut off from the others, "
                         "or a node another client wrote): nobody crawls its items while it "
                         "stays. See who wrote it (zkCli: stat <root>/partitions/<p>/owner) "
                         "and delete it; this consumer takes the partition at once then")

    def _let_go(self, done: list[tuple[int, _Part]]) -> None:
        """Nothing of these partitions in flight: clear the marks of items given back (else
        their next owners would charge them a death) and write their host state where it
        changed (the next owners' holds) -- one checkpoint for all -- then delete their
        owner nodes (a few transactions: :meth:`PartitionQueue.release_many`)."""
        try:
            if any(any(b.unstart for b in part.batches.values()) or part.touched
                   or part.state_gen != part.written_gen for _p, part in done):
                self._flush()
        except (QueueSuspended, ConnectionLoss, SessionExpiredError, KazooException):
            return  # no answer: tried again at the next round (or gone with the session)
        with self._lock:  # out of the checkpoints' sight before their owner nodes go
            for p, _part in done:
                self._parts.pop(p, None)
        try:
            self.pq.release_many([part.owned for _p, part in done])
        except (QueueSuspended, ConnectionLoss, SessionExpiredError, KazooException):
            # No answer: put back (leaving, nothing in flight) for the next round to try again.
            # Forgotten here once, an owner node whose delete a leader's death cut off stayed
            # with this live session, and its next owner waited for ever (tests/faults/
            # test_owner_faults.py, the leader killed during a rebalance).
            with self._lock:
                for p, part in done:
                    self._parts.setdefault(p, part)
            return
        log.debug("partition.released", consumer=self.consumer_id,
                  partitions=[p for p, _part in done])

    def _move_loop(self) -> None:
        """The owner of partition 0 moves the ingress into the partitions, as fast as it
        fills (a thread of its own: the claim loop's pace must not set the producers')."""
        names: list[str] = []
        while not self._stopping.is_set():
            if 0 not in self._parts or not self._connected.is_set():
                self._ingress_event.wait(1.0)
                self._ingress_event.clear()
                names = []
                continue
            try:
                if not names:
                    self._ingress_event.clear()
                    names = self.pq.ingress_names(watch=self._on_ingress)
                    if not names:
                        self._ingress_event.wait(1.0)
                        continue
                moved, dead = self.pq.move_ingress(INGRESS_MOVE, names=names)
                if not (moved + dead):
                    names = []  # raced (another mover) or the listing was stale: list again
                    continue
                names = names[self.pq.ingress_consumed:]
            except (ConnectionLoss, SessionExpiredError, KazooException):
                names = []
                self._connected.wait(1.0)
            except Exception:  # never let the mover die: the ingress would stop
                log.exception("partition.move_failed", consumer=self.consumer_id)
                names = []
                self._stopping.wait(1.0)

    def _list(self, parts: list[_Part], now: float) -> None:
        """Read the new batches of ``parts`` (one pipelined read for all): each becomes a
        :class:`_Batch` to pick from. A partition whose listing got no answer is listed
        again next round; one fenced is given up."""
        for part in parts:
            part.dirty, part.listed = False, now  # before: a watch firing meanwhile sets it
        try:
            reads = self.pq.read_many([(part.owned, frozenset(part.batches))
                                       for part in parts], self._watch_part)
        except Exception:
            for part in parts:
                part.dirty = True  # no answer: listed again next round
            raise
        for part in parts:
            read = reads[part.owned.partition]
            if isinstance(read, Fenced):
                self._fence(part.owned.partition)
            elif isinstance(read, Exception):
                part.dirty = True  # no answer (ZooKeeper away, a dead letter not written)
            else:
                try:
                    self._adopt(part, read.batches)
                except Fenced:
                    self._fence(part.owned.partition)

    def _adopt(self, part: _Part, nodes: list[BatchNode]) -> None:
        """A partition's batches read: adopted (a dead holder's items charged), each a
        :class:`_Batch` to pick from."""
        for node in nodes:
            node2 = self.pq.adopt(part.owned, node, keep_abandoned=True)
            if node2 is None:
                continue
            abandoned = self.pq.abandoned_here(node2)
            b = _Batch(part.owned.partition, node2, item_codec.parse_seq(node2.name) or 0,
                       time.time())
            b.queued = [i for i in node2.batch.pending if i not in node2.batch.started]
            b.hosts = [host_key(it.url) if it is not None else ""
                       for it in node2.batch.items]
            with self._lock:
                part.batches[node2.name] = b
                self._abandoned.extend((b, i) for i in abandoned)

    def _take(self, n: int) -> list[Claimed]:
        """Up to ``n`` queued items, handed out unmarked -- no write: the ones
        that start are marked then (:meth:`mark`). Abandoned entries first (marked by their
        dead holder). At-most-once: deleted from their batch first (SPEC §3), one
        checkpoint for all (:meth:`_flush`), shared with the settles waiting for it."""
        given = self._hand_abandoned(n)
        if given:
            return given
        if self._once:
            return self._take_once(n)
        with self._lock:  # one hold: no checkpoint sees the picks among the marks
            out: list[Claimed] = []
            for b, chosen in self._pick(n):
                out.extend(self._hand(b, chosen))
            return out

    def _take_once(self, n: int) -> list[Claimed]:
        picks = self._pick(n)
        if not picks:
            return []
        try:
            self._flush()
        except QueueSuspended:
            pass  # the deletes wait in want_done: handed out once written
        out: list[Claimed] = []
        with self._lock:
            for b, chosen in picks:
                taken = [i for i in chosen if i not in b.want_done]
                unwritten = [i for i in chosen if i in b.want_done]
                b.want_done.difference_update(unwritten)
                out.extend(self._hand(b, taken))
                if unwritten and b.p in self._parts:  # not written (yet): claimable again
                    b.queued = sorted({*b.queued, *unwritten})
        return out

    def mark(self, c: Claimed, by: float | None = None) -> bool:
        """``c`` is admitted to start: its mark must be durable before its request (a page
        that kills its consumers is charged each time). True: nothing to write -- marked
        already (an abandoned entry, or given back after its mark and claimed again), or
        at-most-once (it left its batch at the take): start it now. False: marked with the
        next checkpoint, within MARK_S -- or, ``by`` given (the monotonic time it is to
        start), MARK_WRITE_S before ``by`` if that is sooner; :attr:`on_marked` gets it once
        written. An item no longer held here (its partition lost) is given up again through
        :meth:`drain_lost`: never started."""
        if self._once:
            return True
        i = self._index(c)
        lost: list[Claimed] = []
        with self._lock:
            for (_part, b), _cs in self._by_batch([c], lost).items():
                if i in b.node.batch.started and i not in b.unstart:
                    return True
                b.unstart.discard(i)
                b.want_start.add(i)
            self._lost.extend(lost)
            if by is not None and by - MARK_WRITE_S < self._mark_by:
                self._mark_by = by - MARK_WRITE_S
                self._mark_wake.set()
        # set only when clear (an item each: Event.set takes the event's lock among the
        # pool threads); the checkpoint thread clears both before it reads the wants
        if not self._mark_now.is_set():
            self._mark_now.set()
        if not self._want.is_set():
            self._want.set()
        return False

    def mark_soon(self) -> None:
        """A pool thread found nothing to take while marks wait (the backlog's
        ``starved``): the next checkpoint goes now, at most MARK_MIN_S after the last."""
        if self._mark_now.is_set() and not self._mark_soon.is_set():
            self._mark_soon.set()
            self._mark_wake.set()

    def _hand_abandoned(self, n: int) -> list[Claimed]:
        """Up to ``n`` kept abandoned entries of batches still ours, each a claim that
        counts the dead holder (``deaths=1``: :meth:`Claimed.abandoned`)."""
        out: list[Claimed] = []
        with self._lock:
            while self._abandoned and len(out) < n:
                b, i = self._abandoned.pop(0)
                part = self._parts.get(b.p)
                if part is None or part.leaving or part.batches.get(b.node.name) is not b \
                        or i in b.handed:
                    continue  # not ours any more: its next owner charges it again
                [c] = self._hand(b, [i])
                out.append(replace(c, deaths=1))
                if not self._once:
                    b.handed[i] = out[-1]
        return out

    def _pick(self, n: int) -> list[tuple[_Batch, list[int]]]:
        """Up to ``n`` queued items, oldest offer first across every owned partition (so
        hosts advance evenly, as in the order they were offered), a host no more than it
        has room for. Ties (a producer stamps a whole offer at once) go to the older batch,
        and a batch yields as many as it has in turn: the items in flight stay in as few
        batches as the order allows, and each checkpoint rewrites few batch nodes (16 per
        batch and per claim spread one host's 272 in flight over 9 batches of 60 KB: half
        a megabyte a checkpoint). A batch is read past the items of at most PICK_PER_BATCH
        hosts that have no room (each such host counts once, however many items it has:
        one big host's run never hides another host's items behind it). At-most-once: the
        chosen go to ``want_done`` (deleted on the take, SPEC §3).

        A host has room when it holds fewer than its cap in the worker *and* its next
        request could start within READY_AHEAD_S (:class:`HostCap`'s ``ready_at``): a host
        in its gap or its back-off keeps its items here, where they take no place in the
        worker's table, and the host waits in a heap of next-contact times (Mercator's).

        A batch whose items read (up to PICK_PER_BATCH full hosts) all had hosts without room is
        *stalled*: it would yield nothing again, and is not read, until one of those hosts
        may have room -- its load went down (the backlog's ``take_freed``), its time came
        (the heap), or a claim picked from it (its pick may have been given back) -- or its
        queue changed."""
        freed: set[str] = set()
        ready: Callable[[str], float] | None = None
        if self.host_cap is None:
            cap, load = 0, None  # no cap: every host has room
        else:
            cap, load, take_freed, ready = self.host_cap
            freed = take_freed()
        horizon = self._clock() + READY_AHEAD_S
        picked: dict[str, int] = {}  # items picked in this claim, per host
        # hosts found full: they stay full for the rest of the claim (a pick only takes room)
        full: set[str] = set()
        with self._lock:
            freed.update(self._woken(horizon))
            stalled = self._stalled
            if stalled:
                freed.update(self._picked_last)
                for host in freed:
                    for b in stalled.pop(host, ()):
                        b.stall = None
                if (now := time.monotonic()) - self._stalled_at >= RELIST_S:
                    self._stalled_at = now
                    self._restall()  # forget the batches that are not ours any more
                    stalled = self._stalled
            # a k-way merge of the batches' queued items, by (offered, partition, batch)
            heads: list[tuple[float, int, int, int, _Batch]] = []
            for part in self._parts.values():
                if part.leaving:
                    continue
                for b in part.batches.values():
                    if b.queued and (b.stall is None or b.stall[0] is not b.queued
                                     or b.stall[1] != len(b.queued)):
                        heads.append((self._offered_of(b)[b.queued[0]], b.p, b.seq, 0, b))
            heapq.heapify(heads)
            chosen: dict[_Batch, list[int]] = {}
            refused: dict[_Batch, int] = {}
            left = n
            while heads and left > 0:
                _, p, seq, pos, b = heads[0]
                queued, hosts = b.queued, b.hosts
                i = queued[pos]
                host = hosts[i]
                if load is None or not host or (
                        host not in full and cap - load.get(host, 0) - picked.get(host, 0) > 0
                        and (ready is None or host in picked
                             or self._ready(host, ready, horizon))):
                    chosen.setdefault(b, []).append(i)
                    left -= 1
                    pos += 1
                    if load is not None and host:
                        picked[host] = picked.get(host, 0) + 1
                else:
                    # A host found full counts once towards the batch's PICK_PER_BATCH, its
                    # later items none: one big host's run of items never hides another
                    # host's behind it (bench skew: a small host in the big one's
                    # partition waited for hundreds of its items to go, at its gap).
                    r = refused.get(b, 0) + (host not in full)
                    full.add(host)
                    # The batch's next items whose hosts are full now would be refused at
                    # their turn too: read past them here, without a trip through the heap
                    # each (at 2,500 hosts, every host at its cap, a claim refused ~2,000)
                    # -- as long as the merge would take them next anyway (the key of the
                    # other batches' first in line is not smaller: a batch's offer times
                    # need not grow with its index).
                    limit = None
                    if len(heads) > 1:
                        nxt = heads[1] if len(heads) == 2 or heads[1] < heads[2] else heads[2]
                        limit = (nxt[0], nxt[1], nxt[2])
                    offered = b.offered
                    pos += 1
                    while pos < len(queued) and r < PICK_PER_BATCH:
                        i = queued[pos]
                        if limit is not None and (offered[i], p, seq) > limit:
                            break
                        host = hosts[i]
                        if host not in full:
                            if not host or (
                                    cap - load.get(host, 0) - picked.get(host, 0) > 0
                                    and (ready is None or host in picked
                                         or self._ready(host, ready, horizon))):
                                break
                            full.add(host)
                            r += 1
                        pos += 1
                    refused[b] = r
                if pos < len(queued) and refused.get(b, 0) < PICK_PER_BATCH:
                    heapq.heapreplace(heads, (b.offered[queued[pos]], p, seq, pos, b))
                else:
                    heapq.heappop(heads)
                    if load is not None and b not in chosen:  # all it was read for refused
                        b.stall = (queued, len(queued), {hosts[i] for i in queued[:pos]})
                        for host in b.stall[2]:
                            stalled.setdefault(host, set()).add(b)
            self._picked_last = list(picked)
            for b, idx in chosen.items():
                gone = set(idx)
                b.queued = [i for i in b.queued if i not in gone]
                if self._once:
                    b.want_done |= gone
            return list(chosen.items())

    def _ready(self, host: str, ready_at: Callable[[str], float], horizon: float) -> bool:
        """Whether ``host``'s next request could start by ``horizon``; if not, it is kept
        in the heap of next-contact times (under the lock: the claim loop's)."""
        at = ready_at(host)
        if at <= horizon:
            return True
        if at < self._wake_at.get(host, math.inf):
            self._wake_at[host] = at
            heapq.heappush(self._waking, (at, host))
        return False

    def _woken(self, horizon: float) -> list[str]:
        """The hosts of the heap whose time comes by ``horizon``, out of it (under the lock)."""
        waking, out = self._waking, []
        while waking and waking[0][0] <= horizon:
            at, host = heapq.heappop(waking)
            if self._wake_at.get(host) == at:
                del self._wake_at[host]
                out.append(host)
        return out

    def next_ready(self) -> float:
        """The monotonic time the heap's first host becomes ready, less READY_AHEAD_S
        (``inf``: none waits): when a claim finding nothing looks again at the latest. The
        claim loop's own call, without the lock (only its picks change the heap): a
        checkpoint holding the lock through its write must not hold the claim's wait."""
        waking = self._waking
        return waking[0][0] - READY_AHEAD_S if waking else math.inf

    def _restall(self) -> None:
        """The stalled batches' index again from the batches held (a lost partition's
        batches leave it here)."""
        self._stalled = {}
        for part in self._parts.values():
            for b in part.batches.values():
                if b.stall is not None:
                    for host in b.stall[2]:
                        self._stalled.setdefault(host, set()).add(b)

    @staticmethod
    def _offered_of(b: _Batch) -> list[float]:
        """Per item of ``b``, the time it was offered (the merge's key): made once per
        batch's items (a progressed copy of the node shares them)."""
        items = b.node.batch.items
        if b.offered_items is not items:
            b.offered = [(item.enqueued_at or b.ctime) if item is not None else b.ctime
                         for item in items]
            b.offered_items = items
        return b.offered

    def _hand(self, b: _Batch, chosen: list[int]) -> list[Claimed]:
        out: list[Claimed] = []
        for i in chosen:
            item = b.node.batch.items[i]
            assert item is not None
            c = _Claim(name=self._name(b, i), seq=b.seq * 1000 + i, data=b"",
                       item=item, error=None, ctime=item.enqueued_at or b.ctime,
                       session=self._session)
            c.lazy(item)
            if not self._once:  # at-most-once: settled already, nothing held
                b.handed[i] = c
            out.append(c)
        return out

    @staticmethod
    def _name(b: _Batch, i: int) -> str:
        return f"{b.p}/{b.node.name}/{i}"

    # -- checkpoints -----------------------------------------------------------------------
    def _flush_loop(self) -> None:
        """One checkpoint at a time, carrying everything that waits: within MARK_S of a
        mark (an item waits for it to start), by the time a mark asked with its start
        needs it (:meth:`mark`'s ``by``), sooner when a pool thread is idle -- at most one
        per MARK_MIN_S, at once when the previous checkpoint's answer came later than that
        -- else within FLUSH_S of a settle or an unmark."""
        last = 0.0
        while not self._stopping.is_set():
            self._want.wait(1.0)
            if not self._want.is_set():
                continue
            # settles alone wait for company; a mark cuts that short
            if self._mark_now.wait(FLUSH_S):
                self._until_marks_go(last)
            if self._stopping.is_set():
                return
            self._want.clear()
            self._mark_now.clear()
            self._mark_soon.clear()
            with self._lock:  # the marks read from here on are this checkpoint's
                self._mark_by = math.inf
            last = time.monotonic()
            try:
                self._flush()
            except QueueSuspended:
                self._wanted_again()  # kept: tried again once connected
                self._connected.wait(1.0)
            except Exception:  # never let the checkpointer die: settles would stop
                log.exception("partition.checkpoint_failed", consumer=self.consumer_id)
                self._wanted_again()
                self._stopping.wait(1.0)

    def _until_marks_go(self, last: float) -> None:
        """Wait until the marks waiting go (``last``: the previous checkpoint's start):
        MARK_S after it, or by the first start a mark was asked for (less MARK_WRITE_S),
        or -- a pool thread idle -- now; never sooner than MARK_MIN_S after it."""
        while not self._stopping.is_set():
            self._mark_wake.clear()  # then read: a nearer moment set after it wakes us
            go = last + MARK_MIN_S if self._mark_soon.is_set() else \
                min(last + MARK_S, self._mark_by)
            left = max(go, last + MARK_MIN_S) - time.monotonic()
            if left <= 0:
                return
            self._mark_wake.wait(left)

    def _wanted_again(self) -> None:
        """A checkpoint that did not go through: what it carried waits for the next one."""
        self._want.set()
        with self._lock:
            if any(b.want_start for part in self._parts.values()
                   for b in part.batches.values()):
                self._mark_now.set()

    def _flush(self) -> None:
        """Write every batch's wants in one checkpoint (as few transactions as fit);
        QueueSuspended when the answer was lost (the wants stay, the batches are read again
        before the next one), also when such a batch could not be read now (the rest is
        written; that batch waits for the next checkpoint, which must come even if nothing
        else asks for one). The items whose marks it wrote (or found written) go to
        :attr:`on_marked`."""
        marked: list[Claimed] = []
        try:
            with self._flushing:
                changes, batches, unread = self._changes(marked)
                states = self._states()
                if not changes and not states:
                    if unread:
                        raise QueueSuspended(f"{unread} batches not read again: held")
                    return
                try:
                    res = self.pq.checkpoint(changes,
                                             {p: (o, d) for p, (o, d, _) in states.items()})
                except (ConnectionLoss, SessionExpiredError, KazooException):
                    with self._lock:
                        for b in batches:
                            b.unsure = True
                    raise QueueSuspended("checkpoint answer lost: held") from None
                marked += self._apply(changes, batches, res)
                self._states_applied(states, res)
                if unread:
                    raise QueueSuspended(f"{unread} batches not read again: held")
        finally:
            if marked and self.on_marked is not None:
                self.on_marked(marked)

    def _states(self) -> dict[int, tuple[Owned, bytes, int]]:
        """The partitions whose host state changed since it was last written: partition ->
        (owned, data, generation). The hosts of items settled since are looked up first."""
        out: dict[int, tuple[Owned, bytes, int]] = {}
        wall = time.time()
        with self._lock:
            for p, part in self._parts.items():
                if part.touched:
                    self._look_up(part, wall)
                if part.state_gen != part.written_gen:
                    part.holds = {h.host: h for h in ps.in_force(part.holds.values(), wall)}
                    out[p] = (part.owned, ps.encode(part.holds.values(), wall), part.state_gen)
        return out

    def _look_up(self, part: _Part, wall: float) -> None:
        """Fold the politeness of ``part.touched`` into ``part.holds``: a hold that is new,
        longer (past a rounding) or of another gap is a change (written with the next
        checkpoint); expired holds go as they are met."""
        changed = False
        for host in part.touched:
            if not host:
                continue
            new = self.ownership.hold(host)
            old = part.holds.get(host)
            if old is not None and old.until <= wall and not old.delay:
                del part.holds[host]
                old = None
            if new is None:
                continue
            if old is not None:
                until = max(new.until, old.until)
                new = ps.Hold(host, until, new.delay,
                              new.reason if new.until >= old.until else old.reason)
                if until <= old.until + 0.05 and new.delay == old.delay:
                    continue
            part.holds[host] = new
            changed = True
        part.touched.clear()
        if changed:
            part.state_gen += 1

    def _states_applied(self, states: dict[int, tuple[Owned, bytes, int]],
                        res: Checkpointed) -> None:
        with self._lock:
            for p in res.states:
                part = self._parts.get(p)
                if part is not None and p in states:
                    part.written_gen = max(part.written_gen, states[p][2])

    def host_figures(self) -> dict[int, tuple[int, int]]:
        """Per owned partition: its active hosts (with items not done in this consumer's
        batches) and its backed-off hosts (a Retry-After or down-host back-off in force,
        kept for a hand-over). O(items held): for the status node, every few seconds."""
        wall = time.time()
        out: dict[int, tuple[int, int]] = {}
        with self._lock:
            for p, part in self._parts.items():
                active: set[str] = set()
                for b in part.batches.values():
                    hosts = b.hosts
                    active.update(hosts[i] for i in b.queued)
                    active.update(hosts[i] for i in b.handed)
                active.discard("")
                backed = sum(1 for h in part.holds.values() if h.until > wall)
                out[p] = (len(active), backed)
        return out

    def _changes(self, marked: list[Claimed]) -> tuple[list[Change], list[_Batch], int]:
        """What the next checkpoint writes, batch by batch, and how many batches whose last
        answer was lost could not be read again now (left out: tried at the next)."""
        unread = 0
        with self._lock:
            todo = [(part, b) for part in self._parts.values() for b in part.batches.values()
                    if b.wants() or b.unsure]
        changes: list[Change] = []
        batches: list[_Batch] = []
        for part, b in todo:
            if b.unsure and not self._reconcile(part, b, marked):
                unread += 1
                continue
            with self._lock:
                if not b.wants():
                    continue
                changes.append(Change(part.owned, b.node, frozenset(b.want_start),
                                      frozenset(b.want_done), frozenset(b.unstart),
                                      [b.want_retry[i] for i in sorted(b.want_retry)],
                                      [b.want_dead[i] for i in sorted(b.want_dead)]))
                batches.append(b)
        return changes, batches, unread

    def _apply(self, changes: list[Change], batches: list[_Batch], res: Checkpointed
               ) -> list[Claimed]:
        """Fold a checkpoint's outcome into the batches; returns the items still handed
        out whose marks it wrote."""
        marked: list[Claimed] = []
        with self._lock:
            for k, (ch, b) in enumerate(zip(changes, batches, strict=True)):
                if k in res.stale:
                    b.unsure = True
                    continue
                if k not in res.nodes:
                    continue  # its partition was fenced
                b.want_start -= ch.started
                b.want_done -= ch.done
                b.unstart -= ch.unstarted
                marked.extend(c for i in ch.started if (c := b.handed.get(i)) is not None)
                for i in ch.done:
                    b.want_retry.pop(i, None)
                    b.want_dead.pop(i, None)
                node = res.nodes[k]
                part = self._parts.get(b.p)
                if node is None:
                    if part is not None:
                        part.batches.pop(b.node.name, None)
                    b.node = replace(b.node, batch=b.node.batch.progressed(done=ch.done))
                else:
                    b.node = node
        for p in res.fenced:
            self._fence(p)
        return marked

    def _reconcile(self, part: _Part, b: _Batch, marked: list[Claimed]) -> bool:
        """A batch whose last checkpoint answer was lost: read it; what that checkpoint
        did is not done again (a settle's retry batch is never created twice), and marks
        it did write are reported in ``marked``. False when the read itself failed (tried
        again at the next checkpoint)."""
        try:
            node = self.pq.reread(part.owned, b.node.name)
        except (ConnectionLoss, SessionExpiredError, KazooException):
            return False
        with self._lock:
            b.unsure = False
            if node is None:  # deleted: the checkpoint that finished it had committed
                part.batches.pop(b.node.name, None)
                # (or by hand, under us: items waiting for their marks never start)
                self._lost.extend(c for i in b.want_start if (c := b.handed.get(i)))
                b.want_start.clear()
                b.want_done.clear()
                b.want_retry.clear()
                b.want_dead.clear()
                return True
            b.node = node
            for i in b.want_done & node.batch.done:
                b.want_retry.pop(i, None)
                b.want_dead.pop(i, None)
            b.want_done -= node.batch.done
            written = b.want_start & (node.batch.started | node.batch.done)
            marked.extend(c for i in written if (c := b.handed.get(i)) is not None)
            b.want_start -= written
        return True

    # -- settles ---------------------------------------------------------------------------
    def complete(self, claimed: Sequence[Claimed]) -> CompleteResult:
        """Settle ``claimed`` with the next checkpoint (within FLUSH_S): returned at once.
        An item whose settle a failure overtakes is redone by the partition's next owner
        (a duplicate only of what was in flight)."""
        if self._once:
            return CompleteResult(list(claimed), [])
        lost: list[Claimed] = []
        done: list[Claimed] = []
        with self._lock:
            for (part, b), cs in self._by_batch(claimed, lost).items():
                for c in cs:
                    i = self._index(c)
                    b.handed.pop(i, None)
                    b.want_done.add(i)
                    part.touched.add(b.hosts[i])
                done.extend(cs)
        if not self._want.is_set():  # cleared by the checkpoint thread before it reads
            self._want.set()
        return CompleteResult(done, lost)

    def retry(self, c: Claimed, error: str) -> CompleteResult:
        """Again at the partition's tail with ``attempt + 1`` and the error, in the same
        checkpoint as its settle (a dead letter if it could not fit)."""
        again = retry_item(c, error)
        if again is None:
            return self.dead_letter(c, too_large_to_retry(error))
        return self._settle_one(c, retry=again)

    def dead_letter(self, c: Claimed, error: str) -> CompleteResult:
        return self._settle_one(c, dead=dead_letter_body(c, error))

    def _settle_one(self, c: Claimed, *, retry: Item | None = None,
                    dead: bytes | None = None) -> CompleteResult:
        if self._once:
            return self._settle_taken(c, retry, dead)
        lost: list[Claimed] = []
        with self._lock:
            for (part, b), _cs in self._by_batch([c], lost).items():
                i = self._index(c)
                b.handed.pop(i, None)
                b.want_done.add(i)
                part.touched.add(b.hosts[i])
                if retry is not None:
                    b.want_retry[i] = retry
                if dead is not None:
                    b.want_dead[i] = dead
                self._want.set()
                return CompleteResult([c], [])
        return CompleteResult([], lost)

    def _settle_taken(self, c: Claimed, retry: Item | None, dead: bytes | None
                      ) -> CompleteResult:
        """At-most-once: the item left its batch on the take; a retry is offered again,
        a dead letter created -- one write each, QueueSuspended when its answer is lost."""
        try:
            if retry is not None:
                self.pq.offer([retry])
            if dead is not None:
                self.zk.create(f"{self.pq.layout.dead}/{item_codec.DEAD_PREFIX}", dead,
                               sequence=True)
        except (ConnectionLoss, SessionExpiredError, KazooException):
            raise QueueSuspended("connection lost: outcome held") from None
        return CompleteResult([c], [])

    def release(self, claimed: Sequence[Claimed]) -> None:
        """Give items back: claimable again here. One given back before its start was
        never marked (nothing to write); one given back after (a forced stop, the sink
        down) is unmarked with the next checkpoint (no write of its own). At-most-once:
        offered again (they left their batch on the take)."""
        if self._once:
            items = [c.item for c in claimed if c.item is not None]
            try:
                if items:
                    self.pq.offer(items)
            except (ConnectionLoss, SessionExpiredError, KazooException, ZkCrawlError) as exc:
                log.warning("queue.release_lost", items=len(items), consumer=self.consumer_id,
                            error=repr(exc)[:300],
                            note="at-most-once: items given back and not offered again (ZooKeeper "
                                 "away, or the offer refused) are lost")
            return
        lost: list[Claimed] = []
        with self._lock:
            for (_, b), cs in self._by_batch(claimed, lost).items():
                for c in cs:
                    i = self._index(c)
                    if b.handed.pop(i, None) is not None:
                        if i in b.want_start or i in b.node.batch.started:
                            b.unstart.add(i)  # its mark written, or maybe being written
                        b.want_start.discard(i)
                        b.queued.append(i)
                b.queued.sort()
        self._want.set()

    # -- bookkeeping ---------------------------------------------------------------------
    def _by_batch(self, claimed: Sequence[Claimed], lost: list[Claimed]
                  ) -> dict[tuple[_Part, _Batch], list[Claimed]]:
        out: dict[tuple[_Part, _Batch], list[Claimed]] = {}
        with self._lock:
            for c in claimed:
                p, name, _ = c.name.split("/")
                part = self._parts.get(int(p))
                b = part.batches.get(name) if part is not None else None
                if part is None or b is None or b.handed.get(self._index(c)) is not c:
                    lost.append(c)
                    continue
                out.setdefault((part, b), []).append(c)
        return out

    @staticmethod
    def _index(c: Claimed) -> int:
        return int(c.name.rsplit("/", 1)[1])

    def _fence(self, p: int) -> None:
        """Partition ``p`` is not ours any more: its handed items are lost."""
        with self._lock:
            part = self._parts.pop(p, None)
            if part is None:
                return
            for b in part.batches.values():
                self._lost.extend(b.handed.values())
        log.warning("partition.fenced", consumer=self.consumer_id, partition=p,
                    note="another consumer owns it now: its items here are given up")

    def _drop_all(self, why: str) -> None:
        with self._lock:
            for part in self._parts.values():
                for b in part.batches.values():
                    self._lost.extend(b.handed.values())
            dropped = len(self._parts)
            self._parts.clear()
        if dropped:
            log.warning("partition.dropped_all", consumer=self.consumer_id, partitions=dropped,
                        reason=why)

    def drain_lost(self) -> list[Claimed]:
        with self._lock:
            lost, self._lost = self._lost, []
        return lost

    def depth(self) -> int:
        return self.pq.depth()

    def wait_connected(self, timeout: float | None) -> bool:
        return self._connected.wait(timeout)

    @property
    def held(self) -> int:
        with self._lock:
            return sum(p.in_flight() for p in self._parts.values())

    @property
    def mark_lead(self) -> float:
        """A mark waits at most MARK_S for its checkpoint, then the write: MARK_LEAD_S (none
        at most once: :meth:`mark` writes nothing)."""
        return 0.0 if self._once else MARK_LEAD_S

    def close(self) -> None:
        """The last checkpoint (settles not written yet), then let go of every partition:
        a clean stop hands them over at once. Disconnected, neither can go through: no
        ZooKeeper call is waited out (each would cost --zk-timeout); the partitions go with
        the session and their next owners redo what was settled since the last checkpoint."""
        self._stopping.set()
        self._ingress_event.set()
        self._mark_now.set()
        self._mark_soon.set()
        self._mark_wake.set()
        away = not self._connected.is_set()
        self._flusher.join(0.1 if away else FLUSH_S + 5.0)  # a daemon: mid-call, left to end
        self._mover.join(0.1 if away else 5.0)
        self.zk.remove_listener(self._on_state)
        if away or not self._connected.is_set():
            log.warning("partition.checkpoint_lost", consumer=self.consumer_id,
                        note="ZooKeeper unreachable: the next owners redo what was settled "
                             "since the last checkpoint (duplicates, none lost)")
            return
        with self._lock:  # the pool has stopped: items still waiting for a mark never start
            for part in self._parts.values():
                for b in part.batches.values():
                    b.want_start.clear()
        try:
            self._flush()
        except QueueSuspended:
            log.warning("partition.checkpoint_lost", consumer=self.consumer_id,
                        note="ZooKeeper unreachable: the next owners redo what was settled "
                             "since the last checkpoint (duplicates, none lost)")
        with self._lock:
            parts = list(self._parts.items())
            self._parts.clear()
        try:
            released = self.pq.release_many([part.owned for _p, part in parts])
        except (ConnectionLoss, SessionExpiredError, KazooException):
            return  # they go with the session
        log.debug("partition.released", consumer=self.consumer_id,
                  partitions=sum(released.values()))
