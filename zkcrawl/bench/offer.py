"""``zkcrawl bench offer``: the producer's offer path against the seed's, in one run, each case
on a fresh root of the same ZooKeeper:

* ``seed_offer``: the seed's one sequential create per URL, timed on a sample;
* ``producer``: ``zkcrawl-producer --from-file`` of N URLs in-process, end to end (read,
  normalize, de-duplicate, batched transactions into P partitions), back-pressure out of
  the way: URLs/s, ZooKeeper writes (``mntr``) and znodes created per URL; the median of
  ``runs`` runs, each on a fresh root;
* ``seen``: the de-duplication state's memory for 1,000,000 URLs and its measured
  false-positive rate.

Without ``--zk`` a throwaway ZooKeeper is used. Compare ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from zkcrawl import logs
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.queue.layout import Layout
from zkcrawl.seen import SeenSet
from zkcrawl.zk import ZkClient, gather

SEED_SAMPLE = 5_000
SEEN_N = 1_000_000
SEEN_FP = 0.001
FP_PROBES = 100_000
_HOSTS = 50


def write_urls(path: Path, n: int, seed: int = 42) -> None:
    """N distinct URLs as a crawler meets them: many hosts, tracking parameters, fragments,
    upper-case hosts, default ports. They stay distinct after normalization."""
    rnd = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            host = f"site{i % _HOSTS}.example.com"
            url = f"http://{host}/articles/{i // _HOSTS}/{rnd.randrange(10**6)}-{i}.html"
            kind = i % 6
            if kind == 1:
                url += "?utm_source=feed&utm_medium=rss"
            elif kind == 2:
                url += "#comments"
            elif kind == 3:
                url = url.replace(host, host.upper() + ":80")
            elif kind == 4:
                url += f"?page={i % 7}&utm_campaign=spring"
            fh.write(url + "\n")


def bench_seed(zk: ZkClient, root: str, urls: list[str]) -> dict[str, Any]:
    """The seed: ``create(path/qn-, url, PERSISTENT_SEQUENTIAL)`` once per URL."""
    path = f"{root}/seed"
    zk.ensure_path(path)
    t0 = time.perf_counter()
    for url in urls:
        zk.create(f"{path}/qn-", url.encode(), sequence=True)
    elapsed = time.perf_counter() - t0
    return {"urls_per_s": round(len(urls) / elapsed, 1), "sample": len(urls),
            "elapsed_s": round(elapsed, 3), "round_trips_per_url": 1.0}


def bench_producer(hosts: str, root: str, path: Path, n: int, batch: int,
                   partitions: int) -> dict[str, Any]:
    """The producer, in-process and end to end, from ``--from-file`` to committed items
    in ``partitions`` partitions (``root`` is new: it records them)."""
    import threading

    from zkcrawl.bench.hosts import zk_counters, zk_ports
    from zkcrawl.producer.main import execute, make_plan
    from zkcrawl.producer.settings import ProducerSettings

    settings = ProducerSettings(zk=hosts, root=root, from_file=str(path), batch=batch,
                                max_depth=n + 1, id="bench-producer", partitions=partitions)
    settings.validate()
    plan = make_plan(settings)
    ports = zk_ports(hosts)
    before = zk_counters(ports)
    t0 = time.perf_counter()
    status = execute(plan, stop=threading.Event())
    elapsed = time.perf_counter() - t0
    after = zk_counters(ports)
    zk = ZkClient(hosts).connect()
    try:
        offered, nodes = _queued(zk, root)
    finally:
        zk.close()
    writes = None if before is None or after is None else after["writes"] - before["writes"]
    return {"urls_per_s": round(n / elapsed, 1), "urls": n, "offered": offered,
            "elapsed_s": round(elapsed, 3), "batch": batch, "exit_status": int(status),
            "partitions": partitions, "nodes": nodes,
            "nodes_per_url": round(nodes / n, 4),
            "zk_writes": writes, "writes_per_url": None if writes is None
            else round(writes / n, 5)}


def _queued(zk: ZkClient, root: str) -> tuple[int, int]:
    """(items queued, znodes holding them): the ingress's, plus every partition's batches
    (their items counted from the batch data)."""
    from zkcrawl.queue.partition_offers import PartitionOffers, root_partitions

    lay = Layout.of(root)
    stat = zk.exists(lay.queue)
    ingress = int(stat.numChildren) if stat else 0
    p = root_partitions(zk, root)
    if p is None:
        return ingress, ingress
    feed = PartitionOffers(zk, root, p)
    items = feed.measure()
    batches = sum(len(feed._counts.get(q, {})) for q in range(p))
    return items, ingress + batches


def bench_seen(n: int = SEEN_N, fp_rate: float = SEEN_FP,
               probes: int = FP_PROBES) -> dict[str, Any]:
    """Bytes per URL of a seen state for ``n`` URLs, filled to ``n``; measured fp rate."""
    with tempfile.TemporaryDirectory(prefix="zkcrawl-seen-") as tmp:
        path = Path(tmp) / "seen"
        seen = SeenSet.open(path, n, fp_rate)
        seen.add_many(f"https://fill.example.com/a/{i}" for i in range(n))
        probes = min(probes, n)
        false = sum(f"https://probe.example.com/b/{i}" in seen for i in range(probes))
        seen.save()
        file_bytes = path.stat().st_size
    return {"urls": n, "fp_rate": fp_rate, "mode": seen.mode, "bytes": seen.nbytes,
            "bytes_per_url": round(seen.nbytes / n, 3), "file_bytes": file_bytes,
            "measured_fp_rate": round(false / probes, 5) if probes else None}


def _drop(hosts: str, root: str) -> None:
    """Remove a bench root with pipelined deletes (recursive delete is one trip per node)."""
    zk = ZkClient(hosts).connect()
    try:
        if zk.exists(root) is None:
            return
        subs = [f"{root}/{sub}" for sub in ("queue", "seed")]
        if zk.exists(f"{root}/partitions") is not None:
            subs += [f"{root}/partitions/{p}" for p in zk.get_children(f"{root}/partitions")]
        for path in subs:
            if zk.exists(path) is None:
                continue
            names = zk.get_children(path)
            for i in range(0, len(names), 2000):
                gather([zk.delete_async(f"{path}/{n}") for n in names[i:i + 2000]])
        zk.delete(root, recursive=True)
    finally:
        zk.close()


def run_bench(hosts: str | None, n: int = 100_000, json_out: bool = False, *,
              seed_sample: int = SEED_SAMPLE, seen_n: int = SEEN_N, batch: int | None = None,
              partitions: int = 256, runs: int = 1) -> dict[str, Any]:
    """Run the cases (the producer ``runs`` times) and return the figures (``json_out`` is
    accepted for the CLI, which prints; :func:`render` gives the table)."""
    del json_out
    import structlog

    from zkcrawl.producer.settings import DEFAULT_BATCH

    if not structlog.is_configured():
        # Unconfigured structlog prints to stdout, which holds the table or the JSON.
        logs.configure("auto", "warning")

    batch = batch or DEFAULT_BATCH
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-offer-") as tmp:
        server = None
        if hosts is None:
            # Room for N items in the heap: ZooKeeper keeps every znode in memory.
            server = ZkServer(Path(tmp) / "zk", heap_mb=1024).start(wait=60)
            hosts = server.hosts
        root = f"/bench-offer-{uuid.uuid4().hex[:8]}"
        try:
            path = Path(tmp) / "urls.txt"
            write_urls(path, n)
            sample = path.read_text(encoding="utf-8").splitlines()[:min(seed_sample, n)]
            zk = ZkClient(hosts).connect()
            try:
                seed = bench_seed(zk, root, sample)
            finally:
                zk.close()
            prod, roots = _runs(hosts, root, path, n, batch, partitions, runs)
        finally:
            if server is not None:
                server.stop()  # the data directory goes with the temporary directory
            else:
                for r in [root, *roots]:
                    _drop(hosts, r)
    seen = bench_seen(seen_n)
    return {"n": n, "zk": "throwaway local" if server is not None else hosts,
            "seed_offer": seed, "producer": prod,
            "speedup": round(prod["urls_per_s"] / seed["urls_per_s"], 1),
            "seen_bytes_per_url": seen["bytes_per_url"], "seen": seen,
            "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
            "targets": {"producer_urls_per_s": 15_000, "speedup": 10,
                        "seen_bytes_per_url": 4.0}}


def _runs(hosts: str, root: str, path: Path, n: int, batch: int, partitions: int,
          runs: int) -> tuple[dict[str, Any], list[str]]:
    """The producer ``runs`` times, each on a fresh root: the run with the median URLs/s,
    with every run's figure in ``runs_urls_per_s``; and the roots."""
    roots = [f"{root}-p{i}" for i in range(max(1, runs))]
    done = [bench_producer(hosts, r, path, n, batch, partitions) for r in roots]
    ordered = sorted(done, key=lambda x: x["urls_per_s"])
    median = dict(ordered[(len(ordered) - 1) // 2])
    median["runs_urls_per_s"] = [x["urls_per_s"] for x in done]
    return median, roots


def render(out: dict[str, Any]) -> str:
    """A readable table of :func:`run_bench`'s result."""
    seed, prod, seen = out["seed_offer"], out["producer"], out["seen"]
    rows = [
        ("seed_offer (1 create/URL)", f"{seed['urls_per_s']:>10,.0f} URLs/s",
         f"sample of {seed['sample']}"),
        ("producer (end to end)", f"{prod['urls_per_s']:>10,.0f} URLs/s",
         f"{prod['offered']} offered into {prod['partitions']} partitions, batch "
         f"{prod['batch']}, {prod['elapsed_s']} s, {prod['nodes_per_url']} znodes and "
         f"{prod['writes_per_url']} writes per URL"),
        ("speedup", f"{out['speedup']:>10.1f} x", "target >= 10x"),
        ("seen state", f"{out['seen_bytes_per_url']:>10.2f} B/URL",
         f"{seen['urls']:,} URLs at fp {seen['fp_rate']} (measured {seen['measured_fp_rate']})"
         ", target <= 4"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"bench offer: N={out['n']:,}, ZooKeeper {out['zk']}, {out['cpus']} CPUs, "
             f"load {out['load_avg_1m']}"]
    lines += [f"  {a:<{width}}  {b}  ({c})" for a, b, c in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m zkcrawl.bench.offer [--zk HOSTS] [--items N] [--json]``."""
    ap = argparse.ArgumentParser(prog="python -m zkcrawl.bench.offer", allow_abbrev=False)
    ap.add_argument("--zk", default=None)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seen-n", type=int, default=SEEN_N)
    ap.add_argument("--partitions", type=int, default=256)
    ap.add_argument("--runs", type=int, default=1, help="producer runs (the median is shown)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = run_bench(args.zk, args.items, args.json, seen_n=args.seen_n, batch=args.batch,
                    partitions=args.partitions, runs=args.runs)
    print(json.dumps(out) if args.json else render(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
