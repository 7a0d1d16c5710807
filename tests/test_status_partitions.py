"""``zkcrawl status``'s ``partitions`` section against the real test ZooKeeper: P from the root,
owners verified by their session, batches and items per partition, the oldest batch's age,
partitions without an owner that hold items; forged owners, garbage batches and foreign
children counted, never a traceback; the item count capped."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_admin_cli import common, register, run, stop_registrations  # noqa: F401
from zkcrawl.admin import partition_status as ps
from zkcrawl.admin.cluster import cluster_status
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_queue import PartitionQueue
from zkcrawl.zk import Stat

P = 4


def _urls_in(pq: PartitionQueue, p: int, n: int) -> list[str]:
    """``n`` URLs whose hosts fall in partition ``p``."""
    out, i = [], 0
    while len(out) < n:
        url = f"http://h{i}.example/x"
        if pq.partition_of_url(url) == p:
            out.append(url)
        i += 1
    return out


@pytest.fixture
def tree(zk_factory, zk_root):
    """Partitions 0..3 of a root with P=4: 0 owned by live consumer c1 (5 items in 2
    batches, 1 done), 1 held by a forged owner node (another session, naming c1), 2 without
    an owner holding 3 items and a garbage batch, 3 empty and unowned; plus a foreign child."""
    owner, forger = zk_factory(), zk_factory()
    owner.ensure_path(zk_root)
    owner.set(zk_root, json.dumps({"partitions": P}).encode())
    pq = PartitionQueue(owner, zk_root, P, consumer="c1", max_items=3)
    pq.offer([Item(url=u) for u in _urls_in(pq, 0, 5)])  # 2 batches: 3 + 2
    pq.offer([Item(url=u) for u in _urls_in(pq, 2, 3)])
    layout = Layout.of(zk_root)
    owner.create(f"{layout.partition(2)}/qn-", b"\x00garbage", sequence=True)
    owner.ensure_path(layout.partition(3))
    owner.ensure_path(f"{layout.partitions}/not-a-partition")
    owner.ensure_path(f"{layout.partitions}/99")  # >= P: no partition of this root
    # c1 publishes its host figures; those of partition 1 (not its own: a forged owner node
    # names it) and the ones that are no figures are not believed
    register(owner, zk_root, "c1", {"id": "c1", "state": "running", "ownership": {
        "hosts": {"0": [3, 1], "1": [5, 5], "x": [1, 1], "3": "x", "2": [True, 1]}}})
    owned = pq.take(0)
    assert owned is not None
    node = pq.read(owned).batches[0]
    from zkcrawl.queue import partition_batch as pb
    owner.set(f"{layout.partition(0)}/{node.name}", pb.encode(node.batch.progressed(done=[0])))
    forger.ensure_path(layout.partition(1))
    forger.create(layout.partition_owner(1), b'{"consumer": "c1", "epoch": 7}', ephemeral=True)
    return zk_root


def test_status_json_partitions_section(zk, tree):
    time.sleep(0.2)  # the oldest batch ages measurably (a real ctime)
    doc = cluster_status(zk, tree)
    s = doc["partitions"]
    [c1] = doc["consumers"]
    assert c1["partitions"] == 1  # the forged node in its name is not counted
    assert s["count"] == P and s["count_error"] is None
    assert s["present"] == 4 and s["ignored"] == 2
    assert s["owned"] == 2 and s["by_owner"] == {"c1": 2}
    assert s["unverified"] == [1]  # the forged node names c1 but is not c1's session
    assert s["batches"] == 2 + 2 and s["items_counted"] and s["items"] == 4 + 3
    assert s["malformed_batches"] == 1
    assert s["unowned_with_items"] == 1 and s["unowned"] == [2]
    assert s["oldest_age_s"] >= 0.2
    by_p = {x["partition"]: x for x in s["list"]}
    assert by_p[0] | {"oldest_age_s": 0} == {
        "partition": 0, "owner": "c1", "epoch": 1, "verified": True, "batches": 2,
        "depth": 4, "malformed": 0, "oldest_age_s": 0, "hosts_active": 3,
        "hosts_backed_off": 1}
    assert s["hosts_active"] == 3 and s["hosts_backed_off"] == 1
    assert by_p[1]["owner"] == "c1" and by_p[1]["verified"] is False
    assert by_p[1]["hosts_active"] is None  # an unverified owner's word is not taken
    assert by_p[2]["owner"] is None and by_p[2]["verified"] is None
    assert (by_p[2]["batches"], by_p[2]["depth"], by_p[2]["malformed"]) == (2, 3, 1)
    assert by_p[3]["batches"] == 0 and by_p[3]["oldest_age_s"] is None


def test_status_text_shows_partitions(capsys, zk_hosts, tree):
    rc, out, err = run(capsys, "status", *common(zk_hosts, tree))
    assert rc == 0, err
    assert "partitions P=4: 4 present, 2 owned (c1 2)" in out
    assert "4 batches, 7 items queued" in out and "1 malformed batches" in out
    assert "WITHOUT AN OWNER, holding items: 1 (2)" in out
    assert "1 owner nodes not held by the live consumer they name" in out
    assert "hosts: 3 active, 1 backed off" in out
    head = next(line for line in out.splitlines() if line.startswith("PARTITION "))
    assert head.split() == ["PARTITION", "OWNER", "BATCHES", "ITEMS", "OLDEST", "HOSTS",
                            "BACKED", "OFF"]
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line[:1].isdigit() and "  " in line}
    assert rows["0"][1:4] == ["c1", "2", "4"] and rows["2"][1:4] == ["NONE", "2", "3"]
    assert rows["0"][-2:] == ["3", "1"] and rows["2"][-2:] == ["-", "-"]
    rc, out, _ = run(capsys, "status", "--json", *common(zk_hosts, tree))
    assert rc == 0 and json.loads(out)["partitions"]["unowned"] == [2]


def test_no_partitions_no_section(zk, zk_root, capsys, zk_hosts):
    zk.ensure_path(f"{zk_root}/queue")
    doc = cluster_status(zk, zk_root)
    assert doc["partitions"] is None and doc["consumers"] == []
    rc, out, _ = run(capsys, "status", *common(zk_hosts, zk_root))
    assert rc == 0 and "partitions" not in out


def test_many_unowned_listed_twenty_counted_all(zk, zk_root, capsys, zk_hosts):
    """25 unowned partitions with items, P edited by hand into garbage: all counted, 20 shown,
    the root's data refused with its reason."""
    zk.ensure_path(zk_root)
    zk.set(zk_root, b'{"partitions": "many"}')
    layout = Layout.of(zk_root)
    for p in range(25):
        zk.create(f"{layout.partition(p)}/qn-", b'{"v":1,"items":["http://a.example/"]}',
                  sequence=True, makepath=True)
    s = cluster_status(zk, zk_root)["partitions"]
    assert s["count"] is None and s["count_error"] == "partitions is not an integer"
    assert s["unowned_with_items"] == 25 and s["items"] == 25
    rc, out, _ = run(capsys, "status", *common(zk_hosts, zk_root))
    assert rc == 0 and "WITHOUT AN OWNER, holding items: 25 (0, 1, 2" in out
    assert "19 and 5 more" in out and "root data refused" in out


def test_items_beyond_the_cap_count_batches_only(zk, zk_root, monkeypatch):
    layout = Layout.of(zk_root)
    for _ in range(4):
        zk.create(f"{layout.partition(1)}/qn-", b'{"v":1,"items":["http://a.example/"]}',
                  sequence=True, makepath=True)
    monkeypatch.setattr(ps, "MAX_BATCH_READS", 3)
    s = cluster_status(zk, zk_root)["partitions"]
    assert s["batches"] == 4 and s["items"] is None and not s["items_counted"]
    assert "over 3" in s["items_note"] and s["list"][0]["depth"] is None
    monkeypatch.setattr(ps, "MAX_BATCH_READS", 3000)
    monkeypatch.setattr(ps, "MAX_READ_BYTES", 10)
    s = cluster_status(zk, zk_root)["partitions"]
    assert s["items"] is None and "MiB" in s["items_note"]


class _Stat:
    def __init__(self, owner: int) -> None:
        self.ephemeralOwner = owner


@settings(deadline=None)
@given(data=st.binary(max_size=2048) | st.builds(
    lambda d: json.dumps(d).encode(),
    st.dictionaries(st.sampled_from(["consumer", "epoch", "since", "x"]),
                    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    max_size=4)),
    session=st.integers(0, 2**63))
def test_any_owner_node_decodes(data, session):
    """Whatever an owner node holds: a dict of the documented keys, verified only when its
    session is the named live consumer's."""
    stat: Stat = _Stat(session)  # type: ignore[assignment]
    out = ps.decode_owner(data, stat, {"c1": 5})
    assert set(out) == {"consumer", "epoch", "since", "verified"}
    assert isinstance(out["consumer"], str)
    assert out["epoch"] is None or (isinstance(out["epoch"], int) and out["epoch"] >= 0)
    assert out["verified"] is (out["consumer"] == "c1" and session == 5)


@pytest.mark.slow
def test_status_of_a_real_owner_consumer(zk, zk_hosts, zk_root, tmp_path, capsys):
    """A real consumer with --politeness owner: every partition owned by it and verified
    (its owner nodes and status node share its session), the items it holds in flight
    counted as queued; stopped, its partitions are unowned and hold nothing."""
    import threading

    from tests.conftest import wait_for
    from tests.httpd import TestServer
    from tests.test_consumer_support import Running, offer, records, settings_for

    gate = threading.Event()

    def held(h):  # type: ignore[no-untyped-def]
        gate.wait(30)  # bounded: released by the test
        return 200, {"Content-Type": "text/html"}, b"<title>t</title>"

    out = tmp_path / "out.jsonl"
    with TestServer({"/a/*": held}) as srv:
        offer(zk, zk_root, [srv.url(f"/a/{i}") for i in range(3)])
        run = Running(settings_for(zk_hosts, zk_root, out, "--id", "own1", "--threads", "2",
                                   "--domain-delay", "0.01", "--politeness", "owner",
                                   "--partitions", "8"))
        try:
            srv.wait_for_requests(1, timeout=30)

            def section() -> dict:
                return cluster_status(zk, zk_root)["partitions"] or {}

            wait_for(lambda: section().get("owned") == 8 and not section()["unverified"],
                     timeout=30, what="8 partitions owned, verified")
            s = section()
            assert s["count"] == 8 and s["by_owner"] == {"own1": 8}
            assert [c["partitions"] for c in cluster_status(zk, zk_root)["consumers"]] == [8]
            assert s["unowned_with_items"] == 0 and s["items"] == 3  # in flight: not done
            # its one host is active in one partition (the status node, refreshed every 2 s)
            wait_for(lambda: section().get("hosts_active") == 1, timeout=10,
                     what="the active host published")
            assert section()["hosts_backed_off"] == 0
            rc, text, _ = run_status(capsys, zk_hosts, zk_root)
            assert rc == 0 and "partitions P=8: 8 present, 8 owned (own1 8)" in text
            gate.set()
            wait_for(lambda: len(records(out)) == 3, timeout=30, what="3 records")
            wait_for(lambda: section()["batches"] == 0, timeout=30, what="batches settled")
        finally:
            gate.set()
            run.stop()
    s = cluster_status(zk, zk_root)["partitions"]
    assert s["owned"] == 0 and s["unowned_with_items"] == 0 and s["items"] == 0


def run_status(capsys, hosts: str, root: str):  # type: ignore[no-untyped-def]
    return run(capsys, "status", *common(hosts, root))


_count = st.one_of(st.integers(-3, 10**8), st.booleans(), st.none(), st.text(max_size=2),
                   st.floats(allow_nan=False))


@given(doc=st.one_of(st.none(), st.integers(), st.builds(lambda h: {"ownership": {"hosts": h}},
       st.one_of(st.dictionaries(st.text(max_size=5) | st.integers(0, 5000).map(str),
                                 st.lists(_count, max_size=3) | _count, max_size=20),
                 st.lists(st.integers(), max_size=3), st.text(max_size=3)))))
def test_any_published_host_figures_decode(doc):
    """A consumer's published host figures (anyone may write a status node): None, or
    partitions below MAX_PARTITIONS with two non-negative counts each; never an error."""
    out = ps.host_figures(doc)
    hosts = doc.get("ownership", {}).get("hosts") if isinstance(doc, dict) else None
    assert (out is None) == (not isinstance(hosts, dict))
    for p, (a, b) in (out or {}).items():
        assert 0 <= p < 4096 and str(p) in hosts
        assert all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 10**7
                   for v in (a, b))


@given(names=st.lists(st.text(max_size=6) | st.integers(-5, 5000).map(str), max_size=30),
       count=st.none() | st.integers(1, 4096))
def test_any_children_of_partitions_are_sorted_out(names, count):
    """Child names of <root>/partitions (anyone may create them): only plain decimals below
    P (or the maximum when P is unknown) are partitions; never an error."""
    got = ps._partition_names(names, count)
    assert got == sorted(got)
    limit = count or 4096
    assert all(0 <= p < limit and str(p) in names for p in got)
    assert len(got) == sum(1 for n in names if ps._NAME.fullmatch(n) and int(n) < limit)


_entries = st.lists(st.one_of(st.builds(lambda i: f"http://h{i}.example/", st.integers(0, 9)),
                              st.integers(), st.none(), st.text(max_size=5)), max_size=12)


@given(data=st.binary(max_size=300) | st.builds(
    lambda items, done, started: json.dumps({"v": 1, "items": items, "done": done,
                                             "started": started}).encode(),
    _entries, st.lists(st.integers(-3, 15) | st.booleans() | st.text(max_size=2), max_size=8)
    | st.none() | st.text(max_size=3), st.lists(st.integers(-3, 15), max_size=5)))
def test_count_pending_agrees_with_decode(data):
    """The status's cheap count follows partition_batch.decode: no batch for the same data,
    and the same items not done, but for entries that are no item (queued until their
    owner dead-letters them)."""
    from zkcrawl.queue import partition_batch as pb

    batch, why = pb.decode(data)
    got = ps.count_pending(data)
    if batch is None:
        assert got is None and why
    else:
        bad_not_done = sum(1 for i in batch.errors if i not in batch.done)
        assert got == len(batch.pending) + bad_not_done
