"""The items a consumer holds (SPEC §3), for ``zkcrawl status --consumer``: an item is held
when its consumer marked it started in a batch of a partition it owns. :func:`held_items`
lists them: ``[{"item": "<p>/<batch>/<i>", "consumer", "age_s", "attempt", "url", "host"}]``.

* **Only verified ownership counts**: a partition is this consumer's when its owner node is
  held by the session of ``<root>/consumers/<id>`` (the name in an owner node is untrusted).
* **Bounded cost**: one listing of ``<root>/partitions``, one pipelined round of listings and
  owner stats, then at most :data:`MAX_BATCHES` batches multi-read; a batch that does not
  decode is skipped, never a traceback.
* ``age_s`` is the time since the batch's last write: a lower bound of how long it is held.
"""

from __future__ import annotations

from typing import Any

from zkcrawl.queue import items as item_codec
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.layout import Layout
from zkcrawl.textsafe import redact_userinfo
from zkcrawl.web.urls import host_key
from zkcrawl.zk import NoNodeError, ZkClient, gather

MAX_BATCHES = 2000  # batch nodes read at most for one consumer's view


def held_items(zk: ZkClient, root: str, consumer_id: str, now: float) -> list[dict[str, Any]]:
    """The started-not-done entries of the partitions ``consumer_id``'s session owns."""
    layout = Layout.of(root)
    if not consumer_id or "/" in consumer_id:
        return []  # no status node can have that name
    try:
        session = zk.exists(layout.consumer(consumer_id))
        names = zk.get_children(layout.partitions)
    except NoNodeError:
        return []
    if session is None or not session.ephemeralOwner:
        return []
    parts = sorted(int(n) for n in names if n.isdigit())
    owners = gather([zk.exists_async(layout.partition_owner(p)) for p in parts], zk.zk_timeout)
    mine = [p for p, st in zip(parts, owners, strict=True)
            if st is not None and not isinstance(st, Exception)
            and st.ephemeralOwner == session.ephemeralOwner]
    listings = gather([zk.get_children_async(layout.partition(p)) for p in mine],
                      zk.zk_timeout)
    paths = [(p, name) for p, res in zip(mine, listings, strict=True)
             if isinstance(res, list) for _, name in item_codec.sort_names(
                 [c for c in res if c.startswith(item_codec.PREFIX)])][:MAX_BATCHES]
    out: list[dict[str, Any]] = []
    reads = zk.get_many([f"{layout.partition(p)}/{n}" for p, n in paths])
    for (p, name), res in zip(paths, reads, strict=True):
        if isinstance(res, Exception):
            continue  # settled meanwhile
        batch, _ = pb.decode(res[0])
        if batch is None:
            continue
        age = round(max(0.0, now - res[1].mtime / 1000.0), 3)
        for i in batch.in_flight:
            item = batch.items[i]
            if item is None:
                continue
            out.append({"item": f"{p}/{name}/{i}", "consumer": consumer_id, "age_s": age,
                        "attempt": item.attempt, "url": redact_userinfo(item.url),
                        "host": host_key(item.url)})
    return out
