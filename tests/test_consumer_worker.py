"""The consumer daemon in-process against a real ZooKeeper and real HTTP servers."""

from __future__ import annotations

import json
import time
from collections import Counter

from tests.conftest import expire_session, wait_for
from tests.httpd import TestServer, delayed, html, sequence, static
from tests.queue_view import held, queued_urls
from tests.test_consumer_support import Running, offer, records, settings_for
from zkcrawl.queue import control
from zkcrawl.web.robots import RobotsDecision


def page(h):  # type: ignore[no-untyped-def]
    return 200, {"Content-Type": "text/html"}, f"<title>T{h.path}</title>".encode()


def test_two_consumers_record_every_item_exactly_once(zk, zk_hosts, zk_root, tmp_path):
    with TestServer({"/a/*": delayed(0.02, page)}) as srv:
        urls = [srv.url(f"/a/{i}", host="localhost" if i % 2 else None) for i in range(80)]
        offer(zk, zk_root, urls)
        outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
        runs = [Running(settings_for(zk_hosts, zk_root, out, "--id", cid, "--threads", "4",
                                     "--backlog", "4", "--exit-when-idle", "1"))
                for cid, out in zip("ab", outs, strict=True)]
        for r in runs:
            r.join(60)
            r.close()
    recs = records(*outs)
    assert sorted(r["url"] for r in recs) == sorted(urls)  # every item, once
    assert all(r["error"] is None and r["title"] == f"T/a/{r['url'].rsplit('/', 1)[1]}"
               for r in recs)
    # Hosts have owners: a host's items go to the consumer that owns its partition (two
    # hosts here: one consumer or both, as the partitions fell).
    assert set(Counter(r["consumer"] for r in recs)) <= {"a", "b"}
    assert queued_urls(zk, zk_root) == [] == held(zk, zk_root)
    assert all(r.error is None and int(r.status) == 0 for r in runs)


def test_domain_delay_holds_per_host_and_a_cooling_host_idles_no_thread(zk, zk_hosts, zk_root,
                                                                       tmp_path):
    delay = 0.3
    with TestServer({"/p/*": page}) as srv:
        urls = ([srv.url(f"/p/a{i}") for i in range(5)]
                + [srv.url(f"/p/b{i}", host="localhost") for i in range(5)])
        offer(zk, zk_root, urls)
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--threads", "1",
                                   "--backlog", "9", "--domain-delay", str(delay),
                                   "--exit-when-idle", "1"))
        run.join(30)
        run.close()
        a_times, b_times = srv.times(host="127.0.0.1"), srv.times(host="localhost")
        gaps = srv.gaps(host="127.0.0.1") + srv.gaps(host="localhost")
    assert len(a_times) == len(b_times) == 5
    assert min(gaps) >= delay  # measured by the server
    # One thread, two hosts: while 127.0.0.1 cools down the thread serves localhost.
    assert b_times[0] < a_times[1]
    assert max(a_times + b_times) - min(a_times + b_times) < 5 * delay * 1.6
    assert len(records(tmp_path / "o.jsonl")) == 10


def test_a_host_in_a_long_back_off_holds_no_place_in_front_of_the_others(
        zk, zk_hosts, zk_root, tmp_path):
    """--domain-delay 0, one partition, a table of 4 (2 threads + 2): 127.0.0.1 answers its
    first request 503 with Retry-After: 5, and 20 of its items are queued in front of 10 of
    localhost's. Its items wait for its turn in ZooKeeper (the pick's ready check; one
    already held goes back), not in the table: every localhost page is fetched well before
    the back-off ends; 127.0.0.1 gets nothing more in it than what was admitted before its
    answer; each URL is recorded once. Before, the backed-off host's items filled the table
    for the whole Retry-After and localhost waited behind them."""
    retry_after = 5.0
    with TestServer({"/a/*": sequence((503, {"Retry-After": f"{retry_after:g}"}, b""), page),
                     "/p/*": page}) as srv:
        urls = ([srv.url(f"/a/{i}") for i in range(20)]
                + [srv.url(f"/p/b{i}", host="localhost") for i in range(10)])
        offer(zk, zk_root, urls)
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--threads", "2",
                                   "--backlog", "2", "--partitions", "1",
                                   "--exit-when-idle", "1"))
        try:
            run.join(60)
        finally:
            run.stop()
        busy, others = srv.times(host="127.0.0.1"), srv.times(host="localhost")
    recs = records(tmp_path / "o.jsonl")
    assert sorted(r["url"] for r in recs) == sorted(urls)  # each once, the 503 retried
    assert len(others) == 10 and len(busy) == 21
    answered = busy[0]  # the 503 (its answer a few ms later)
    assert max(others) < answered + retry_after - 2  # localhost did not wait for it
    inside = [t for t in busy[1:] if t < answered + retry_after - 0.5]
    assert len(inside) <= 4  # admitted before the answer came: the table's worth at most
    assert queued_urls(zk, zk_root) == [] == held(zk, zk_root)


def test_a_fresh_item_whose_host_must_wait_goes_to_the_heap_not_through_the_pool(
        zk, zk_hosts, zk_root, tmp_path):
    """The claim loop reserves a fresh item's politeness slot (robots.txt known: off here)
    and puts an item whose host's turn has not come straight into the heap: no pool thread
    takes it only to queue it, and the server still sees every gap."""
    delay = 0.3
    with TestServer({"/p/*": page}) as srv:
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--threads", "2",
                                   "--backlog", "8", "--domain-delay", str(delay),
                                   "--exit-when-idle", "1", "--no-robots"))
        try:
            puts: list[tuple[int, int]] = []
            put, cool = run.worker.backlog.put, run.worker.backlog.cool
            pool_cools: list[str] = []
            run.worker.backlog.put = lambda ready, cooled=(), *ahead: (  # type: ignore[method-assign]
                puts.append((len(ready), len(cooled) + len(ahead[0] if ahead else ()))),
                put(ready, cooled, *ahead))[1]
            run.worker.backlog.cool = lambda t, due: (  # type: ignore[method-assign]
                pool_cools.append(t.name), cool(t, due))[1]
            taken: list[tuple[str, bool]] = []
            take = run.worker.backlog.take
            run.worker.backlog.take = lambda timeout: (  # type: ignore[method-assign]
                t := take(timeout), t is not None and taken.append((t.name, t.marked)), t)[2]
            offer(zk, zk_root, [srv.url(f"/p/a{i}") for i in range(4)])
            run.join(30)
        finally:
            run.stop()
        gaps = srv.gaps(host="127.0.0.1")
    assert len(records(tmp_path / "o.jsonl")) == 4
    # admitted and marked by the claim loop or, at their time, by the scheduler: each item
    # goes through the pool once
    assert len(taken) == 4 and all(marked for _, marked in taken)
    assert min(gaps) >= delay  # measured by the server
    # the first ready; each later one planned in the claims that bring them (the host holds
    # two at a time): to the heap, or -- its turn within the mark's lead -- admitted there,
    # its mark asked, and waiting in the heap marked
    assert sum(c for _, c in puts) >= 3
    # a planned item asked again at its time may wait the rest of a gap counted from the
    # end of the request before it (a few ms): at most once each
    assert len(pool_cools) <= 3 and len(set(pool_cools)) == len(pool_cools)


def test_the_claim_loop_asks_the_start_marks_so_each_item_goes_through_the_pool_once(
        zk, zk_hosts, zk_root, tmp_path):
    """A claimed item the claim loop can admit (robots.txt known, the host's turn come) is
    admitted and its start mark asked there: a pool thread takes it once, marked, instead of
    once to admit it and again to perform it."""
    with TestServer({"/p/*": page}) as srv:
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--threads", "4",
                                   "--backlog", "8", "--domain-delay", "0", "--no-robots",
                                   "--exit-when-idle", "1"))
        try:
            taken: list[tuple[str, bool]] = []
            take = run.worker.backlog.take

            def counted(timeout: float):  # type: ignore[no-untyped-def]
                t = take(timeout)
                if t is not None:
                    taken.append((t.name, t.marked))
                return t

            run.worker.backlog.take = counted  # type: ignore[method-assign]
            offer(zk, zk_root, [srv.url(f"/p/a{i}") for i in range(8)])
            run.join(30)
        finally:
            run.stop()
    assert len(records(tmp_path / "o.jsonl")) == 8
    assert len(taken) == 8 and all(marked for _, marked in taken)  # once each, marked
    assert len({name for name, _ in taken}) == 8


def test_a_mark_that_fails_off_the_pool_stops_neither_loop_nor_item(zk, zk_hosts, zk_root,
                                                                     tmp_path):
    """The claim loop and the scheduler ask start marks themselves now: a bug in the queue's
    mark is logged there and the item performed (as a pool thread's internal error settles
    its item), never a dead claim loop or scheduler, never an item left waiting."""
    with TestServer({"/p/*": page}) as srv:
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--threads", "2",
                                   "--domain-delay", "0.2", "--no-robots",
                                   "--exit-when-idle", "1"))
        try:
            mark, failed = run.worker.queue.mark, []

            def flaky(c, by=None):  # type: ignore[no-untyped-def]
                if len(failed) < 3:
                    failed.append(c.name)
                    raise RuntimeError("a bug in mark")
                return mark(c, by)

            run.worker.queue.mark = flaky  # type: ignore[method-assign]
            offer(zk, zk_root, [srv.url(f"/p/a{i}") for i in range(4)])
            run.join(30)
        finally:
            run.stop()
    assert len(failed) == 3
    assert len(records(tmp_path / "o.jsonl")) == 4


def test_robots_txt_judges_each_item_once_wherever_its_slot_was_reserved(
        zk, zk_hosts, zk_root, tmp_path):
    """The verdict read when an item's slot is reserved (the claim loop's plan, or a pool
    thread's admission) travels with the item to the thread that fetches it: robots.txt is
    asked once per item, not again by the fetch."""
    robots = (200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow: /private\n")
    with TestServer({"/robots.txt": robots, "/p/*": page}) as srv:
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--threads", "2",
                                   "--robots", "--exit-when-idle", "1"))
        try:
            cache = run.worker.item_handler.fetcher._robots
            assert cache is not None
            asked: Counter[str] = Counter()
            decide, cached = cache.decide, cache.cached
            cache.decide = lambda url, retry_after=None: (  # type: ignore[method-assign]
                asked.update([url]), decide(url, retry_after))[1]

            def judged_from_memory(url: str) -> RobotsDecision | None:
                verdict = cached(url)
                if verdict is not None:  # None: not judged (robots.txt still to read)
                    asked.update([url])
                return verdict

            cache.cached = judged_from_memory  # type: ignore[method-assign]
            urls = [srv.url(f"/p/a{i}") for i in range(8)]
            offer(zk, zk_root, urls[:1])
            wait_for(lambda: len(records(tmp_path / "o.jsonl")) == 1, timeout=15)
            offer(zk, zk_root, urls[1:])  # robots.txt known now: their slots are planned
            run.join(30)
        finally:
            run.stop()
    assert len(records(tmp_path / "o.jsonl")) == 8
    assert {u: asked[u] for u in urls} == dict.fromkeys(urls, 1)


def test_failures_are_retried_at_the_tail_dead_lettered_or_recorded(zk, zk_hosts, zk_root,
                                                                   tmp_path):
    routes = {"/flaky": sequence((500, {}, b"oops"), html("<title>ok</title>")),
              "/limited": sequence((429, {"Retry-After": "1"}, b""), html("<title>ok2</title>")),
              "/gone": static(404, "no"), "/always": static(503, "down")}
    with TestServer(routes) as srv:
        urls = [srv.url(p) for p in routes]
        offer(zk, zk_root, urls)
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--threads", "2",
                                   "--max-attempts", "2", "--exit-when-idle", "1"))
        run.join(40)
        run.close()
        limited_gaps = srv.gaps("/limited")
    recs = {r["url"].rsplit("/", 1)[1]: r for r in records(tmp_path / "o.jsonl")}
    assert set(recs) == {"flaky", "limited", "gone", "always"}  # one record each
    assert recs["flaky"]["error"] is None and recs["flaky"]["attempt"] == 1
    assert recs["limited"]["title"] == "ok2" and limited_gaps[0] >= 1.0  # Retry-After
    assert recs["gone"]["error"] == "http-404" and recs["gone"]["attempt"] == 0
    assert recs["always"]["error"] == "http-503" and recs["always"]["attempt"] == 1
    [dead] = zk.get_children(f"{zk_root}/dead")
    letter = json.loads(zk.get(f"{zk_root}/dead/{dead}")[0])
    assert letter["url"] == srv.url("/always") and letter["error"] == "http-503"
    assert queued_urls(zk, zk_root) == []


def test_malformed_and_bare_url_items_as_stored(zk, zk_hosts, zk_root, tmp_path):
    with TestServer({"/bare": html("<title>Bare</title>")}) as srv:
        zk.ensure_path(f"{zk_root}/queue")
        zk.create(f"{zk_root}/queue/qn-", b"\xff\xfe\x00junk" * 2000, sequence=True)
        zk.create(f"{zk_root}/queue/qn-", f" {srv.url('/bare')}\n".encode(), sequence=True)
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl",
                                   "--exit-when-idle", "1"))
        run.join(30)
        run.close()
    recs = records(tmp_path / "o.jsonl")
    # The malformed node never reached a partition: its mover made it a dead letter.
    assert [(r["title"], r["error"]) for r in recs] == [("Bare", None)]
    [dead] = zk.get_children(f"{zk_root}/dead")
    data = zk.get(f"{zk_root}/dead/{dead}")[0]
    assert json.loads(data)["error"] == "malformed: not UTF-8" and len(data) < 24_000
    assert queued_urls(zk, zk_root) == []


def test_status_node_and_the_lease_bound(zk, zk_hosts, zk_root, tmp_path):
    with TestServer({"/s/*": delayed(0.3, page)}) as srv:
        offer(zk, zk_root, [srv.url(f"/s/{i}") for i in range(24)])
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--id", "st",
                                   "--threads", "2", "--backlog", "3", "--exit-when-idle", "1"))
        path = f"{zk_root}/consumers/st"
        first = json.loads(wait_for(lambda: zk.exists(path) and zk.get(path)[0]))
        leases, marked = [], []
        # Sample the count while it works: 2.5 s at least, and until it reached the bound (on
        # a loaded machine the claims may come late; 24 items at 0.3 s on 2 threads last 3.6 s).
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5 or (max(leases) < 5 and time.monotonic() - t0 < 15
                                             and run.worker.backlog.stats()[2]):
            leases.append(run.worker.backlog.stats()[2])
            marked.append(len(held(zk, zk_root)))
            time.sleep(0.05)
        later = json.loads(wait_for(
            lambda: (d := json.loads(zk.get(path)[0]))["heartbeat_at"] > first["heartbeat_at"]
            and json.dumps(d), timeout=6, what="a refreshed status node"))
        run.join(30)
        run.close()
    assert max(leases) == 5  # threads + backlog, never more
    assert max(marked) <= 5  # marked started in ZooKeeper: only items it holds
    for key in ("id", "host", "pid", "started_at", "state", "processed", "failed", "in_flight",
                "items_per_s"):
        assert key in later
    assert later["id"] == "st" and later["state"] == "running" and later["processed"] > 0
    assert zk.exists(path) is None  # deregistered on exit


def test_pause_stops_every_consumer_within_a_second_and_resume_finishes(zk, zk_hosts, zk_root,
                                                                        tmp_path):
    with TestServer({"/q/*": delayed(0.1, page)}) as srv:
        urls = [srv.url(f"/q/{i}") for i in range(60)]
        offer(zk, zk_root, urls)
        outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
        runs = [Running(settings_for(zk_hosts, zk_root, out, "--id", cid, "--threads", "2",
                                     "--backlog", "2", "--exit-when-idle", "1"))
                for cid, out in zip("ab", outs, strict=True)]
        wait_for(lambda: len(srv.requests) >= 6, what="crawl under way")
        control.set_state(zk, zk_root, control.PAUSED)
        time.sleep(1.2)  # the promise: no fetch starts later than 1 s (+ one in flight)
        during = len(srv.requests)
        states = {json.loads(zk.get(f"{zk_root}/consumers/{c}")[0])["state"] for c in "ab"}
        time.sleep(1.0)  # observe a quiet window: nothing to await, absence is the point
        assert len(srv.requests) == during < len(urls)
        assert states == {"paused"}
        control.set_state(zk, zk_root, control.RUNNING)
        for r in runs:
            r.join(60)
            r.close()
    assert sorted(r["url"] for r in records(*outs)) == sorted(urls)


def test_session_expiry_mid_crawl_loses_nothing_and_re_registers(zk, zk_hosts, zk_root,
                                                                 tmp_path):
    with TestServer({"/x/*": delayed(0.2, page)}) as srv:
        urls = [srv.url(f"/x/{i}") for i in range(16)]
        offer(zk, zk_root, urls)
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--id", "ex",
                                   "--threads", "2", "--backlog", "2", "--exit-when-idle", "1.5"))
        wait_for(lambda: len(records(tmp_path / "o.jsonl")) >= 3, what="first records")
        old = run.worker.zk.session_id
        expire_session(run.worker.zk)
        wait_for(lambda: run.worker.zk.connected and run.worker.zk.session_id != old,
                 what="a new session")
        wait_for(lambda: zk.exists(f"{zk_root}/consumers/ex"), timeout=10,
                 what="re-registration")
        run.join(60)
        run.close()
    recs = records(tmp_path / "o.jsonl")
    assert set(r["url"] for r in recs) == set(urls)  # at least once; lost ones may repeat
    assert run.error is None and int(run.status) == 0
    assert queued_urls(zk, zk_root) == []


def test_at_most_once_deletes_on_take_and_still_records_everything(zk, zk_hosts, zk_root,
                                                                   tmp_path):
    with TestServer({"/m/*": page}) as srv:
        urls = [srv.url(f"/m/{i}") for i in range(12)]
        offer(zk, zk_root, urls)
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--delivery",
                                   "at-most-once", "--threads", "2", "--exit-when-idle", "1"))
        run.join(30)
        run.close()
    assert sorted(r["url"] for r in records(tmp_path / "o.jsonl")) == sorted(urls)
    assert queued_urls(zk, zk_root) == [] == held(zk, zk_root)


def test_at_most_once_items_leave_their_batch_before_their_fetch(zk, zk_hosts, zk_root,
                                                                 tmp_path):
    with TestServer({"/m/*": delayed(1.0, page)}) as srv:
        urls = [srv.url(f"/m/{i}") for i in range(6)]
        offer(zk, zk_root, urls)
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--delivery",
                                   "at-most-once", "--threads", "2", "--backlog", "0"))
        try:
            srv.wait_for_requests(2, timeout=20)
            fetching = {srv.url(r.path) for r in srv.requests}
            # Deleted on the take (SPEC §3): what runs is neither held nor queued any more.
            assert held(zk, zk_root) == []
            assert fetching.isdisjoint(queued_urls(zk, zk_root))
        finally:
            run.stop()
