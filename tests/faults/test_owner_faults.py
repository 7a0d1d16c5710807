"""``--politeness owner`` under faults, on the real 3-node ensemble with real consumer processes
and the many-hosts site (one loopback address per host; gaps measured by the server on
arrival): an owner SIGKILLed mid-crawl, an owner SIGSTOPped past its session and resumed, a
consumer that joins and leaves every few seconds, the leader killed during a rebalance. Each
ends with the books checked
(tests/faults/books.py) and every host's gap held as the server saw it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import requests

from tests.conftest import wait_for
from tests.faults.books import check_books, held_leases
from tests.faults.conftest import SESSION, exited, heal, new_leader, no_traceback, written
from tests.test_consumer_support import offer, records
from zkcrawl.bench.site import start_site, stop_benchsite

pytestmark = [pytest.mark.faults, pytest.mark.ensemble]

DELAY = 0.3
HOSTS = 12
PER_HOST = 15
OWNER = ("--politeness", "owner", "--domain-delay", str(DELAY), "--threads", "4")


@pytest.fixture
def hosts_site() -> Iterator[list[str]]:
    proc, bases = start_site(latency_ms=5, articles=PER_HOST, hosts=HOSTS)
    yield bases
    stop_benchsite(proc)


def urls_of(bases: list[str]) -> list[str]:
    return [f"{b}/a/{i}.html" for i in range(1, PER_HOST + 1) for b in bases]


def server_gaps(bases: list[str]) -> dict[str, float]:
    stats = requests.get(f"{bases[0]}/stats", timeout=10).json()
    return {h: g for h, g in stats["host_min_gap_s"].items() if g is not None}


def test_owner_sigkilled_mid_crawl(ens, admin, zk_root, hosts_site, start_consumer):
    urls = urls_of(hosts_site)
    offer(admin, zk_root, urls)
    victim, vout, _ = start_consumer(ens.hosts, zk_root, "c0", *OWNER)
    other, oout, oerr = start_consumer(ens.hosts, zk_root, "c1", *OWNER,
                                       "--exit-when-idle", "2")
    wait_for(lambda: len({r["consumer"] for r in records(vout, oout, strict=False)}) == 2
             and written([vout]) >= 10, 90, "both owners under way")
    victim.kill()  # SIGKILL: its partitions come back when its session expires
    victim.wait(10)
    # Read after the death, before its session expires: exactly what it held when it died
    # (marks of items it claimed, and of items recorded whose settle checkpoint, due within
    # 0.2 s, it never wrote -- the duplicates at-least-once allows).
    held = held_leases(admin, zk_root, "c0")
    assert exited(other, oerr, 180) == 0
    books = check_books(admin, zk_root, urls, [vout, oout], explained=set(held.values()))
    gaps = server_gaps(hosts_site)
    assert len(gaps) == HOSTS and min(gaps.values()) >= DELAY, gaps
    no_traceback(oerr)
    print(f"FIGURE owner-sigkilled: {books.line()}, held={len(held)}")


def test_owner_sigstopped_past_its_session_and_resumed(ens, admin, zk_root, hosts_site,
                                                       start_consumer):
    urls = urls_of(hosts_site)
    offer(admin, zk_root, urls)
    victim, vout, verr = start_consumer(ens.hosts, zk_root, "c0", *OWNER,
                                        "--exit-when-idle", "2")
    other, oout, oerr = start_consumer(ens.hosts, zk_root, "c1", *OWNER,
                                       "--exit-when-idle", "2")
    wait_for(lambda: written([vout]) >= 10 and written([oout]) >= 1, 90, "both under way")
    os.kill(victim.pid, signal.SIGSTOP)
    held = held_leases(admin, zk_root, "c0")
    its_hosts = {urlsplit(r["url"]).netloc for r in records(vout, strict=False)}
    wait_for(lambda: not held_leases(admin, zk_root, "c0"), 4 * SESSION + 10,
             "the frozen owner's leases gone with its session")
    # the survivor has taken the frozen one's hosts over before it wakes
    wait_for(lambda: any(urlsplit(r["url"]).netloc in its_hosts
                         for r in records(oout, strict=False)), 60, "a hand-over")
    os.kill(victim.pid, signal.SIGCONT)  # a zombie now: it must not fetch those hosts
    assert exited(other, oerr, 180) == 0
    assert exited(victim, verr, 60) == 0
    books = check_books(admin, zk_root, urls, [vout, oout], explained=set(held.values()))
    gaps = server_gaps(hosts_site)
    assert len(gaps) == HOSTS and min(gaps.values()) >= DELAY, gaps
    no_traceback(verr, oerr)
    print(f"FIGURE owner-sigstopped: {books.line()}, held={len(held)}")


def test_a_consumer_joining_and_leaving_every_few_seconds(ens, admin, zk_root, hosts_site,
                                                          start_consumer):
    urls = urls_of(hosts_site)
    offer(admin, zk_root, urls)
    steady, sout, serr = start_consumer(ens.hosts, zk_root, "steady", *OWNER,
                                        "--exit-when-idle", "3")
    outs, explained = [sout], set()
    for i in range(3):  # join, crawl a little, leave (SIGTERM: drained, nothing held)
        proc, out, err = start_consumer(ens.hosts, zk_root, f"churn{i}", *OWNER)
        outs.append(out)
        wait_for(lambda out=out: written([out]) >= 1 or steady.poll() is not None, 60,
                 "the newcomer fetching")
        proc.send_signal(signal.SIGTERM)
        assert exited(proc, err, 60) == 0
        no_traceback(err)
    assert exited(steady, serr, 180) == 0
    books = check_books(admin, zk_root, urls, outs, explained=explained)
    gaps = server_gaps(hosts_site)
    assert len(gaps) == HOSTS and min(gaps.values()) >= DELAY, gaps  # every hand-over
    no_traceback(serr)
    print(f"FIGURE owner-churn: {books.line()}")


def test_the_leader_killed_during_a_rebalance(ens, admin, zk_root, hosts_site, start_consumer):
    """Two owners crawling; a third joins (the partitions start moving) and the ensemble's
    leader is SIGKILLed at that moment: the take transactions, the hand-overs and the
    checkpoints go through the election. Nothing lost, duplicates only of items in flight,
    every host's gap held as the server saw it."""
    urls = urls_of(hosts_site)
    offer(admin, zk_root, urls)
    runs = [start_consumer(ens.hosts, zk_root, f"o{i}", *OWNER, "--exit-when-idle", "3")
            for i in range(2)]
    outs = [out for _, out, _ in runs]
    wait_for(lambda: written(outs) >= 20, 90, "two owners under way")
    third = start_consumer(ens.hosts, zk_root, "o2", *OWNER, "--exit-when-idle", "3")
    runs.append(third)
    outs.append(third[1])
    wait_for(lambda: '"ownership.changed"' in runs[0][2].read_text()
             and runs[0][2].read_text().count('"ownership.changed"') >= 2, 60,
             "the rebalance under way (an owner saw the newcomer)")
    held = held_leases(admin, zk_root)
    leader = ens.leader()
    assert leader is not None
    leader.kill()
    new_leader(ens, leader)
    held.update(held_leases(admin, zk_root))
    heal(ens)
    for proc, _, err in runs:
        assert exited(proc, err, 180) == 0
    books = check_books(admin, zk_root, urls, outs, explained=set(held.values()))
    gaps = server_gaps(hosts_site)
    assert len(gaps) == HOSTS and min(gaps.values()) >= DELAY, gaps
    no_traceback(*(err for _, _, err in runs))
    print(f"FIGURE owner-leader-killed-in-rebalance: {books.line()}, held={len(held)}")
