"""Politeness across consumers (zkcrawl.politeness.cluster), against a real ZooKeeper and, for
the end-to-end case, two real consumer processes and a server that measures the gaps."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from tests.conftest import wait_for
from tests.httpd import TestServer
from tests.test_consumer_signals import args, page
from tests.test_consumer_support import offer, records, spawn
from zkcrawl.politeness.cluster import ClusterPoliteness
from zkcrawl.queue import control
from zkcrawl.zk.client import ZkClient

HOST = "site.example:80"


def two(zk_factory: Callable[..., ZkClient], root: str, delay: float
        ) -> tuple[ClusterPoliteness, ClusterPoliteness]:
    return (ClusterPoliteness(zk_factory(), root, delay),
            ClusterPoliteness(zk_factory(), root, delay))


def test_slots_from_two_consumers_are_a_gap_apart(zk_factory, zk_root) -> None:
    a, b = two(zk_factory, zk_root, 0.2)
    slots = [(a if i % 2 else b).reserve(HOST) for i in range(8)]
    assert all(later - earlier >= 0.2 - 0.002 for earlier, later in itertools.pairwise(slots))
    assert slots[0] <= time.monotonic() + 0.01  # the first slot is now
    other = a.reserve("other.example:80")  # hosts never wait for each other
    assert other - time.monotonic() < 0.05


def test_back_off_and_crawl_delay(zk_factory, zk_root) -> None:
    a, b = two(zk_factory, zk_root, 0.05)
    a.back_off(HOST, 2.0)  # Retry-After seen by a
    assert b.reserve(HOST) - time.monotonic() > 1.8  # ... holds for b
    a.back_off(HOST, 0.1)  # a shorter back-off never shortens the wait
    assert b.reserve(HOST) - time.monotonic() > 1.8
    for p in (a, b):
        p.set_min_delay("slow.example:80", 0.4)  # robots.txt Crawl-delay, read by both
    first, second = a.reserve("slow.example:80"), b.reserve("slow.example:80")
    assert second - first >= 0.4 - 0.002


def test_prune_deletes_only_hosts_idle_long_enough(zk, zk_factory, zk_root) -> None:
    (a, _) = two(zk_factory, zk_root, 0.01)
    for i in range(5):
        a.reserve(f"h{i}.example:80")
    a.back_off("busy.example:80", 60)  # its slot is a minute away: not idle
    time.sleep(0.05)  # the five slots (10 ms gaps) are now in the past
    assert a.prune(idle=0.0) == 5
    assert [ClusterPoliteness.host_of_node(n)
            for n in zk.get_children(f"{zk_root}/hosts")] == ["busy.example:80"]


def test_without_zookeeper_it_falls_back_to_the_local_gap(zk_factory, zk_root) -> None:
    client = zk_factory()
    p = ClusterPoliteness(client, zk_root, 0.2)
    client.close()  # every ZooKeeper call now fails
    first, second = p.reserve(HOST), p.reserve(HOST)
    assert second - first >= 0.2 - 0.002  # still polite within the process, no exception


def test_two_consumer_processes_keep_one_gap_between_them(zk, zk_hosts, zk_root, tmp_path):
    delay = 0.4
    with TestServer({"/c/*": page}) as srv:
        urls = [srv.url(f"/c/{i}") for i in range(8)]
        offer(zk, zk_root, urls)
        control.set_state(zk, zk_root, control.PAUSED)  # both up before either claims
        zk.ensure_path(f"{zk_root}/consumers")
        outs = [tmp_path / f"o{i}.jsonl" for i in range(2)]
        procs = [spawn([*args(zk_hosts, zk_root, out, "--threads", "2", "--backlog", "2",
                              "--exit-when-idle", "2"), "--domain-delay", str(delay)],
                       tmp_path / f"err{i}.log") for i, out in enumerate(outs)]
        wait_for(lambda: len(zk.get_children(f"{zk_root}/consumers")) == 2,
                 what="two consumers registered")
        control.set_state(zk, zk_root, control.RUNNING)
        for proc in procs:
            assert proc.wait(timeout=60) == 0
        gaps = srv.gaps(host="127.0.0.1")
    recs = records(*outs)
    assert sorted(r["url"] for r in recs) == sorted(urls)
    assert len({r["consumer"] for r in recs}) == 2 and len(gaps) == 7
    # Measured by the server across both consumers (per-consumer gaps measure ~0.06 s here).
    # Across consumers the gap is between request *starts* (see zkcrawl.politeness.cluster):
    # a request that opens a new connection reaches the server a few ms after it started.
    assert min(gaps) >= delay - 0.03
