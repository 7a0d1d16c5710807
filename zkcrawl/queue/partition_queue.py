"""The partitioned queue recipe (SPEC §2, §3): batches in partitions, owners that fence.
Layout in :class:`~zkcrawl.queue.layout.Layout` and docs/concepts/zookeeper-layout.md; the
full guarantees in :class:`PartitionQueue`'s docstring.

* **Offers are batched** and committed with an ephemeral marker: a transaction whose answer
  was lost is never doubled while the session lives (:mod:`zkcrawl.queue.ingress`).
* **Ownership is fenced by an epoch**: :meth:`~PartitionQueue.take` bumps the partition
  node's version with the owner node in one transaction; every later owner write checks
  that version, so a zombie changes nothing (:class:`Fenced`).
* **A holder's death is charged only for started items**; progress (starts, dones, retries,
  dead letters, the host state) is one fenced write.
* **The ingress is moved, not copied**; everything read is untrusted (a bad batch or entry
  becomes a dead letter, never an error).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from zkcrawl.errors import ZkCrawlError
from zkcrawl.logs import get_logger
from zkcrawl.queue import items as item_codec
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue import partition_state as ps
from zkcrawl.queue import untrusted
from zkcrawl.queue.claims import spent
from zkcrawl.queue.ingress import MAX_TX_BYTES
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partitions import partition_of
from zkcrawl.web.urls import host_key
from zkcrawl.zk import (
    BadVersionError,
    ConnectionLoss,
    Multi,
    NodeExistsError,
    NoNodeError,
    ReadResult,
    RolledBackError,
    RuntimeInconsistency,
    TxResult,
    Watcher,
    ZkClient,
    gather,
    tx_ok,
)

log = get_logger(__name__)

DEAD_PER_TX = 100  # dead letters in one transaction (each at most ~4.5 KB)
CHECKPOINT_TX_BYTES = 512 * 1024  # one checkpoint transaction, far below jute.maxbuffer
INGRESS_PER_MOVE = 2000  # ingress nodes moved by one transaction at most
OWNER_LIMIT = 1024  # bytes of an owner node worth reading
# Batch nodes (each at most 64 KiB) per read request: a pipelined read of many partitions
# asks its batches in requests of at most ~1 MiB each, not one answer of any size.
BATCHES_PER_READ = 16
# Partitions taken, given up or made by one transaction at most: a consumer starting on a
# root of 256 partitions (or stopping) writes a few transactions, not 256 -- each one a
# quorum write, and the start and stop of a short crawl were most of its writes (bench
# hosts: ~1,350 of ~2,400 ZooKeeper writes of 5,000 pages). A transaction that fails (one
# partition raced) is done again partition by partition.
OWNERSHIP_PER_TX = 64
_ENSURE_ROUNDS = 3  # listings and transactions before the partition nodes are made one by one


class Fenced(ZkCrawlError):
    """This consumer no longer owns the partition (its epoch moved): write nothing more."""


class Stale(ZkCrawlError):
    """The batch node is not at the version this owner last saw (a write of ours whose
    answer was lost did commit, or the node went): read it again before the next write."""


@dataclass(frozen=True)
class Owned:
    """A partition this consumer took, at ``epoch`` (the partition node's version then; a
    checkpoint that writes the partition's host state moves the version on, and this queue
    keeps track: :meth:`PartitionQueue.version`), and the host state the take found in the
    partition node (:mod:`zkcrawl.queue.partition_state`: the back-offs in force that the
    previous owners left)."""

    partition: int
    epoch: int
    since: float
    state: ps.Decoded = field(default_factory=ps.Decoded, compare=False)


@dataclass
class BatchNode:
    """A batch as read: its name, the node's version, and the decoded batch."""

    name: str
    version: int
    batch: pb.Batch


@dataclass
class Read:
    """What :meth:`PartitionQueue.read` found: the good batches in order, and the nodes that
    are not batches (already turned into dead letters by the same call)."""

    batches: list[BatchNode] = field(default_factory=list)
    dead: int = 0


@dataclass
class Change:
    """What one checkpoint does to one batch (:meth:`PartitionQueue.checkpoint`)."""

    owned: Owned
    node: BatchNode
    started: frozenset[int] = frozenset()
    done: frozenset[int] = frozenset()
    unstarted: frozenset[int] = frozenset()
    retry: list[Item] = field(default_factory=list)
    dead: list[bytes] = field(default_factory=list)


@dataclass
class Checkpointed:
    """A checkpoint's outcome: per change (by index) the batch as it now is (None: deleted),
    the partitions found fenced, the changes whose batch moved (:class:`Stale`)."""

    nodes: dict[int, BatchNode | None] = field(default_factory=dict)
    fenced: set[int] = field(default_factory=set)
    stale: set[int] = field(default_factory=set)
    states: set[int] = field(default_factory=set)  # partitions whose host state was written


def _owner_doc(consumer: str, epoch: int) -> bytes:
    return json.dumps({"consumer": consumer, "epoch": epoch, "since": round(time.time(), 3)},
                      separators=(",", ":")).encode("utf-8", "backslashreplace")


class PartitionQueue:
    """The partitioned queue of one root with ``partitions`` partitions.

    Layout (:class:`~zkcrawl.queue.layout.Layout`)::

        <root>/partitions/<p>                 persistent; data: the host state
                                              (zkcrawl.queue.partition_state); version: the epoch
        <root>/partitions/<p>/owner           ephemeral: {"consumer": id, "epoch": n, "since": t}
        <root>/partitions/<p>/qn-NNNNNNNNNN   a batch (:mod:`zkcrawl.queue.partition_batch`)
        <root>/queue/qn-NNNNNNNNNN            the ingress: one item, any client (a producer writes
                                              batches into the partitions itself when the root
                                              records P: zkcrawl.queue.partition_offers)

    Guarantees:

    * **offers are batched**: :meth:`PartitionQueue.offer` groups items by partition
      (:func:`~zkcrawl.queue.partitions.partition_of` of the URL's host key), packs each group
      into batches of at most 64 KiB and commits them in transactions of at most
      ``MAX_TX_BYTES``, each with an ephemeral marker ``<root>/offers/<token>``: a transaction
      whose answer was lost is found committed or sent again, never doubled while the session
      lives (the rule of :mod:`zkcrawl.queue.ingress`);
    * **ownership is the lease, fenced by an epoch**: :meth:`take` bumps the partition node's
      version and creates the ephemeral owner node in one transaction, conditional on the
      version it read, so two consumers never both take a partition; every later write of the
      owner (:meth:`progress`, :meth:`adopt`, :meth:`release`) carries a ``check`` of that
      version, so a zombie -- whose session ended and whose partition another took -- has every
      write refused (:class:`Fenced`) and changes nothing;
    * **a holder's death is charged only for started items**: a batch records the items its
      owner marked started; :meth:`adopt` (a new owner's first look at a batch) counts an
      attempt for those only, turns the ones out of attempts into dead letters (``abandoned``),
      and clears the marks -- one fenced write per batch that had any. The charged items stay
      where they were (same batch, index and creation time: the identity a sink keys its rows
      on, so a record written before the death is not stored twice); only a batch that would
      outgrow 64 KiB by the charge moves them to a new batch at the tail;
    * **progress is one write**: items started, items done, items to retry (a new batch at the
      partition's tail) and dead letters go in one fenced transaction; a batch whose items are
      all done is deleted in it;
    * **the host state rides the checkpoint**: a checkpoint given a partition's new host state
      (the back-offs in force, :mod:`zkcrawl.queue.partition_state`) writes it as the partition
      node's data with a setData at the owner's version -- the same fence as the check it
      replaces, so no write of its own; the version moves on with it, and this queue keeps the
      owner's current version (:meth:`PartitionQueue.version`; every fenced write is built and
      sent under one lock, so none checks a version another thread has just moved). An answer
      lost is settled before the next fenced write (the node read: our data one version on, or
      not). :meth:`take` decodes the state it read (untrusted: a reason, never an error);
    * **the ingress is moved, not copied**: :meth:`move_ingress` deletes ingress nodes (at the
      version read) and creates their batches in the same transaction, so an item is in the
      ingress or in its partition, never both and never neither; two movers racing lose
      nothing (the loser's transaction fails whole); malformed ingress data is a dead letter;
    * everything read is untrusted: a batch that does not decode is a dead letter with its
      data; an entry that is not an item is a dead letter and the others go on; a forged owner
      node is only ever compared by its ZooKeeper session, never trusted for its content.
    """

    def __init__(self, zk: ZkClient, root: str, partitions: int, *, consumer: str = "",
                 max_attempts: int = 3, max_items: int = pb.MAX_ITEMS) -> None:
        self.zk = zk
        self.layout = Layout.of(root)
        self.partitions = partitions
        self.consumer = consumer
        self.max_attempts = max(1, max_attempts)
        self.max_items = max_items
        self.refused = 0  # items over the limit, never sent (SPEC §2)
        self._made: set[int] = set()  # partitions known to exist: no create tried again
        self.ingress_consumed = 0  # of the last move_ingress: names read (moved or gone)
        # partition -> (epoch taken, the partition node's version now): a host-state write
        # moves the version; every fenced write is built and sent under _fence_lock, so one
        # never checks a version another thread of this owner has just moved on.
        self._versions: dict[int, tuple[int, int]] = {}
        self._unsure: dict[int, bytes] = {}  # a state write whose answer was lost
        self._fence_lock = threading.RLock()
        for path in (self.layout.partitions, self.layout.dead, self.layout.offers,
                     self.layout.queue):
            zk.ensure_path(path)

    def partition_of_url(self, url: str) -> int:
        """The partition of ``url``'s host (an unparsable URL goes to partition 0)."""
        try:
            key = host_key(url)
        except ValueError:
            key = ""
        return partition_of(key, self.partitions)

    # -- offers ----------------------------------------------------------------------
    def offer(self, items: Iterable[Item]) -> int:
        """Offer ``items`` in batches per partition; returns the batches created."""
        groups: dict[int, list[Item]] = defaultdict(list)
        for item in items:
            groups[self.partition_of_url(item.url)].append(item)
        token = uuid.uuid4().hex
        creates: list[tuple[str, bytes]] = []
        self.ensure_partitions(groups)
        for p, group in sorted(groups.items()):
            self._ensure_partition(p)
            for chunk, refused in pb.pack(group, max_items=self.max_items, token=token):
                self._refuse(refused)
                if chunk:
                    creates.append((self.layout.partition_batch_prefix(p),
                                    pb.encode(pb.Batch(tuple(chunk), token=token))))
        return len(self._create_protected(creates))

    def _refuse(self, refused: Sequence[Item]) -> None:
        for item in refused:
            self.refused += 1
            log.warning("queue.offer_refused", url=item.url[:200],
                        reason=f"item larger than {item_codec.ITEM_LIMIT} bytes")

    def _create_protected(self, creates: list[tuple[str, bytes]]) -> list[str]:
        """Sequential creates in transactions of at most MAX_TX_BYTES, each protected by an
        ephemeral marker (a lost answer: committed or sent again, never doubled). Returns
        the created paths in order ("" where a lost answer hid one: it did commit)."""
        done: list[str] = []
        tx_creates: list[tuple[str, bytes]] = []
        size = 0
        for prefix, data in creates:
            if tx_creates and size + len(data) > MAX_TX_BYTES:
                done += self._commit_creates(tx_creates)
                tx_creates, size = [], 0
            tx_creates.append((prefix, data))
            size += len(data) + len(prefix)
        if tx_creates:
            done += self._commit_creates(tx_creates)
        return done

    def _commit_creates(self, creates: list[tuple[str, bytes]]) -> list[str]:
        marker = f"{self.layout.offers}/{uuid.uuid4().hex}"
        session = self.zk.session_id
        for _ in range(5):
            tx = self.zk.transaction()
            tx.create(marker, b"", ephemeral=True)
            for prefix, data in creates:
                tx.create(prefix, data, sequence=True)
            try:
                results = tx.commit()
            except ConnectionLoss:
                if self._committed(marker, session):
                    return [""] * len(creates)
                continue
            if tx_ok(results):
                self.zk.delete_async(marker)
                return [str(r) for r in results[1:]]
            if isinstance(results[0], NodeExistsError):  # the first try did commit
                self.zk.delete_async(marker)
                return [""] * len(creates)
            if any(isinstance(r, NoNodeError) for r in results):  # a partition was deleted
                self._remake(creates)
                continue
            first = next(r for r in results if isinstance(r, Exception))
            raise ZkCrawlError(f"offer failed: {first!r}")
        raise ZkCrawlError("offer failed after 5 attempts")

    def _committed(self, marker: str, session: int | None) -> bool:
        """After ConnectionLoss: did the transaction commit? Exact while the session lives
        (the marker tells). After a session loss the marker is gone and the batches are
        sent again: at-least-once, a duplicate only of what was in flight at the failure."""
        deadline = time.monotonic() + self.zk.zk_timeout
        while time.monotonic() < deadline:
            try:
                found = self.zk.exists(marker) is not None
            except ConnectionLoss:
                time.sleep(0.05)  # not connected yet: a short pause, bounded by the deadline
                continue
            if found:
                self.zk.delete_async(marker)
            return found
        raise ConnectionLoss("ZooKeeper unreachable while offering")

    def _remake(self, creates: list[tuple[str, bytes]]) -> None:
        """Partition nodes deleted under us (by hand, mid-crawl): made again."""
        self._made.clear()
        for path in (self.layout.partitions, self.layout.offers):
            self.zk.ensure_path(path)
        for prefix, _ in creates:
            self.zk.ensure_path(prefix.rsplit("/", 1)[0])

    def ensure_partitions(self, ps_: Iterable[int]) -> None:
        """The nodes of partitions ``ps_`` exist (made, in a few transactions, where this
        queue has not seen them yet): call it before writing into many partitions at once,
        so that a fresh root costs a listing and a few writes, not one create per
        partition (a create of a node that exists fails, and still counts as a write)."""
        self._ensure_many(sorted({p for p in ps_ if p not in self._made}))

    def _ensure_partition(self, p: int) -> None:
        """The partition node exists (made once; a deleted one is made again by the
        offer's NoNodeError path)."""
        if p in self._made:
            return
        try:
            self.zk.create(self.layout.partition(p), b"{}")
        except NodeExistsError:
            pass
        self._made.add(p)

    # -- ownership -------------------------------------------------------------------
    def owner(self, p: int) -> tuple[str | None, int | None]:
        """``(consumer named by the owner node, its session)``; (None, None) without one.
        The name is untrusted (any client may write it); the session is ZooKeeper's."""
        try:
            data, stat = self.zk.get(self.layout.partition_owner(p))
        except NoNodeError:
            return None, None
        doc, why = untrusted.load_json(data[:OWNER_LIMIT], limit=OWNER_LIMIT)
        name = doc.get("consumer") if why is None and isinstance(doc, dict) else None
        return (name if isinstance(name, str) else None), int(stat.ephemeralOwner) or None

    def take(self, p: int, watch: Watcher | None = None) -> Owned | None:
        """Take partition ``p``: None if another session owns it (``watch`` fires once when
        its owner node changes). Fenced from now on."""
        self._ensure_partition(p)
        owner_path = self.layout.partition_owner(p)
        for _ in range(3):
            try:
                data, stat = self.zk.get(self.layout.partition(p))
            except NoNodeError:  # deleted by hand since it was made here: made again
                self._made.discard(p)
                self._ensure_partition(p)
                continue
            existing = self.zk.exists(owner_path, watch=watch)
            if existing is not None:
                if int(existing.ephemeralOwner) != (self.zk.session_id or -1):
                    return None
                self.zk.delete(owner_path)  # ours from before (a retry): taken again
            tx = self.zk.transaction()
            tx.set_data(self.layout.partition(p), data, version=int(stat.version))
            tx.create(owner_path, _owner_doc(self.consumer, int(stat.version) + 1),
                      ephemeral=True)
            results = tx.commit()
            if tx_ok(results):
                epoch = int(stat.version) + 1
                with self._fence_lock:
                    self._versions[p] = (epoch, epoch)
                    self._unsure.pop(p, None)
                now = time.time()
                return Owned(p, epoch, now, ps.decode(data, now))
            if isinstance(results[1], NodeExistsError):
                return None
        return None

    def take_many(self, ps_: Sequence[int], watch: Watcher | None = None
                  ) -> dict[int, Owned | None]:
        """:meth:`take` for many partitions at once: their nodes and owners read pipelined,
        the free ones taken in transactions of up to :data:`OWNERSHIP_PER_TX` partitions
        (a consumer starting on a root of 256 partitions took them in 3.5 s one by one, and
        in 256 writes). A transaction that fails -- a partition whose version moved between
        the read and the take, or taken meanwhile by another consumer -- is done again one
        partition at a time; the answer per partition is its Owned, or None (another
        session holds it)."""
        self._ensure_many([p for p in ps_ if p not in self._made])
        reads = gather([self.zk.get_async(self.layout.partition(p)) for p in ps_],
                       self.zk.zk_timeout)
        owners = gather([self.zk.exists_async(self.layout.partition_owner(p), watch=watch)
                         for p in ps_], self.zk.zk_timeout)
        out: dict[int, Owned | None] = {}
        free: list[tuple[int, bytes, int]] = []
        for p, read, owner in zip(ps_, reads, owners, strict=True):
            if isinstance(read, Exception) or isinstance(owner, Exception) or (
                    owner is not None and int(owner.ephemeralOwner) == (self.zk.session_id
                                                                         or -1)):
                out[p] = self.take(p, watch)  # an error, or ours from before: one by one
            elif owner is not None:
                out[p] = None
            else:
                data, stat = read
                free.append((p, bytes(data or b""), int(stat.version)))
        chunks = list(_ownership_chunks(free))
        answers = gather([self._take_tx(chunk).commit_async() for chunk in chunks],
                         self.zk.zk_timeout)
        now = time.time()
        for chunk, res in zip(chunks, answers, strict=True):
            if isinstance(res, list) and tx_ok(res):
                for p, data, version in chunk:
                    out[p] = self._taken(p, version + 1, data, now)
            else:  # raced, or no answer: one by one
                for p, _data, _version in chunk:
                    out[p] = self.take(p, watch)
        return out

    def _take_tx(self, chunk: Sequence[tuple[int, bytes, int]]) -> Multi:
        """One transaction taking every partition of ``chunk``: the partition node written
        at the version read (the new epoch, fencing older owners) and the owner node made."""
        tx = self.zk.transaction()
        for p, data, version in chunk:
            tx.set_data(self.layout.partition(p), data, version=version)
            tx.create(self.layout.partition_owner(p), _owner_doc(self.consumer, version + 1),
                      ephemeral=True)
        return tx

    def _taken(self, p: int, epoch: int, data: bytes, now: float) -> Owned:
        with self._fence_lock:
            self._versions[p] = (epoch, epoch)
            self._unsure.pop(p, None)
        return Owned(p, epoch, now, ps.decode(data, now))

    def _ensure_many(self, ps_: Sequence[int]) -> None:
        """The partition nodes exist: a listing tells which do (reads cost no quorum
        write); the missing ones are made in transactions of up to
        :data:`OWNERSHIP_PER_TX`. Consumers that start together race to make the same
        nodes: a transaction that fails is not done node by node at once (each of those
        creates would fail too, and count as a write), the listing is read again and only
        what is still missing is made; after a few rounds node by node, where an existing
        node is fine."""
        missing = list(ps_)
        for _ in range(_ENSURE_ROUNDS):
            if not missing:
                return
            missing = self._unlisted(missing)
            chunks = [missing[i:i + OWNERSHIP_PER_TX]
                      for i in range(0, len(missing), OWNERSHIP_PER_TX)]
            txs = []
            for chunk in chunks:
                tx = self.zk.transaction()
                for p in chunk:
                    tx.create(self.layout.partition(p), b"{}")
                txs.append(tx.commit_async())
            failed: list[int] = []
            for chunk, res in zip(chunks, gather(txs, self.zk.zk_timeout), strict=True):
                if isinstance(res, list) and tx_ok(res):
                    self._made.update(chunk)
                else:
                    failed += chunk
            missing = failed
        self._ensure_each(self._unlisted(missing) if missing else [])

    def _unlisted(self, ps_: Sequence[int]) -> list[int]:
        """Of ``ps_``, the partitions whose node the listing does not show (the others are
        marked made)."""
        if not ps_:
            return []
        try:
            there = set(self.zk.get_children(self.layout.partitions))
        except NoNodeError:
            there = set()
        missing = []
        for p in ps_:
            if str(p) in there:
                self._made.add(p)
            else:
                missing.append(p)
        return missing

    def _ensure_each(self, ps_: Sequence[int]) -> None:
        if not ps_:
            return
        txs = []
        for p in ps_:
            tx = self.zk.transaction()
            tx.create(self.layout.partition(p), b"{}")
            txs.append(tx.commit_async())
        for p, res in zip(ps_, gather(txs, self.zk.zk_timeout), strict=True):
            if isinstance(res, list) and (tx_ok(res) or isinstance(res[0], NodeExistsError)):
                self._made.add(p)

    def version(self, owned: Owned) -> int:
        """The partition node's version this owner's next fenced write checks: the epoch of
        the take, moved on by every host-state write of this owner since (another Owned of
        the same partition -- an older take -- keeps its own epoch, and is fenced)."""
        with self._fence_lock:
            taken, now = self._versions.get(owned.partition, (owned.epoch, owned.epoch))
            if taken != owned.epoch:
                return owned.epoch
            written = self._unsure.pop(owned.partition, None)
            if written is not None:
                now = self._reconcile(owned.partition, now, written)
                self._versions[owned.partition] = (taken, now)
            return now

    def _reconcile(self, p: int, version: int, written: bytes) -> int:
        """A host-state write whose answer was lost: did it commit? (Its data is ours and
        the version one past what we knew: yes. Anything else: the version we knew -- a
        write of another client fences us as it should.)"""
        try:
            data, stat = self.zk.get(self.layout.partition(p))
        except NoNodeError:
            return version
        except ConnectionLoss:
            self._unsure[p] = written  # still unknown: asked again at the next write
            return version
        return version + 1 if int(stat.version) == version + 1 and data == written \
            else version

    def release(self, owned: Owned) -> bool:
        """Give ``owned`` up (a clean stop or a rebalance): False if it was not ours."""
        with self._fence_lock:
            tx = self.zk.transaction()
            tx.check(self.layout.partition(owned.partition), self.version(owned))
            tx.delete(self.layout.partition_owner(owned.partition))
            ok = tx_ok(tx.commit())
            if ok:
                self._versions.pop(owned.partition, None)
            return ok

    def forgotten_owners(self, ps_: Sequence[int]) -> list[tuple[int, int]]:
        """Of partitions ``ps_`` (ones this consumer neither owns nor holds in memory), those
        whose owner node this session holds all the same: ``(partition, node version)``, read
        pipelined. No answer is no finding (tried at the next sweep)."""
        me = self.zk.session_id
        if not ps_ or me is None:
            return []
        stats = gather([self.zk.exists_async(self.layout.partition_owner(p)) for p in ps_],
                       self.zk.zk_timeout)
        return [(p, int(st.version)) for p, st in zip(ps_, stats, strict=True)
                if st is not None and not isinstance(st, Exception)
                and int(st.ephemeralOwner) == me]

    def drop_owner(self, p: int, version: int) -> bool:
        """Delete the owner node of ``p`` that :meth:`forgotten_owners` found ours, at the
        version it saw; True if gone. (An owner node is never written, so the version does not
        tell a node deleted and made again by another consumer in between: only this session
        deletes its owner nodes, and only from the claim loop, so that takes an operator's
        hand-delete and another take within this one round trip.)"""
        try:
            self.zk.delete(self.layout.partition_owner(p), version=version)
        except (NoNodeError, BadVersionError):
            return False
        with self._fence_lock:
            self._versions.pop(p, None)
        return True

    def release_many(self, owned: Sequence[Owned]) -> dict[int, bool]:
        """:meth:`release` for many partitions, in transactions of up to
        :data:`OWNERSHIP_PER_TX` (each checks every partition's version, as one release
        does); a transaction that fails (one partition no longer ours) is done again one
        partition at a time. Per partition: True if released, False if it was not ours.
        ConnectionLoss and session errors are raised, as :meth:`release` raises them."""
        out: dict[int, bool] = {}
        for i in range(0, len(owned), OWNERSHIP_PER_TX):
            chunk = owned[i:i + OWNERSHIP_PER_TX]
            with self._fence_lock:
                tx = self.zk.transaction()
                for o in chunk:
                    tx.check(self.layout.partition(o.partition), self.version(o))
                    tx.delete(self.layout.partition_owner(o.partition))
                if tx_ok(tx.commit()):
                    for o in chunk:
                        self._versions.pop(o.partition, None)
                        out[o.partition] = True
                    continue
            for o in chunk:
                out[o.partition] = self.release(o)
        return out

    # -- reading and progress --------------------------------------------------------
    def probe_many(self, ps_: Sequence[int], watch: Callable[[int], Watcher]
                   ) -> dict[int, bool | None]:
        """Whether each partition holds a batch node: one pipelined listing for all, each
        with ``watch(p)`` set (it fires once when the partition's children change); None
        where the listing failed. A consumer that gains many partitions at once reads only
        the ones with batches (the empty ones have their watch)."""
        listings = gather([self.zk.get_children_async(self.layout.partition(p), watch=watch(p))
                           for p in ps_], self.zk.zk_timeout)
        return {p: None if isinstance(res, Exception)
                else any(c.startswith(item_codec.PREFIX) for c in res)
                for p, res in zip(ps_, listings, strict=True)}

    def read(self, owned: Owned, limit: int = 100, *, skip: frozenset[str] = frozenset(),
             watch: Watcher | None = None) -> Read:
        """The partition's first ``limit`` batches, lowest first, but those named in
        ``skip`` (known already); nodes that are not batches become dead letters (fenced)
        and are left out. ``watch`` fires once when the partition's children change."""
        path = self.layout.partition(owned.partition)
        names = self._unread(self.zk.get_children(path, watch=watch), skip, limit)
        return self._decoded(owned, names, self.zk.get_many(
            [f"{path}/{n}" for n in names], per_request=BATCHES_PER_READ))

    def read_many(self, wanted: Sequence[tuple[Owned, frozenset[str]]],
                  watch: Callable[[int], Watcher], limit: int = 100
                  ) -> dict[int, Read | Exception]:
        """:meth:`read` of many partitions (each ``(owned, skip)``) in two round trips --
        one pipelined listing, one pipelined read of their batches -- each listing with
        ``watch(p)``; per partition its Read, or the exception its listing or a fenced
        dead letter raised (the others are read all the same). A consumer that takes 128
        partitions at a start read them 8 a round, one after another, in ~3 s (bench hosts,
        2,500 hosts: the hosts' first pages waited for it)."""
        paths = [self.layout.partition(o.partition) for o, _ in wanted]
        listings = gather([self.zk.get_children_async(path, watch=watch(o.partition))
                           for path, (o, _) in zip(paths, wanted, strict=True)],
                          self.zk.zk_timeout)
        names = [[] if isinstance(found, Exception) else self._unread(found, skip, limit)
                 for found, (_, skip) in zip(listings, wanted, strict=True)]
        datas = iter(self.zk.get_many([f"{path}/{n}" for path, ns in zip(paths, names,
                                                                         strict=True)
                                       for n in ns], per_request=BATCHES_PER_READ))
        out: dict[int, Read | Exception] = {}
        for (owned, _), found, ns in zip(wanted, listings, names, strict=True):
            results = [next(datas) for _ in ns]
            if isinstance(found, Exception):
                out[owned.partition] = found
                continue
            try:
                out[owned.partition] = self._decoded(owned, ns, results)
            except Exception as exc:
                out[owned.partition] = exc
        return out

    @staticmethod
    def _unread(children: Sequence[str], skip: frozenset[str], limit: int) -> list[str]:
        """The batch names of a listing not in ``skip``, lowest first, at most ``limit``."""
        return [n for _, n in item_codec.sort_names(
            [c for c in children if c.startswith(item_codec.PREFIX) and c not in skip])][:limit]

    def _decoded(self, owned: Owned, names: Sequence[str], results: Sequence[ReadResult]
                 ) -> Read:
        """The batches read (``results``, one per name); nodes that are not batches become
        dead letters (fenced) and are left out, nodes gone since the listing too."""
        path = self.layout.partition(owned.partition)
        out = Read()
        bad: list[tuple[str, int, bytes, str]] = []
        for name, res in zip(names, results, strict=True):
            if isinstance(res, Exception):
                continue  # gone since the listing
            data, stat = res
            batch, why = pb.decode(data)
            if batch is None:
                bad.append((name, int(stat.version), data, why or "malformed"))
            else:
                out.batches.append(BatchNode(name, int(stat.version), batch))
        for name, version, data, why in bad:
            with self._fence_lock:
                tx = self._fenced(owned)
                tx.delete(f"{path}/{name}", version=version)
                tx.create(self.layout.dead_prefix,
                          item_codec.encode_dead_letter(name, None, why, 0, data), sequence=True)
                self._commit(tx)
            out.dead += 1
        return out

    def reread(self, owned: Owned, name: str) -> BatchNode | None:
        """A batch as it is now (None: gone, or no longer a batch)."""
        try:
            data, stat = self.zk.get(f"{self.layout.partition(owned.partition)}/{name}")
        except NoNodeError:
            return None
        batch, _ = pb.decode(data)
        return None if batch is None else BatchNode(name, int(stat.version), batch)

    def depth(self) -> int:
        """Batch nodes in every partition plus items in the ingress: 0 means nothing is
        queued anywhere (owner nodes are not counted). Pipelined listings, 256 at a time:
        for an idle check, not for a hot path."""
        total = 0
        stat = self.zk.exists(self.layout.queue)
        total += int(stat.numChildren) if stat else 0
        try:
            names = self.zk.get_children(self.layout.partitions)
        except NoNodeError:
            return total
        paths = [f"{self.layout.partitions}/{n}" for n in names]
        for i in range(0, len(paths), 256):
            for res in gather([self.zk.get_children_async(p) for p in paths[i:i + 256]],
                              self.zk.zk_timeout):
                if isinstance(res, list):
                    total += sum(1 for c in res if c.startswith(item_codec.PREFIX))
        return total

    def adopt(self, owned: Owned, node: BatchNode, *, keep_abandoned: bool = False
              ) -> BatchNode | None:
        """A new owner's first look at a batch: items started by a holder that died count
        an attempt (dead letters at ``max_attempts``: ``abandoned``) and are redone in place
        (their identity kept), bad entries become dead letters. Returns the batch to work on
        (None: nothing left in it).

        ``keep_abandoned``: the items out of attempts stay in the batch as they are, still
        marked started, for the caller to settle as ``abandoned`` itself (with a record in
        its sink: :func:`abandoned_here`); should it die first, the next owner charges them
        again -- the same count, nothing lost."""
        b = node.batch
        if b.finished and not b.in_flight and not b.errors:
            # Nothing to do in it (an empty batch, which any client may write): deleted
            # now -- left, it would count as queued for ever (--exit-when-idle never ends).
            return self.progress(owned, node)
        if not b.in_flight and not b.errors:
            return node
        items = list(b.items)
        again: list[int] = []  # charged, redone where they are
        dead: list[bytes] = []
        kept: set[int] = set()
        for i in b.in_flight:
            item = items[i]
            assert item is not None
            charged = _charged(item)
            if not spent(charged.attempt, self.max_attempts):
                items[i] = charged
                again.append(i)
            elif keep_abandoned:
                kept.add(i)
            else:
                dead.append(self._dead(node.name, charged, "abandoned"))
        for i, why in b.errors.items():
            dead.append(item_codec.encode_dead_letter(node.name, None, why, 0, b.raws.get(i, b"")))
        settled = (set(b.in_flight) - set(again) - kept) | set(b.errors)
        if not settled and not again:
            return node
        in_place = BatchNode(node.name, node.version, replace(b, items=tuple(items)))
        if _fits(in_place.batch.progressed(done=settled, unstarted=again)):
            # Same batch, same index, same creation time: the item's identity (a sink's
            # unique key, zkcrawl.consumer.sinks.postgres) sees the redelivery, as it should.
            return self.progress(owned, in_place, done=settled, unstarted=again, dead=dead)
        return self.progress(owned, node, done=settled | set(again),  # a new batch at the tail
                             retry=[it for i in again if (it := items[i]) is not None],
                             dead=dead)

    def abandoned_here(self, node: BatchNode) -> list[int]:
        """After :meth:`adopt` with ``keep_abandoned``: the entries it kept (started by
        holders that died, out of attempts once this death is counted)."""
        b = node.batch
        return [i for i in b.in_flight if b.items[i] is not None
                and spent(_charged(b.items[i]).attempt, self.max_attempts)]  # type: ignore[arg-type]

    def progress(self, owned: Owned, node: BatchNode, *, started: Iterable[int] = (),
                 done: Iterable[int] = (), retry: Sequence[Item] = (),
                 dead: Sequence[bytes] = (), unstarted: Iterable[int] = ()
                 ) -> BatchNode | None:
        """One batch's :meth:`checkpoint`: mark ``started`` (and clear ``unstarted``: items
        given back before their fetch), settle ``done``, create a batch of ``retry`` items at
        the partition's tail and the ``dead`` letters; a batch with nothing left is deleted.
        Returns the batch as it now is (None: deleted). Raises :class:`Fenced` when the
        partition is no longer ours, :class:`Stale` when the batch moved under us."""
        res = self.checkpoint([Change(owned, node, frozenset(started), frozenset(done),
                                      frozenset(unstarted), list(retry), list(dead))])
        if owned.partition in res.fenced:
            raise Fenced("partition no longer ours (its epoch moved)")
        if res.stale:
            raise Stale("batch changed since it was read")
        return res.nodes[0]

    def checkpoint(self, changes: Sequence[Change],
                   states: Mapping[int, tuple[Owned, bytes]] | None = None) -> Checkpointed:
        """Many batches' progress in as few transactions as fit (``CHECKPOINT_TX_BYTES``
        each; one ZooKeeper write per transaction, whatever the number of batches and
        partitions in it): per partition a fence, then its batches' setData/delete, retry
        batches and dead letters. The fence is a check of the partition node's version, or
        -- for a partition in ``states`` (partition -> (owned, data of
        :func:`zkcrawl.queue.partition_state.encode`)) -- a setData of its host state at
        that version: the same fence, and the state rides the checkpoint (no write of its
        own). A transaction that fails is split per partition and tried again, so one
        fenced partition does not hold back the others. ConnectionLoss is raised as it
        comes (the caller reads the batches again)."""
        out = Checkpointed()
        states = states or {}
        groups: dict[int, list[int]] = defaultdict(list)
        for i, ch in enumerate(changes):
            groups[ch.owned.partition].append(i)
        for p in states:
            groups.setdefault(p, [])
        afters = [ch.node.batch.progressed(started=ch.started, done=ch.done,
                                           unstarted=ch.unstarted) for ch in changes]
        datas = [None if a.finished else pb.encode(a) for a in afters]  # each encoded once
        txs: list[list[int]] = []  # partitions per transaction
        size = 0
        for p, idx in groups.items():
            n = sum(len(datas[i] or b"") for i in idx) + 200 * len(idx) \
                + len(states[p][1] if p in states else b"")
            if not txs or size + n > CHECKPOINT_TX_BYTES:
                txs.append([])
                size = 0
            txs[-1].append(p)
            size += n
        batch = _TxInput(changes, afters, datas, groups, states)
        for parts in txs:
            if not self._checkpoint_tx(batch, parts, out) and len(parts) > 1:
                for p in parts:  # find the fenced or stale one: each alone
                    self._checkpoint_tx(batch, [p], out)
        return out

    def _fence_op(self, tx: Multi, batch: _TxInput, p: int) -> None:
        owned = batch.states[p][0] if p in batch.states else \
            batch.changes[batch.groups[p][0]].owned
        version = self.version(owned)
        if p in batch.states:
            tx.set_data(self.layout.partition(p), batch.states[p][1], version=version)
        else:
            tx.check(self.layout.partition(p), version)

    def _states_written(self, batch: _TxInput, ops: list[tuple[int, int | None]],
                        results: Sequence[TxResult], out: Checkpointed) -> None:
        """The partitions whose host state this transaction wrote: their version moved."""
        for (p, ci), res in zip(ops, results, strict=True):
            if ci is None and p in batch.states:
                owned = batch.states[p][0]
                taken, _ = self._versions.get(p, (owned.epoch, owned.epoch))
                if taken == owned.epoch:
                    self._versions[p] = (taken, int(getattr(res, "version", 0)))
                out.states.add(p)

    def _checkpoint_tx(self, batch: _TxInput, parts: list[int], out: Checkpointed) -> bool:
        with self._fence_lock:
            return self._checkpoint_tx_locked(batch, parts, out)

    def _checkpoint_tx_locked(self, batch: _TxInput, parts: list[int],
                              out: Checkpointed) -> bool:
        changes, afters, datas, groups = batch.changes, batch.afters, batch.datas, batch.groups
        tx = self.zk.transaction()
        ops: list[tuple[int, int | None]] = []  # (partition, change index or None)
        for p in parts:
            self._fence_op(tx, batch, p)
            ops.append((p, None))
            for i in groups[p]:
                ch = changes[i]
                path = f"{self.layout.partition(p)}/{ch.node.name}"
                data = datas[i]
                if data is None:
                    tx.delete(path, version=ch.node.version)
                else:
                    tx.set_data(path, data, version=ch.node.version)
                ops.append((p, i))
                for chunk, refused in pb.pack(ch.retry, max_items=self.max_items):
                    self._refuse(refused)
                    if chunk:
                        tx.create(self.layout.partition_batch_prefix(p),
                                  pb.encode(pb.Batch(tuple(chunk))), sequence=True)
                        ops.append((p, -1))
                for letter in ch.dead[:DEAD_PER_TX]:
                    tx.create(self.layout.dead_prefix, letter, sequence=True)
                    ops.append((p, -1))
        try:
            results = tx.commit()
        except ConnectionLoss:
            for p in parts:  # did the state write commit? asked before the next write
                if p in batch.states:
                    self._unsure[p] = batch.states[p][1]
            raise
        if tx_ok(results):
            self._states_written(batch, ops, results, out)
            for (_, ci), res in zip(ops, results, strict=True):
                if ci is None or ci < 0:
                    continue
                after = afters[ci]
                node = changes[ci].node
                out.nodes[ci] = None if after.finished else BatchNode(
                    node.name, int(getattr(res, "version", node.version + 1)), after)
            return True
        if len(parts) == 1:
            bad = next(k for k, r in enumerate(results)
                       if isinstance(r, Exception)
                       and not isinstance(r, (RolledBackError, RuntimeInconsistency)))
            bp, bi = ops[bad]
            if bi is None:
                out.fenced.add(bp)
            elif bi >= 0 and isinstance(results[bad], (BadVersionError, NoNodeError)):
                out.stale.update(groups[bp])
            else:
                raise ZkCrawlError(f"checkpoint failed: {results[bad]!r}")
        return False

    def _dead(self, name: str, item: Item, error: str) -> bytes:
        data = pb.encode(pb.Batch((item,)))
        return item_codec.encode_dead_letter(name, item.url, error, item.attempt, data,
                                holder_deaths=int(item.meta.get("holder_deaths", 0) or 0))

    def _fenced(self, owned: Owned) -> Multi:
        tx = self.zk.transaction()
        tx.check(self.layout.partition(owned.partition), self.version(owned))
        return tx

    def _commit(self, tx: Multi) -> list[TxResult]:
        results = tx.commit()
        if tx_ok(results):
            return results
        if isinstance(results[0], (BadVersionError, NoNodeError)):
            raise Fenced("partition no longer ours (its epoch moved)")
        if len(results) > 1 and isinstance(results[1], (BadVersionError, NoNodeError)):
            raise Stale("batch changed since it was read")
        first = next(r for r in results if isinstance(r, Exception))
        raise ZkCrawlError(f"partition write failed: {first!r}")

    # -- the ingress -----------------------------------------------------------------
    def ingress_names(self, watch: Watcher | None = None) -> list[str]:
        """The ingress's item names, oldest first (one listing: a mover takes from it)."""
        return [n for _, n in item_codec.sort_names(
            self.zk.get_children(self.layout.queue, watch=watch))]

    def move_ingress(self, limit: int = INGRESS_PER_MOVE, watch: Watcher | None = None,
                     names: Sequence[str] | None = None) -> tuple[int, int]:
        """Move up to ``limit`` ingress items (the oldest, or the first of ``names``, a
        listing made before) into their partitions in one transaction (at most
        ``MAX_TX_BYTES`` of items): ``(moved, dead)``. (0, 0) when another mover won the
        race or there was nothing to move."""
        if names is None:
            names = self.ingress_names(watch)
        names = list(names[:limit])
        if not names:
            return 0, 0
        tx = self.zk.transaction()
        groups: dict[int, list[Item]] = defaultdict(list)
        dead = moved = size = 0
        self.ingress_consumed = 0  # names of ``names`` this move dealt with (read or gone)
        for name, res in zip(names, self.zk.get_many([self.layout.item(n) for n in names]),
                             strict=True):
            if isinstance(res, Exception):
                self.ingress_consumed += 1
                continue
            data, stat = res
            size += len(data) + 2 * len(name) + 64
            if size > MAX_TX_BYTES and moved + dead:
                break  # the rest: the next move
            self.ingress_consumed += 1
            tx.delete(self.layout.item(name), version=int(stat.version))
            decoded = item_codec.decode(data)
            if decoded.item is None:
                tx.create(self.layout.dead_prefix,
                          item_codec.encode_dead_letter(name, None,
                                                        decoded.error or "malformed", 0, data),
                          sequence=True)
                dead += 1
                continue
            groups[self.partition_of_url(decoded.item.url)].append(decoded.item)
            moved += 1
        self.ensure_partitions(groups)
        for p, group in sorted(groups.items()):
            self._ensure_partition(p)
            for chunk, refused in pb.pack(group, max_items=self.max_items):
                for item in refused:  # cannot happen for a decoded item; never dropped
                    tx.create(self.layout.dead_prefix, item_codec.encode_dead_letter(
                        "ingress", item.url, "too large for a batch", item.attempt, b""),
                        sequence=True)
                if chunk:
                    tx.create(self.layout.partition_batch_prefix(p),
                              pb.encode(pb.Batch(tuple(chunk))), sequence=True)
        if not tx_ok(tx.commit()):
            # Raced by another mover, or a partition deleted by hand since it was made here:
            # the next move lists them again (a read) and makes the missing ones.
            self._made.difference_update(groups)
            return 0, 0
        return moved, dead


@dataclass(frozen=True)
class _TxInput:
    """One checkpoint's input, shared by its transactions."""

    changes: Sequence[Change]
    afters: Sequence[pb.Batch]
    datas: Sequence[bytes | None]
    groups: dict[int, list[int]]
    states: Mapping[int, tuple[Owned, bytes]]


def _ownership_chunks(free: Sequence[tuple[int, bytes, int]]
                      ) -> Iterator[list[tuple[int, bytes, int]]]:
    """``free`` partitions ``(p, data, version)`` in groups for one take transaction each:
    at most :data:`OWNERSHIP_PER_TX` partitions and :data:`MAX_TX_BYTES` of node data (a
    partition node carries its host state: kilobytes at most, written back as it is)."""
    chunk: list[tuple[int, bytes, int]] = []
    size = 0
    for entry in free:
        cost = len(entry[1]) + 256  # the owner document and the paths, generously
        if chunk and (len(chunk) >= OWNERSHIP_PER_TX or size + cost > MAX_TX_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += cost
    if chunk:
        yield chunk


def _fits(batch: pb.Batch) -> bool:
    """Whether ``batch`` encodes within :data:`~zkcrawl.queue.partition_batch.BATCH_LIMIT`
    (charged items are a few bytes longer than they were)."""
    try:
        pb.encode(batch)
    except ValueError:
        return False
    return True


def _charged(item: Item) -> Item:
    """``item`` with one more attempt, counted as a holder's death (SPEC §3)."""
    meta = dict(item.meta)
    deaths = meta.get("holder_deaths", 0)
    meta["holder_deaths"] = (deaths if isinstance(deaths, int) and deaths >= 0 else 0) + 1
    return Item(url=item.url, attempt=min(item.attempt + 1, item_codec.MAX_ATTEMPT),
                producer=item.producer, meta=meta, enqueued_at=item.enqueued_at)
