"""The partitioned queue recipe (zkcrawl/queue/partition_queue.py) on a real ZooKeeper, and
its batch codec (zkcrawl/queue/partition_batch.py) under hypothesis."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import expire_session, wait_for
from zkcrawl.bench.hosts import zk_counters, zk_ports
from zkcrawl.queue import items as item_codec
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_queue import Fenced, PartitionQueue
from zkcrawl.zk.client import ZkClient

P = 8


def _items(n: int, hosts: int = 10) -> list[Item]:
    return [Item(url=f"http://h{i % hosts}.test/{i}", producer="p") for i in range(n)]


def _batches(zk: ZkClient, root: str, p: int) -> list[tuple[str, pb.Batch]]:
    path = Layout.of(root).partition(p)
    if zk.exists(path) is None:
        return []
    out = []
    for _, name in item_codec.sort_names([c for c in zk.get_children(path) if c.startswith("qn-")]):
        batch, why = pb.decode(zk.get(f"{path}/{name}")[0])
        assert batch is not None, why
        out.append((name, batch))
    return out


def _all_urls(zk: ZkClient, root: str) -> list[str]:
    return [it.url for p in range(P) for _, b in _batches(zk, root, p)
            for i, it in enumerate(b.items) if it is not None and i not in b.done]


def _dead(zk: ZkClient, root: str) -> list[dict[str, object]]:
    path = Layout.of(root).dead
    return [json.loads(zk.get(f"{path}/{n}")[0]) for n in sorted(zk.get_children(path))]


# -- offers ----------------------------------------------------------------------------
def test_offers_go_in_batches_to_the_partition_of_their_host(zk: ZkClient, zk_root: str
                                                             ) -> None:
    q = PartitionQueue(zk, zk_root, P)
    items = _items(300, hosts=30)
    created = q.offer(items)
    assert created <= P  # one batch per partition touched: 300 items in at most 8 nodes
    assert sorted(_all_urls(zk, zk_root)) == sorted(it.url for it in items)
    for p in range(P):
        for _, b in _batches(zk, zk_root, p):
            assert {q.partition_of_url(it.url) for it in b.items if it} == {p}
    assert zk.get_children(Layout.of(zk_root).offers) == []  # markers deleted


def test_a_big_offer_is_split_into_batches_within_the_limit(zk: ZkClient, zk_root: str) -> None:
    q = PartitionQueue(zk, zk_root, 1)
    meta = {"pad": "x" * 2000}
    items = [Item(url=f"http://one.test/{i}", meta=meta) for i in range(100)]
    items.append(Item(url="http://one.test/huge", meta={"pad": "y" * 70_000}))
    assert q.offer(items) >= 4  # ~200 KB of items: at least four 64 KiB batches
    path = Layout.of(zk_root).partition(0)
    for name in zk.get_children(path):
        if name.startswith("qn-"):
            assert len(zk.get(f"{path}/{name}")[0]) <= pb.BATCH_LIMIT
    assert q.refused == 1  # the huge one, with a reason in the log; the others went in
    assert len(_all_urls(zk, zk_root)) == 100


def test_an_offer_after_the_partition_directory_was_deleted_makes_it_again(
        zk: ZkClient, zk_root: str) -> None:
    q = PartitionQueue(zk, zk_root, P)
    q.offer(_items(20))
    zk.delete(Layout.of(zk_root).partitions, recursive=True)  # by hand, mid-crawl
    assert q.offer(_items(20)) >= 1
    assert len(_all_urls(zk, zk_root)) == 20


# -- ownership and the fence -----------------------------------------------------------
def test_one_owner_at_a_time_and_a_zombie_is_fenced(zk_factory: Callable[..., ZkClient],
                                                    zk_root: str) -> None:
    a_zk, b_zk = zk_factory(session_timeout=4.0), zk_factory()
    a = PartitionQueue(a_zk, zk_root, P, consumer="a")
    b = PartitionQueue(b_zk, zk_root, P, consumer="b")
    a.offer(_items(40, hosts=1))
    p = a.partition_of_url("http://h0.test/0")
    owned_a = a.take(p)
    assert owned_a is not None
    assert b.take(p) is None  # a lives: b does not get it
    assert b.owner(p) == ("a", a_zk.session_id)
    node = a.read(owned_a).batches[0]
    node = a.progress(owned_a, node, started=[0, 1])
    assert node is not None
    old = a_zk.session_id
    expire_session(a_zk)  # a's session ends: its owner node goes
    owned_b = b.take(p)
    assert owned_b is not None and owned_b.epoch > owned_a.epoch
    # the zombie comes back with a new session and tries to settle what it held
    wait_for(lambda: a_zk.connected and a_zk.session_id not in (None, old), 20, "reconnected")
    with pytest.raises(Fenced):  # the zombie's settle changes nothing
        a.progress(owned_a, node, done=[0, 1])
    (_, batch), = _batches(b_zk, zk_root, p)
    assert batch.started == {0, 1} and not batch.done


def test_release_hands_a_partition_over_at_once(zk_factory: Callable[..., ZkClient],
                                               zk_root: str) -> None:
    a = PartitionQueue(zk_factory(), zk_root, P, consumer="a")
    b = PartitionQueue(zk_factory(), zk_root, P, consumer="b")
    owned = a.take(3)
    assert owned is not None and b.take(3) is None
    assert a.release(owned)
    assert b.take(3) is not None
    assert not a.release(owned)  # no longer ours: nothing deleted
    assert b.owner(3)[0] == "b"


def test_take_many_takes_what_is_free_fenced_like_one_take(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    a_zk, b_zk = zk_factory(), zk_factory()
    a = PartitionQueue(a_zk, zk_root, P, consumer="a")
    b = PartitionQueue(b_zk, zk_root, P, consumer="b")
    first = a.take(2)
    assert first is not None
    # Another writer moves partition 5's version between nothing and the take: still taken.
    b_zk.ensure_path(Layout.of(zk_root).partition(5))
    b_zk.set(Layout.of(zk_root).partition(5), b"{}")
    got = a.take_many(range(P))
    assert set(got) == set(range(P)) and all(o is not None for o in got.values())
    assert got[2] is not None and got[2].epoch > first.epoch  # ours from before: taken again
    assert b.take_many([1, 2, 3]) == {1: None, 2: None, 3: None}  # a holds them
    owned1 = got[1]
    assert owned1 is not None and a.release(owned1)
    again = b.take_many([1, 2])
    assert again[2] is None
    assert again[1] is not None and again[1].epoch > owned1.epoch
    assert b.owner(1)[0] == "b" and not a.release(owned1)  # a's old take deletes nothing


def _writes(zk_hosts: str) -> float:
    """Writes the test's server has served (``mntr``: a transaction is one)."""
    counters = zk_counters(zk_ports(zk_hosts))
    assert counters is not None, "mntr unanswered"
    return counters["writes"]


def test_many_partitions_are_taken_and_given_up_in_a_few_transactions(
        zk_factory: Callable[..., ZkClient], zk_hosts: str, zk_root: str) -> None:
    many = 200
    a_zk, b_zk = zk_factory(), zk_factory()
    a = PartitionQueue(a_zk, zk_root, many, consumer="a")
    b = PartitionQueue(b_zk, zk_root, many, consumer="b")
    held = b.take(7)  # another consumer's: seen in the read, not tried
    assert held is not None
    before = _writes(zk_hosts)
    got = a.take_many(range(many))
    took = _writes(zk_hosts) - before
    assert got[7] is None and all(got[p] is not None for p in range(many) if p != 7)
    # 4 transactions make the missing partition nodes, 4 take them: 8 writes, where one
    # per node and one per take were ~400 (a closed session elsewhere may add one).
    assert took <= 10, took
    assert a.owner(0)[0] == "a" and b.owner(7)[0] == "b"
    mine = [o for o in got.values() if o is not None]
    before = _writes(zk_hosts)
    released = a.release_many(mine)
    assert _writes(zk_hosts) - before <= 6  # 199 partitions in 4 transactions
    assert all(released.values()) and len(released) == many - 1
    assert a.owner(0) == (None, None) and b.owner(7)[0] == "b"
    # A fenced partition (taken again by b meanwhile) is not released, the others are.
    again = a.take_many([1, 2, 3])
    one = again[1]
    assert one is not None and a.release(one) and b.take(1) is not None
    out = a.release_many([o for o in again.values() if o is not None])
    assert out == {1: False, 2: True, 3: True}
    assert b.owner(1)[0] == "b" and a.owner(2) == (None, None)


# -- progress --------------------------------------------------------------------------
def test_progress_settles_retries_to_the_tail_and_writes_dead_letters(zk: ZkClient,
                                                                      zk_root: str) -> None:
    q = PartitionQueue(zk, zk_root, 1, consumer="c")
    q.offer(_items(5, hosts=1))
    owned = q.take(0)
    assert owned is not None
    node = q.read(owned).batches[0]
    node = q.progress(owned, node, started=[0, 1, 2])
    assert node is not None and node.batch.in_flight == [0, 1, 2]
    retry = Item(url=node.batch.items[1].url, attempt=1)  # type: ignore[union-attr]
    letter = item_codec.encode_dead_letter("x", node.batch.items[2].url, "http 404", 1, b"")  # type: ignore[union-attr]
    node = q.progress(owned, node, done=[0, 1, 2], retry=[retry], dead=[letter])
    assert node is not None and node.batch.pending == [3, 4]
    batches = _batches(zk, zk_root, 0)
    assert len(batches) == 2 and batches[1][1].items[0] == retry  # at the tail
    assert [d["error"] for d in _dead(zk, zk_root)] == ["http 404"]
    assert q.progress(owned, node, started=[3, 4], done=[3, 4]) is None  # all done: deleted
    assert len(_batches(zk, zk_root, 0)) == 1


def test_an_empty_batch_anyone_wrote_is_deleted_when_adopted(zk: ZkClient, zk_root: str
                                                            ) -> None:
    q = PartitionQueue(zk, zk_root, 1, consumer="a")
    q.ensure_partitions([0])
    zk.create(Layout.of(zk_root).partition_batch_prefix(0), b'{"items": []}', sequence=True)
    owned = q.take(0)
    assert owned is not None
    read = q.read(owned)
    assert len(read.batches) == 1 and read.batches[0].batch.finished
    assert q.adopt(owned, read.batches[0]) is None  # nothing in it: gone, not queued for ever
    assert _batches(zk, zk_root, 0) == [] and q.depth() == 0


def test_a_new_owner_charges_only_the_items_that_were_started(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    a_zk = zk_factory(session_timeout=4.0)
    a = PartitionQueue(a_zk, zk_root, 1, consumer="a", max_attempts=3)
    items = [Item(url=f"http://h.test/{i}", attempt=2 if i == 1 else 0) for i in range(6)]
    a.offer(items)
    owned = a.take(0)
    assert owned is not None
    node = a.read(owned).batches[0]
    node = a.progress(owned, node, started=[0, 1, 2], done=[0])  # 1 and 2 in flight
    expire_session(a_zk)  # kill -9, as the server sees it
    b = PartitionQueue(zk_factory(), zk_root, 1, consumer="b", max_attempts=3)
    owned_b = b.take(0)
    assert owned_b is not None
    node_b = b.adopt(owned_b, b.read(owned_b).batches[0])
    assert node_b is not None and node_b.batch.pending == [2, 3, 4, 5]
    assert node_b.batch.in_flight == []  # the marks cleared
    dead = _dead(b.zk, zk_root)
    assert [(d["url"], d["error"], d["attempts"], d["holder_deaths"]) for d in dead] == [
        ("http://h.test/1", "abandoned", 3, 1)]  # its third attempt was the death
    # Charged in place: same batch, same index (the identity a sink keys its rows on).
    ((_, first),) = _batches(b.zk, zk_root, 0)
    again = first.items[2]
    assert again is not None and (again.url, again.attempt, again.meta["holder_deaths"]) == (
        "http://h.test/2", 1, 1)
    assert all(it.attempt == 0 for i, it in enumerate(first.items) if it and i >= 3)


# -- hostile nodes ---------------------------------------------------------------------
def test_a_node_that_is_no_batch_and_a_bad_entry_become_dead_letters(zk: ZkClient,
                                                                    zk_root: str) -> None:
    q = PartitionQueue(zk, zk_root, 1, consumer="c")
    prefix = Layout.of(zk_root).partition_batch_prefix(0)
    q.offer(_items(1))  # makes the partition
    zk.create(prefix, b"\xff\x00 not json", sequence=True)
    zk.create(prefix, json.dumps({"items": [{"url": "http://ok.test/1"}, {"no": "url"},
                                            "http://bare.test/x", 7]}).encode(),
              sequence=True)
    owned = q.take(0)
    assert owned is not None
    read = q.read(owned)
    assert read.dead == 1 and len(read.batches) == 2
    node = q.adopt(owned, read.batches[1])
    assert node is not None
    assert [node.batch.items[i].url for i in node.batch.pending] == [  # type: ignore[union-attr]
        "http://ok.test/1", "http://bare.test/x"]
    errors = sorted(str(d["error"]) for d in _dead(zk, zk_root))
    assert len(errors) == 3 and all(e.startswith("malformed") for e in errors)


@pytest.mark.parametrize("entries", [
    [f"http://t.test/{i}" for i in range(10_000)],  # good URLs: 0.2 MB, over the byte cap
    [0] * 10_000])  # no URLs: within the byte cap, more entries than a batch may hold
def test_a_forged_batch_of_10000_tiny_items_is_one_dead_letter_with_its_reason(
        zk: ZkClient, zk_root: str, entries: list[object]) -> None:
    """Issue #22's "batch of 10,000 tiny items": more than any batch zkcrawl writes (1,000
    items, 64 KiB) and more than one decode may cost -- one dead letter with the reason
    and a bounded copy of the data (not 10,000 writes), the partition's other batches read
    and crawled as usual."""
    q = PartitionQueue(zk, zk_root, 1, consumer="c")
    prefix = Layout.of(zk_root).partition_batch_prefix(0)
    q.offer(_items(3))  # makes the partition, and a good batch
    zk.create(prefix, json.dumps({"items": entries}).encode(), sequence=True)
    owned = q.take(0)
    assert owned is not None
    read = q.read(owned)
    assert read.dead == 1 and len(read.batches) == 1
    assert len(read.batches[0].batch.items) == 3
    letters = _dead(zk, zk_root)
    assert len(letters) == 1 and str(letters[0]["error"]).startswith("malformed")
    assert len(json.dumps(letters[0])) < 16 * 1024  # bounded, whatever the node held


def test_many_partitions_are_read_at_once_and_one_bad_partition_spoils_none(
        zk: ZkClient, zk_root: str) -> None:
    """read_many: the batches of many partitions in one pipelined listing and read, each
    listing watched; a node that is no batch in one becomes its dead letter, a partition
    deleted by hand after its take gives its own error -- the others are read all the same,
    with what each call skips left out."""
    q = PartitionQueue(zk, zk_root, P, consumer="c")
    q.offer(_items(200, hosts=40))
    zk.create(Layout.of(zk_root).partition_batch_prefix(3), b"not a batch", sequence=True)
    owned = [o for p in range(P) if (o := q.take(p)) is not None]
    assert len(owned) == P
    gone = owned[5]
    zk.delete(Layout.of(zk_root).partition(gone.partition), recursive=True)
    skip = frozenset(n for n, _ in _batches(zk, zk_root, 0))
    fired: list[int] = []
    reads = q.read_many([(o, skip if o.partition == 0 else frozenset()) for o in owned],
                        lambda p: lambda _event: fired.append(p))
    assert sorted(reads) == list(range(P))
    assert isinstance(reads[gone.partition], Exception)
    good = {p: r for p, r in reads.items() if not isinstance(r, Exception)}
    assert len(good) == P - 1 and good[0].batches == []  # its one batch was skipped
    dead = _dead(zk, zk_root)
    assert good[3].dead == 1 and len(dead) == 1 and str(dead[0]["error"]).startswith("malformed")
    urls = {it.url for p, r in good.items() for node in r.batches for it in node.batch.items
            if it is not None}
    expected = {it.url for it in _items(200, hosts=40)
                if q.partition_of_url(it.url) not in (0, gone.partition)}
    assert urls == expected
    q.offer([it for it in _items(200, hosts=40) if q.partition_of_url(it.url) == 1][:1])
    wait_for(lambda: 1 in fired, 10, "the listing's watch")


def test_a_forged_batch_of_thousands_of_tiny_items_is_crawled_not_refused() -> None:
    """Another client may pack more tiny items than a batch made here holds: every one
    that fits in 64 KiB decodes; a batch of more entries than could be items is one reason."""
    urls = [f"http://a.t/{i}" for i in range(3000)]
    data = json.dumps({"items": urls}).encode()
    assert len(data) <= pb.BATCH_LIMIT
    batch, why = pb.decode(data)
    assert batch is not None, why
    assert [it.url for it in batch.items if it] == urls and batch.pending == list(range(3000))
    batch, why = pb.decode(json.dumps({"items": [0] * 20_000}).encode())
    assert batch is None and why is not None and "items" in why


# -- the ingress -----------------------------------------------------------------------
def test_the_ingress_is_moved_into_partitions_by_racing_movers(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    zk = zk_factory()
    layout = Layout.of(zk_root)
    zk.ensure_path(layout.queue)
    urls = [f"http://h{i % 7}.test/{i}" for i in range(120)]
    for i, url in enumerate(urls):
        data = url.encode() if i % 2 else Item(url=url).encode()  # Curator's bare URL too
        zk.create(layout.item_prefix, data, sequence=True)
    zk.create(layout.item_prefix, b"\xffgarbage", sequence=True)
    movers = [PartitionQueue(zk_factory(), zk_root, P, consumer=f"m{i}") for i in range(3)]
    totals = [0, 0]
    lock = threading.Lock()

    def run(q: PartitionQueue) -> None:
        for _ in range(40):
            moved, dead = q.move_ingress(limit=25)
            with lock:
                totals[0] += moved
                totals[1] += dead
            if not zk.get_children(layout.queue):
                return

    threads = [threading.Thread(target=run, args=(q,)) for q in movers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert zk.get_children(layout.queue) == []
    assert totals == [120, 1]
    assert sorted(_all_urls(zk, zk_root)) == sorted(urls)  # each once: none lost, none doubled
    assert [d["error"] for d in _dead(zk, zk_root)] == ["malformed: not UTF-8"]


# -- the codec -------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_any_bytes_decode_to_a_batch_or_a_reason(data: bytes) -> None:
    batch, why = pb.decode(data)
    assert (batch is None) != (why is None)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=5)
                     | st.dictionaries(st.text(max_size=8), kids, max_size=5), max_leaves=12)


@settings(max_examples=120, deadline=None)
@given(st.fixed_dictionaries({"items": st.lists(_JSON | st.fixed_dictionaries(
    {"url": st.sampled_from(["http://a.test/", "https://b.test/x", "nope"])}), max_size=10),
    "done": _JSON, "started": _JSON}))
def test_hostile_batches_decode_with_sane_progress(doc: dict[str, object]) -> None:
    batch, why = pb.decode(json.dumps(doc).encode())
    assert batch is not None, why
    n = len(batch.items)
    assert all(0 <= i < n for i in batch.done | batch.started)
    assert not batch.started & batch.done
    assert set(batch.errors) == {i for i, it in enumerate(batch.items) if it is None}
    # what it says is pending is exactly the good items not done
    assert batch.pending == [i for i in range(n) if batch.items[i] and i not in batch.done]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=30), st.integers(0, 5),
                          st.text(max_size=3000)), max_size=60))
def test_packed_batches_fit_and_round_trip(rows: list[tuple[str, int, str]]) -> None:
    items = [Item(url=f"http://h.test/{path}", attempt=a, meta={"pad": pad})
             for path, a, pad in rows]
    out: list[Item] = []
    for chunk, refused in pb.pack(items, max_items=25):
        assert not refused
        assert len(chunk) <= 25
        data = pb.encode(pb.Batch(tuple(chunk), token="t" * 32))
        assert len(data) <= pb.BATCH_LIMIT
        batch, why = pb.decode(data)
        assert batch is not None, why
        out.extend(it for it in batch.items if it is not None)
    assert [(i.url, i.attempt, i.meta) for i in out] == [(i.url, i.attempt, i.meta)
                                                          for i in items]
