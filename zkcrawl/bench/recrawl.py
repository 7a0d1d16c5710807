"""``zkcrawl bench recrawl`` and ``zkcrawl bench recrawl-store``: a re-crawl against the first
crawl in one run, and the ``--recrawl`` store at scale.

* ``recrawl``: N unchanged articles of the synthetic site (ETags, 304 to a matching
  ``If-None-Match``). Pass 1 offers them as a ``--recrawl`` producer does (its
  :class:`~zkcrawl.producer.offerer.Offerer`, into the partitions) and one consumer crawls them; the
  producer's re-crawl pass (:class:`~zkcrawl.producer.recrawl.Recrawler`) offers them again with
  their validators for pass 2. Per pass: the bytes the site sent, the
  consumer's CPU per page, the records' ``changed``; the figures are the ratios pass 2 /
  pass 1. A ``floor`` crawl of bare 404s measures a page's fixed cost in the same run.
  ``--extract article``: every pass with the consumer's ``--extract article`` (its extraction
  processes' CPU counted), as a blog is crawled; default: the title only.
* ``recrawl-store``: N URLs in a store on this disk: insert rate, bytes per URL, the time
  to find and count due URLs, and re-offers per second (the store's side of a re-offer).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog

from zkcrawl.bench.crawl import Probe, _env, _read_lines, _wait_registered, _zookeeper
from zkcrawl.bench.site import start_benchsite, stop_benchsite
from zkcrawl.producer.offerer import Offerer
from zkcrawl.producer.recrawl import Recrawler, RecrawlStore, Schedule
from zkcrawl.producer.summary import Counts
from zkcrawl.queue import control
from zkcrawl.queue.fetched import FetchedReader
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.queue.partition_offers import PartitionOffers, recorded_partitions
from zkcrawl.seen import SeenSet
from zkcrawl.zk.client import ZkClient

__all__ = ["render", "render_store", "run_bench", "run_store"]

HOUR = 3600.0


def _site_bytes(base: str) -> int:
    with urllib.request.urlopen(f"{base}/stats", timeout=10) as resp:
        return int(json.load(resp)["bytes_sent"])


def _crawl(hosts: str, root: str, threads: int, latency_ms: int, tmp: Path, tag: str,
           n: int, extract: str = "title") -> dict[str, Any]:
    """One consumer process over what is queued; CPU per page (its extraction processes'
    included) and the records."""
    out, log = tmp / f"{tag}.jsonl", tmp / f"{tag}.log"
    zk = ZkClient(hosts, session_timeout=30).connect()
    control.set_state(zk, root, control.PAUSED, by="bench")
    with open(log, "wb") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "zkcrawl.consumer.main", "--zk", hosts, "--root", root,
             "--id", f"bench-{tag}", "--threads", str(threads), "--backlog", str(threads * 2),
             "--out", str(out), "--exit-when-idle", "2", "--domain-delay", "0",
             "--no-robots", "--log-format", "json", "--allow-private-addresses",
             "--extract", extract],
            env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_registered(zk, root, 1, [child], timeout=60)
        control.set_state(zk, root, control.RUNNING, by="bench")
    finally:
        zk.close()
    probe = Probe([child], [out], children=extract == "article")
    probe.run(timeout=60 + n * latency_ms / 1000)
    recs = _read_lines([out])
    return {"pages": len(recs), "cpu_ms_per_page": probe.cpu_ms_per_page(),
            "errors": sum(1 for r in recs if r.get("error")),
            "changed_false": sum(1 for r in recs if r.get("changed") is False),
            "changed_true": sum(1 for r in recs if r.get("changed") is True),
            "changed_absent": sum(1 for r in recs if "changed" not in r),
            "status_304": sum(1 for r in recs if r.get("status") == 304),
            "exit_code": child.returncode}


def run_bench(hosts: str | None, n: int = 2000, threads: int = 32, latency_ms: int = 50,
              page_kb: int = 0, extract: str = "title") -> dict[str, Any]:
    """Pass 1 and the re-crawl pass 2 of N unchanged articles; see the module docstring.
    ``page_kb``: the articles' size (0: the site's 5-15 KB; else 0.5-1.5 times that);
    ``extract``: the consumers' ``--extract`` (``article``: a blog's crawl, extraction
    processes' CPU counted)."""
    if not structlog.is_configured():  # the producer pass's events: not into --json output
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-recrawl-") as name:
        tmp = Path(name)
        site, base = start_benchsite(latency_ms, n, page_kb=page_kb)
        try:
            with _zookeeper(hosts, tmp) as zk_hosts:
                return {**_passes(zk_hosts, base, tmp, n, threads, latency_ms, extract),
                        "page_kb": page_kb, "extract": extract}
        finally:
            stop_benchsite(site)


def _passes(hosts: str, base: str, tmp: Path, n: int, threads: int, latency_ms: int,
            extract: str) -> dict[str, Any]:
    root = f"/bench-recrawl-{uuid.uuid4().hex[:8]}"
    urls = [f"{base}/a/{i}.html" for i in range(1, n + 1)]
    store = RecrawlStore(str(tmp / "store.recrawl"), Schedule(HOUR, 30 * 24 * HOUR))
    zk = ZkClient(hosts, session_timeout=30).connect()
    hooks = {"meta": {"recrawl": {}}, "on_offered": store.add_new}  # as --recrawl's
    with _offerer(zk, root, n, hooks) as offerer:
        for url in urls:
            offerer.add(url, "bench")
        offerer.drain()
    out: dict[str, Any] = {"n": n, "threads": threads, "latency_ms": latency_ms,
                           "cpus": os.cpu_count()}
    before = _site_bytes(base)
    out["first"] = _crawl(hosts, root, threads, latency_ms, tmp, "first", n, extract)
    out["first"]["bytes"] = _site_bytes(base) - before
    started = time.perf_counter()
    with _offerer(zk, root, n) as offerer:
        recrawler = Recrawler(store, FetchedReader(zk, root), offerer, batch=500,
                              stop=threading.Event())
        done = recrawler.run_pass(now=time.time() + 2 * HOUR)  # past --recrawl-min
    out["producer_pass"] = {**done.doc(), "seconds": round(time.perf_counter() - started, 3)}
    zk.close()
    before = _site_bytes(base)
    out["recrawl"] = _crawl(hosts, root, threads, latency_ms, tmp, "recrawl", n, extract)
    out["recrawl"]["bytes"] = _site_bytes(base) - before
    store.close()
    out["floor"] = _floor(hosts, base, tmp, n, threads, latency_ms, extract)
    first, again = out["first"], out["recrawl"]
    out["ratios"] = {
        "bytes_recrawl_vs_first": round(again["bytes"] / max(1, first["bytes"]), 4),
        "cpu_per_page_recrawl_vs_first": round(
            again["cpu_ms_per_page"] / first["cpu_ms_per_page"], 3)
        if first["cpu_ms_per_page"] else None,
        "changed_false_share": round(again["changed_false"] / max(1, again["pages"]), 4),
        "cpu_per_page_recrawl_vs_floor": round(
            again["cpu_ms_per_page"] / out["floor"]["cpu_ms_per_page"], 3)
        if out["floor"]["cpu_ms_per_page"] else None}
    return out


@contextmanager
def _offerer(zk: ZkClient, root: str, n: int, hooks: dict[str, Any] | None = None
             ) -> Iterator[Offerer]:
    """The producer's offerer into ``root``'s partitions, its bounds above ``n`` items."""
    feed = PartitionOffers(zk, root, recorded_partitions(zk, root))
    offerer = Offerer(feed, SeenSet.open(None, n + 1, 0.001), Counts(), producer_id="bench",
                      batch=500, max_depth=n + 1, max_partition_depth=n + 1, max_held=n + 1,
                      stop=threading.Event(), **(hooks or {}))
    try:
        yield offerer
    finally:
        offerer.close()


def _floor(hosts: str, base: str, tmp: Path, n: int, threads: int, latency_ms: int,
           extract: str) -> dict[str, Any]:
    """The baseline of a page's fixed cost, in the same run: N URLs the site answers with a
    bare 404 (no body to read or extract, a record all the same), no re-crawl meta."""
    root = f"/bench-floor-{uuid.uuid4().hex[:8]}"
    zk = ZkClient(hosts, session_timeout=30).connect()
    try:
        IngressQueue(zk, root).offer_many(
            Item(url=f"{base}/a/{i}.missing", producer="bench") for i in range(1, n + 1))
    finally:
        zk.close()
    before = _site_bytes(base)
    out = _crawl(hosts, root, threads, latency_ms, tmp, "floor", n, extract)
    out["bytes"] = _site_bytes(base) - before
    return out


def render(out: dict[str, Any]) -> str:
    size = f"{out['page_kb']} KB +- 50 %" if out.get("page_kb") else "5-15 KB"
    extract = out.get("extract", "title")
    lines = [f"zkcrawl bench recrawl: {out['n']} unchanged articles of {size}, "
             f"--extract {extract}, "
             f"{out['threads']} threads, {out['latency_ms']} ms per response, "
             f"{out['cpus']} CPUs",
             f"{'pass':<10}{'pages':>8}{'bytes':>12}{'cpu ms/page':>13}{'304':>7}"
             f"{'changed=false':>15}{'errors':>8}"]
    for key in ("first", "recrawl", "floor"):
        c = out[key]
        lines.append(f"{key:<10}{c['pages']:>8}{c['bytes']:>12}{c['cpu_ms_per_page']:>13}"
                     f"{c['status_304']:>7}{c['changed_false']:>15}{c['errors']:>8}")
    r = out["ratios"]
    lines.append(f"re-crawl / first: bytes {r['bytes_recrawl_vs_first']}x, CPU per page "
                 f"{r['cpu_per_page_recrawl_vs_first']}x; changed: false on "
                 f"{100 * r['changed_false_share']:.1f}% of the pages; CPU per page "
                 f"re-crawl / floor (a bare 404) {r['cpu_per_page_recrawl_vs_floor']}x")
    p = out["producer_pass"]
    lines.append(f"producer pass: {p['reports']} reports learnt, {p['reoffered']} re-offered "
                 f"in {p['seconds']} s")
    return "\n".join(lines)


# -- the store alone ------------------------------------------------------------------------
def run_store(n: int = 1_000_000, directory: str | None = None) -> dict[str, Any]:
    """N URLs in a store; see the module docstring. ``directory``: where the file goes
    (default: a temporary directory, removed after)."""
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-store-", dir=directory) as name:
        path = os.path.join(name, "store.recrawl")
        store = RecrawlStore(path, Schedule(HOUR, 30 * 24 * HOUR, random.Random(1)))
        t0 = 1_800_000_000.0
        started = time.perf_counter()
        chunk = 20_000
        for i in range(0, n, chunk):
            store.add_new([f"https://host{j % 5000}.example/articles/{j}.html"
                           for j in range(i, min(n, i + chunk))], t0)
        insert_s = time.perf_counter() - started
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = os.path.getsize(path) + _size(path + "-wal")
        due_at = t0 + 1.2 * HOUR  # every URL due (first interval 1 h +- 10 %)
        started = time.perf_counter()
        page = store.due(due_at, 500)
        first_page_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        due_count = store._db.execute("SELECT count(*) FROM urls WHERE retired = 0 AND "
                                      "due <= ?", (int(due_at),)).fetchone()[0]
        count_s = time.perf_counter() - started
        target = min(n, 200_000)
        reoffered = 0
        started = time.perf_counter()
        while reoffered < target:
            page = store.due(due_at, 500)
            if not page:
                break
            store.offered([d.id for d in page], due_at)
            reoffered += len(page)
        reoffer_s = time.perf_counter() - started
        store.close()
        return {"urls": n, "insert_per_s": round(n / insert_s), "bytes": size,
                "bytes_per_url": round(size / n, 1), "due_first_500_ms": round(first_page_ms, 3),
                "due_count": due_count, "due_count_s": round(count_s, 3),
                "reoffered": reoffered, "reoffers_per_s": round(reoffered / reoffer_s)}


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def render_store(out: dict[str, Any]) -> str:
    return "\n".join([
        f"zkcrawl bench recrawl-store: {out['urls']:,} URLs",
        f"insert {out['insert_per_s']:,} URLs/s; {out['bytes']:,} bytes on disk = "
        f"{out['bytes_per_url']} bytes per URL",
        f"due URLs: first 500 in {out['due_first_500_ms']} ms; all {out['due_count']:,} "
        f"counted in {out['due_count_s']} s",
        f"re-offer (find due + mark offered): {out['reoffers_per_s']:,} URLs/s over "
        f"{out['reoffered']:,}"])
