"""The partitions of a root as ``zkcrawl status`` and the exporter show them:
:func:`partition_status` (its docstring has the document and the rules).

* **Bounded cost**: one listing of ``<root>/partitions``, then pipelined reads per partition;
  batch data is read only to count items, and only up to :data:`MAX_BATCH_READS` batches
  and :data:`MAX_READ_BYTES` (beyond, ``items`` is null and ``items_note`` says why).
* **Hostile input** (SPEC §2) never raises: odd children are ``ignored``, an owner node is
  *verified* only by its ZooKeeper session, a batch that does not decode is ``malformed``.
* Host figures are taken only from a partition's verified owner's status node.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zkcrawl.queue import items as item_codec
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue import untrusted
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_queue import OWNER_LIMIT
from zkcrawl.queue.partitions import MAX_PARTITIONS, decode_root
from zkcrawl.zk import NoNodeError, Stat, ZkClient, gather

MAX_BATCH_READS = 2000  # batches whose data is read to count items, in all
MAX_READ_BYTES = 8 * 1024 * 1024  # batch data counted per status, in all
READ_CHUNK = 100  # batches per multi-read (as PartitionQueue.read), the bytes capped in all
HEAD_TRIES = 3  # batches tried per partition for the oldest one's age
UNKNOWN = "?"  # the owner of an owner node that names no consumer
_NAME = re.compile(r"0|[1-9][0-9]{0,3}")  # a partition's node name: plain decimal


@dataclass
class _PartitionFindings:
    """What one partition was found to hold."""

    p: int
    batches: list[str] = field(default_factory=list)
    owner: dict[str, Any] | None = None
    depth: int | None = None
    malformed: int = 0
    oldest_age_s: float | None = None
    hosts: tuple[int, int] | None = None  # (active, backed off): its verified owner's word

    def to_json(self) -> dict[str, Any]:
        o = self.owner or {}
        return {"partition": self.p, "owner": o.get("consumer"), "epoch": o.get("epoch"),
                "verified": o.get("verified", False) if self.owner else None,
                "batches": len(self.batches), "depth": self.depth,
                "malformed": self.malformed, "oldest_age_s": self.oldest_age_s,
                "hosts_active": None if self.hosts is None else self.hosts[0],
                "hosts_backed_off": None if self.hosts is None else self.hosts[1]}


MAX_HOST_COUNT = 10**7  # a count of hosts past this is no count


def host_figures(doc: object) -> dict[int, tuple[int, int]] | None:
    """A consumer status document's per-partition host figures (``ownership.hosts``,
    module docstring), or None when it publishes none. Untrusted: a partition key that is
    no partition number or a value that is not two counts is dropped; never raises."""
    own = doc.get("ownership") if isinstance(doc, dict) else None
    hosts = own.get("hosts") if isinstance(own, dict) else None
    if not isinstance(hosts, dict):
        return None
    out: dict[int, tuple[int, int]] = {}
    for key, value in list(hosts.items())[:MAX_PARTITIONS]:
        if not (isinstance(key, str) and _NAME.fullmatch(key) and int(key) < MAX_PARTITIONS):
            continue
        if not (isinstance(value, list) and len(value) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_HOST_COUNT
                for v in value)):
            continue
        out[int(key)] = (value[0], value[1])
    return out


def _hosts(parts: Sequence[_PartitionFindings], published: Mapping[str, object]) -> None:
    """Each partition's host figures from its verified owner's status document."""
    figures: dict[str, dict[int, tuple[int, int]] | None] = {}
    for part in parts:
        o = part.owner
        if o is None or not o.get("verified"):
            continue
        name = o["consumer"]
        if name not in figures:
            figures[name] = host_figures(published.get(name))
        mine = figures[name]
        if mine is not None:
            part.hosts = mine.get(part.p, (0, 0))


def count_pending(data: bytes) -> int | None:
    """The items of a batch node not done, or None when the node is no batch -- the envelope
    rules of :func:`zkcrawl.queue.partition_batch.decode` (size, JSON, an ``items`` list of
    at most ``MAX_ITEMS``; ``done`` indices in range, repeats and wrong types dropped)
    without decoding each item (ten times cheaper: a status counts, its owner decodes). An
    entry that is no item counts as queued until its owner dead-letters it. Never raises."""
    if len(data) > pb.BATCH_LIMIT:
        return None
    doc, why = untrusted.load_json(data, limit=pb.BATCH_LIMIT)
    if why is not None or not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        return None
    n = len(doc["items"])
    if n > pb.MAX_ITEMS:
        return None
    done = doc.get("done")
    if not isinstance(done, list):
        return n
    return n - len({i for i in done
                    if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n})


def _count(zk: ZkClient, root: str) -> tuple[int | None, str | None]:
    """P as the root's data records it (untrusted: a reason instead)."""
    try:
        data, _ = zk.get(root.rstrip("/") or "/")
    except NoNodeError:
        return None, None
    return decode_root(data)


def _partition_names(names: list[str], count: int | None) -> list[int]:
    limit = count if count is not None else MAX_PARTITIONS
    return sorted(int(n) for n in names if _NAME.fullmatch(n) and int(n) < limit)


def decode_owner(data: bytes | None, stat: Stat, sessions: Mapping[str, int]
                 ) -> dict[str, Any]:
    """An owner node, untrusted: ``{"consumer", "epoch", "since", "session", "verified"}``;
    never raises. ``verified``: its session is the one of the live consumer it names."""
    raw = data or b""
    doc, _why = untrusted.load_json(raw, limit=OWNER_LIMIT)
    doc = doc if isinstance(doc, dict) else {}
    name = doc.get("consumer")
    name = name if isinstance(name, str) and name else None
    epoch = doc.get("epoch")
    epoch = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) and \
        0 <= epoch < 2**31 else None
    session = int(getattr(stat, "ephemeralOwner", 0) or 0)
    verified = bool(name is not None and session and sessions.get(name) == session)
    since = untrusted.number(doc.get("since"), 0.0, lo=0.0, hi=1e11) or None
    return {"consumer": name or UNKNOWN, "epoch": epoch, "since": since,
            "verified": verified}


def _list(zk: ZkClient, layout: Layout, ps: list[int]) -> list[_PartitionFindings]:
    results = gather([zk.get_children_async(layout.partition(p)) for p in ps], zk.zk_timeout)
    parts = []
    for p, res in zip(ps, results, strict=True):
        if isinstance(res, Exception):
            continue  # deleted between the two listings
        part = _PartitionFindings(p, [n for _, n in item_codec.sort_names(
            [c for c in res if c.startswith(item_codec.PREFIX)])])
        part.owner = {} if "owner" in res else None  # read next
        parts.append(part)
    return parts


def _owners(zk: ZkClient, layout: Layout, parts: list[_PartitionFindings],
            sessions: Mapping[str, int]) -> None:
    held = [x for x in parts if x.owner is not None]
    results = gather([zk.get_async(layout.partition_owner(x.p)) for x in held], zk.zk_timeout)
    for part, res in zip(held, results, strict=True):
        part.owner = None if isinstance(res, Exception) else decode_owner(res[0], res[1],
                                                                          sessions)


def _heads(zk: ZkClient, layout: Layout, parts: list[_PartitionFindings], now: float) -> None:
    """Each partition's oldest batch age: the first batch's ctime (pipelined); a head
    settled meanwhile is replaced by the next batch, at most :data:`HEAD_TRIES` deep."""
    todo = [(x, 0) for x in parts if x.batches]
    for _ in range(HEAD_TRIES):
        results = gather([zk.exists_async(f"{layout.partition(x.p)}/{x.batches[i]}")
                          for x, i in todo], zk.zk_timeout)
        again = []
        for (part, i), res in zip(todo, results, strict=True):
            if res is not None and not isinstance(res, Exception):
                part.oldest_age_s = round(max(0.0, now - res.ctime / 1000.0), 3)
            elif i + 1 < len(part.batches):
                again.append((part, i + 1))
        if not again:
            return
        todo = again


def _items(zk: ZkClient, layout: Layout, parts: list[_PartitionFindings]) -> str | None:
    """Each partition's depth from its batches' data (module docstring: the caps); returns
    why the items were not counted, or None."""
    total = sum(len(x.batches) for x in parts)
    if total > MAX_BATCH_READS:
        return f"{total} batches: over {MAX_BATCH_READS}, batches counted only"
    paths = [(x, f"{layout.partition(x.p)}/{n}") for x in parts for n in x.batches]
    depth: Counter[int] = Counter()
    malformed: Counter[int] = Counter()
    read = 0
    for i in range(0, len(paths), READ_CHUNK):
        chunk = paths[i:i + READ_CHUNK]
        for (part, _), res in zip(chunk, zk.get_many([p for _, p in chunk]), strict=True):
            if isinstance(res, Exception):
                continue  # settled and deleted meanwhile: holds nothing
            read += len(res[0])
            pending = count_pending(res[0])
            if pending is None:
                malformed[part.p] += 1
            else:
                depth[part.p] += pending
        if read > MAX_READ_BYTES:
            return f"over {MAX_READ_BYTES // 2**20} MiB of batch data: batches counted only"
    for part in parts:
        part.depth, part.malformed = depth[part.p], malformed[part.p]
    return None


def partition_status(zk: ZkClient, root: str, now: float, sessions: Mapping[str, int],
                     published: Mapping[str, object] | None = None) -> dict[str, Any] | None:
    """The ``partitions`` section of ``zkcrawl status --json`` -- ``None`` when
    ``<root>/partitions`` does not exist (no consumer has run on the root). ``sessions``:
    live consumer id -> the session of its status node; ``published``: live consumer id ->
    its status document (for the host figures)::

        {"count": P | null, "count_error": reason | null,   # P from the root's data
         "present": partition nodes, "ignored": children that are no partition,
         "owned": partitions with an owner node, "by_owner": {consumer: n},
         "unverified": [p...],          # owner node not held by the live consumer it names
         "batches": n, "items": n | null, "items_counted": bool, "items_note": why | null,
         "malformed_batches": n, "oldest_age_s": s | null,
         "unowned_with_items": n, "unowned": [p...],          # all of them
         "hosts_active": n | null, "hosts_backed_off": n | null,  # sums of the list's
         "list": [{"partition", "owner", "epoch", "verified", "batches", "depth",
                   "malformed", "oldest_age_s", "hosts_active", "hosts_backed_off"}]}

    Guarantees:

    * **bounded cost**: one listing of ``<root>/partitions``, then pipelined: one listing per
      partition, one read per owner node, one ``exists`` per partition's first batch (its
      ctime is the oldest batch's age, server clock); batch data is read -- multi-reads of
      :data:`READ_CHUNK` nodes -- only to count items, and only while
      the root holds at most :data:`MAX_BATCH_READS` batches and :data:`MAX_READ_BYTES` of
      them: beyond, batches alone are counted (``items`` is null and ``items_note`` says why);
    * **hostile input** (SPEC §2): child names that are no partition of ``0..P-1`` are counted
      as ``ignored``; an owner node is read at most :data:`~zkcrawl.queue.partition_queue.
      OWNER_LIMIT` bytes and is *verified* only when its ZooKeeper session is the session of
      the live status node ``<root>/consumers/<id>`` it names (a forged or garbage owner node is
      shown as owned -- it does hold the partition -- by ``?`` or its claimed name, unverified);
      a batch is counted by :func:`count_pending` (the envelope rules of
      :func:`zkcrawl.queue.partition_batch.decode`, never raises) and one that is no batch is
      counted in ``malformed``, never a traceback;
    * a partition *holds items* while it has batch nodes (a batch whose items are all done is
      deleted by the write that settles the last one); ``depth`` counts the entries not done
      (an entry that is no item among them, until its owner dead-letters it), null when not
      counted;
    * nodes that go between the listing and the read (a batch completed, an owner leaving, a
      partition deleted by hand) are what they are at the read: no error.

    ``hosts_active`` (hosts with items not done in the owner's batches) and ``hosts_backed_off``
    (hosts under a Retry-After or down-host back-off that its checkpoint keeps for a hand-over)
    live in the owner's memory (SPEC §4): each consumer publishes them per partition in its
    status node (``ownership.hosts``: ``{"<p>": [active, backed off]}``, partitions with any,
    :meth:`zkcrawl.consumer.ownership.Ownership.snapshot`). They are taken only from the *verified*
    owner's node (a forged status node cannot speak for a partition it does not hold), decoded
    by :func:`host_figures` (never raises: counts that are no count are dropped); a partition
    whose verified owner publishes figures but not for it has 0 and 0; null where the owner
    publishes none (unowned, unverified, or a consumer that does not say).
    """
    layout = Layout.of(root)
    try:
        names = zk.get_children(layout.partitions)
    except NoNodeError:
        return None
    count, count_error = _count(zk, root)
    ps = _partition_names(names, count)
    parts = _list(zk, layout, ps)
    _owners(zk, layout, parts, sessions)
    _heads(zk, layout, parts, now)
    note = _items(zk, layout, parts)
    _hosts(parts, published or {})
    counted = [x.hosts for x in parts if x.hosts is not None]
    unowned = [x.p for x in parts if x.owner is None and x.batches]
    ages = [x.oldest_age_s for x in parts if x.oldest_age_s is not None]
    return {
        "count": count, "count_error": count_error, "present": len(parts),
        "ignored": len(names) - len(ps),
        "owned": sum(1 for x in parts if x.owner is not None),
        "by_owner": dict(sorted(Counter(x.owner["consumer"] for x in parts
                                        if x.owner is not None).items())),
        "unverified": [x.p for x in parts if x.owner is not None and not x.owner["verified"]],
        "batches": sum(len(x.batches) for x in parts),
        "items": None if note else sum(x.depth or 0 for x in parts),
        "items_counted": note is None, "items_note": note,
        "malformed_batches": sum(x.malformed for x in parts),
        "oldest_age_s": max(ages, default=None),
        "unowned_with_items": len(unowned), "unowned": unowned,
        "hosts_active": sum(a for a, _ in counted) if counted else None,
        "hosts_backed_off": sum(b for _, b in counted) if counted else None,
        "list": [x.to_json() for x in parts],
    }
