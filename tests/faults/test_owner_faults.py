"""``--politeness owner`` under faults, on the real 3-node ensemble with real consumer processes
and the many-hosts site (one loopback address per host; gaps measured by the server on
arrival): an owner SIGKILLed mid-crawl, an owner SIGSTOPped past its session and resumed, a
consumer that joins and leaves every few seconds, the leader killed during a rebalance. Each
ends with the books checked
(tests/faults/books.py) and every host's gap held as the server saw it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import requests

from tests.conftest import wait_for
from tests.faults.books import check_books, held_leases
from tests.faults.conftest import SESSION, exited, heal, new_leader, no_traceback, written
from tests.test_consumer_support import offer, records
from zkcrawl.bench.site import start_site, stop_benchsite
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partitions import decode_root, owner_of, partition_of
from zkcrawl.web.urls import host_key

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


@pytest.fixture
def logged_site() -> Iterator[list[str]]:
    """``hosts_site`` that also keeps every request's arrival: time, host, User-Agent."""
    proc, bases = start_site(latency_ms=5, articles=PER_HOST, hosts=HOSTS, request_log=4096)
    yield bases
    stop_benchsite(proc)


def agent(cid: str) -> str:
    """The User-Agent of consumer ``cid``: the site tells the consumers apart by it."""
    return f"zkcrawl-faults/{cid}"


def arrivals(bases: list[str], cids: tuple[str, ...]) -> dict[str, list[tuple[float, str]]]:
    """Per host (its base URL), every request the server has seen, in arrival order:
    ``(arrival, consumer id)``. The arrival is the site's ``time.monotonic()``: the
    machine's CLOCK_MONOTONIC, the clock this process's ``time.monotonic()`` reads too."""
    stats = requests.get(f"{bases[0]}/stats", timeout=10).json()
    log = stats["request_log"]
    assert stats["request_log_dropped"] == 0 and len(log) == stats["requests"], \
        "the site's request log is incomplete"
    of = {agent(c): c for c in cids}
    out: dict[str, list[tuple[float, str]]] = {}
    for t, host, ua in log:
        assert ua in of, f"a request from none of {cids}: User-Agent {ua!r}"
        out.setdefault(host, []).append((t, of[ua]))
    return out


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


def test_owner_sigstopped_past_its_session_and_resumed(ens, admin, zk_root, logged_site,
                                                       start_consumer):
    """The victim c0 is frozen past its session; c1 takes its hosts over; c0 wakes a zombie,
    starts nothing while in doubt, registers again in a new session and takes its share
    back (the same id, the same rendezvous share) -- with the hand-over wait each time. As
    the server saw it, per host: c0's requests before c1's first were made before the
    freeze, none came while c1 held the host (between c1's first and last request), and
    between the resume and its new registration c0 made no request at all."""
    cids = ("c0", "c1")
    urls = urls_of(logged_site)
    offer(admin, zk_root, urls)
    victim, vout, verr = start_consumer(ens.hosts, zk_root, "c0", *OWNER,
                                        "--exit-when-idle", "2", "--user-agent", agent("c0"))
    other, oout, oerr = start_consumer(ens.hosts, zk_root, "c1", *OWNER,
                                       "--exit-when-idle", "2", "--user-agent", agent("c1"))
    wait_for(lambda: written([vout]) >= 10 and written([oout]) >= 1, 90, "both under way")
    member = Layout.of(zk_root).consumer("c0")
    registered = admin.exists(member)  # its registration, in the session about to end
    assert registered is not None
    os.kill(victim.pid, signal.SIGSTOP)
    held = held_leases(admin, zk_root, "c0")
    # its share (rendezvous over both ids) that the server saw it fetch before it froze
    parts, _ = decode_root(admin.get(Layout.of(zk_root).root)[0])  # P, as they recorded it
    assert parts is not None
    its_hosts = {h for h, seq in arrivals(logged_site, cids).items()
                 if owner_of(partition_of(host_key(h), parts), cids) == "c0"
                 and any(c == "c0" for _, c in seq)}
    assert its_hosts, "the victim made no request to its hosts before it was stopped"
    wait_for(lambda: not held_leases(admin, zk_root, "c0"), 4 * SESSION + 10,
             "the frozen owner's leases gone with its session")
    # the survivor has taken the frozen one's hosts over before it wakes (the server saw it)
    wait_for(lambda: any(c == "c1" for h, seq in arrivals(logged_site, cids).items()
                         if h in its_hosts for _, c in seq), 60, "a hand-over")
    resumed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGCONT)  # a zombie now: it must not fetch those hosts

    rejoined: list[float] = []  # when it was back in the member list, in this clock

    def registered_again() -> bool:
        stat = admin.exists(member)
        if stat is not None and stat.czxid != registered.czxid:  # ctime: wall clock, ms
            rejoined.append(stat.ctime / 1000 - (time.time() - time.monotonic()))
            return True
        return victim.poll() is not None  # gone without registering: a zombie to its end

    wait_for(registered_again, 60, "the zombie registered again (or gone)")
    # nothing is its own before that, and its share comes back a gap after it at the
    # earliest (Ownership.update, not_before)
    rejoined_at = rejoined[0] if rejoined else float("inf")
    assert exited(other, oerr, 180) == 0
    assert exited(victim, verr, 60) == 0
    books = check_books(admin, zk_root, urls, [vout, oout], explained=set(held.values()))
    seen = arrivals(logged_site, cids)
    handed = {h for h in its_hosts if any(c == "c1" for _, c in seen[h])}
    assert handed, "no host of the victim's fetched by the survivor"
    zombie = [(h, round(t - resumed_at, 3)) for h, seq in seen.items() for t, c in seq
              if c == "c0" and resumed_at <= t < rejoined_at]
    assert not zombie, f"requests of the zombie before it registered again (s after the " \
                       f"resume): {zombie}"
    for host, seq in seen.items():
        survivor = [i for i, (_, c) in enumerate(seq) if c == "c1"]
        if not survivor:
            continue
        for i, (t, c) in enumerate(seq):
            if c != "c0":
                continue
            shown = [(round(u - resumed_at, 3), d) for u, d in seq]  # s after the resume
            assert i < survivor[0] or i > survivor[-1], \
                f"{host}: the victim fetched it while the survivor held it: {shown}"
            assert (i < survivor[0]) == (t < resumed_at), \
                f"{host}: the victim's request #{i} is on the wrong side of the survivor's " \
                f"first (before it only from before the freeze): {shown}"
    gaps = server_gaps(logged_site)
    assert len(gaps) == HOSTS and min(gaps.values()) >= DELAY, gaps
    no_traceback(verr, oerr)
    back = sum(c == "c0" and t >= resumed_at for seq in seen.values() for t, c in seq)
    print(f"FIGURE owner-sigstopped: {books.line()}, held={len(held)}, "
          f"hosts handed over {len(handed)}, zombie's requests after it registered {back}")


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
