"""The owned queue's pick (zkcrawl.consumer.owned_queue.OwnedQueue._pick) against the plain k-way
merge it replaces: the same items, claim after claim, while hosts fill and free up."""

from __future__ import annotations

import heapq
import math
import random
import threading
import time

import pytest

from zkcrawl.consumer.owned_queue import (
    PICK_PER_BATCH,
    READY_AHEAD_S,
    HostCap,
    OwnedQueue,
    _Batch,
    _Part,
)
from zkcrawl.queue.items import Item
from zkcrawl.queue.partition_batch import Batch
from zkcrawl.queue.partition_queue import BatchNode, Owned


def reference(batches: list[_Batch], n: int, room_of: dict[str, int]) -> list[tuple[int, int]]:
    """The merge item by item: every refused item a trip through the heap."""
    picked: dict[str, int] = {}
    heads = [(b.offered[b.queued[0]], b.p, b.seq, 0, b) for b in batches if b.queued]
    heapq.heapify(heads)
    out, refused, left = [], {}, n
    full: set[str] = set()  # a full host counts once towards a batch's bound
    while heads and left > 0:
        _, p, seq, pos, b = heads[0]
        i = b.queued[pos]
        host = b.hosts[i]
        if not host or room_of.get(host, 0) - picked.get(host, 0) > 0:
            picked[host] = picked.get(host, 0) + 1
            out.append((b.p, i))
            left -= 1
        else:
            refused[b] = refused.get(b, 0) + (host not in full)
            full.add(host)
        pos += 1
        if pos < len(b.queued) and refused.get(b, 0) < PICK_PER_BATCH:
            heapq.heapreplace(heads, (b.offered[b.queued[pos]], p, seq, pos, b))
        else:
            heapq.heappop(heads)
    return sorted(out)


@pytest.mark.parametrize(("seed", "spread"), [(7, 3), (8, 3), (9, 1), (10, 1), (11, 20)])
def test_the_pick_takes_what_the_plain_merge_takes_claim_after_claim(seed: int, spread: int):
    """``spread``: distinct offer times in a batch (1: one offer's stamp for all, as the
    producer's; more: retries and moved items, whose times need not grow with the index)."""
    rnd = random.Random(seed)
    q = OwnedQueue.__new__(OwnedQueue)
    q._lock, q._once, q._parts = threading.RLock(), False, {}
    q._stalled, q._picked_last, q._stalled_at = {}, [], 0.0
    q._waking, q._wake_at, q._clock = [], {}, time.monotonic
    now, load, cap = time.time(), {}, 2
    for p in range(12):
        hosts = [f"h{p}-{k}" for k in range(4)] + [""]  # "": an item that needs no host
        items = tuple(Item(url=f"http://x/{p}/{i}", enqueued_at=now + rnd.randrange(spread))
                      for i in range(60))
        b = _Batch(p, BatchNode("qn-0000000001", 0, Batch(items)), p % 3, now)
        b.queued = list(range(60))
        b.hosts = [rnd.choice(hosts) for _ in range(60)]
        q._parts[p] = _Part(Owned(p, 1, now), batches={"qn-0000000001": b})
    freed: set[str] = set()

    def take_freed() -> set[str]:
        out = set(freed)
        freed.clear()
        return out

    q.host_cap = HostCap(cap, load, take_freed)
    every = [b for part in q._parts.values() for b in part.batches.values()]
    held: list[str] = []
    for claim in range(150):
        for host in rnd.sample(held, min(len(held), rnd.randint(0, 6))):  # tasks ended
            held.remove(host)
            load[host] -= 1
            freed.add(host)
        for b in every:
            q._offered_of(b)
        want = reference(every, 10, {h: cap - load.get(h, 0) for b in every for h in b.hosts})
        got = q._pick(10)
        assert sorted((b.p, i) for b, idx in got for i in idx) == want, claim
        for b, idx in got:
            for i in idx:
                if b.hosts[i] and rnd.random() < 0.9:  # some are given back (parked)
                    load[b.hosts[i]] = load.get(b.hosts[i], 0) + 1
                    held.append(b.hosts[i])
        if claim % 40 == 39:
            for b in every:  # released items come back to their batches
                b.queued = sorted({*b.queued, *rnd.sample(range(60), 5)})


def test_a_full_hosts_run_of_items_never_hides_another_hosts_items_behind_it():
    """One big host's items fill a batch, a small host's few come after 300 of them (bench
    skew, a small host in the big one's partition): the big host at its cap, a claim still
    reaches the small host's items -- a full host counts once towards the read-past bound,
    not once per item (before: 16 items, and the small host waited for the big one's 300)."""
    q = OwnedQueue.__new__(OwnedQueue)
    q._lock, q._once, q._parts = threading.RLock(), False, {}
    q._stalled, q._picked_last, q._stalled_at = {}, [], 0.0
    q._waking, q._wake_at, q._clock = [], {}, time.monotonic
    now = time.time()
    hosts = ["big"] * 300 + ["small"] * 3 + ["big"] * 100
    items = tuple(Item(url=f"http://x/{i}", enqueued_at=now) for i in range(len(hosts)))
    b = _Batch(0, BatchNode("qn-0000000001", 0, Batch(items)), 0, now)
    b.queued, b.hosts = list(range(len(hosts))), hosts
    q._parts[0] = _Part(Owned(0, 1, now), batches={"qn-0000000001": b})
    q._offered_of(b)
    load = {"big": 2}  # at its cap
    q.host_cap = HostCap(2, load, set)
    got = q._pick(10)
    assert [b.hosts[i] for _, idx in got for i in idx] == ["small", "small"]  # its cap: 2
    load["small"] = 2
    assert q._pick(10) == []  # every host full: nothing, and the batch is stalled
    assert b.stall is not None and b.stall[2] == {"big", "small"}


def test_a_host_in_its_gap_keeps_its_items_in_the_queue_until_its_turn_is_near():
    """Mercator's heap of next-contact times in the pick: a host whose next request could
    not start within READY_AHEAD_S (its gap, Crawl-delay, back-off) has no room, whatever its
    load -- its items take no place in the worker's table while it waits; the batch
    stalls on it, and the heap wakes it (and the claim loop: next_ready) when its time
    comes. Before: a host's next item was taken as soon as the last one settled, and held a
    place for the whole gap (bench hosts' default case ran at 15 % of its bound)."""
    q = OwnedQueue.__new__(OwnedQueue)
    q._lock, q._once, q._parts = threading.RLock(), False, {}
    q._stalled, q._picked_last, q._stalled_at = {}, [], 0.0
    now = [100.0]
    q._waking, q._wake_at, q._clock = [], {}, lambda: now[0]
    ready = {"a": -math.inf, "b": 105.0, "c": 100.0 + READY_AHEAD_S / 2}
    hosts = ["a", "b", "a", "b", "c"]
    items = tuple(Item(url=f"http://x/{i}", enqueued_at=time.time()) for i in range(5))
    b = _Batch(0, BatchNode("qn-0000000001", 0, Batch(items)), 0, time.time())
    b.queued, b.hosts = list(range(5)), hosts
    q._parts[0] = _Part(Owned(0, 1, time.time()), batches={"qn-0000000001": b})
    q._offered_of(b)
    load: dict[str, int] = {}
    q.host_cap = HostCap(1, load, set, ready.__getitem__)

    got = q._pick(10)
    assert [b.hosts[i] for _, idx in got for i in idx] == ["a", "c"]  # b is in its gap
    assert q.next_ready() == 105.0 - READY_AHEAD_S  # when a claim looks again at the latest
    load.update(a=1, c=1)
    assert q._pick(10) == []  # a and c full, b not ready: the batch stalls
    assert b.stall is not None and "b" in b.stall[2]
    assert q._pick(10) == []  # and is not read again (a look at b would push it again)
    assert q._waking == [(105.0, "b")]
    now[0] = 105.0 - READY_AHEAD_S  # b's turn is near: woken, its batch read again
    got = q._pick(10)
    assert [(b.hosts[i], i) for _, idx in got for i in idx] == [("b", 1)]  # one: its cap
    assert q._waking == [] and q.next_ready() == math.inf
