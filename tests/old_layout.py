"""Roots made before partitions, written by hand: the per-item lease nodes of the previous
layout (SPEC §2, ``<root>/leases``), which ``zkcrawl status`` and ``queue list`` still show
and the fault books still check, and an ingress item moved to the dead letters as a consumer
does."""

from __future__ import annotations

import json
import time

from zkcrawl.queue import items as item_codec
from zkcrawl.queue.layout import Layout
from zkcrawl.zk import tx_ok
from zkcrawl.zk.client import ZkClient


def hold(zk: ZkClient, root: str, names: list[str], consumer: str) -> None:
    """Lease ingress items ``names`` for ``consumer``: ephemeral nodes of ``zk``'s session."""
    layout = Layout.of(root)
    zk.ensure_path(layout.leases)
    doc = json.dumps({"consumer": consumer, "claimed_at": time.time()}).encode()
    for name in names:
        zk.create(layout.lease(name), doc, ephemeral=True)


def oldest(zk: ZkClient, root: str, n: int) -> list[str]:
    """The ``n`` oldest ingress items' names."""
    return [name for _, name in item_codec.sort_names(zk.get_children(Layout.of(root).queue))][:n]


def dead_letter(zk: ZkClient, root: str, name: str, error: str) -> None:
    """Ingress item ``name`` to ``<root>/dead/`` with ``error`` (its tries: attempt + 1),
    in one transaction."""
    layout = Layout.of(root)
    data, _ = zk.get(layout.item(name))
    item = item_codec.decode(data).item
    tries = (item.attempt if item else 0) + 1
    zk.ensure_path(layout.dead)
    tx = zk.transaction()
    body = item_codec.encode_dead_letter(name, item.url if item else None, error, tries, data)
    tx.create(layout.dead_prefix, body, sequence=True)
    tx.delete(layout.item(name))
    assert tx_ok(tx.commit()), name
