"""Cluster politeness under contention (zkcrawl.politeness.cluster): runs of slots reserved by
one compare-and-set, and the last written version tried without a read -- against a real
ZooKeeper, many threads in two consumers racing for one host."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

from tests.conftest import wait_for
from zkcrawl.politeness.cluster import ClusterPoliteness
from zkcrawl.zk.client import ZkClient

HOST = "busy.example:80"
GAP = 0.05


def reserve_from_threads(pol: ClusterPoliteness, n: int, out: list[float]
                         ) -> list[threading.Thread]:
    barrier = threading.Barrier(n)

    def one() -> None:
        barrier.wait(timeout=10)
        slot = pol.reserve(HOST)
        with lock:
            out.append(slot)

    lock = threading.Lock()
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_threads_racing_for_one_host_get_distinct_slots_a_gap_apart_in_fewer_writes(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    a = ClusterPoliteness(zk_factory(), zk_root, GAP)
    b = ClusterPoliteness(zk_factory(), zk_root, GAP)
    slots: list[float] = []
    threads = reserve_from_threads(a, 16, slots) + reserve_from_threads(b, 16, slots)
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert len(slots) == 32
    ordered = sorted(slots)
    # a slot from one consumer and the next from the other are compared on one clock
    # (monotonic, converted from the shared wall-clock slots): 1 ms of conversion slack
    assert all(later - earlier >= GAP - 0.001 for earlier, later in itertools.pairwise(ordered))
    counts = [a.counts, b.counts]
    assert sum(c["reservations"] for c in counts) == 32
    assert sum(c["fallbacks"] for c in counts) == 0
    # the threads of one consumer that queued behind a write were served by one more write
    assert sum(c["writes"] for c in counts) < 32


def test_a_host_only_this_consumer_writes_costs_no_read(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    pol = ClusterPoliteness(zk_factory(), zk_root, 0.001)
    for _ in range(5):
        pol.reserve("solo.example:80")
    assert pol.counts["writes"] == 5 and pol.counts["races"] == 0
    # another consumer writes the node: the remembered version is stale, the write fails
    # once (a race), the node is read, and the slot still follows the other's
    other = ClusterPoliteness(zk_factory(), zk_root, 5.0)
    first = other.reserve("solo.example:80")
    after = pol.reserve("solo.example:80")
    assert after - first >= 5.0 - 0.01
    assert pol.counts["races"] == 1


def test_a_consumers_slots_last_the_gap_plus_its_response_time(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    a = ClusterPoliteness(zk_factory(), zk_root, GAP)
    first = a.reserve(HOST)
    # the gate reports the request done 0.1 s after its slot came
    wait_for(lambda: time.monotonic() >= first + 0.1, timeout=5, what="the response time")
    a.request_done(HOST)
    second, third = a.reserve(HOST), a.reserve(HOST)
    # this consumer's gate would start them a gap after the previous *end*: so do the slots
    assert third - second >= GAP + 0.1 - 0.002
    # and another consumer's slot comes a gap after the start of the last of them at least
    b = ClusterPoliteness(zk_factory(), zk_root, GAP)
    assert b.reserve(HOST) - third >= GAP + 0.1 - 0.002
