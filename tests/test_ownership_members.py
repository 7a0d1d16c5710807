"""Only consumers are members (SPEC §2: a status node is untrusted): a node under
``<root>/consumers`` that is no consumer's status gets no partitions, so none of its
share of hosts waits for an owner that never comes."""

from __future__ import annotations

import json

from tests.conftest import wait_for
from zkcrawl.consumer.ownership import Ownership
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partitions import assign

P = 16


def test_a_node_that_is_no_consumer_status_gets_no_partitions(zk, zk_root):
    consumers = Layout.of(zk_root).consumers
    zk.ensure_path(consumers)
    zk.create(f"{consumers}/me", json.dumps({"id": "me"}).encode(), ephemeral=True)
    zk.create(f"{consumers}/evil", b'{"state":' + b"[" * 100 + b"]" * 100 + b"}",
              ephemeral=True)
    zk.create(f"{consumers}/liar", json.dumps({"id": "someone"}).encode(), ephemeral=True)
    zk.create(f"{consumers}/peer", json.dumps({"id": "peer"}).encode(), ephemeral=True)
    own = Ownership(zk, zk_root, "me", 0.0, partitions=P).start()
    try:
        assert own.owned() == set(assign(P, ("me", "peer"))["me"])
        zk.delete(f"{consumers}/peer")

        def all_mine() -> bool:  # once the watch fired: read again, still without the two
            own.refresh()
            return own.owned() == set(range(P))

        wait_for(all_mine, timeout=10, what="every partition mine")
    finally:
        own.stop()


def test_a_partitions_first_owner_ever_starts_its_hosts_at_once(zk, zk_root):
    """A take at epoch 1 (the partition node never taken: every take moves its version on,
    and only owners write it) -- nobody ever started a request to its hosts, so the first
    one goes at once; any later take waits a gap (an owner before may have just started
    one), and a partition lost and gained again waits again, whatever its first take was."""
    now = [100.0]
    own = Ownership(zk, zk_root, "me", 1.0, partitions=P, clock=lambda: now[0])
    own.update(["me"])  # every partition, gained at 100.0
    others = set(assign(P, ("me", "other"))["other"])  # what "me" loses when "other" joins
    host = next(h for h in (f"h{i}.example" for i in range(1000)) if own.partition(h) in others)
    p = own.partition(host)
    assert own.not_before(host) == 100.0 + own.wait  # gained, not taken yet: the hand-over
    own.taken(p, 100.5)
    assert own.not_before(host) == 101.5  # taken from someone: a gap after the take
    own.taken(p, 100.5, first=True)
    assert own.not_before(host) == 100.5  # the first owner ever: at once
    now[0] = 200.0
    own.update(["me", "other"])  # lost ...
    assert not own.owns(host)
    own.update(["me"])  # ... and gained again: waits as any gain
    assert own.not_before(host) == 200.0 + own.wait
