"""``--politeness owner`` (zkcrawl.consumer.ownership): every host is fetched by the one consumer
that owns its partition, with no ZooKeeper write per request, and the gap holds when a consumer
joins mid-crawl. Real ZooKeeper, real consumers, the many-hosts bench site (one loopback
address per host, gaps measured on arrival by the server)."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import requests

from tests.conftest import wait_for
from tests.test_consumer_support import Running, left, offer, records, settings_for
from zkcrawl.bench.site import start_site, stop_benchsite
from zkcrawl.queue import control
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS, assign, partition_of
from zkcrawl.web.urls import host_key

DELAY = 0.3
HOSTS = 12
PER_HOST = 4


@pytest.fixture
def site() -> Iterator[list[str]]:
    proc, bases = start_site(latency_ms=1, articles=PER_HOST, hosts=HOSTS)
    yield bases
    stop_benchsite(proc)


def consumer(zk_hosts, zk_root, out, cid):  # type: ignore[no-untyped-def]
    return Running(settings_for(zk_hosts, zk_root, out, "--id", cid, "--threads", "4",
                                "--domain-delay", str(DELAY), "--politeness", "owner",
                                "--exit-when-idle", "1"))


def owners(recs):  # type: ignore[no-untyped-def]
    by_host = defaultdict(set)
    for r in recs:
        by_host[urlsplit(r["url"]).netloc].add(r["consumer"])
    return by_host


def gaps_ok(bases: list[str]) -> dict[str, float]:
    stats = requests.get(f"{bases[0]}/stats", timeout=10).json()
    return {h: g for h, g in stats["host_min_gap_s"].items() if g is not None}


def test_each_host_has_one_owner_and_no_write_per_request(zk, zk_hosts, zk_root, tmp_path,
                                                          site):
    urls = [f"{b}/a/{i}.html" for i in range(1, PER_HOST + 1) for b in site]
    offer(zk, zk_root, urls)
    control.set_state(zk, zk_root, control.PAUSED, by="test")
    outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    runs = [consumer(zk_hosts, zk_root, out, cid) for cid, out in zip("ab", outs, strict=True)]
    wait_for(lambda: len(zk.get_children(f"{zk_root}/consumers")) == 2, 30, "registered")
    control.set_state(zk, zk_root, control.RUNNING, by="test")
    for r in runs:
        r.join(90)
        r.close()
    recs = records(*outs)
    assert sorted(r["url"] for r in recs) == sorted(urls)  # each once
    by_host = owners(recs)
    assert all(len(cs) == 1 for cs in by_host.values()), by_host  # one consumer per host
    want = assign(DEFAULT_PARTITIONS, ["a", "b"])
    for netloc, cs in by_host.items():  # the one rendezvous hashing names
        p = partition_of(host_key(f"http://{netloc}/"), DEFAULT_PARTITIONS)
        assert p in want[next(iter(cs))]
    assert {c for cs in by_host.values() for c in cs} == {"a", "b"}
    gaps = gaps_ok(site)
    assert len(gaps) == HOSTS and min(gaps.values()) >= DELAY  # as the server saw them
    # politeness stayed in the owners' memory: nothing written under <root>/hosts
    assert not zk.exists(f"{zk_root}/hosts") or zk.get_children(f"{zk_root}/hosts") == []
    assert left(zk, zk_root) == []
    assert all(r.error is None for r in runs)


@pytest.mark.slow
def test_a_consumer_joining_mid_crawl_takes_its_share_and_the_gap_holds(
        zk, zk_hosts, zk_root, tmp_path, site):
    urls = [f"{b}/a/{i}.html" for i in range(1, PER_HOST + 1) for b in site]
    offer(zk, zk_root, urls)
    a = consumer(zk_hosts, zk_root, tmp_path / "a.jsonl", "a")
    # a crawls alone for a while: every host is its own
    wait_for(lambda: len(records(tmp_path / "a.jsonl", strict=False)) >= HOSTS, 30, "a runs")
    b = consumer(zk_hosts, zk_root, tmp_path / "b.jsonl", "b")
    for r in (a, b):
        r.join(90)
        r.close()
    recs = records(tmp_path / "a.jsonl", tmp_path / "b.jsonl")
    assert sorted(r["url"] for r in recs) == sorted(urls)  # nothing lost, nothing twice
    assert any(r["consumer"] == "b" for r in recs)  # the newcomer took its share
    gaps = gaps_ok(site)
    assert min(gaps.values()) >= DELAY, gaps  # across the hand-over too
    assert a.worker.ownership is not None and a.worker.ownership.handovers > 0


def test_the_first_consumer_records_p_in_the_root_and_later_ones_keep_it(zk, zk_root):
    from zkcrawl.consumer.ownership import recorded_partitions

    assert recorded_partitions(zk, zk_root, 64) == 64
    assert json.loads(zk.get(zk_root)[0]) == {"partitions": 64}
    assert recorded_partitions(zk, zk_root, 128) == 64  # fixed when the root was made
    assert recorded_partitions(zk, zk_root) == 64


def test_two_first_consumers_agree_on_whichever_recorded_first(zk, zk_root):
    from zkcrawl.consumer.ownership import recorded_partitions

    got: list[int] = []
    threads = [threading.Thread(target=lambda w=w: got.append(
        recorded_partitions(zk, zk_root, w))) for w in (32, 64, 96, 128)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 4 and len(set(got)) == 1


def test_other_keys_of_the_root_data_are_kept(zk, zk_root):
    from zkcrawl.consumer.ownership import recorded_partitions

    zk.ensure_path(zk_root)
    zk.set(zk_root, b'{"owner": "team-a"}')
    assert recorded_partitions(zk, zk_root) == DEFAULT_PARTITIONS
    assert json.loads(zk.get(zk_root)[0]) == {"owner": "team-a",
                                              "partitions": DEFAULT_PARTITIONS}


@pytest.mark.parametrize("data", [b"\xff garbage", b'{"partitions": 0}', b'{"partitions": "9"}',
                                  b"[1, 2]", b'{"partitions": 1e400}'])
def test_a_root_whose_p_was_edited_by_hand_is_one_line_and_exit_2(zk, zk_hosts, zk_root,
                                                                   tmp_path, capsys, data):
    from zkcrawl.consumer.main import main

    zk.ensure_path(zk_root)
    zk.set(zk_root, data)
    code = main(["--zk", zk_hosts, "--root", zk_root, "--out", str(tmp_path / "o.jsonl"),
                 "--politeness", "owner", "--log-format", "json", "--exit-when-idle", "1"], {})
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "error" in x and "partition" in x]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]


@pytest.mark.parametrize("data", [b'{"partitions": 16}', b'{"partitions": "x"}', b"{}"])
def test_p_edited_while_a_consumer_runs_stops_it_with_one_line_and_exit_2(
        zk, zk_hosts, zk_root, tmp_path, data):
    """P edited by hand under a running consumer (another valid P, garbage, none): it would
    own hosts that a consumer started after the edit owns too -- it stops, one line, exit 2,
    what it had queued untouched (the items stay in their partitions)."""
    from tests.test_consumer_support import spawn

    zk.ensure_path(zk_root)
    zk.set(zk_root, b'{"partitions": 8}')
    offer(zk, zk_root, [f"http://127.0.0.1:9/{i}" for i in range(3)])  # nothing answers
    control.set_state(zk, zk_root, control.PAUSED, by="test")  # held in ZooKeeper
    err = tmp_path / "err.log"
    proc = spawn(["--zk", zk_hosts, "--root", zk_root, "--id", "c1", "--log-format", "json",
                  "--out", str(tmp_path / "o.jsonl")], err)
    wait_for(lambda: zk.exists(f"{zk_root}/consumers/c1"), 30, "the consumer registered")
    zk.set(zk_root, data)
    assert proc.wait(timeout=30) == 2
    text = err.read_text()
    lines = [x for x in text.splitlines() if "not the 8 this consumer owns by" in x]
    assert len(lines) == 1 and "Traceback" not in text, text[-2000:]
    assert "set it back" in lines[0] and '{"partitions": 8}' in lines[0], lines[0]
    assert len(left(zk, zk_root)) >= 1  # queued still: in the ingress or a partition


def test_ownership_figures_are_exported_at_scrape_time():
    from zkcrawl.consumer.metrics import Metrics

    m = Metrics()
    snap = {"partitions": 3, "members": 2, "handovers": 5}
    m.count_ownership(lambda: snap)
    text = m.exposition().decode()
    assert "zkcrawl_consumer_partitions_owned 3.0" in text
    assert "zkcrawl_consumer_members_seen 2.0" in text
    assert "zkcrawl_consumer_handovers_total 5.0" in text
    snap["handovers"] = 7  # read when scraped, not when registered
    assert "zkcrawl_consumer_handovers_total 7.0" in m.exposition().decode()
    snap.update(rebalances=2, partitions_taken=4, holds_inherited=1, states_ignored=1,
                hosts_active=9, hosts_backed_off=3)
    text = m.exposition().decode()
    for line in ("zkcrawl_consumer_rebalances_total 2.0",
                 "zkcrawl_consumer_partitions_taken_total 4.0",
                 "zkcrawl_consumer_holds_inherited_total 1.0",
                 "zkcrawl_consumer_states_ignored_total 1.0",
                 "zkcrawl_consumer_hosts_active 9.0", "zkcrawl_consumer_hosts_backed_off 3.0"):
        assert line in text, line
