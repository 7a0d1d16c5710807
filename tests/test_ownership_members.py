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
