"""Counting holders' deaths (SPEC §3, zkcrawl.queue.claimlog) against a real ZooKeeper."""

from __future__ import annotations

from tests.conftest import expire_session, wait_for
from zkcrawl.queue.claimlog import LIVE, ClaimLog
from zkcrawl.queue.items import Item
from zkcrawl.queue.leases import LeaseQueue


def items(n: int) -> list[Item]:
    return [Item(url=f"http://127.0.0.1/d/{i}") for i in range(n)]


def test_a_dead_holder_counts_released_and_completed_items_do_not(zk_factory, zk_root):
    a, b = zk_factory(session_timeout=4), zk_factory()
    qa = LeaseQueue(a, zk_root, "a")
    qa.offer_many(items(4))
    held = qa.claim(4, timeout=5)
    assert [c.deaths for c in held] == [0, 0, 0, 0]
    qa.complete(held[:1])
    qa.release(held[1:2])
    expire_session(a)  # the holder dies with held[2:] leased
    wait_for(lambda: b.get_children(f"{zk_root}/leases") == [], what="leases gone")
    qb = LeaseQueue(b, zk_root, "b")
    again = {c.url: c for c in qb.claim(4, timeout=5)}
    assert set(again) == {c.url for c in held[1:]}
    assert again[held[1].url].deaths == 0  # released: not a death
    assert again[held[2].url].deaths == again[held[3].url].deaths == 1
    assert again[held[2].url].attempt == 1
    # Every record was settled or reaped: only b's live record (and twin) remain.
    records = b.get_children(f"{zk_root}/claims")
    assert len([r for r in records if not r.endswith(LIVE)]) == 1


def test_two_reapers_count_one_death_once(zk_factory, zk_root):
    a, b, c = zk_factory(session_timeout=4), zk_factory(), zk_factory()
    qa = LeaseQueue(a, zk_root, "a")
    qa.offer_many(items(3))
    qa.claim(3, timeout=5)
    expire_session(a)
    children = b.get_children(f"{zk_root}/claims")
    logs = [ClaimLog(z, f"{zk_root}/claims", f"{zk_root}/queue") for z in (b, c)]
    counted = [log.reap(children) for log in logs]
    assert sorted(counted) == [0, 3]
    for name in b.get_children(f"{zk_root}/queue"):
        assert b.get(f"{zk_root}/queue/{name}")[1].cversion == 2


def test_a_malformed_record_is_removed_and_does_not_block(zk, zk_root):
    log = ClaimLog(zk, f"{zk_root}/claims", f"{zk_root}/queue")
    zk.create(f"{zk_root}/claims/junk", b'{"not": "a list"}')
    zk.create(f"{zk_root}/claims/deep", b"[" * 5000 + b"]" * 5000)
    zk.create(f"{zk_root}/claims/paths", b'["../../x", "qn-1/../../y"]')
    assert log.reap(zk.get_children(f"{zk_root}/claims")) == 0
    wait_for(lambda: zk.get_children(f"{zk_root}/claims") == [], what="garbage removed")


def test_the_bench_baseline_writes_no_records(zk, zk_root):
    q = LeaseQueue(zk, zk_root, "a", count_claims=False)
    q.offer_many(items(2))
    assert len(q.claim(2, timeout=5)) == 2
    assert zk.get_children(f"{zk_root}/claims") == [] if zk.exists(f"{zk_root}/claims") else True
