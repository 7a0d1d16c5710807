"""``zkcrawl bench frontier``: ZooKeeper writes per page of the partitioned queue, one run.

No HTTP: the queue's own cost, with the server's counters (``mntr``) as the judge. One
throwaway ZooKeeper (or ``--zk``), a fresh root per case, the same URLs (``--items`` over
``--site-hosts`` hosts) in both:

* ``owned``        what a consumer runs: the items offered into their partitions, then
  :class:`~zkcrawl.consumer.owned_queue.OwnedQueue` claims, marks started and completes them
  (:func:`zkcrawl.bench.drain.drain`), its checkpoint thread writing marks and settles on
  its own clock;
* ``partitioned``  :class:`~zkcrawl.queue.partition_queue.PartitionQueue` driven by hand
  (the figures quoted since 2026-12-02) -- offers packed per
  partition, one owner takes every partition, reads its batches, and works them in rounds:
  each round is one checkpoint (:meth:`~zkcrawl.queue.partition_queue.PartitionQueue.
  checkpoint`: one transaction per 512 KiB, fenced per partition) that marks the next
  ``wave`` items of every batch started and settles the wave before -- what an owner's
  0.2 s checkpoints do (:mod:`zkcrawl.consumer.owned_queue`); a finished batch is deleted in it.

Reported: writes, reads and requests per page from the server, items per second of the
client, and the ratio owned ÷ partitioned (the consumer's own checkpoint clock against
checkpoints in waves).
The queue's figure only: a crawl's (with HTTP, the ingress mover) is ``bench hosts``'s. The
layout before partitions (a lease per item) is gone; its figures stay in
docs/benchmarks.md.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from zkcrawl.bench.drain import drain, owned_queue
from zkcrawl.bench.hosts import per_page, zk_counters, zk_ports, zookeeper
from zkcrawl.queue.items import Item
from zkcrawl.queue.partition_queue import BatchNode, Change, Owned, PartitionQueue
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS
from zkcrawl.zk import ZkClient


def _items(n: int, hosts: int) -> list[Item]:
    return [Item(url=f"http://h{i % hosts}.bench.test/a/{i}.html", producer="bench")
            for i in range(n)]


def _owned(zk: ZkClient, root: str, items: list[Item], partitions: int) -> int:
    """Offer into the partitions, then drain them as a consumer's queue does."""
    PartitionQueue(zk, root, partitions, consumer="bench").offer(items)
    q = owned_queue(zk, root, "bench", partitions=partitions)
    try:
        return drain(q, len(items))
    finally:
        q.close()


def _partitioned(zk: ZkClient, root: str, items: list[Item], partitions: int,
                 wave: int) -> int:
    q = PartitionQueue(zk, root, partitions, consumer="bench")
    q.offer(items)
    work: dict[tuple[int, str], tuple[Owned, BatchNode]] = {}
    for p in range(partitions):
        owned = q.take(p)
        if owned is None:
            continue
        for node in q.read(owned, limit=1000).batches:
            adopted = q.adopt(owned, node)
            if adopted is not None:
                work[(p, adopted.name)] = (owned, adopted)
    done = 0
    last: dict[tuple[int, str], frozenset[int]] = {}
    while work:  # one checkpoint a round: every batch's next wave started, the last one done
        keys = list(work)
        changes = []
        for key in keys:
            owned, node = work[key]
            prev = last.get(key, frozenset())
            nxt = frozenset([i for i in node.batch.pending if i not in prev][:wave])
            changes.append(Change(owned, node, started=nxt, done=prev))
            last[key] = nxt
        res = q.checkpoint(changes)
        for k, key in enumerate(keys):
            done += len(changes[k].done)
            node2 = res.nodes.get(k)
            if node2 is None:
                del work[key]
            else:
                work[key] = (work[key][0], node2)
    return done


def _case(hosts: str, run: str, name: str, fn: Any, *args: Any) -> dict[str, Any]:
    ports = zk_ports(hosts)
    with ZkClient(hosts, zk_timeout=30) as zk:
        root = f"{run}/{name}"
        before = zk_counters(ports)
        t0 = time.perf_counter()
        pages = fn(zk, root, *args)
        seconds = time.perf_counter() - t0
        after = zk_counters(ports)
        zk.delete(root, recursive=True)
    return {"pages": pages, "seconds": round(seconds, 3),
            "items_per_s": round(pages / seconds) if seconds > 0 else None,
            "zk": per_page(before, after, pages)}


def run_bench(zk_hosts: str | None, items: int = 20_000, site_hosts: int = 2_500,
              partitions: int = DEFAULT_PARTITIONS, wave: int = 20) -> dict[str, Any]:
    """Both cases in one run (module docstring)."""
    urls = _items(items, site_hosts)
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-frontier-") as name, \
            zookeeper(zk_hosts, Path(name)) as (hosts, _server):
        run = f"/zkcrawl-bench/frontier-{uuid.uuid4().hex[:8]}"
        owned = _case(hosts, run, "owned", _owned, urls, partitions)
        parted = _case(hosts, run, "partitioned", _partitioned, urls, partitions, wave)
        with ZkClient(hosts, zk_timeout=30) as zk:
            zk.delete(run, recursive=True)
    out: dict[str, Any] = {"items": items, "site_hosts": site_hosts, "partitions": partitions,
                           "wave": wave, "owned": owned, "partitioned": parted}
    o = owned["zk"] or {}
    base = (parted["zk"] or {}).get("writes_per_page")
    if base and o.get("writes_per_page") is not None:
        out["writes_per_page_owned_vs_partitioned"] = round(o["writes_per_page"] / base, 4)
    return out


def render(out: dict[str, Any]) -> str:
    lines = [f"bench frontier: {out['items']} items over {out['site_hosts']} hosts, "
             f"{out['partitions']} partitions, waves of {out['wave']}",
             f"{'case':<13}{'pages':>7}{'items/s':>9}{'writes/pg':>11}{'reads/pg':>10}"
             f"{'requests/pg':>13}"]
    for key in ("owned", "partitioned"):
        c = out[key]
        zk = c["zk"] or {}
        lines.append(f"{key:<13}{c['pages']:>7}{c['items_per_s'] or '-':>9}"
                     f"{zk.get('writes_per_page', '-'):>11}{zk.get('reads_per_page', '-'):>10}"
                     f"{zk.get('requests_per_page', '-'):>13}")
    if "writes_per_page_owned_vs_partitioned" in out:
        lines.append("writes per page, owned / partitioned: "
                     f"{out['writes_per_page_owned_vs_partitioned']}")
    return "\n".join(lines)
