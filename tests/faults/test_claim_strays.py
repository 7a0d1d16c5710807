"""A claim record whose settle was lost (its pipelined delete failed under a leader fail-over,
found by test_ensemble_faults.py::test_leader_sigkilled_mid_crawl) is deleted by its own
holder's next listing -- and nothing else is: records it still tracks, and other live
holders' records, stay. Real ZooKeeper; the lost settle is made by never telling the log."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from zkcrawl.queue.claimlog import LIVE, ClaimLog

pytestmark = pytest.mark.faults


def record(log: ClaimLog, zk, names: list[str], track: bool) -> str:  # type: ignore[no-untyped-def]
    tx = zk.transaction()
    name = log.add_ops(tx, names, zk.session_id)
    tx.commit()
    if track:
        log.committed(name, names)
    return name


def test_a_listing_drops_its_own_untracked_records_only(zk_factory, zk_root):
    a, b = zk_factory(), zk_factory()
    claims, queue = f"{zk_root}/claims", f"{zk_root}/queue"
    mine, other = ClaimLog(a, claims, queue), ClaimLog(b, claims, queue)
    kept = record(mine, a, ["qn-0000000001"], track=True)  # items still held
    stray = record(mine, a, ["qn-0000000002"], track=False)  # settled, delete lost
    theirs = record(other, b, ["qn-0000000003"], track=False)  # another live holder's
    assert stray in a.get_children(claims)
    assert mine.reap(a.get_children(claims)) == 0  # no death: every twin lives
    want = sorted([kept, kept + LIVE, theirs, theirs + LIVE])
    wait_for(lambda: sorted(a.get_children(claims)) == want, 10, "the stray deleted")
    mine.settled(["qn-0000000001"])  # the tracked one goes the ordinary way
    wait_for(lambda: sorted(a.get_children(claims)) == [theirs, theirs + LIVE], 10,
             "the settled record deleted")
