"""The books of a crawl after a fault: what every fault test checks at its end.

* every offered URL has a record (in any consumer's ``--out``) or a dead letter -- none lost;
* no record for a URL nobody offered;
* duplicates (a URL recorded more than once) are counted, and each one is *explained*: its
  item was held by a victim of the fault when the fault struck (``explained``); the at-least-
  once contract allows exactly those (SPEC §3);
* nothing left behind: no item in the ingress or in a partition's batches, no item held -- no
  lease: neither an item marked started and not done (the partitions' lease) nor a lease node
  of the previous layout (``<root>/leases``) -- and no partition owned by a consumer that is
  gone (:func:`owned_by`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.test_consumer_support import records
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.layout import Layout
from zkcrawl.zk import NoNodeError
from zkcrawl.zk.client import ZkClient

__all__ = ["Books", "check_books", "held_leases", "owned_by"]


@dataclass
class Books:
    """What the books say; :func:`check_books` has already asserted they balance."""

    offered: int
    recorded: int  # records written, duplicates included
    dead: int  # dead letters
    duplicates: Counter[str] = field(default_factory=Counter)  # url -> extra records

    @property
    def extra(self) -> int:
        return sum(self.duplicates.values())

    def line(self) -> str:
        return (f"offered {self.offered}, records {self.recorded}, dead letters {self.dead}, "
                f"lost 0, duplicates {self.extra}")


def held_leases(zk: ZkClient, root: str, consumer: str | None = None) -> dict[str, str]:
    """Items leased right now (by ``consumer``, or by anyone): item name -> URL. Items
    that vanish between the two listings are left out (they were completed). With owners
    (the partitioned layout) an item is held when it is marked started in a batch of a
    partition whose owner node names ``consumer``."""
    layout = Layout.of(root)
    held: dict[str, str] = _held_in_partitions(zk, layout, consumer)
    if not zk.exists(layout.leases):
        return held
    for name in zk.get_children(layout.leases):
        try:
            lease = json.loads(zk.get(layout.lease(name))[0])
            if consumer is not None and lease.get("consumer") != consumer:
                continue
            held[name] = json.loads(zk.get(layout.item(name))[0])["url"]
        except (NoNodeError, ValueError, KeyError, TypeError):
            continue  # gone between listing and reading (or not ours to judge here)
    return held


def owned_by(zk: ZkClient, root: str, consumer: str) -> list[int]:
    """The partitions whose owner node names ``consumer`` now (a clean stop deletes them at
    once; a dead consumer's go when its session expires)."""
    layout = Layout.of(root)
    if not zk.exists(layout.partitions):
        return []
    out = []
    for p in zk.get_children(layout.partitions):
        try:
            owner = json.loads(zk.get(layout.partition_owner(int(p)))[0])
        except (NoNodeError, ValueError):
            continue
        if isinstance(owner, dict) and owner.get("consumer") == consumer:
            out.append(int(p))
    return sorted(out)


def _held_in_partitions(zk: ZkClient, layout: Layout, consumer: str | None
                        ) -> dict[str, str]:
    held: dict[str, str] = {}
    if not zk.exists(layout.partitions):
        return held
    for p in zk.get_children(layout.partitions):
        try:
            owner = json.loads(zk.get(layout.partition_owner(int(p)))[0])
        except (NoNodeError, ValueError):
            continue
        if consumer is not None and owner.get("consumer") != consumer:
            continue
        path = layout.partition(int(p))
        for name in zk.get_children(path):
            if not name.startswith("qn-"):
                continue
            try:
                batch, _ = pb.decode(zk.get(f"{path}/{name}")[0])
            except NoNodeError:
                continue
            for i in batch.in_flight if batch is not None else ():
                item = batch.items[i]
                if item is not None:
                    held[f"{p}/{name}/{i}"] = item.url
    return held


def _batches_left(zk: ZkClient, layout: Layout) -> list[str]:
    if not zk.exists(layout.partitions):
        return []
    return [f"{p}/{n}" for p in zk.get_children(layout.partitions)
            for n in zk.get_children(f"{layout.partitions}/{p}") if n.startswith("qn-")]


def _dead_urls(zk: ZkClient, layout: Layout) -> list[str]:
    out = []
    if zk.exists(layout.dead):
        for name in zk.get_children(layout.dead):
            out.append(json.loads(zk.get(layout.dead_letter_path(name))[0])["url"])
    return out


def check_books(zk: ZkClient, root: str, offered: Iterable[str], outs: Sequence[Path], *,
                explained: Collection[str] = ()) -> Books:
    """Assert the books balance (module docstring) and return them.

    ``explained``: the URLs a victim of the fault held when it struck -- the only ones that
    may be recorded twice."""
    layout = Layout.of(root)
    want = list(offered)
    assert len(set(want)) == len(want), "the test offered a URL twice"
    recorded = Counter(r["url"] for r in records(*outs))
    dead = _dead_urls(zk, layout)
    got = set(recorded) | set(dead)
    lost = set(want) - got
    if lost:  # left in the queue (a consumer quit too early) or gone (a real loss)?
        left = zk.get_children(layout.queue) if zk.exists(layout.queue) else []
        leases = zk.get_children(layout.leases) if zk.exists(layout.leases) else []
        raise AssertionError(f"{len(lost)} offered URLs have neither record nor dead letter: "
                             f"{sorted(lost)[:5]}; {len(left)} items still in the queue "
                             f"({sorted(left)[:5]}), {len(leases)} leases")
    stray = got - set(want)
    assert not stray, f"records of URLs nobody offered: {sorted(stray)[:5]}"
    duplicates = Counter({u: n - 1 for u, n in recorded.items() if n > 1})
    duplicates.update(Counter(u for u in dead if u in recorded))
    assert all(n == 1 for n in duplicates.values()), \
        f"recorded three times or more: {duplicates.most_common(3)}"  # one victim, one extra
    unexplained = set(duplicates) - set(explained)
    assert not unexplained, (f"{len(unexplained)} duplicates no victim held at the fault: "
                             f"{sorted(unexplained)[:5]}")
    assert zk.get_children(layout.queue) == [], "items left in the queue"
    held = held_leases(zk, root)
    assert held == {}, f"leases left (items held): {sorted(held.items())[:5]}"
    batches = _batches_left(zk, layout)
    assert batches == [], f"batches left in partitions: {batches[:5]}"
    return Books(len(want), sum(recorded.values()), len(dead), duplicates)
