"""The ZooKeeper queue with leases: the layout before partitions, kept for what still uses it
-- the ingress ``<root>/queue`` (offers of any client, which consumers move into partitions),
the producer's offer window, and the benchmarks' baseline (``bench queue``, ``bench
frontier``). Consumers claim from their partitions (:mod:`consumer.owned_queue`), not here.

Layout (SPEC §2)::

    <root>/queue/qn-NNNNNNNNNN   persistent sequential   the item (JSON, or a bare URL)
    <root>/leases/qn-NNNNNNNNNN  ephemeral               {"consumer": id, "claimed_at": t}
    <root>/dead/dl-NNNNNNNNNN    persistent sequential   an item that will not pass
    <root>/offers/<token>        ephemeral               protected-create marker of a batch

Guarantees
----------
* **At-least-once** (default). An item is *claimed* by creating its ephemeral lease
  (leases of a batch in one transaction) and reading the item right behind it: an item
  that is gone by then (completed by its last holder) drops its lease at once. It is
  *completed* by deleting item and lease in one transaction, which the caller does
  only after the result is durable. No item is ever lost: if the holder dies, is killed
  or loses its session, its leases vanish with the session and the items are claimable
  again at once.
  Duplicates can only come from items in flight at such a failure.
* **At-most-once** (``delivery="at-most-once"``): the seed's behaviour, delete on take.
  Faster; an item in flight when the process dies is lost.
* **Offers** go in transactions of up to ``offer_batch`` items (well under the 1 MB
  request limit), protected against double insert on retry: see :mod:`zkcrawl.queue.offers`.
* **Takes are O(1) amortised**: the children are listed once, sorted (wrap-safe), and
  claimed from the cached list -- leases created ``claim_batch`` per transaction (a batch
  that meets a taken item drops it and retries, then falls back to single creates), the
  batch's data read with one multiRead. The queue is re-listed only when the cached list is used up.
  When nothing is claimable the caller blocks on children watches (queue and leases),
  never in a polling loop.
* **Skipping**: :attr:`LeaseQueue.skip`, when set, names items the caller does not want now
  (the consumer's per-host caps, :mod:`consumer.parking`): they are left out of the cached
  list and of every claim, unleased, for anyone else to take, and listed again next time.
* **Fair sharing**: with ``n`` live consumers (``<root>/consumers``) consumer ``i`` first
  walks the items whose ``seq % n == i``, then steals the others from their tail, so
  consumers do not all fight for the head of the list.

Counting claims (a holder's death is an attempt, SPEC §3)
---------------------------------------------------------
Each lease transaction also writes a record of the items it leases, with an ephemeral
twin (:mod:`zkcrawl.queue.claimlog`); a relist reaps the records whose twin died with their
holder's session, raising each surviving item's ``cversion`` by 2 *before* the listing is
used to claim. So every claim reads, in the item's stat, how many of its holders died:
:attr:`Claimed.deaths`; :attr:`Claimed.attempt` adds that to the item's own ``attempt``,
and a retry carries the sum into the re-offered item. Nothing is parsed for it: Curator's
bare-URL items are counted too. Cost: measured by ``zkcrawl bench queue`` against the same
drain without it (docs/benchmarks.md).

Why leases beat a timeout-based repair
--------------------------------------
The MongoDB queue in the seeds marks a job "processing" and repairs "stalled" jobs after
a timeout: a slow job is duplicated, a dead worker's job waits for the timer. Here the
lease is tied to the holder's ZooKeeper session: it vanishes exactly when the holder is
gone (session expiry, ``session_timeout`` after the last heartbeat), and never while a
slow but live holder works on it. No timer to tune, no clock to trust.

What a LOST session means for items in flight
---------------------------------------------
When the session expires, every lease this process held is already gone on the server
and other consumers may be working on those items. The queue forgets them (their
completion would race the new holder) and reports them through :meth:`drain_lost`; work
already written for them stays written, so such items may appear twice in the results
-- the documented at-least-once duplicate. The client carries on with a new session.
Kazoo callbacks only set flags here: they never block.

Every wait on ZooKeeper is bounded by ``--zk-timeout``
------------------------------------------------------
kazoo keeps a request made while disconnected until it reconnects, and a frozen server
answers nothing until it resumes: an unbounded wait could hang a claim, a completion or a
release for as long as the ensemble is away (and a SIGTERM with it). So every synchronous
call and every pipelined wait here (:func:`~zkcrawl.zk.client.gather` with a timeout) gives
up after ``--zk-timeout``. What a wait cut short means is decided per call, and always
keeps the delivery contract (SPEC §3):

* a **lease** transaction whose answer was lost may have committed: its batch is checked at
  once if connected, else marked *uncertain* and adopted by the first claim once connected
  (``queue.leases_recovered``), so no lease of this session is left with nobody on it;
* a **completion** (or retry, dead letter) whose answer was lost is neither done nor lost:
  :class:`QueueSuspended`, the items stay held, and the caller's retry once connected finds
  each item gone (done, counted once) or completes it;
* a **release** cut short is harmless and never raises: the items are forgotten here, their
  leases go with the session if it ends, and if it lives on the claim loop deletes those
  it still holds once connected (``queue.release_deferred``);
* an **at-most-once take** whose answer was lost takes nothing: what its deletes removed
  is lost -- the mode's documented loss at a failure.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias, TypeVar

from zkcrawl.errors import UsageError
from zkcrawl.logs import get_logger
from zkcrawl.queue import items as wire
from zkcrawl.queue.claimlog import ClaimLog
from zkcrawl.queue.claims import (
    AT_LEAST_ONCE,
    AT_MOST_ONCE,
    Claimed,
    CompleteResult,
    Delivery,
    QueueStats,
    dead_letter_body,
    retry_item,
    too_large_to_retry,
)
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.offers import BatchOffers, OfferWindow, QueueSuspended
from zkcrawl.zk import (
    ConnectionLoss,
    KazooException,
    Multi,
    NoNodeError,
    Pending,
    ReadResult,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
    Stat,
    TxResult,
    WatchedEvent,
    ZkClient,
    ZkState,
    gather,
    tx_ok,
)

log = get_logger(__name__)

T = TypeVar("T")
Cand: TypeAlias = tuple[int, str]  # (sequence number, item name)
Build: TypeAlias = Callable[[Multi, Claimed], None]  # adds an outcome's ops for one item


class LeaseQueue:
    """A FIFO-ish work queue in ZooKeeper where a claim is an ephemeral lease."""

    def __init__(self, zk: ZkClient, root: str, consumer_id: str = "anonymous", *,
                 delivery: Delivery | str = AT_LEAST_ONCE, claim_batch: int = 100,
                 complete_batch: int = 200, offer_batch: int = 500,
                 count_claims: bool = True) -> None:
        if delivery not in (AT_LEAST_ONCE, AT_MOST_ONCE):
            raise ValueError(f"unknown delivery {delivery!r}")
        self.zk = zk
        self.layout = Layout.of(root)
        self.root = self.layout.root
        self.queue_path = self.layout.queue
        self.lease_path = self.layout.leases
        self.dead_path = self.layout.dead
        self.offer_path = self.layout.offers
        self.consumers_path = self.layout.consumers
        self.consumer_id = consumer_id
        self.delivery = Delivery(delivery)
        self.claim_batch = max(1, claim_batch)
        self.complete_batch = max(1, complete_batch)
        self.offer_batch = max(1, offer_batch)
        self.claims_path = self.layout.claims
        self.stats = QueueStats()
        self._lock = threading.RLock()
        self._held: dict[str, Claimed] = {}
        self._lost: list[Claimed] = []
        self._own: deque[Cand] = deque()
        self._steal: deque[Cand] = deque()
        self._steal_fresh = False
        # Candidates whose lease transaction met a ConnectionLoss that outlasted the wait in
        # _recover_leases: the transaction may still be applied (kazoo resends what it had
        # not sent; a quorum may commit what it had logged) and leave leases of this session
        # that nobody tracks. Checked once connected again (_recover_uncertain).
        self._uncertain: list[Cand] = []
        # Leases whose release was cut short (name -> session): deleted by the claim loop
        # once connected, if that session still holds them (_finish_releases).
        self._unreleased: dict[str, int | None] = {}
        # Names not to claim now (module docstring, Skipping); called by the claiming thread.
        self.skip: Callable[[str], bool] | None = None
        self._changed = threading.Event()
        self._connected = threading.Event()
        self._lost_flag = threading.Event()
        if zk.connected:
            self._connected.set()
        self._session = zk.session_id
        for path in (self.queue_path, self.lease_path, self.dead_path, self.offer_path):
            zk.ensure_path(path)
        # False only for `zkcrawl bench queue`'s baseline (the cost of counting, measured
        # in the same run): a holder's death is then not an attempt (SPEC §3).
        self._claimlog = (ClaimLog(zk, self.claims_path, self.queue_path)
                          if count_claims and delivery == AT_LEAST_ONCE else None)
        zk.add_listener(self._on_state)
        self._offers = BatchOffers(zk, self.queue_path, self.offer_path, offer_batch,
                                   self._connected, lambda: self._session)

    # -- connection state (kazoo thread: set flags only) ---------------------
    def _on_state(self, state: str) -> bool:
        if state == ZkState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
            if state == ZkState.LOST:
                self._lost_flag.set()
        self._changed.set()
        return False

    def _check_session(self) -> None:
        """Forget leases of an expired session (caller's thread, not kazoo's)."""
        current = self.zk.session_id if self._connected.is_set() else self._session
        if not self._lost_flag.is_set() and current == self._session:
            return
        if not self._connected.is_set():
            return  # decide once the new session is there
        with self._lock:
            self._lost_flag.clear()
            gone = [c for c in self._held.values() if c.session != current]
            for c in gone:
                del self._held[c.name]
            self._lost.extend(gone)
            self._session = current
            if self._claimlog is not None:
                self._claimlog.forget()
            self._own.clear()
            self._steal.clear()
        if gone:
            log.warning("queue.session_lost", items=len(gone), consumer=self.consumer_id)

    def drain_lost(self) -> list[Claimed]:
        """Items this process no longer holds because its session was lost."""
        self._check_session()
        with self._lock:
            lost, self._lost = self._lost, []
        return lost

    def room_freed(self) -> None:
        """The worker's seam (a task left the pool): nothing to do here, the shared queue
        has no per-host room."""

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def wait_connected(self, timeout: float | None) -> bool:
        return self._connected.wait(timeout)

    def close(self) -> None:
        self.zk.remove_listener(self._on_state)

    def settle_offer_markers(self) -> int:
        """Before the session ends: no offer marker left behind while connected
        (:meth:`~zkcrawl.queue.offers.BatchOffers.settle_markers`); returns those left."""
        return self._offers.settle_markers()

    # -- offers ----------------------------------------------------------
    def offer(self, url: str, *, meta: dict[str, Any] | None = None,
              producer: str | None = None) -> str:
        names = self.offer_many([Item(url=url, producer=producer, meta=meta or {})])
        if not names:
            raise ItemRefused(f"item for {url[:80]!r} is larger than {wire.ITEM_LIMIT} bytes")
        return names[0]

    def offer_many(self, items: Iterable[Item]) -> list[str]:
        """Offer items in transactions; returns the created znode names in order. Items
        over the size limit are refused (counted in :attr:`refused`, logged), not sent."""
        return self._offers.offer_many(items)

    def offer_window(self, depth: int = 2) -> OfferWindow:
        """A pipeline of offer transactions (:class:`~zkcrawl.queue.offers.OfferWindow`) for a
        caller that offers group after group and settles each as it commits."""
        return self._offers.window(depth)

    @property
    def refused(self) -> int:
        """Items :meth:`offer_many` refused as over the size limit (SPEC §2)."""
        return self._offers.refused

    def depth(self) -> int:
        """Items in the queue (leased ones included), from the parent's stat: O(1)."""
        return self._offers.depth()

    def wait_depth_below(self, low: int, timeout: float) -> int:
        """Block until fewer than ``low`` items are queued, or ``timeout``; returns depth."""
        return self._offers.wait_depth_below(low, timeout)

    def _find_committed(self, marker: str, token: str, n: int) -> list[str] | None:
        return self._offers.find_committed(marker, token, n)

    # -- claims ----------------------------------------------------------
    def claim(self, max_items: int = 1, timeout: float | None = None) -> list[Claimed]:
        """Claim up to ``max_items``; wait up to ``timeout`` s (None: forever) for one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        relisted = False
        while True:
            self._check_session()
            if not self._connected.wait(_remaining(deadline)):
                return []
            try:
                if self._unreleased:
                    self._finish_releases()
                if self._uncertain and (got := self._recover_uncertain(max_items)):
                    return got
                got = self._claim_cached(max_items)
                if got:
                    return got
                if not relisted:
                    relisted = True
                    self._relist(watch=False)
                    continue
                self._changed.clear()
                self._relist(watch=True)
                if self._own or self._steal:
                    continue
            except (ConnectionLoss, SessionExpiredError):
                # The state listener has the story; the loop re-checks. A wait cut short
                # while the connection still looks up (a frozen server) must not keep the
                # claim past its own deadline: each try costs up to --zk-timeout.
                if deadline is not None and time.monotonic() >= deadline:
                    return []
                continue
            remaining = _remaining(deadline)
            if remaining is not None and remaining <= 0:
                return []
            self._changed.wait(remaining)
            relisted = True  # a watch fired: the next round lists with a watch again
            if deadline is not None and time.monotonic() >= deadline:
                return []

    def _relist(self, watch: bool) -> None:
        cb = self._on_children if watch else None
        q_res, l_res, c_res, r_res = gather([
            self.zk.get_children_async(self.queue_path, watch=cb),
            self.zk.get_children_async(self.lease_path, watch=cb),
            self.zk.get_children_async(self.consumers_path),
            # After the leases (one session: in this order on the server), so every item
            # unleased in that listing has its holder's death in this one.
            self.zk.get_children_async(self.claims_path),
        ], self.zk.zk_timeout)  # bounded: listed just as the connection dropped, these wait
        # for a reconnect, and the claim loop must stay free to act on a SIGTERM
        self.stats.listings += 1
        self.stats.requests += 1
        if isinstance(q_res, NoNodeError):
            # Curator makes the queue a CONTAINER node: an empty one is reaped by the
            # server. A missing queue is an empty queue; re-create it and keep watching.
            self.zk.ensure_path(self.queue_path)
            q_res = self.zk.get_children(self.queue_path, watch=cb)
        if isinstance(l_res, NoNodeError):
            self.zk.ensure_path(self.lease_path)
            l_res = []
        if isinstance(q_res, Exception):
            raise q_res
        if isinstance(l_res, Exception):
            raise l_res
        leased = set(l_res)
        skip = self.skip
        pairs = [p for p in wire.sort_names(q_res) if p[1] not in leased
                 and (skip is None or not skip(p[1]))]
        consumers = [] if isinstance(c_res, Exception) else sorted(set(c_res))
        if self.consumer_id not in consumers:
            consumers = sorted([*consumers, self.consumer_id])
        n, me = len(consumers), consumers.index(self.consumer_id)
        own = [p for p in pairs if p[0] % n == me]
        others = [p for p in pairs if p[0] % n != me]
        others.reverse()  # steal from the tail, away from the owners walking the head
        if self._claimlog is not None and isinstance(r_res, list):
            self._claimlog.reap(r_res)  # before this listing is used to claim
        with self._lock:
            self._own = deque(own)
            self._steal = deque(others)
            self._steal_fresh = not own  # steal only from a list made after own ran out

    def _on_children(self, _event: WatchedEvent) -> None:
        self._changed.set()

    def _claim_cached(self, max_items: int) -> list[Claimed]:
        got: list[Claimed] = []
        while len(got) < max_items:
            with self._lock:
                if not self._own and self._steal and not self._steal_fresh:
                    break  # own share used up: list again before stealing from a stale list
                source = self._own if self._own else self._steal
                k = min(self.claim_batch, max_items - len(got), len(source))
                cands = [source.popleft() for _ in range(k)]
            if not cands:
                break
            if self.skip is not None:
                skip = self.skip
                cands = [c for c in cands if not skip(c[1])]
                if not cands:
                    continue
            won = self._take(cands) if self.delivery == AT_MOST_ONCE else self._lease(cands)
            got.extend(won)
            if len(won) * 2 < len(cands):
                with self._lock:  # mostly taken by others: the cached list is stale
                    self._own.clear()
                    self._steal.clear()
        self.stats.claimed += len(got)
        return got

    def _lease_tx(self, batch: Sequence[Cand], body: bytes) -> tuple[Multi, str | None]:
        """[create lease x n] + the claim record of the batch (:mod:`zkcrawl.queue.claimlog`,
        after the leases: a failed op's index is still its item's)."""
        tx = self.zk.transaction()
        # No check(item) op: it would cost the server a quarter of its work per item.
        # A lease created for an item completed meanwhile is found by the multiRead
        # right behind (NoNode) and dropped at once (see _hold).
        for _, name in batch:
            tx.create(f"{self.lease_path}/{name}", body, ephemeral=True)
        record = None
        if self._claimlog is not None:
            record = self._claimlog.add_ops(tx, [n for _, n in batch], self.zk.session_id)
        return tx, record

    def _leased(self, batch: Sequence[Cand], record: str | None,
                results: list[TxResult] | Exception) -> bool:
        """Did the lease transaction commit? If so its claim record is ours to settle."""
        ok = isinstance(results, list) and _first_error(results) is None
        if ok and record is not None and self._claimlog is not None:
            self._claimlog.committed(record, [n for _, n in batch])
        return ok

    def _lease(self, cands: list[Cand]) -> list[Claimed]:
        """Lease a batch in one transaction; the items' data is read in the same flight."""
        body = json.dumps({"consumer": self.consumer_id,
                           "claimed_at": round(time.time(), 3)}).encode()
        session = self.zk.session_id
        try:
            self.stats.requests += 1
            tx, record = self._lease_tx(cands, body)
            pending = tx.commit_async()
            # Sent right behind the transaction on the same session (ZooKeeper keeps a
            # session's requests in order): one multiRead, no extra round trip waited for.
            reads = self.zk.get_many([f"{self.queue_path}/{n}" for _, n in cands])
            results = self.zk.answer(pending)
            got: list[tuple[Cand, ReadResult]]
            if self._leased(cands, record, results):
                got = list(zip(cands, reads, strict=True))
            else:
                won = self._lease_retry(cands, body, results)
                # Read again: an item read before a retried lease may have been completed
                # by its holder in between (without a check op, the new lease proves nothing).
                datas = self.zk.get_many([f"{self.queue_path}/{n}" for _, n in won])
                got = list(zip(won, datas, strict=True))
        except (ConnectionLoss, SessionExpiredError):
            got = self._recover_leases(cands)
        return self._hold(got, session)

    def _lease_retry(self, cands: list[Cand], body: bytes, results: list[TxResult]
                     ) -> list[Cand]:
        """A batch that met a taken lease: drop that item and retry the rest (a taken item
        is usually alone: the others walk their own share); after 3 such rounds fall
        back to single creates, pipelined."""
        for _ in range(3):
            failed = _first_error(results)
            if failed is None:
                return cands
            self.stats.wasted += 1
            if failed < len(cands):
                cands = cands[:failed] + cands[failed + 1:]
            else:  # the claim record's op: its parent was removed under us
                self.zk.ensure_path(self.claims_path)
            if not cands:
                return []
            self.stats.requests += 1
            tx, record = self._lease_tx(cands, body)
            results = tx.commit()
            if self._leased(cands, record, results):
                return cands
        self.stats.wasted += 1
        return self._lease_each(cands, body)

    def _lease_each(self, cands: list[Cand], body: bytes) -> list[Cand]:
        """One lease transaction per item, pipelined, waited for at most ``--zk-timeout``.

        An answer that did not come (no answer in time, or the connection dropped under
        it) raises ConnectionLoss: those leases may exist or not, so none is counted won
        here; :meth:`_lease` hands the whole batch to :meth:`_recover_leases`, which keeps
        the ones this session got or marks the batch uncertain."""
        txs = [(c, *self._lease_tx([c], body)) for c in cands]
        singles = _answered(gather([tx.commit_async() for _, tx, _ in txs],
                                   self.zk.zk_timeout))
        won = [c for (c, _, record), r in zip(txs, singles, strict=True)
               if self._leased([c], record, r)]
        self.stats.requests += len(cands)
        self.stats.wasted += len(cands) - len(won)
        return won

    def _recover_leases(self, cands: list[Cand]) -> list[tuple[Cand, ReadResult]]:
        """ConnectionLoss mid-claim: keep the leases the server did give us. Not connected
        again within ``--zk-timeout``: the batch is remembered as uncertain and checked by
        the first claim once connected (else a lease created later would be held by this
        live session with nobody working on it, and no other consumer could take it)."""
        if not self._connected.wait(self.zk.zk_timeout):
            with self._lock:
                self._uncertain.extend(cands)
            return []
        session = self.zk.session_id
        try:
            stats = gather([self.zk.exists_async(f"{self.lease_path}/{n}") for _, n in cands],
                           self.zk.zk_timeout)
            mine = [c for c, st in zip(cands, stats, strict=True)
                    if st is not None and not isinstance(st, Exception)
                    and st.ephemeralOwner == session]
            datas = self.zk.get_many([f"{self.queue_path}/{n}" for _, n in mine])
        except ConnectionLoss:  # gone again before the answer: still uncertain
            with self._lock:
                self._uncertain.extend(cands)
            return []
        return list(zip(mine, datas, strict=True))

    def _recover_uncertain(self, max_items: int) -> list[Claimed]:
        """The uncertain batches' leases this session holds after all, adopted as claimed
        (at most ``max_items``: the rest are released, the caller's capacity holds)."""
        with self._lock:
            cands, self._uncertain = self._uncertain, []
        got = self._hold(self._recover_leases(cands), self.zk.session_id)
        if got:
            log.info("queue.leases_recovered", items=len(got),
                     note="a claim whose answer was lost in an outage did go through")
        if len(got) > max_items:
            self.release(got[max_items:])
            got = got[:max_items]
        return got

    def _hold(self, won: list[tuple[Cand, ReadResult]], session: int | None) -> list[Claimed]:
        out = []
        for (seq, name), res in won:
            if isinstance(res, Exception):  # vanished under our lease (a purge): let go
                self.zk.delete_async(f"{self.lease_path}/{name}")
                if self._claimlog is not None:
                    self._claimlog.settled([name])
                continue
            out.append(self._claimed(seq, name, res, session))
        with self._lock:
            for c in out:
                self._held[c.name] = c
        return out

    def _claimed(self, seq: int, name: str, res: tuple[bytes, Stat], session: int | None
                 ) -> Claimed:
        data, stat = res
        dec = wire.decode(data)
        deaths = stat.cversion // 2 if session is not None and self._claimlog else 0
        return Claimed(name=name, seq=seq, data=data, item=dec.item, error=dec.error,
                       ctime=stat.ctime / 1000.0, session=session, bare=dec.bare,
                       deaths=deaths)

    def _take(self, cands: list[Cand]) -> list[Claimed]:
        """At-most-once: read, then delete; whoever deletes first owns the item.

        Each wait is bounded by ``--zk-timeout``. A take whose answer was lost (none in
        time, or the connection dropped) takes nothing: the items its deletes removed are
        lost -- at-most-once's documented loss at a failure (SPEC §3) -- and the others stay
        queued for anyone. It returns ``[]`` rather than raising, so a claim keeps the
        items its earlier batches took (deleted already: raising would lose them too)."""
        try:
            return self._take_batch(cands)
        except (ConnectionLoss, SessionExpiredError) as exc:
            log.warning("queue.take_uncertain", items=len(cands), error=type(exc).__name__,
                        consumer=self.consumer_id,
                        note="at-most-once: items this take deleted are lost")
            return []

    def _take_batch(self, cands: list[Cand]) -> list[Claimed]:
        paths = [f"{self.queue_path}/{n}" for _, n in cands]
        reads = self.zk.get_many(paths)
        live = [(c, r) for c, r in zip(cands, reads, strict=True)
                if not isinstance(r, Exception)]
        tx = self.zk.transaction()
        for (_, name), _ in live:
            tx.delete(f"{self.queue_path}/{name}")
        self.stats.requests += 1
        if live and tx_ok(tx.commit()):
            won = live
        else:
            self.stats.wasted += 1
            won = self._take_each(live)
        return [self._claimed(seq, name, r, None) for (seq, name), r in won]

    def _take_each(self, live: list[tuple[Cand, tuple[bytes, Stat]]]
                   ) -> list[tuple[Cand, tuple[bytes, Stat]]]:
        """One delete per item, pipelined, waited for at most ``--zk-timeout`` (past it:
        ConnectionLoss). An item is won only on a delete answered: one whose answer was
        lost counts as not taken (lost if it was applied: at-most-once)."""
        dels = gather([self.zk.delete_async(f"{self.queue_path}/{c[1]}") for c, _ in live],
                      self.zk.zk_timeout)
        return [lr for lr, d in zip(live, dels, strict=True) if not isinstance(d, Exception)]

    # -- outcomes --------------------------------------------------------
    def _owned(self, claimed: Sequence[Claimed]) -> tuple[list[Claimed], list[Claimed]]:
        self._check_session()
        if not self._connected.is_set():
            raise QueueSuspended("not connected to ZooKeeper: completion held")
        with self._lock:
            # Identity, not name: a stale claim from an expired session must not pass
            # for the same item claimed again in the new one.
            mine = [c for c in claimed if self._held.get(c.name) is c]
        ids = {id(c) for c in mine}
        return mine, [c for c in claimed if id(c) not in ids]

    def _forget(self, claimed: Iterable[Claimed]) -> None:
        gone = []
        with self._lock:
            for c in claimed:
                if self._held.get(c.name) is c:
                    del self._held[c.name]
                    gone.append(c.name)
        if self._claimlog is not None:
            self._claimlog.settled(gone)

    def _run_per_item(self, mine: list[Claimed], build: Build) -> CompleteResult:
        """Commit one transaction for all, falling back to one per item.

        Every wait is bounded by ``--zk-timeout``. An answer lost (none in time, or the
        connection dropped) raises :class:`QueueSuspended` and forgets nothing: an item
        whose completion may or may not have been applied is neither counted done nor
        given up. The caller retries once connected: an item completed meanwhile is found
        gone and counted done then, once; one not completed is completed then."""
        done: list[Claimed] = []
        lost: list[Claimed] = []
        for i in range(0, len(mine), self.complete_batch):
            chunk = mine[i:i + self.complete_batch]
            tx = self.zk.transaction()
            for c in chunk:
                build(tx, c)
            try:
                results = tx.commit()
                if tx_ok(results):
                    done.extend(chunk)
                    continue
                for c, settled in zip(chunk, self._complete_each(chunk, build), strict=True):
                    (done if settled else lost).append(c)
            except (ConnectionLoss, SessionExpiredError):
                # Nothing forgotten: a retry finds completed items gone and counts them done.
                raise QueueSuspended("connection lost while completing: held") from None
        self._forget(done + lost)
        return CompleteResult(done, lost)

    def _complete_each(self, chunk: list[Claimed], build: Build) -> list[bool]:
        """One transaction per item, pipelined, waited for at most ``--zk-timeout``;
        per item: settled, or lost to us (:meth:`_settled`). An answer that did not come
        raises ConnectionLoss (SessionExpiredError): the caller suspends."""
        singles: list[Pending[list[TxResult]]] = []
        for c in chunk:
            one = self.zk.transaction()
            build(one, c)
            singles.append(one.commit_async())
        results = _answered(gather(singles, self.zk.zk_timeout))
        return [self._settled(c, res) for c, res in zip(chunk, results, strict=True)]

    def _settled(self, c: Claimed, res: list[TxResult] | Exception) -> bool:
        """Per-item outcome of a failed transaction ending in [delete item, delete lease].

        Done unless our lease was gone while the item still exists: then another
        consumer may hold it and the item is *lost to us* (not to the queue).
        """
        if not isinstance(res, list):
            return self.zk.exists(f"{self.queue_path}/{c.name}") is None
        failed = _first_error(res)
        if failed is None:
            return True
        if self.delivery == AT_LEAST_ONCE and failed == len(res) - 1:
            return False  # the lease was gone; the item was not deleted (rolled back)
        # Item already gone (completed by us before a ConnectionLoss, or purged).
        self.zk.delete_async(f"{self.lease_path}/{c.name}")
        return True

    def _drop_lease_ops(self, tx: Multi, c: Claimed) -> None:
        if self.delivery == AT_LEAST_ONCE:
            tx.delete(f"{self.queue_path}/{c.name}")
            tx.delete(f"{self.lease_path}/{c.name}")

    def complete(self, claimed: Sequence[Claimed]) -> CompleteResult:
        """Delete items and their leases (one transaction for up to ``complete_batch``)."""
        if self.delivery == AT_MOST_ONCE:
            self.stats.completed += len(claimed)
            return CompleteResult(list(claimed), [])
        mine, not_held = self._owned(claimed)
        res = self._run_per_item(mine, self._drop_lease_ops)
        self.stats.completed += len(res.done)
        return CompleteResult(res.done, res.lost + not_held)

    on_marked: Callable[[Sequence[Claimed]], None] | None = None  # never called: see mark

    def mark(self, claimed: Claimed) -> bool:
        """An item admitted to start: its lease, taken at the claim, is its mark (True)."""
        return True

    def mark_soon(self) -> None:
        """No mark ever waits here (see :meth:`mark`)."""

    def release(self, claimed: Sequence[Claimed]) -> None:
        """Give items back: claimable by anyone at once (at-most-once: re-offered).

        At-least-once: waits at most ``--zk-timeout`` and never raises for the connection.
        A release cut short -- not connected, no answer in time, or the connection dropped
        under a delete -- is harmless: the items are forgotten here all the same (nobody
        works on them); their leases go with the session if it ends, and if it lives on,
        the claim loop deletes the ones it still holds once connected
        (:meth:`_finish_releases`). Until then those items wait, as they would for a
        holder that lost its connection."""
        if not claimed:
            return
        if self.delivery == AT_MOST_ONCE:
            self.offer_many([c.item for c in claimed if c.item])
            return
        self._check_session()
        with self._lock:
            mine = [c for c in claimed if self._held.get(c.name) is c]
        unsure = self._drop_leases(mine) if self._connected.is_set() else mine
        self._forget(mine)
        if unsure:
            with self._lock:
                self._unreleased.update((c.name, c.session) for c in unsure)
            log.warning("queue.release_deferred", items=len(unsure), consumer=self.consumer_id,
                        note="released once connected again, or gone with the session")

    def _drop_leases(self, mine: list[Claimed]) -> list[Claimed]:
        """Delete the leases of ``mine`` within ``--zk-timeout``, ``complete_batch`` per
        transaction (one write, not one per item: a consumer gives back the items of a full
        host as they come, :mod:`consumer.parking`); returns those whose delete may not have
        been applied."""
        deadline = time.monotonic() + self.zk.zk_timeout
        unsure: list[Claimed] = []
        i = 0
        try:
            if self._claimlog is not None:  # first out of the records: not a death if we die now
                self._claimlog.released([c.name for c in mine])
            for i in range(0, len(mine), self.complete_batch):
                unsure += self._drop_chunk(mine[i:i + self.complete_batch], deadline)
        except SessionExpiredError:
            return []  # the leases went with the session
        except ConnectionLoss:
            return [*unsure, *mine[i:]]  # this chunk and the ones after it: not sent or unsure
        return unsure

    def _drop_chunk(self, chunk: list[Claimed], deadline: float) -> list[Claimed]:
        """One transaction of deletes; if one lease of it is gone already (NoNode: the whole
        transaction rolls back), the chunk's leases one by one."""
        paths = [f"{self.lease_path}/{c.name}" for c in chunk]
        if len(chunk) > 1:
            tx = self.zk.transaction()
            for path in paths:
                tx.delete(path)
            (res,) = gather([tx.commit_async()], _remaining(deadline))
            if isinstance(res, list) and tx_ok(res):
                return []
            if isinstance(res, ConnectionLoss):
                return chunk
            if isinstance(res, SessionExpiredError):
                raise res
        dels = gather([self.zk.delete_async(path) for path in paths], _remaining(deadline))
        if any(isinstance(d, SessionExpiredError) for d in dels):
            raise SessionExpiredError()
        return [c for c, d in zip(chunk, dels, strict=True) if isinstance(d, ConnectionLoss)]

    def _finish_releases(self) -> None:
        """Delete the leases whose release was cut short, if this session still holds them
        and no claim took the item again since. Runs in the claim loop, never beside a
        claim of this queue: a lease it is creating is not in ``_held`` yet. Bounded by
        ``--zk-timeout`` per wait; cut short again, they stay for the next round and the
        ConnectionLoss goes to the claim loop (which keeps its deadline)."""
        session = self.zk.session_id
        with self._lock:
            names = [n for n, s in self._unreleased.items()
                     if s == session and n not in self._held]
            self._unreleased.clear()
        try:
            stats = gather([self.zk.exists_async(f"{self.lease_path}/{n}") for n in names],
                           self.zk.zk_timeout)
            ours = [n for n, st in zip(names, stats, strict=True)
                    if not isinstance(st, Exception) and st is not None
                    and st.ephemeralOwner == session]
            unsure = [n for n, st in zip(names, stats, strict=True)
                      if isinstance(st, ConnectionLoss)]
            dels = gather([self.zk.delete_async(f"{self.lease_path}/{n}") for n in ours],
                          self.zk.zk_timeout)
            unsure += [n for n, d in zip(ours, dels, strict=True)
                       if isinstance(d, ConnectionLoss)]
        except ConnectionLoss:
            with self._lock:
                self._unreleased.update((n, session) for n in names)
            raise
        with self._lock:
            self._unreleased.update((n, session) for n in unsure)
        if len(unsure) < len(names):
            log.info("queue.releases_finished", items=len(names) - len(unsure),
                     consumer=self.consumer_id)

    def retry(self, c: Claimed, error: str) -> CompleteResult:
        """Re-offer at the tail with ``attempt + 1``; old item and lease go in the same tx.

        The re-offered item never outgrows the limit (SPEC §2): the stored error is short,
        and dropped if the item would not fit with it; one that still would not fit goes
        to the dead letters instead of being sent to ZooKeeper.
        """
        again = retry_item(c, error)
        if again is None:
            return self.dead_letter(c, too_large_to_retry(error))
        data = again.encode()

        def build(tx: Multi, cl: Claimed) -> None:
            tx.create(f"{self.queue_path}/{wire.PREFIX}", data, sequence=True)
            self._drop_lease_ops(tx, cl)

        return self._outcome(c, build)

    def dead_letter(self, c: Claimed, error: str) -> CompleteResult:
        """Move to ``<root>/dead/`` with the reason (one transaction)."""
        body = dead_letter_body(c, error)

        def build(tx: Multi, cl: Claimed) -> None:
            tx.create(f"{self.dead_path}/{wire.DEAD_PREFIX}", body, sequence=True)
            self._drop_lease_ops(tx, cl)

        return self._outcome(c, build)

    def _outcome(self, c: Claimed, build: Build) -> CompleteResult:
        if self.delivery == AT_MOST_ONCE:
            tx = self.zk.transaction()
            build(tx, c)
            tx.commit()
            return CompleteResult([c], [])
        mine, not_held = self._owned([c])
        if not mine:
            return CompleteResult([], not_held)
        tx = self.zk.transaction()
        build(tx, c)
        try:
            results = tx.commit()
        except (ConnectionLoss, SessionExpiredError):
            raise QueueSuspended("connection lost: outcome held") from None
        ok = tx_ok(results) or self._settled(c, results)
        self._forget([c])
        return CompleteResult([c], []) if ok else CompleteResult([], [c])


class ItemRefused(UsageError):
    """An offered item is over the size limit (SPEC §2): nothing was sent."""


def _first_error(results: Sequence[TxResult]) -> int | None:
    """Index of the op that failed a transaction (the others are rolled back)."""
    for i, r in enumerate(results):
        if isinstance(r, Exception) and not isinstance(r, RolledBackError | RuntimeInconsistency):
            return i
    return None


def _answered(results: list[T | Exception]) -> list[T | Exception]:
    """``results`` of pipelined requests -- unless one's answer was lost with the connection
    (ConnectionLoss, SessionExpiredError): then that error is raised, since the request may
    or may not have been applied, and the caller decides what that uncertainty means."""
    for res in results:
        if isinstance(res, ConnectionLoss | SessionExpiredError):
            raise res
    return results


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


__all__ = ["AT_LEAST_ONCE", "AT_MOST_ONCE", "Claimed", "CompleteResult", "Delivery",
           "ItemRefused", "KazooException", "LeaseQueue", "QueueStats", "QueueSuspended"]
