"""The faults of issue #10's table, each against a real 3-node ensemble on loopback with real
consumer (and producer) processes, each ending with the books checked (tests/faults/books.py):
every offered URL recorded or dead-lettered, duplicates counted and explained by the items a
victim had marked started in its partitions when the fault struck, no item left in the ingress
or in a partition's batches, none held (marked started and not done).

One ensemble for the module (``ens`` heals what a test killed before the next one starts).
Each test prints a ``FIGURE`` line (``pytest -s``): what the README's Reliability table states.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.faults.books import check_books, held_leases, owned_by
from tests.faults.conftest import (
    SESSION,
    exited,
    heal,
    new_leader,
    no_traceback,
    resumed,
    written,
)
from tests.faults.netns import Forwarder, Netns, make_netns
from tests.httpd import TestServer, delayed
from tests.queue_view import queued_count, queued_counter
from tests.test_consumer_support import ROOT, offer, records, stats_held
from zkcrawl.queue.layout import Layout

pytestmark = [pytest.mark.faults, pytest.mark.ensemble]


def figure(name: str, **values: object) -> None:
    print(f"FIGURE {name}: " + ", ".join(f"{k}={v}" for k, v in values.items()))


def page(h):  # type: ignore[no-untyped-def]
    return 200, {"Content-Type": "text/html"}, f"<title>T{h.path}</title>".encode()


def articles(site: str, n: int, first: int = 1) -> list[str]:
    return [f"{site}/a/{i}.html" for i in range(first, first + n)]


def test_leader_sigkilled_mid_crawl(ens, admin, zk_root, site, start_consumer):
    urls = articles(site, 2000)
    offer(admin, zk_root, urls)
    runs = [start_consumer(ens.hosts, zk_root, f"c{i}", "--threads", "8",
                           "--exit-when-idle", "2") for i in range(2)]
    outs = [out for _, out, _ in runs]
    wait_for(lambda: written(outs) >= 300, 90, "the crawl under way")
    leader = ens.leader()
    assert leader is not None
    held = held_leases(admin, zk_root)
    leader.kill()  # SIGKILL
    elected = new_leader(ens, leader)
    again = resumed(outs)
    for proc, _, err in runs:
        assert exited(proc, err, 120) == 0
    books = check_books(admin, zk_root, urls, outs, explained=held.values())
    no_traceback(*(err for _, _, err in runs))
    figure("leader-killed", books=books.line(), held=len(held),
           new_leader_s=round(elected, 2), records_again_s=round(again, 2))


def test_two_of_three_servers_down_longer_than_the_session(ens, admin, zk_root, site,
                                                           start_consumer):
    urls = articles(site, 2000)
    offer(admin, zk_root, urls)
    runs = [start_consumer(ens.hosts, zk_root, f"c{i}", "--threads", "8",
                           "--exit-when-idle", "2") for i in range(2)]
    outs = [out for _, out, _ in runs]
    wait_for(lambda: written(outs) >= 300, 90, "the crawl under way")
    held = held_leases(admin, zk_root)
    leader = ens.leader()
    assert leader is not None
    follower = next(s for s in ens.servers if s is not leader)
    follower.kill()
    held.update(held_leases(admin, zk_root))  # what they claimed in between
    leader.kill()  # no quorum from here: nothing can be claimed or completed
    time.sleep(2 * SESSION)  # the fault itself: an outage longer than the session
    heal(ens)
    again = resumed(outs)
    for proc, _, err in runs:
        assert exited(proc, err, 120) == 0
    books = check_books(admin, zk_root, urls, outs, explained=held.values())
    errs = [err for _, _, err in runs]
    no_traceback(*errs)
    seen = [zk_events(err) for err in errs]
    # Every server lost its quorum, so every consumer's connection was dropped at least once;
    # and it was connected again when it left (an idle exit needs a read of the queue).
    # How many times each was suspended depends on which server it was on when the follower
    # and then the leader went, so the count is per consumer, not a total.
    for err, events in zip(errs, seen, strict=True):
        assert "zk.suspended" in events, (err.stem, zk_lines(err))
    assert any("zk.reconnected" in events for events in seen), [zk_lines(e) for e in errs]
    lost = sum(events.count("zk.lost") for events in seen)
    figure("quorum-lost", books=books.line(), held=len(held), outage_s=2 * SESSION,
           records_again_after_quorum_s=round(again, 2), lost_sessions=lost,
           zk_events=["/".join(e) for e in seen])


def zk_lines(err: Path) -> list[str]:
    """The ``zk.*`` lines of a consumer's log, raw (what an assertion shows)."""
    return [line for line in err.read_text(errors="replace").splitlines()
            if '"zk.' in line]


def zk_events(err: Path) -> list[str]:
    """The ``zk.*`` events a consumer logged, in order. A line is read from its first ``{``:
    a library that wrote to stderr without a newline must not hide the JSON after it."""
    events = []
    for line in zk_lines(err):
        try:
            event = json.loads(line[line.index("{"):])["event"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(event, str) and event.startswith("zk."):
            events.append(event)
    return events


def quiet(srv: TestServer, period: float = 0.5, timeout: float = 10.0) -> None:
    """Return once ``srv`` logged no new request for ``period`` s (bounded by ``timeout``)."""
    last = [len(srv.requests), time.monotonic()]

    def settled() -> bool:
        n = len(srv.requests)
        if n != last[0]:
            last[:] = [n, time.monotonic()]
        return time.monotonic() - last[1] >= period

    wait_for(settled, timeout, "the server's request log settled")


def test_frozen_consumer_starts_none_of_the_items_it_held(ens, admin, zk_root,
                                                          start_consumer):
    """SIGSTOP past the session: the ensemble gives the victim's partitions to another
    consumer; once resumed, the victim starts nothing it held (fetched once, elsewhere), and
    only the items it had started are charged a holder's death (SPEC §3)."""
    with TestServer({"/s/*": delayed(0.2, page)}) as srv:
        urls = [srv.url(f"/s/{i}") for i in range(160)]
        offer(admin, zk_root, urls)
        victim, vout, verr = start_consumer(ens.hosts, zk_root, "victim", "--threads", "2",
                                            "--backlog", "10", "--exit-when-idle", "2",
                                            "--stats-interval", "0.2")
        wait_for(lambda: written([vout]) >= 4, 60, "the victim under way")
        wait_for(lambda: stats_held(verr) >= 8, 60,
                 "the victim holding 2 running and at least 6 waiting")
        os.kill(victim.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        held_then = stats_held(verr)
        started = held_leases(admin, zk_root, "victim")  # frozen: marked started
        # A request the victim sent just before it froze may still wait in the server's
        # socket to be parsed (and logged); nothing else runs, so the log stops growing.
        quiet(srv)
        asked = {r.path for r in srv.requests}  # everything the victim asked for
        other, oout, oerr = start_consumer(ens.hosts, zk_root, "other", "--threads", "4",
                                           "--exit-when-idle", "2")
        # Past its session: the ensemble expires it, its partitions go, the other takes them.
        wait_for(lambda: not held_leases(admin, zk_root, "victim")
                 and not owned_by(admin, zk_root, "victim"), 4 * SESSION + 10,
                 "the victim's partitions gone with its session")
        freed = time.monotonic() - stopped_at
        wait_for(lambda: written([oout]) > 0, 60, "the other consumer under way")
        os.kill(victim.pid, signal.SIGCONT)
        assert exited(other, oerr, 120) == 0
        assert exited(victim, verr, 60) == 0
    per_path = Counter(r.path for r in srv.requests)
    path_of = {u: u.removeprefix(srv.base_url) for u in urls}
    started_paths = {path_of[u] for u in started.values()}
    # Never started on the stale claim: each item not asked for before the freeze is
    # fetched exactly once, by the other consumer.
    assert {p: n for p, n in per_path.items() if p not in asked and n != 1} == {}
    assert all(per_path[p] <= 2 for p in asked)
    books = check_books(admin, zk_root, urls, [vout, oout],
                        explained={srv.url(p) for p in asked})
    final = {r["url"]: r for r in records(vout, strict=False)}
    final.update({r["url"]: r for r in records(oout)})
    charged = {path_of[u] for u, r in final.items() if r["holder_deaths"]}
    assert charged <= asked | started_paths, (charged, asked, started_paths)
    # Charged without a request: what a thread had taken but not asked for yet, and the
    # marks written ahead (MARKS_AHEAD per pool thread): 3 per thread at most.
    assert len(started_paths - asked) <= 6 and len(charged - asked) <= 6, (started, charged)
    # Most of what it held waited in its backlog: held, never started, never charged.
    assert held_then - len(charged) >= 4, (held_then, charged)
    no_traceback(verr, oerr)
    lost = [json.loads(line) for line in verr.read_text().splitlines()
            if '"zk.lost"' in line]
    assert lost, "the victim never logged zk.lost"
    figure("consumer-frozen", books=books.line(), held=held_then, started=len(started),
           charged=len(charged), held_not_charged=held_then - len(charged),
           waiting_started_by_victim=0, leases_freed_after_s=round(freed, 2))


def test_out_on_a_full_disk(ens, admin, zk_root, site, start_consumer):
    urls = articles(site, 300)
    offer(admin, zk_root, urls)
    # /dev/full: every write fails with ENOSPC -- a full disk without mount privileges.
    full, _, ferr = start_consumer(ens.hosts, zk_root, "full", "--threads", "8",
                                   "--out", "/dev/full", "--log-level", "debug")
    assert full.wait(60) == 1
    assert owned_by(admin, zk_root, "full") == []  # released, not expired
    lines = [json.loads(line) for line in ferr.read_text().splitlines()
             if line.startswith("{")]
    assert any(e["event"] == "sink.failed" for e in lines), lines[-5:]
    assert not any(e["event"] == "item.done" for e in lines)  # nothing durable, none done
    good, out, err = start_consumer(ens.hosts, zk_root, "good", "--threads", "8",
                                    "--exit-when-idle", "2")
    assert exited(good, err, 120) == 0
    books = check_books(admin, zk_root, urls, [out])
    no_traceback(ferr, err)
    figure("out-full-disk", books=books.line(), exit=1)


def _producer(hosts: str, root: str, src: Path, seen: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "zkcrawl.producer.main", "--zk", hosts, "--root", root,
           "--from-file", str(src), "--seen", str(seen), "--batch", "100",
           "--max-depth", "100000", "--id", "p", "--log-format", "json",
           "--session-timeout", str(SESSION), "--zk-timeout", "10",
           "--allow-private-addresses"]
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def test_leader_killed_during_the_producers_offers(ens, admin, zk_root, site, tmp_path,
                                                   procs, start_consumer):
    urls = articles(site, 4000)
    src = tmp_path / "urls.txt"
    src.write_text("\n".join(urls) + "\n")
    layout = Layout.of(zk_root)
    producer = _producer(ens.hosts, zk_root, src, tmp_path / "seen")
    procs.append(producer)
    kills = []
    for at in (800, 2000):  # two kill points: each time the leader of the moment
        wait_for(lambda at=at: queued_count(admin, zk_root) >= at, 60, f"{at} offered")
        leader = ens.leader()
        assert leader is not None
        leader.kill()
        kills.append(round(new_leader(ens, leader), 2))
        heal(ens)  # back to three before the next kill
    _, err = producer.communicate(timeout=120)
    assert producer.returncode == 0, err.decode()[-3000:]
    queued = queued_counter(admin, zk_root)
    assert set(queued) == set(urls) and set(queued.values()) == {1}  # none missing or doubled
    # An offer marker is ephemeral: deleted after its transaction, and with the producer's
    # session in any case -- a close the ensemble did not answer (the leader's moves) leaves
    # it only until that session times out.
    wait_for(lambda: not admin.exists(layout.offers) or not admin.get_children(layout.offers),
             SESSION * 3 + 10, "the producer's offer markers to go with its session")
    c, out, cerr = start_consumer(ens.hosts, zk_root, "c", "--threads", "16",
                                  "--exit-when-idle", "2")
    assert exited(c, cerr, 120) == 0
    books = check_books(admin, zk_root, urls, [out])
    assert books.extra == 0
    no_traceback(cerr)
    assert b"Traceback" not in err
    figure("leader-killed-during-offers", books=books.line(), kill_points=len(kills),
           new_leader_s=kills)


def test_consumer_sigterm_while_zookeeper_is_down(ens, admin, zk_root, start_consumer):
    grace, zk_timeout = 8.0, 3.0
    with TestServer({"/t/*": delayed(1.5, page)}) as srv:
        urls = [srv.url(f"/t/{i}") for i in range(60)]
        offer(admin, zk_root, urls)
        extra = ("--threads", "4", "--backlog", "4", "--grace", str(grace), "--zk-timeout",
                 str(zk_timeout))
        once, oout, oerr = start_consumer(ens.hosts, zk_root, "once", *extra)
        twice, tout, terr = start_consumer(ens.hosts, zk_root, "twice", *extra)
        wait_for(lambda: len(srv.requests) >= 8 and written([oout, tout]) >= 2, 60,
                 "both fetching")
        if written([oout]) > written([tout]):
            # One host, one owner: the consumer fetching it is the one that gets the second
            # signal mid-fetch (the other has nothing in flight and drains at once).
            once, oout, oerr, twice, tout, terr = twice, tout, terr, once, oout, oerr
        held = held_leases(admin, zk_root)
        for server in ens.servers:
            server.kill()  # the whole ensemble: SIGKILL, no goodbye
        t0 = time.monotonic()
        once.send_signal(signal.SIGTERM)
        twice.send_signal(signal.SIGTERM)
        # Two signals sent back to back merge into one pending signal: the second is sent
        # once the first was acted on.
        wait_for(lambda: '"consumer.draining"' in terr.read_text(), 10, "draining")
        t1 = time.monotonic()
        twice.send_signal(signal.SIGTERM)  # the second one: stop now
        assert twice.wait(grace + zk_timeout + 10) == 0
        t_twice = time.monotonic() - t1
        assert '"forced": true' in terr.read_text()
        assert once.wait(grace + zk_timeout + 10) == 0
        t_once = time.monotonic() - t0
        # Bounds from SPEC §4, plus the interpreter's own exit; not speed figures.
        assert t_once < grace + zk_timeout + 3, t_once
        # The grace is for the fetches running (1.5 s pages), not for completions that
        # cannot go through while ZooKeeper is away (the committer waits --zk-timeout).
        assert t_once < grace, t_once
        assert t_twice < zk_timeout, t_twice  # at once: no ZooKeeper call waited out
        heal(ens)
        after, aout, aerr = start_consumer(ens.hosts, zk_root, "after", "--threads", "8",
                                           "--exit-when-idle", "2")
        assert exited(after, aerr, 120) == 0
    books = check_books(admin, zk_root, urls, [oout, tout, aout], explained=held.values())
    no_traceback(oerr, terr, aerr)
    figure("sigterm-zookeeper-down", books=books.line(), held=len(held),
           exit_one_sigterm_s=round(t_once, 2), exit_two_sigterms_s=round(t_twice, 2),
           grace=grace, zk_timeout=zk_timeout)


@pytest.fixture
def netns() -> Iterator[Netns]:
    ns, why = make_netns()
    if ns is None:
        print(f"SKIP network partition: {why}")
        pytest.skip(why)
    yield ns
    ns.remove()


def test_consumer_partitioned_from_zookeeper(ens, admin, zk_root, start_consumer, netns):
    zk_via = Forwarder(netns.zk_host, [s.port for s in ens.servers])
    try:
        _partition(ens, admin, zk_root, start_consumer, netns,
                   ",".join(f"{netns.zk_host}:{p}" for p in zk_via.ports))
    finally:
        zk_via.close()


def _partition(ens, admin, zk_root, start_consumer, netns, victim_zk):  # type: ignore[no-untyped-def]
    # Slow pages: the victim goes on starting items until it has not heard from ZooKeeper
    # for 2/3 of its session (then its session may be gone); 1 s each leaves most waiting.
    with TestServer({"/p/*": delayed(1.0, page)}, host=netns.http_host) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(48)]
        offer(admin, zk_root, urls)
        victim, vout, verr = start_consumer(victim_zk, zk_root, "victim", "--threads", "2",
                                            "--backlog", "10", "--exit-when-idle", "2",
                                            "--stats-interval", "0.2", prefix=netns.prefix)
        wait_for(lambda: stats_held(verr) == 12, 60, "the victim holding 2 running + 10 waiting")
        netns.partition()
        cut_at = time.monotonic()
        held = held_leases(admin, zk_root, "victim")  # started: it cannot claim from here on
        # Past its session the ensemble expires it; the victim cannot hear of it.
        wait_for(lambda: not held_leases(admin, zk_root, "victim"), 4 * SESSION + 10,
                 "the victim's leases gone with its session")
        expired = time.monotonic() - cut_at
        quiet(srv)
        asked = {r.path for r in srv.requests}  # all the victim's: nobody else ran yet
        other, oout, oerr = start_consumer(ens.hosts, zk_root, "other", "--threads", "4",
                                           "--exit-when-idle", "2")
        wait_for(lambda: written([oout]) > 0, 60, "the other consumer under way")
        netns.heal()
        healed_at = time.monotonic()
        wait_for(lambda: '"zk.lost"' in verr.read_text(), 30, "the victim told of its loss")
        told = time.monotonic() - healed_at
        assert exited(other, oerr, 120) == 0
        assert exited(victim, verr, 60) == 0
    per_path = Counter(r.path for r in srv.requests)
    # Never started on the stale claim: what it had not asked for is fetched once, elsewhere.
    assert {p: n for p, n in per_path.items() if p not in asked and n != 1} == {}
    held_paths = {u.removeprefix(srv.base_url) for u in held.values()}
    assert len(held_paths - asked) <= 6, (held, asked)  # marked, unasked: 3 a thread at most
    running = asked
    books = check_books(admin, zk_root, urls, [vout, oout],
                        explained={srv.url(p) for p in running})
    no_traceback(verr, oerr)
    figure("consumer-partitioned", books=books.line(), held=len(held), running=len(running),
           waiting_started_by_victim=0, leases_freed_after_s=round(expired, 2),
           lost_logged_after_heal_s=round(told, 2))
