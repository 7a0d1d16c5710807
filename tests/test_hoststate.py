"""A back-off in force survives a hand-over (issue #22 item 3; SPEC §3): the partition's host
state (zkcrawl/queue/partition_state.py) rides the owner's checkpoint as the partition node's
data, and a new owner waits it out.

Real ZooKeeper, a real HTTP server on 127.0.0.1 (tests/httpd.py) and real consumer processes
(``--politeness owner``): the host answers 429 with ``Retry-After: 4`` to owner A; A is
SIGKILLed (or SIGTERMed); owner B takes the partition well before the 4 s are over and the
server sees no request to the host before they are (its own request log, not sleeps). Then
the codec under hypothesis, forged host state (ignored with its reason, the partition still
crawled), the version a state write moves (no spurious fence, a zombie still fenced), and a
checkpoint of 10,000 backed-off hosts (bounded far below jute.maxbuffer)."""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import expire_session, wait_for
from tests.httpd import TestServer, html, sequence
from tests.test_consumer_support import records, spawn
from zkcrawl.consumer.owned_queue import OwnedQueue
from zkcrawl.consumer.ownership import Ownership
from zkcrawl.politeness.gate import HostGate, hold_of
from zkcrawl.politeness.local import MAX_CRAWL_DELAY, LocalPoliteness
from zkcrawl.queue import partition_state as ps
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_queue import Change, PartitionQueue
from zkcrawl.queue.partitions import assign, partition_of
from zkcrawl.zk.client import ZkClient

P = 8
GAP = 0.2
RETRY_AFTER = 4.0
SESSION = 2.0


@pytest.fixture
def site() -> Iterator[TestServer]:
    # The first request to /slow/* is a "try later" with Retry-After: 4; every later one a page.
    with TestServer({"/slow/*": sequence((429, {"Retry-After": "4"}, b"later"),
                                         html("<title>ok</title>"))}) as srv:
        yield srv


def _host(srv: TestServer) -> str:
    return f"{srv.host}:{srv.port}"


def _names(host: str) -> tuple[str, str]:
    """Two consumer ids of which the first owns ``host``'s partition (rendezvous)."""
    p = partition_of(host, P)
    for k in range(100):
        a, b = f"a{k}", "b"
        if p in assign(P, [a, b])[a]:
            return a, b
    raise AssertionError("no id owns the partition")


def _consumer(zk_hosts: str, root: str, cid: str, tmp: Path, *extra: str):  # type: ignore[no-untyped-def]
    out, err = tmp / f"{cid}.jsonl", tmp / f"{cid}.err"
    args = ["--zk", zk_hosts, "--root", root, "--id", cid, "--out", str(out), "--no-robots",
            "--domain-delay", str(GAP), "--politeness", "owner", "--partitions", str(P),
            "--log-format", "json", "--allow-private-addresses", "--threads", "2",
            "--session-timeout", str(SESSION), *extra]
    return spawn(args, err), out, err


def _owner(zk: ZkClient, root: str, p: int) -> str | None:
    try:
        data, _ = zk.get(Layout.of(root).partition_owner(p))
    except Exception:
        return None
    return str(json.loads(data).get("consumer"))


def _state(zk: ZkClient, root: str, p: int) -> ps.Decoded:
    return ps.decode(zk.get(Layout.of(root).partition(p))[0], time.time())


def _events(err: Path, name: str) -> list[dict[str, object]]:
    out = []
    for line in err.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("event") == name:
            out.append(doc)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_retry_after_in_force_survives_the_hand_over(zk, zk_hosts, zk_root, tmp_path, procs,
                                                       site, stop):
    host = _host(site)
    p = partition_of(host, P)
    a_id, b_id = _names(host)
    a, _, a_err = _consumer(zk_hosts, zk_root, a_id, tmp_path)
    b, b_out, b_err = _consumer(zk_hosts, zk_root, b_id, tmp_path, "--exit-when-idle", "1")
    procs.extend([a, b])
    wait_for(lambda: _owner(zk, zk_root, p) == a_id, 60, "A owning the host's partition")
    urls = [site.url(f"/slow/{i}") for i in (1, 2)]
    PartitionQueue(zk, zk_root, P).offer([Item(url=u) for u in urls])
    first = site.wait_for_requests(1, timeout=30)[0]
    assert first.path.startswith("/slow/")
    t_end = first.t + RETRY_AFTER  # the server's clock: nothing to the host before this
    # the hold rides A's next checkpoint (<= 0.2 s): in the partition node, then A is stopped
    wait_for(lambda: any(h.host == host and h.reason == "retry-after"
                         for h in _state(zk, zk_root, p).holds), 10, "the hold checkpointed")
    a.send_signal(stop)
    wait_for(lambda: _owner(zk, zk_root, p) == b_id, 30, "B owning the partition",
             interval=0.02)
    t_taken = time.monotonic()
    # The hand-over came before the Retry-After's end: without the kept state, B would have
    # asked the host one gap after its take (the test would fail).
    assert t_taken < t_end - 2 * GAP, (t_taken - first.t)
    assert b.wait(60) == 0
    later = [r.t for r in site.requests if r.path.startswith("/slow/")][1:]
    assert later and min(later) >= t_end - 0.02, [round(t - first.t, 3) for t in later]
    recs = records(b_out, strict=False)
    assert sorted(r["url"] for r in recs if r["status"] == 200) == urls  # B crawled both
    taken = [e for e in _events(b_err, "partition.taken") if e.get("partition") == p]
    assert taken and taken[-1]["holds"] == 1
    assert a.wait(30) == (-signal.SIGKILL if stop == signal.SIGKILL else 0)
    assert "Traceback" not in a_err.read_text() + b_err.read_text()
    print(f"FIGURE hoststate-{stop.name}: taken {t_taken - first.t:.2f} s after the 429, "
          f"next request {min(later) - first.t:.2f} s after it (Retry-After {RETRY_AFTER})")


FORGED = [b"\xff\xfe not json", b'{"hosts": [1, 2]}', b'{"hosts": {"HOST": [1, 2]}}']


@pytest.mark.slow
def test_forged_host_state_is_ignored_with_its_reason_and_the_partition_crawled(
        zk, zk_hosts, zk_root, tmp_path, procs):
    """Three hosts in three partitions, each partition node forged its own way (bytes, a
    list, an entry that is no hold): one consumer crawls them all and says why it ignored
    each state."""
    with contextlib.ExitStack() as stack:
        servers: dict[int, TestServer] = {}
        while len(servers) < len(FORGED):  # a server per partition (ports hash anywhere)
            srv = stack.enter_context(TestServer({"/p/*": html("<title>ok</title>")}))
            servers.setdefault(partition_of(_host(srv), P), srv)
        zk.ensure_path(Layout.of(zk_root).partitions)
        zk.set(zk_root, json.dumps({"partitions": P}).encode())
        urls = []
        for (p, srv), data in zip(servers.items(), FORGED, strict=True):
            zk.create(Layout.of(zk_root).partition(p), data.replace(b"HOST", _host(srv).encode()))
            urls += [srv.url(f"/p/{i}") for i in range(2)]
        PartitionQueue(zk, zk_root, P).offer([Item(url=u) for u in urls])
        c, out, err = _consumer(zk_hosts, zk_root, "c", tmp_path, "--exit-when-idle", "1")
        procs.append(c)
        assert c.wait(60) == 0
    assert sorted(r["url"] for r in records(out)) == sorted(urls)
    ignored = {e["partition"]: e["reason"] for e in _events(err, "partition.state_ignored")}
    assert set(servers) <= set(ignored) and all(ignored[p] for p in servers), ignored
    assert "Traceback" not in err.read_text()


# -- in-process: the queue's side, with a real gate and real ZooKeeper ----------------------

def _member(zk: ZkClient, root: str, me: str, gap: float) -> Ownership:
    zk.ensure_path(Layout.of(root).consumers)
    zk.create(Layout.of(root).consumer(me), b"{}", ephemeral=True)
    return Ownership(zk, root, me, gap, partitions=P).start()


def _claim(q: OwnedQueue, n: int) -> list:
    got: list = []
    wait_for(lambda: got.extend(q.claim(100, timeout=0.3)) or len(got) >= n, 30, "claimed")
    return got


def test_a_hold_rides_the_checkpoint_and_seeds_the_next_owner(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    a_zk = zk_factory(session_timeout=4.0)
    hosts = ["slow.test", "calm.test", "delayed.test"]
    PartitionQueue(a_zk, zk_root, P).offer([Item(url=f"http://{h}/x") for h in hosts])
    own_a = _member(a_zk, zk_root, "a", 0.5)
    gate = HostGate(LocalPoliteness(0.5), 0.5)
    own_a.keep_holds(gate)
    a = OwnedQueue(a_zk, zk_root, "a", own_a)
    got = _claim(a, 3)
    gate.back_off("slow.test", 30.0)  # a Retry-After: 30
    gate.set_min_delay("delayed.test", 7.0)  # a Crawl-delay above the gap
    a.complete(got)
    parts = {h: partition_of(h, P) for h in hosts}
    wait_for(lambda: {h.host for p in set(parts.values())
                      for h in _state(a_zk, zk_root, p).holds} == {"slow.test", "delayed.test"},
             10, "the holds checkpointed")
    holds = {h.host: h for p in set(parts.values()) for h in _state(a_zk, zk_root, p).holds}
    assert holds["slow.test"].reason == "retry-after"
    assert 28 < holds["slow.test"].until - time.time() <= 30.01
    assert holds["delayed.test"].reason == "crawl-delay" and holds["delayed.test"].delay == 7.0
    figures = own_a.snapshot()
    assert figures["hosts_backed_off"] == 1 and figures["rebalances"] == 0
    # the same owner goes on writing after its state write moved the partition's version
    PartitionQueue(a_zk, zk_root, P).offer([Item(url="http://slow.test/y")])
    again = _claim(a, 1)
    a.complete(again)
    wait_for(lambda: not any(n.startswith("qn-") for n in a_zk.get_children(
        Layout.of(zk_root).partition(parts["slow.test"]))), 10, "settled, not fenced")
    PartitionQueue(a_zk, zk_root, P).offer([Item(url="http://slow.test/z")])
    a_items = _claim(a, 1)
    expire_session(a_zk)  # a dies: b takes every partition over
    b_zk = zk_factory()
    own_b = _member(b_zk, zk_root, "b", 0.5)
    gate_b = HostGate(LocalPoliteness(0.5), 0.5)
    own_b.keep_holds(gate_b)
    b = OwnedQueue(b_zk, zk_root, "b", own_b)
    try:
        redone = _claim(b, 1)
        t = time.monotonic()
        assert own_b.not_before("slow.test") - t > 25  # the Retry-After, not one gap
        assert 6 < own_b.not_before("delayed.test") - t <= 7.0  # the Crawl-delay after the take
        assert own_b.not_before("calm.test") - t <= 0.5  # one gap after the take, as before
        assert own_b.snapshot()["holds_inherited"] == 2
        assert hold_of(gate_b, "slow.test")[0] > 25  # its gate holds it too (redirect hops)
        assert hold_of(gate_b, "calm.test")[0] <= 0
        wait_for(lambda: a_zk.connected, 20, "a reconnected (a zombie now)")
        a.complete(a_items)  # fenced: the version a's state writes moved is b's now
        wait_for(lambda: len(a.drain_lost()) > 0 or a.held == 0, 10, "a's items given up")
        b.complete(redone)
    finally:
        b.close()
        a.close()


def test_a_state_write_moves_the_version_and_the_owner_keeps_up(zk: ZkClient, zk_root: str
                                                                ) -> None:
    pq = PartitionQueue(zk, zk_root, P)
    pq.offer([Item(url=f"http://h.test/{i}") for i in range(3)])
    p = pq.partition_of_url("http://h.test/0")
    owned = pq.take(p)
    assert owned is not None
    node = pq.read(owned).batches[0]
    now = time.time()
    data = ps.encode([ps.Hold("h.test", now + 60, 0, "down")], now)
    res = pq.checkpoint([Change(owned, node, started=frozenset({0}))], {p: (owned, data)})
    assert res.states == {p} and not res.fenced
    assert pq.version(owned) == owned.epoch + 1
    node2 = res.nodes[0]
    assert node2 is not None
    assert pq.progress(owned, node2, done=[0]) is not None  # checked at the moved version
    assert pq.release(owned)
    again = pq.take(p)
    assert again is not None and [h.host for h in again.state.holds] == ["h.test"]


# -- the codec --------------------------------------------------------------------------------

@given(st.binary(max_size=2048))
def test_any_bytes_decode_to_holds_or_a_reason(data: bytes) -> None:
    now = time.time()
    out = ps.decode(data, now)
    assert isinstance(out, ps.Decoded)
    for h in out.holds:
        assert 0 <= h.until <= now + ps.HOLD_CAP and 0 <= h.delay <= MAX_CRAWL_DELAY


_VALUE = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12),
                   st.floats(allow_nan=False, allow_infinity=False),
                   st.lists(st.integers(), max_size=4))
_ENTRY = st.one_of(_VALUE, st.tuples(st.one_of(st.floats(allow_nan=False), st.integers()),
                                     st.one_of(st.floats(allow_nan=False), st.integers()),
                                     st.sampled_from([*ps.REASONS, "x", ""])).map(list))


@given(st.dictionaries(st.text(max_size=40), _ENTRY, max_size=30), st.sampled_from(
    ["hosts", "x"]))
def test_hostile_states_decode_clamped(hosts: dict[str, object], key: str) -> None:
    now = time.time()
    try:
        data = json.dumps({"v": 1, key: hosts}, allow_nan=False).encode()
    except ValueError:
        return  # not JSON at all (infinite floats)
    out = ps.decode(data, now)
    assert out.error is None
    assert len(out.holds) + out.dropped <= len(hosts)
    for h in out.holds:
        assert h.host in hosts and h.reason in ps.REASONS
        assert 0 <= h.until <= now + ps.HOLD_CAP and 0 <= h.delay <= MAX_CRAWL_DELAY
        assert h.until > now or h.delay > 0  # only holds in force


_HOLD = st.builds(ps.Hold, st.from_regex(r"[a-z0-9.-]{1,40}(:[0-9]{1,5})?", fullmatch=True),
                  st.floats(0, 2 * ps.HOLD_CAP), st.floats(0, MAX_CRAWL_DELAY),
                  st.sampled_from(ps.REASONS))


@settings(max_examples=50)
@given(st.lists(_HOLD, max_size=50, unique_by=lambda h: h.host))
def test_encoded_holds_round_trip_never_shorter(holds: list[ps.Hold]) -> None:
    now = 1.7e9
    shifted = [ps.Hold(h.host, now + h.until - ps.HOLD_CAP if h.until else 0.0, h.delay,
                       h.reason) for h in holds]
    data = ps.encode(shifted, now)
    assert len(data) <= ps.STATE_LIMIT
    back = {h.host: h for h in ps.decode(data, now).holds}
    for h in shifted:
        host = h.host
        if h.until > now or h.delay > 0:
            got = back[host]
            assert got.until >= min(h.until, now + ps.HOLD_CAP) - 1e-6 or h.until <= now
            assert got.delay >= h.delay - 1e-9 and got.delay - h.delay < 0.011
        else:
            assert host not in back


def test_ten_thousand_backed_off_hosts_stay_far_below_jute_maxbuffer() -> None:
    now = time.time()
    holds = [ps.Hold(f"host-{i:05d}.example.com:8080", now + 1 + i % 600, 0, "down")
             for i in range(10_000)]
    t0 = time.perf_counter()
    data = ps.encode(holds, now)
    took = time.perf_counter() - t0
    assert len(data) <= ps.STATE_LIMIT < 1024 * 1024 // 16
    back = ps.decode(data, now).holds
    assert 0 < len(back) <= ps.MAX_HOSTS
    # the soonest-ending were dropped: every kept hold ends no sooner than any dropped one
    kept = {h.host for h in back}
    assert min(h.until for h in back) >= max(h.until for h in holds if h.host not in kept) - 0.01
    assert not math.isnan(took)
    print(f"FIGURE hoststate-10k: {len(data)} bytes, {len(back)} holds kept, "
          f"encode {took * 1000:.1f} ms")
