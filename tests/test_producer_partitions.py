"""The producer offers straight into partitions (issue #22, items 1 and 6): batched, each
item in the partition of its host, back-pressure per partition and in all, held items that
survive a SIGKILL, hostile root data. Real ZooKeeper; real producer processes where a
signal or a consumer matters."""

from __future__ import annotations

import io
import json
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.test_producer_cli import _producer, _summary
from zkcrawl.producer.main import main
from zkcrawl.producer.offerer import held_bound, partition_bound
from zkcrawl.queue import items as item_codec
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_offers import PartitionOffers
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS, partition_of
from zkcrawl.seen import SeenSet
from zkcrawl.web.urls import host_key
from zkcrawl.zk import ZkClient


def batches(zk: ZkClient, root: str) -> dict[int, list[tuple[str, list[str]]]]:
    """Every partition's batches in order: ``p -> [(name, [url...])]`` (pending items)."""
    lay = Layout.of(root)
    out: dict[int, list[tuple[str, list[str]]]] = {}
    if zk.exists(lay.partitions) is None:
        return out
    for p in sorted(int(n) for n in zk.get_children(lay.partitions)):
        names = [n for _, n in item_codec.sort_names(
            [c for c in zk.get_children(lay.partition(p)) if c.startswith(item_codec.PREFIX)])]
        rows = []
        for name, res in zip(names, zk.get_many([f"{lay.partition(p)}/{n}" for n in names]),
                             strict=True):
            batch, why = pb.decode(res[0])  # type: ignore[index]
            assert batch is not None, why
            rows.append((name, [batch.items[i].url for i in batch.pending]))  # type: ignore[union-attr]
        if rows:
            out[p] = rows
    return out


def queued(zk: ZkClient, root: str) -> Counter[str]:
    return Counter(u for rows in batches(zk, root).values() for _, urls in rows for u in urls)


def ingress(zk: ZkClient, root: str) -> int:
    stat = zk.exists(Layout.of(root).queue)
    return int(stat.numChildren) if stat else 0


def run(zk_hosts: str, zk_root: str, *argv: str) -> tuple[int, dict[str, Any]]:
    """The producer in-process (``main``), its summary event."""
    err = io.StringIO()
    import contextlib
    import sys

    with contextlib.redirect_stderr(err):
        status = main(["--zk", zk_hosts, "--root", zk_root, "--log-format", "json",
                       "--session-timeout", "4", *argv], env={})
        sys.stderr.flush()
    events = [json.loads(line) for line in err.getvalue().splitlines() if line.startswith("{")]
    summary = next((e for e in events if e.get("event") == "producer.summary"), {})
    return int(status), summary


def write(path: Path, urls: list[str]) -> Path:
    path.write_text("\n".join(urls) + "\n")
    return path


def test_items_land_in_their_hosts_partition_in_batches(zk, zk_hosts, zk_root, tmp_path):
    urls = [f"http://site{i % 40}.example.com/a/{i}" for i in range(4000)]
    status, s = run(zk_hosts, zk_root, "--from-file", str(write(tmp_path / "u", urls)),
                    "--partitions", "16")
    assert status == 0 and s["offered"] == 4000 and s["offers_into"] == "partitions"
    assert s["partition_listings"] == 16  # each listed once: far from the bounds, no more
    assert json.loads(zk.get(zk_root)[0]) == {"partitions": 16}  # recorded by this producer
    found = batches(zk, zk_root)
    for p, rows in found.items():
        for _name, got in rows:
            assert {partition_of(host_key(u), 16) for u in got} == {p}
    assert queued(zk, zk_root) == Counter(urls)  # each once
    nodes = sum(len(rows) for rows in found.values())
    assert nodes / len(urls) < 0.02  # batched: far fewer nodes than URLs
    assert ingress(zk, zk_root) == 0


def test_a_root_that_records_p_gets_partitions_without_the_flag(zk, zk_hosts, zk_root,
                                                                tmp_path):
    zk.ensure_path(zk_root)
    zk.set(zk_root, b'{"partitions": 8}')
    urls = [f"http://h{i}.example/x" for i in range(50)]
    status, s = run(zk_hosts, zk_root, "--from-file", str(write(tmp_path / "u", urls)),
                    "--partitions", "32")  # ignored: P is the root's
    assert status == 0 and s["offers_into"] == "partitions"
    assert set(batches(zk, zk_root)) <= set(range(8)) and queued(zk, zk_root) == Counter(urls)


def test_a_root_without_p_gets_the_default_p_recorded_by_the_producer(zk, zk_hosts, zk_root,
                                                                     tmp_path):
    urls = [f"http://h{i}.example/x" for i in range(30)]
    status, s = run(zk_hosts, zk_root, "--from-file", str(write(tmp_path / "u", urls)))
    assert status == 0 and s["offers_into"] == "partitions"
    assert json.loads(zk.get(zk_root)[0]) == {"partitions": DEFAULT_PARTITIONS}
    assert set(batches(zk, zk_root)) <= set(range(DEFAULT_PARTITIONS))
    assert queued(zk, zk_root) == Counter(urls) and ingress(zk, zk_root) == 0


@pytest.mark.parametrize("data", [b"\xff garbage", b'{"partitions": 0}',
                                  b'{"partitions": "9"}', b'{"partitions": 99999}', b"[1]"])
def test_hostile_root_data_is_one_line_exit_2(data, zk, zk_hosts, zk_root, tmp_path):
    zk.ensure_path(zk_root)
    zk.set(zk_root, data)
    src = write(tmp_path / "u", ["http://a.example/1"])
    proc = _producer(zk_hosts, zk_root, "--from-file", str(src))
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err.decode()[-2000:]
    lines = [ln for ln in err.decode().splitlines() if not ln.startswith("{")]
    assert len(lines) == 1 and "partition count" in lines[0], err.decode()
    assert "Traceback" not in err.decode()
    assert ingress(zk, zk_root) == 0 and not batches(zk, zk_root)


def test_the_default_bounds():
    assert partition_bound(10_000, 256) == 2500  # a quarter
    assert partition_bound(10_000, 4) == 5000  # 2 N / P on a root of few partitions
    assert partition_bound(10_000, 1) == 10_000  # never above N
    assert partition_bound(10_000, 256, 700) == 700
    assert held_bound(10_000, 500) == 5000 and held_bound(100, 500) == 500
    assert held_bound(10_000, 500, 42) == 42


def test_depth_counts_items_of_every_batch_cheaply(zk, zk_root):
    """Own batches from their create, another's read once; the ingress one per child."""
    feed = PartitionOffers(zk, zk_root, 4)
    from zkcrawl.queue.items import Item

    urls = [f"http://h{i}.example/x" for i in range(200)]
    groups: dict[int, list[Item]] = {}
    for u in urls:
        groups.setdefault(feed.partition_of(u), []).append(Item(url=u))
    assert sum(len(c.indices) for c in feed.commit(groups)) == 200
    other = PartitionOffers(zk, zk_root, 4)
    assert other.measure() == 200  # read from the batches: nobody told it
    zk.create(f"{zk_root}/queue/qn-", b"http://x.example/1", sequence=True)
    assert other.measure() == 201 and other.measure([0, 1]) == 201
    assert feed.measure() == 201


def held_items(zk: ZkClient, root: str, pid: str) -> dict[str, Any] | None:
    node = f"{root}/producers/{pid}"
    if not zk.exists(node):
        return None
    doc = json.loads(zk.get(node)[0])
    return doc if isinstance(doc, dict) else None


@pytest.mark.slow
def test_a_full_partition_never_blocks_the_others_and_a_sigkill_loses_nothing(
        zk, zk_hosts, zk_root, tmp_path):
    """One big host fills its partition; the small hosts' items keep going in; the big
    host's items wait held back (shown on the status node); a SIGKILL then, and a rerun
    once the partition has room, queues every URL exactly once."""
    big = [f"http://big.example/p/{i}" for i in range(1500)]
    small = [f"http://small{i}.example/x" for i in range(300)]
    mixed = big[:200] + [u for pair in zip(big[200:500], small, strict=True) for u in pair] \
        + big[500:]
    src, seen = write(tmp_path / "u", mixed), tmp_path / "seen"
    proc = _producer(zk_hosts, zk_root, "--from-file", str(src), "--seen", str(seen),
                     "--partitions", "16", "--max-depth", "100000",
                     "--max-partition-depth", "400", "--max-held", "600", "--batch", "100",
                     "--id", "bp")
    big_p = partition_of("big.example", 16)
    try:
        wait_for(lambda: (held_items(zk, zk_root, "bp") or {}).get("state") == "waiting",
                 what="the producer waiting with its buffer full", timeout=60)
        doc = held_items(zk, zk_root, "bp")
        assert doc is not None
        assert doc["held_back"]["top"][0]["partition"] == big_p
        assert doc["held_back"]["items"] > 600 - 100
        got = queued(zk, zk_root)
        assert sum(n for u, n in got.items() if u.startswith("http://big")) <= 400
        # every small host of another partition came through, though they came after the
        # big host filled its own (those sharing its partition wait with it)
        others = {u for u in small if partition_of(host_key(u), 16) != big_p}
        assert others <= set(got) and len(others) > 250
        wait_for(lambda: seen.exists() and SeenSet.open(seen, 100_000, 0.001).count
                 == len(got), what="a checkpoint of every committed URL")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    # a consumer takes the big host's batches away: the rerun finds room, offers the rest
    lay = Layout.of(zk_root)
    for name in zk.get_children(lay.partition(big_p)):
        if name.startswith(item_codec.PREFIX):
            zk.delete(f"{lay.partition(big_p)}/{name}")
    taken = [u for u in got if partition_of(host_key(u), 16) == big_p]
    proc = _producer(zk_hosts, zk_root, "--from-file", str(src), "--seen", str(seen),
                     "--max-depth", "100000", "--batch", "100", "--id", "bp2")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()[-2000:]
    s = _summary(err)
    assert s["offers_into"] == "partitions"  # the root records P: no flag needed
    books = queued(zk, zk_root) + Counter(taken)
    assert books == Counter(mixed)  # every URL queued once: nothing lost, nothing doubled
    assert s["offered"] == len(mixed) - len(got)


def test_the_total_bound_holds_across_partitions(zk, zk_hosts, zk_root, tmp_path):
    """--max-depth bounds the ingress plus every partition; a stop while held counts the
    held items as unoffered and leaves them out of the seen state."""
    zk.ensure_path(f"{zk_root}/queue")
    for i in range(50):
        zk.create(f"{zk_root}/queue/qn-", f"http://ingress.example/{i}".encode(), sequence=True)
    urls = [f"http://h{i % 64}.example/{i}" for i in range(1000)]
    stop = threading.Event()
    from zkcrawl.producer.main import execute, make_plan
    from zkcrawl.producer.settings import ProducerSettings

    settings = ProducerSettings(zk=zk_hosts, root=zk_root, from_file=str(write(
        tmp_path / "u", urls)), seen=str(tmp_path / "seen"), partitions=16, max_depth=300,
        max_held=200, batch=50, id="total")
    settings.validate()
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(int(execute(make_plan(settings),
                                                                  stop=stop))))
    t.start()
    try:
        wait_for(lambda: (held_items(zk, zk_root, "total") or {}).get("state") == "waiting",
                 what="the producer waiting at the total bound", timeout=60)
        assert sum(queued(zk, zk_root).values()) + ingress(zk, zk_root) <= 300
        assert sum(queued(zk, zk_root).values()) == 250
    finally:
        stop.set()
        t.join(60)
    assert result == [0]
    seen = SeenSet.open(tmp_path / "seen", 100_000, 0.001)
    got = queued(zk, zk_root)
    assert seen.count == 250 and not any(u in seen for u in urls if u not in got)


@pytest.mark.slow
def test_a_consumer_in_owner_mode_crawls_what_the_producer_put_into_partitions(
        zk, zk_hosts, zk_root, tmp_path):
    """End to end, small: a real producer offers into 8 partitions (nothing through the
    ingress), a real consumer with --politeness owner crawls every URL once."""
    import subprocess
    import sys

    from tests.test_producer_cli import REPO, _env
    from zkcrawl.bench.site import start_site, stop_benchsite

    site, bases = start_site(latency_ms=1, articles=6, hosts=4)
    try:
        urls = [f"{b}/a/{i}.html" for b in bases for i in range(1, 7)]
        proc = _producer(zk_hosts, zk_root, "--from-file", str(write(tmp_path / "u", urls)),
                         "--partitions", "8")
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert ingress(zk, zk_root) == 0 and queued(zk, zk_root) == Counter(urls)
        out = tmp_path / "out.jsonl"
        consumer = subprocess.run(
            [sys.executable, "-m", "zkcrawl.consumer.main", "--zk", zk_hosts, "--root", zk_root,
             "--out", str(out), "--politeness", "owner", "--domain-delay", "0.01",
             "--threads", "4", "--exit-when-idle", "1", "--allow-private-addresses",
             "--log-format", "json", "--session-timeout", "4"],
            cwd=REPO, env=_env(), capture_output=True, timeout=120)
        assert consumer.returncode == 0, consumer.stderr.decode()[-2000:]
    finally:
        stop_benchsite(site)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert Counter(r["url"] for r in records) == Counter(urls)
    assert all(r["error"] is None for r in records), records[:3]
    assert not batches(zk, zk_root)  # every batch settled and deleted


def test_recrawl_reoffers_go_into_partitions_and_move_their_due_time(zk, zk_root, tmp_path):
    """--recrawl into partitions: due URLs offered through the partition offerer with their
    validators, the store's due time moved once committed; a URL on its way is not doubled
    and the cursor reads each due URL once."""
    import time

    from zkcrawl.producer.offerer import Offerer
    from zkcrawl.producer.recrawl import Recrawler, RecrawlStore, Schedule
    from zkcrawl.producer.summary import Counts
    from zkcrawl.queue.fetched import FetchedReader

    store = RecrawlStore(str(tmp_path / "s.recrawl"), Schedule(min_s=60, max_s=3600))
    urls = [f"http://h{i}.example/r" for i in range(30)]
    store.add_new(urls, time.time() - 7200)
    seen = SeenSet.open(None, 1000, 0.001)
    stop = threading.Event()
    offerer = Offerer(PartitionOffers(zk, zk_root, 4), seen, Counts(), producer_id="p",
                      batch=7, max_depth=1000, max_partition_depth=1000, max_held=100,
                      stop=stop)
    try:
        offerer.add(urls[0], "listing")  # already on its way: the re-offer skips it
        rc = Recrawler(store, FetchedReader(zk, zk_root), offerer, batch=7, stop=stop)
        assert rc.offer_due() == 29
        offerer.drain()
    finally:
        offerer.close()
    assert queued(zk, zk_root) == Counter(urls)
    metas = [json.loads(zk.get(f"{Layout.of(zk_root).partition(p)}/{name}")[0])["items"]
             for p, rows in batches(zk, zk_root).items() for name, _ in rows]
    recrawled = [i for group in metas for i in group if "recrawl" in i["meta"]]
    assert len(recrawled) == 29 and {i["meta"]["source"] for i in recrawled} == {"recrawl"}
    assert [d.url for d in store.due(time.time(), 100)] == [urls[0]]  # the others moved on
    store.close()


def test_status_and_the_exporter_show_what_a_producer_holds_back(zk, zk_root):
    from zkcrawl.admin.cluster import cluster_status
    from zkcrawl.admin.commands.status import render
    from zkcrawl.admin.exporter import cluster_families

    lay = Layout.of(zk_root)
    zk.ensure_path(lay.producers)
    doc = {"id": "p1", "host": "h", "state": "waiting", "offered": 10,
           "held_back": {"items": 1200, "partitions": 2,
                         "top": [{"partition": 17, "items": 900}, {"partition": 4,
                                                                    "items": 300}]}}
    zk.create(lay.producer("p1"), json.dumps(doc).encode(), ephemeral=True)
    zk.create(lay.producer("p2"), json.dumps({"id": "p2", "held_back": {"items": "x"}})
              .encode(), ephemeral=True)  # forged: shown as nothing, no error
    status = cluster_status(zk, zk_root)
    text = render(status, "zk")
    assert "HELD BACK" in text and "1200 in 2 (p17 900, p4 300)" in text
    (fam,) = [f for f in cluster_families(status, zk_root)
              if f.name == "zkcrawl_cluster_producer_held_back_items"]
    assert [(s.labels["producer"], s.value) for s in fam.samples] == [("p1", 1200.0)]


@pytest.mark.parametrize("doc", [None, 1, [], {"held_back": None}, {"held_back": []},
                                 {"held_back": {"items": True, "partitions": 1}},
                                 {"held_back": {"items": -1, "partitions": 1}},
                                 {"held_back": {"items": 1}}])
def test_a_malformed_held_back_decodes_as_none(doc):
    from zkcrawl.producer.summary import held_back_of, held_back_text

    assert held_back_of(doc) is None and held_back_text(doc) == "-"


def test_held_back_decoding_never_raises_on_any_json():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from zkcrawl.producer.summary import HELD_TOP, held_back_of, held_back_text

    leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
    docs = st.recursive(leaf, lambda c: st.lists(c, max_size=4)
                        | st.dictionaries(st.sampled_from(["items", "partitions", "top",
                                                           "partition", "held_back", "x"]),
                                          c, max_size=4), max_leaves=20)

    @settings(max_examples=150, deadline=None)
    @given(docs)
    def check(doc: object) -> None:
        held = held_back_of({"held_back": doc})
        assert isinstance(held_back_text({"held_back": doc}), str)
        if held is not None:
            assert held["items"] >= 0 and held["partitions"] >= 0
            assert len(held["top"]) <= HELD_TOP
            assert all(isinstance(p, int) and isinstance(n, int) for p, n in held["top"])

    check()


def test_follow_deletes_a_node_once_its_links_committed_and_a_full_partition_holds_only_its_own(
        zk, zk_root):
    """--follow into partitions: a node whose links are held back for a full partition stays
    (a crash now drains it again: nothing lost), the others go; once the partition has room
    its links are offered and its node goes too."""
    from zkcrawl.producer.follow import Follower
    from zkcrawl.producer.offerer import Offerer
    from zkcrawl.producer.summary import Counts
    from zkcrawl.queue.discovered import DiscoveredReader, DiscoveredWriter, Link
    from zkcrawl.web.urls import LinkFilter

    feed = PartitionOffers(zk, zk_root, 8)
    big_p = feed.partition_of("http://big.example/")
    small = [u for u in (f"http://s{i}.example/x" for i in range(40))
             if feed.partition_of(u) != big_p][:10]
    writer = DiscoveredWriter(zk, zk_root, "c")
    writer.write([Link(f"http://big.example/{i}", "http://big.example/", 1) for i in range(30)])
    reader = DiscoveredReader(zk, zk_root)
    big_node = reader.names()[0]
    writer.write([Link(u, "http://seed.example/", 1) for u in small])
    counts, stop = Counts(), threading.Event()
    offerer = Offerer(feed, SeenSet.open(None, 1000, 0.001), counts, producer_id="p",
                      batch=50, max_depth=1000, max_partition_depth=20, max_held=100,
                      stop=stop)
    follower = Follower(reader, offerer, LinkFilter(), counts, max_link_depth=5,
                        queue_depth=feed.pq.depth, stop=stop)
    try:
        assert follower.drain_once() == 2
        assert reader.names() == [big_node]  # the small hosts' node went, the big one's waits
        assert offerer.held_back()["items"] == 10
        got = queued(zk, zk_root)
        assert set(small) <= set(got) and sum("big" in u for u in got) == 20
        lay = Layout.of(zk_root)
        for name in zk.get_children(lay.partition(big_p)):  # a consumer took them
            if name.startswith(item_codec.PREFIX):
                zk.delete(f"{lay.partition(big_p)}/{name}")
        wait_for(lambda: offerer.held_back()["items"] == 0, what="the held links offered")
        assert follower.drain_once() == 0 and reader.names() == []
        assert counts.discovered == 2
    finally:
        offerer.close()


def test_a_partition_deleted_by_hand_is_made_again_and_its_depth_forgotten(zk, zk_root):
    from zkcrawl.queue.items import Item

    feed = PartitionOffers(zk, zk_root, 2)
    feed.measure()
    p = feed.partition_of("http://a.example/")
    assert [len(c.indices) for c in feed.commit({p: [Item(url="http://a.example/1")]})] == [1]
    feed.measure([p])  # listed: its watch armed
    zk.delete(Layout.of(zk_root).partition(p), recursive=True)
    wait_for(lambda: feed.dirty(p), what="the watch of the deleted partition")
    assert feed.measure([p]) == 0  # gone: nothing queued there
    assert [len(c.indices) for c in feed.commit({p: [Item(url="http://a.example/2")]})] == [1]
    assert queued(zk, zk_root) == Counter(["http://a.example/2"]) and feed.depth(p) == 1


def test_the_recrawl_cursor_reads_each_due_url_once_also_at_equal_due_times(tmp_path):
    import random

    from zkcrawl.producer.recrawl import RecrawlStore, Schedule

    store = RecrawlStore(str(tmp_path / "s"), Schedule(60, 3600, random.Random(1)))
    store.add_new([f"http://h.example/{i}" for i in range(5)], 1000.0)
    store._db.execute("UPDATE urls SET due = 500")  # every one due at the same second
    store._db.commit()
    seen: list[str] = []
    cursor = None
    while page := store.due(2000.0, 2, after=cursor):
        seen += [d.url for d in page]
        cursor = (page[-1].due, page[-1].id)
    assert sorted(seen) == sorted(f"http://h.example/{i}" for i in range(5)) and len(seen) == 5
    store.close()


def test_push_hands_a_pages_links_over_without_waiting_for_their_commit(zk, zk_root):
    """A listing walk pushes each page's links and fetches the next page while they commit
    (Offerer.push); flush still returns only once they are committed. The committer is held
    here by its own lock (it buffers a handoff under it), so "not committed yet" is a state,
    not a race."""
    from zkcrawl.producer.offerer import Offerer
    from zkcrawl.producer.summary import Counts

    offerer = Offerer(PartitionOffers(zk, zk_root, 4), SeenSet.open(None, 1000, 0.001),
                      Counts(), producer_id="p", batch=100, max_depth=1000,
                      max_partition_depth=1000, max_held=100, stop=threading.Event())
    urls = [f"http://h{i}.example/a" for i in range(3)]
    try:
        with offerer._hold_lock:  # the committer cannot buffer (so commit) anything
            for url in urls:
                assert offerer.add(url, "listing")
            pusher = threading.Thread(target=offerer.push)
            pusher.start()
            pusher.join(30)
            assert not pusher.is_alive()  # returned with nothing committed
            assert queued(zk, zk_root) == Counter() and offerer.pending == 3
            flusher = threading.Thread(target=offerer.flush)
            flusher.start()
            flusher.join(0.2)
            assert flusher.is_alive()  # a flush waits for the commit
        flusher.join(30)
        assert not flusher.is_alive()
        assert queued(zk, zk_root) == Counter(urls) and offerer.pending == 0
    finally:
        offerer.close()


def test_the_depths_are_listed_when_the_offerer_starts_not_at_its_first_commit(zk, zk_root):
    """Listing every partition (~70 ms at the default P) is done by the committer as soon
    as the Offerer exists, while the producer fetches its first page: nothing offered yet,
    the depths are known and each partition listed once; the first commit lists nothing
    again (bench e2e: the first page's items waited for that listing before)."""
    from zkcrawl.producer.offerer import Offerer
    from zkcrawl.producer.summary import Counts

    feed = PartitionOffers(zk, zk_root, 8)
    offerer = Offerer(feed, SeenSet.open(None, 1000, 0.001), Counts(), producer_id="p",
                      batch=100, max_depth=1000, max_partition_depth=1000, max_held=100,
                      stop=threading.Event())
    try:
        # ``measured`` is set as the listing begins (a measure-once flag): wait for the
        # listings themselves (waiting for the flag raced them, once in a full run)
        wait_for(lambda: feed.listings >= 8, timeout=30, what="the depths listed at the start")
        assert feed.measured and feed.listings == 8 and offerer.pending == 0
        assert offerer.add("http://h.example/a", "listing")
        offerer.flush()
        assert queued(zk, zk_root) == Counter(["http://h.example/a"]) and feed.listings == 8
    finally:
        offerer.close()
