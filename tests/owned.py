"""A consumer's queue for tests that need real claims without a consumer process: the
partitions one registered member owns (zkcrawl.consumer.owned_queue), closed -- every partition
handed over, the registration gone -- when the block ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.conftest import wait_for
from zkcrawl.consumer.owned_queue import OwnedQueue
from zkcrawl.consumer.ownership import Ownership
from zkcrawl.queue.claims import AT_LEAST_ONCE, Claimed
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_offers import recorded_partitions
from zkcrawl.zk.client import ZkClient


@contextmanager
def owned_queue(zk: ZkClient, root: str, consumer: str = "test",
                delivery: str = AT_LEAST_ONCE) -> Iterator[OwnedQueue]:
    """The root's partitions (P as recorded, or the default recorded now), all owned by
    ``consumer``, registered for the block."""
    layout = Layout.of(root)
    zk.ensure_path(layout.consumers)
    zk.create(layout.consumer(consumer), b"{}", ephemeral=True)
    ownership = Ownership(zk, root, consumer, 0.0,
                          partitions=recorded_partitions(zk, root, 0)).start()
    q = OwnedQueue(zk, root, consumer, ownership, delivery=delivery)
    try:
        yield q
    finally:
        q.close()
        ownership.stop()
        zk.delete(layout.consumer(consumer))


def claim(q: OwnedQueue, n: int, timeout: float = 30.0) -> list[Claimed]:
    """Exactly ``n`` claims (the ingress moved first when that is where they are)."""
    got: list[Claimed] = []
    wait_for(lambda: got.extend(q.claim(n - len(got), timeout=0.5)) or len(got) >= n,
             timeout, f"{n} claimed")
    return got
