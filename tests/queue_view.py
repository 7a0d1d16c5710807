"""What a root holds, as tests read it: the ingress ``<root>/queue`` and the partitions.

Consumers move the ingress into ``<root>/partitions/<p>/`` batches (SPEC §2); a test that
asks "what is still queued" or "what is held" must look at both. Reads only, no fakes.
"""

from __future__ import annotations

from collections import Counter

from zkcrawl.queue import items as item_codec
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.zk import NoNodeError
from zkcrawl.zk.client import ZkClient

__all__ = ["held", "queued_count", "queued_counter", "queued_items", "queued_urls"]

_CHUNK = 1000  # znodes per multi-read


def queued_urls(zk: ZkClient, root: str) -> list[str]:
    """URLs still to do: ingress items, and batch entries not done (started ones too --
    a holder may die; they are queued until settled). Order: ingress, then partitions."""
    layout = Layout.of(root)
    out: list[str] = []
    for name in _children(zk, layout.queue):
        try:
            decoded = item_codec.decode(zk.get(f"{layout.queue}/{name}")[0])
        except NoNodeError:
            continue
        if decoded.item is not None:
            out.append(decoded.item.url)
    for _, batch in _batches(zk, layout):
        out.extend(batch.items[i].url for i in batch.pending  # type: ignore[union-attr]
                   if batch.items[i] is not None)
    return out


def held(zk: ZkClient, root: str) -> list[str]:
    """URLs marked started and not done in a batch: claimed by their partition's owner
    (in its pool or its backlog), what a holder's death would be charged for."""
    return [batch.items[i].url for _, batch in _batches(zk, Layout.of(root))  # type: ignore[union-attr]
            for i in batch.in_flight if batch.items[i] is not None]


def _batches(zk: ZkClient, layout: Layout) -> list[tuple[str, pb.Batch]]:
    out = []
    for p in _children(zk, layout.partitions):
        path = f"{layout.partitions}/{p}"
        for name in _children(zk, path):
            if not name.startswith(item_codec.PREFIX):
                continue
            try:
                batch, _ = pb.decode(zk.get(f"{path}/{name}")[0])
            except NoNodeError:
                continue
            if batch is not None:
                out.append((f"{path}/{name}", batch))
    return out


def _children(zk: ZkClient, path: str) -> list[str]:
    try:
        return sorted(zk.get_children(path))
    except NoNodeError:
        return []


def queued_items(zk: ZkClient, root: str) -> list[Item]:
    """The items :func:`queued_urls` lists (with their meta), read with multi-reads of
    ``_CHUNK`` znodes: for roots of many thousands of items. Order: ingress, then partitions."""
    layout = Layout.of(root)
    out: list[Item] = []
    for data in _read_all(zk, [f"{layout.queue}/{n}" for n in _children(zk, layout.queue)]):
        decoded = item_codec.decode(data)
        if decoded.item is not None:
            out.append(decoded.item)
    paths = [f"{layout.partitions}/{p}/{n}" for p in _children(zk, layout.partitions)
             for n in _children(zk, f"{layout.partitions}/{p}") if n.startswith(item_codec.PREFIX)]
    for data in _read_all(zk, paths):
        batch, _ = pb.decode(data)
        if batch is not None:
            out.extend(it for i in batch.pending if (it := batch.items[i]) is not None)
    return out


def queued_counter(zk: ZkClient, root: str) -> Counter[str]:
    """:func:`queued_items`' URLs as a multiset."""
    return Counter(it.url for it in queued_items(zk, root))


def queued_count(zk: ZkClient, root: str) -> int:
    """How many items :func:`queued_urls` would list."""
    return sum(queued_counter(zk, root).values())


def _read_all(zk: ZkClient, paths: list[str]) -> list[bytes]:
    """The data of ``paths`` that still exist, ``_CHUNK`` per round trip."""
    out: list[bytes] = []
    for i in range(0, len(paths), _CHUNK):
        out.extend(r[0] for r in zk.get_many(paths[i:i + _CHUNK])
                   if not isinstance(r, Exception))
    return out
