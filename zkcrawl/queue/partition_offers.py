"""The producer's side of the partitioned frontier (SPEC §2, §4): a root's P, offers straight
into partitions, and how full each partition is.

* :func:`recorded_partitions`: the root's P, recorded once with a conditional write; root
  data not to be trusted is one line, exit 2. :func:`root_partitions` only reads it.
* :class:`PartitionOffers`: batches of at most 64 KiB per partition, committed in protected
  transactions (an ephemeral marker: a lost answer never doubled while the session lives);
  :meth:`PartitionOffers.commit` yields the batches as they commit.
* **Depth in items, cheap and from above**: the sum of a partition's batch counts (known
  from our creates, others read once, done items counted until their batch goes); a
  partition is listed again only when an offer might pass its bound, and a children watch
  sets :attr:`PartitionOffers.changed` (no polling).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from zkcrawl.errors import UsageError
from zkcrawl.logs import get_logger
from zkcrawl.queue import items as item_codec
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue import untrusted
from zkcrawl.queue.ingress import MAX_TX_BYTES
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_queue import PartitionQueue
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS, decode_root
from zkcrawl.zk import BadVersionError, NoNodeError, WatchedEvent, Watcher, ZkClient, gather

log = get_logger(__name__)

_LIST_CHUNK = 256  # partitions listed per pipelined round
_READ_CHUNK = 100  # batches per multi-read (as PartitionQueue.read)
_READS_PER_LISTING = 2000  # another's batches read per listing of a partition at most
_ORIGINS_CACHED = 100_000  # scheme://host:port -> partition, memoised


def root_path(root: str) -> str:
    """The znode whose data records the root's P."""
    return Layout.of(root).root or "/"


def _refuse_root(path: str, why: str) -> UsageError:
    return UsageError(f"the root {path} records no usable partition count ({why}): "
                      "set it with every consumer and producer stopped, e.g. "
                      f"'set {path} {{\"partitions\": {DEFAULT_PARTITIONS}}}' in zkCli")


def root_changed(path: str, partitions: int, p: int | None, why: str | None) -> UsageError:
    """A running process's P (``partitions``) no longer what the root records (``p``, or
    ``why`` it records none usable): one line, exit 2, naming the P to set back."""
    now = f"records {p} partitions" if why is None and p is not None else (
        f"records no usable partition count ({why or 'none'})")
    return UsageError(
        f"the root {path} now {now}, not the {partitions} this consumer owns by (edited by "
        "hand?): consumers that disagree on P would fetch a host twice, so this one stops. "
        f"Its queued items are in the partitions of P = {partitions}: set it back with "
        f"every consumer and producer stopped, 'set {path} {{\"partitions\": {partitions}}}' "
        "in zkCli")


def root_partitions(zk: ZkClient, root: str) -> int | None:
    """The P the root records, None when it records none (or does not exist); hostile root
    data is a :class:`~zkcrawl.errors.UsageError` (exit 2)."""
    path = root_path(root)
    try:
        data, _stat = zk.get(path)
    except NoNodeError:
        return None
    p, why = decode_root(data)
    if why is not None:
        raise _refuse_root(path, why)
    return p


def recorded_partitions(zk: ZkClient, root: str, wanted: int = 0) -> int:
    """The root's P (SPEC §2: fixed when the root is made, recorded in its data). The first
    consumer or producer records ``wanted`` (0: :data:`DEFAULT_PARTITIONS`) with a
    conditional write -- two first ones agree on whichever wrote first; later a different
    ``wanted`` is a warning and the recorded P is used. Root data that is not to be trusted
    (malformed, P out of range: edited by hand) is one line, exit 2: processes that disagree
    on P would fetch a host twice."""
    path = root_path(root)
    zk.ensure_path(path)
    for _ in range(5):
        data, stat = zk.get(path)
        p, why = decode_root(data)
        if why is not None:
            raise _refuse_root(path, why)
        if p is not None:
            if wanted and wanted != p:
                log.warning("ownership.partitions_ignored", wanted=wanted, recorded=p,
                            note="P is fixed when the root is made")
            return p
        doc, _ = untrusted.load_json(data) if data else ({}, None)
        new = {**(doc if isinstance(doc, dict) else {}),
               "partitions": wanted or DEFAULT_PARTITIONS}
        try:
            zk.set(path, json.dumps(new).encode(), version=stat.version)
        except BadVersionError:
            continue  # another process recorded it first: read what it wrote
        return int(new["partitions"])
    raise UsageError(f"the root {path} changed under every attempt to record its partitions")


@dataclass(frozen=True)
class Committed:
    """One batch node a commit created: its partition, name ("" when a lost answer hid it)
    and the indices (into the group given to :meth:`PartitionOffers.commit`) it holds."""

    partition: int
    name: str
    indices: tuple[int, ...]


class PartitionOffers:
    """Offers into the partitions of one root, and their depths (module docstring)."""

    def __init__(self, zk: ZkClient, root: str, partitions: int, *, max_items: int = pb.MAX_ITEMS
                 ) -> None:
        self.zk = zk
        self.layout = Layout.of(root)
        self.partitions = partitions
        self.pq = PartitionQueue(zk, root, partitions, max_items=max_items)
        self.changed = threading.Event()  # a listed partition's children changed
        self._counts: dict[int, dict[str, int]] = {}  # p -> batch name -> items
        self._depth: dict[int, int] = {}  # p -> items, from above (measured + offered since)
        self._dirty: set[int] = set()  # watch fired since the last listing
        self._armed: set[int] = set()  # listed (a watch set) and not changed since
        self._watchers: dict[int, Watcher] = {}  # one callable per partition (kazoo: a set)
        self._lock = threading.Lock()
        self.ingress = 0
        self.measured = False
        self.listings = 0  # partitions listed (the cost of back-pressure)
        self._origins: dict[str, int] = {}

    @property
    def refused(self) -> int:
        return self.pq.refused

    def partition_of(self, url: str) -> int:
        """The partition of ``url``'s host, memoised by its ``scheme://authority`` (what
        :func:`~zkcrawl.web.urls.host_key` reads: the rest of the URL cannot change it)."""
        end = url.find("/", url.find("//") + 2) if "//" in url else -1
        origin = url if end < 0 else url[:end]
        p = self._origins.get(origin)
        if p is None:
            p = self.pq.partition_of_url(url)
            if len(self._origins) >= _ORIGINS_CACHED:
                self._origins.clear()
            self._origins[origin] = p
        return p

    # -- depths -------------------------------------------------------------------------
    def depth(self, p: int) -> int:
        """Items in ``p`` as last known (from above)."""
        return self._depth.get(p, 0)

    def total(self) -> int:
        """Items queued anywhere as last known: the ingress and every partition."""
        return self.ingress + sum(self._depth.values())

    def dirty(self, p: int) -> bool:
        return p in self._dirty

    def armed(self, p: int) -> bool:
        """A watch is set on ``p``'s children (listed since its last change)."""
        return p in self._armed

    def measure_ingress(self) -> int:
        """The ingress's depth again (its children count: one item each)."""
        stat = self.zk.exists(self.layout.queue)
        self.ingress = int(stat.numChildren) if stat else 0
        return self.ingress

    def mark_all_dirty(self, parts: Sequence[int] | None = None) -> None:
        """Every partition (or ``parts``) may have changed (a wait without any watch firing:
        a watch lost with a session is made good by listing again)."""
        with self._lock:
            self._dirty.update(range(self.partitions) if parts is None else parts)

    def measure(self, parts: Sequence[int] | None = None) -> int:
        """List ``parts`` (None: every partition, and the ingress) again, arming a watch on
        each; returns the total as now known."""
        todo = list(range(self.partitions)) if parts is None else list(parts)
        if parts is None:
            self.measure_ingress()
            self.measured = True
        for i in range(0, len(todo), _LIST_CHUNK):
            chunk = todo[i:i + _LIST_CHUNK]
            with self._lock:
                self._dirty.difference_update(chunk)
            listings = gather([self.zk.get_children_async(self.layout.partition(p),
                                                          watch=self._watcher(p))
                               for p in chunk], self.zk.zk_timeout)
            self.listings += len(chunk)
            for p, res in zip(chunk, listings, strict=True):
                names = [] if isinstance(res, Exception) else \
                    [n for n in res if n.startswith(item_codec.PREFIX)]
                if not isinstance(res, Exception):
                    with self._lock:  # no node, no watch: armed once it is made and listed
                        self._armed.add(p)
                self._count(p, names)
        return self.total()

    def _count(self, p: int, names: list[str]) -> None:
        known = self._counts.get(p, {})
        counts = {n: known[n] for n in names if n in known}
        foreign = [n for n in names if n not in known]
        base = self.layout.partition(p)
        for i in range(0, min(len(foreign), _READS_PER_LISTING), _READ_CHUNK):
            chunk = foreign[i:i + _READ_CHUNK]
            for name, res in zip(chunk, self.zk.get_many([f"{base}/{n}" for n in chunk]),
                                 strict=True):
                if isinstance(res, Exception):
                    continue  # gone since the listing
                batch, _why = pb.decode(res[0])
                counts[name] = 1 if batch is None else len(batch.pending)
        # beyond the reads of one listing: one item each until a later listing reads them
        unread = max(0, len(foreign) - _READS_PER_LISTING)
        self._counts[p] = counts
        self._depth[p] = sum(counts.values()) + unread

    def _watcher(self, p: int) -> Watcher:
        watcher = self._watchers.get(p)
        if watcher is None:
            def changed(_event: WatchedEvent) -> None:  # kazoo's thread: flags only
                with self._lock:
                    self._dirty.add(p)
                    self._armed.discard(p)
                self.changed.set()
            watcher = self._watchers[p] = changed
        return watcher

    # -- offers -------------------------------------------------------------------------
    def commit(self, groups: Mapping[int, Sequence[Item]]) -> Iterator[Committed]:
        """Commit ``groups`` (partition -> items) as batches, yielding each batch as its
        transaction committed (the depths count it at once). Items over the size limit are
        refused (counted in :attr:`refused`, logged) and never yielded."""
        creates: list[tuple[str, bytes]] = []
        holds: list[tuple[int, tuple[int, ...]]] = []
        self.pq.ensure_partitions(p for p, group in groups.items() if group)
        for p, group in sorted(groups.items()):
            if not group:
                continue
            self.pq._ensure_partition(p)
            index = {id(item): i for i, item in enumerate(group)}
            for chunk, refused in pb.pack(list(group), max_items=self.pq.max_items):
                self.pq._refuse(refused)
                if chunk:
                    creates.append((self.layout.partition_batch_prefix(p),
                                    pb.encode(pb.Batch(tuple(chunk)))))
                    holds.append((p, tuple(index[id(it)] for it in chunk)))
        for start, end in _transactions(creates):
            names = self.pq._create_protected(creates[start:end])
            for (p, idx), path in zip(holds[start:end], names, strict=True):
                name = path.rsplit("/", 1)[-1]
                self._depth[p] = self._depth.get(p, 0) + len(idx)
                if name:
                    self._counts.setdefault(p, {})[name] = len(idx)
                yield Committed(p, name, idx)


def _transactions(creates: Sequence[tuple[str, bytes]]) -> Iterator[tuple[int, int]]:
    """``[start, end)`` of the creates one protected transaction takes (its rule: at most
    ``MAX_TX_BYTES``), so a caller can settle transaction by transaction."""
    start, size = 0, 0
    for i, (prefix, data) in enumerate(creates):
        n = len(data) + len(prefix)
        if i > start and size + n > MAX_TX_BYTES:
            yield start, i
            start, size = i, 0
        size += n
    if start < len(creates):
        yield start, len(creates)
