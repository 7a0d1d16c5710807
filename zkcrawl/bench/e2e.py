"""``zkcrawl bench e2e``: the whole crawl -- producer walking listings, consumer fetching --
against seed 002's threaded crawler, one run, each case on a freshly started synthetic site
(a chain of ``LISTING_PAGES`` listing pages, every response delayed by ``latency_ms``).

* ``zkcrawl``: one consumer waiting on an empty queue, then the producer walking the chain
  (``--start`` + ``--next``) and offering articles as it reads them;
* ``seed_naive``: :mod:`zkcrawl.bench.naive` following the same links.

Figures: ``pages_per_s`` (first request to last record; ``from_spawn_pages_per_s`` from the
first process start), ``attainable_pages_per_s`` (the chain's bound), ``cpu_ms_per_page``
of every process of the case, ZooKeeper's included (``zk_cpu_ms_per_page``).
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from zkcrawl.bench.crawl import _read_lines, _wait_registered
from zkcrawl.bench.hosts import CpuMeter, env, record_spans, zookeeper
from zkcrawl.bench.site import start_site, stop_benchsite
from zkcrawl.zk.client import ZkClient

LISTING_PAGES = 50
SAMPLE_S = 0.05


def bound_s(articles: int, pages: int, per_list: int, threads: int, latency_s: float) -> float:
    """The shortest possible crawl of the chain: the listings one after the other, then the
    last one's articles in rounds of ``threads``; or the first listing, then every article
    in rounds of ``threads`` -- whole rounds: one of the threads fetches
    ``ceil(articles / threads)`` of them one after the other. (Until session 17 this term
    counted fractional rounds, 62.5 of 50 ms for 2,000 articles on 32 threads: a bound no
    crawler can reach, 0.8 % below the one here.)"""
    chain = pages * latency_s + math.ceil(per_list / threads) * latency_s
    fetches = latency_s + math.ceil(articles / threads) * latency_s
    return max(chain, fetches)


def _await(meter: CpuMeter, children: list[subprocess.Popen[bytes]],
           done: Callable[[], bool],
           timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meter.sample()
        if done() or all(c.poll() is not None for c in children):
            break
        time.sleep(SAMPLE_S)  # sampling period, bounded by ``timeout``


def _stop(children: list[subprocess.Popen[bytes]], meter: CpuMeter, grace: float) -> None:
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(c.poll() is None for c in children):
        meter.sample()
        time.sleep(SAMPLE_S)  # the consumer's idle timer ends it; bounded by ``grace``
    for c in children:
        if c.poll() is None:
            c.kill()
        c.wait()


def case_zkcrawl(zk_hosts: str, server_pid: int | None, articles: int, threads: int,
                 latency_ms: float, tmp: Path) -> dict[str, Any]:
    per_list = math.ceil(articles / LISTING_PAGES)
    site, bases = start_site(latency_ms, articles, per_list=per_list)
    base = bases[0]
    root = f"/bench-e2e-{uuid.uuid4().hex[:8]}"
    out, log, plog = tmp / "e2e-consumer.jsonl", tmp / "e2e-consumer.log", tmp / "e2e-prod.log"
    meter = CpuMeter()
    if server_pid is not None:
        meter.add(server_pid, from_now=True)
    try:
        spawned = time.time()
        with open(log, "wb") as err:
            consumer = subprocess.Popen(
                [sys.executable, "-m", "zkcrawl.consumer.main", "--zk", zk_hosts, "--root", root,
                 "--id", "bench-e2e", "--threads", str(threads), "--backlog", str(threads * 2),
                 "--out", str(out), "--exit-when-idle", "2", "--domain-delay", "0",
                 "--no-robots", "--log-format", "json", "--allow-private-addresses"],
                env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        meter.add(consumer.pid)
        zk = ZkClient(zk_hosts, session_timeout=30).connect()
        try:
            _wait_registered(zk, root, 1, [consumer], timeout=60)
        finally:
            zk.close()
        with open(plog, "wb") as err:
            producer = subprocess.Popen(
                [sys.executable, "-m", "zkcrawl.producer.main", "--zk", zk_hosts, "--root", root,
                 "--id", "bench-e2e", "--start", f"{base}/list/1",
                 "--next", '//a[@rel="next"]/@href', "--links", '//a[@class="item"]/@href',
                 "--delay", "0", "--no-robots", "--max-pages", "0", "--log-format", "json",
                 "--allow-private-addresses"],
                env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        meter.add(producer.pid)
        children = [consumer, producer]

        def done() -> bool:
            with contextlib.suppress(OSError), open(out, "rb") as fh:
                return sum(1 for _ in fh) >= articles and producer.poll() is not None
            return False

        _await(meter, children, done, timeout=120 + articles * latency_ms / 1000)
        _stop(children, meter, grace=15)
        stats = requests.get(f"{base}/stats", timeout=10).json()
    finally:
        stop_benchsite(site)
    recs = _read_lines([out])
    res = _figures(recs, stats, spawned, articles, per_list, threads, latency_ms, meter)
    res["zk_cpu_ms_per_page"] = (round(meter.seconds(server_pid) * 1000 / res["pages"], 3)
                                 if server_pid is not None and res["pages"] else None)
    res["exit_codes"] = {"consumer": consumer.returncode, "producer": producer.returncode}
    res["unique_urls"] = len({r["url"] for r in recs})
    res["errors"] = sum(1 for r in recs if r.get("error"))
    return res


def case_naive(articles: int, threads: int, latency_ms: float, tmp: Path) -> dict[str, Any]:
    per_list = math.ceil(articles / LISTING_PAGES)
    site, bases = start_site(latency_ms, articles, per_list=per_list)
    out = tmp / "e2e-naive.jsonl"
    meter = CpuMeter()
    try:
        spawned = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-m", "zkcrawl.bench.naive", f"{bases[0]}/list/1",
             r"/(list|a)/", str(threads), str(out)],
            env=env(), stdin=subprocess.DEVNULL)
        meter.add(proc.pid)
        _await(meter, [proc], lambda: False, timeout=120 + articles * latency_ms / 1000)
        _stop([proc], meter, grace=0)
        stats = requests.get(f"{bases[0]}/stats", timeout=10).json()
    finally:
        stop_benchsite(site)
    recs = [r for r in _read_lines([out]) if "/a/" in r["url"]]
    for r in recs:
        r["process_ms"] = (r["end"] - r["start"]) * 1000
    res = _figures(recs, stats, spawned, articles, per_list, threads, latency_ms, meter,
                   naive=True)
    res["unique_urls"] = len({r["url"] for r in recs})
    return res


def _figures(recs: list[dict[str, Any]], stats: dict[str, Any], spawned: float, articles: int,
             per_list: int, threads: int, latency_ms: float, meter: CpuMeter,
             naive: bool = False) -> dict[str, Any]:
    ends = [r["end"] for r in recs] if naive else [e for _, e in record_spans(recs)]
    listings = stats["by_kind"]["list"]
    pages = len(recs) + listings
    first = stats["first_request_at"] or spawned
    last = max(ends) if ends else first
    seconds = max(1e-9, last - first)
    bound = bound_s(articles, LISTING_PAGES, per_list, threads, latency_ms / 1000)
    attainable = (articles + LISTING_PAGES) / bound
    rate = pages / seconds
    # The site's timers fire after the latency, never before (late_ms_mean): the bound at
    # the latency the site really served, beside the nominal one the figure is judged by.
    late = float(stats.get("late_ms_mean") or 0.0)
    served = (articles + LISTING_PAGES) / bound_s(articles, LISTING_PAGES, per_list, threads,
                                                  (latency_ms + late) / 1000)
    return {"articles": len(recs), "expected_articles": articles, "listings": listings,
            "site_late_ms": round(late, 3),
            "pct_attainable_as_served": round(100 * rate / served, 1),
            "pages": pages, "server_requests": stats["requests"],
            "seconds": round(seconds, 3), "pages_per_s": round(rate, 1),
            "from_spawn_pages_per_s": round(pages / max(1e-9, last - spawned), 1),
            "attainable_pages_per_s": round(attainable, 1),
            "pct_attainable": round(100 * rate / attainable, 1),
            "cpu_ms_per_page": round(meter.seconds() * 1000 / max(pages, 1), 3)}


def _warm_up(zk_hosts: str, n: int = 2000) -> None:
    """Offer and drain ``n`` items on a fresh server: a JVM just started spends seconds of
    CPU compiling its hot paths, which would be counted against the first case (a
    production ensemble is warm)."""
    from zkcrawl.bench.drain import drain, owned_queue
    from zkcrawl.queue.ingress import IngressQueue
    from zkcrawl.queue.items import Item

    zk = ZkClient(zk_hosts, session_timeout=30).connect()
    root = f"/bench-e2e-warm-{uuid.uuid4().hex[:8]}"
    try:
        IngressQueue(zk, root).offer_many(
            Item(url=f"http://127.0.0.1:9/w/{i}", producer="bench") for i in range(n))
        q = owned_queue(zk, root, "warm-up")  # the owner of partition 0 moves the ingress
        try:
            drain(q, n)
        finally:
            q.close()
        zk.delete(root, recursive=True)
    finally:
        zk.close()


def run_bench(zk_hosts: str | None, articles: int = 2000, threads: int = 32,
              latency_ms: float = 50) -> dict[str, Any]:
    """Both cases in one run: the naive crawler, then zkcrawl, then the naive crawler again
    (the figure is the mean of its two runs, so a drift of the shared machine hits both)."""
    if articles < LISTING_PAGES:
        raise ValueError(f"articles must be at least {LISTING_PAGES}")
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-e2e-") as name:
        tmp = Path(name)
        with zookeeper(zk_hosts, tmp) as (zkh, server):
            pid = server.proc.pid if server is not None and server.proc is not None else None
            out: dict[str, Any] = {"articles": articles, "listing_pages": LISTING_PAGES,
                                   "threads": threads, "latency_ms": latency_ms,
                                   "cpus": os.cpu_count(),
                                   "load_avg_1m": round(os.getloadavg()[0], 2),
                                   "zk_cpu_counted": pid is not None}
            if server is not None:
                _warm_up(zkh)
            naive = [case_naive(articles, threads, latency_ms, tmp)]
            out["zkcrawl"] = case_zkcrawl(zkh, pid, articles, threads, latency_ms, tmp)
            naive.append(case_naive(articles, threads, latency_ms, tmp))
    out["seed_naive"] = naive[0] | {
        "pages_per_s": round(sum(n["pages_per_s"] for n in naive) / 2, 1),
        "pct_attainable": round(sum(n["pct_attainable"] for n in naive) / 2, 1),
        "cpu_ms_per_page": round(sum(n["cpu_ms_per_page"] for n in naive) / 2, 3),
        "runs_pages_per_s": [n["pages_per_s"] for n in naive]}
    z, s = out["zkcrawl"], out["seed_naive"]
    out["ratios"] = {
        "zkcrawl_vs_seed_pages_per_s": round(z["pages_per_s"] / s["pages_per_s"], 2)
        if s["pages_per_s"] else None,
        "zkcrawl_vs_seed_cpu_per_page": round(z["cpu_ms_per_page"] / s["cpu_ms_per_page"], 2)
        if s["cpu_ms_per_page"] else None}
    return out


def render(out: dict[str, Any]) -> str:
    """A table for humans (``--json`` prints the dict instead)."""
    lines = [f"bench e2e: {out['listing_pages']} listing pages + {out['articles']} articles, "
             f"{out['latency_ms']:g} ms per page, {out['threads']} threads, {out['cpus']} CPUs, "
             f"load {out['load_avg_1m']}",
             f"{'case':<12}{'pages':>7}{'seconds':>9}{'pages/s':>9}{'attain.':>9}{'%':>7}"
             f"{'CPU ms/pg':>11}{'ZK ms/pg':>10}"]
    for key in ("zkcrawl", "seed_naive"):
        c = out[key]
        lines.append(f"{key:<12}{c['pages']:>7}{c['seconds']:>9}{c['pages_per_s']:>9}"
                     f"{c['attainable_pages_per_s']:>9}{c['pct_attainable']:>7}"
                     f"{c['cpu_ms_per_page']:>11}{c.get('zk_cpu_ms_per_page', '-')!s:>10}")
    lines.append("ratios: " + ", ".join(f"{k}={v}" for k, v in out["ratios"].items()))
    z = out["zkcrawl"]
    lines.append(f"the site's responses left {z['site_late_ms']} ms late on average: zkcrawl "
                 f"at {z['pct_attainable_as_served']} % of the bound at the latency served")
    return "\n".join(lines)
