"""``zkcrawl bench skew``: one big host among many small ones -- does a host hold back another?

Two cases on the synthetic site (:mod:`zkcrawl.bench.site`, one loopback address per host),
same consumers: ``alone`` (the small hosts' pages only) and ``mixed`` (the same pages
shuffled among ``big`` pages of one big host). Reported from the records:
``small_span_s`` and the ratio ``mixed / alone`` (1.0: the big host slows nobody;
``finished`` false when a case hit its time limit), the big host's pace against
``1 / delay`` and its smallest gap as the server saw it (never below ``--domain-delay``),
ZooKeeper writes and client CPU per page.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from zkcrawl.bench.crawl import Probe, _read_lines, _wait_registered
from zkcrawl.bench.hosts import (
    SAMPLE_S,
    CpuMeter,
    env,
    per_page,
    record_spans,
    zk_counters,
    zk_ports,
    zookeeper,
)
from zkcrawl.bench.site import start_site, stop_benchsite
from zkcrawl.queue import control
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.zk.client import ZkClient

SEED = 20261201


def case(zk_hosts: str, urls: list[str], small: set[str], *, procs: int, threads: int,
         delay: float, limit_s: float, tmp: Path, stats_url: str) -> dict[str, Any]:
    """Crawl ``urls`` with ``procs`` consumers until every URL whose host is in ``small`` is
    recorded (or ``limit_s``), then stop them; what the module docstring lists."""
    tag = f"skew-{uuid.uuid4().hex[:8]}"
    root = f"/bench-{tag}"
    outs = [tmp / f"{tag}-{i}.jsonl" for i in range(procs)]
    logs = [tmp / f"{tag}-{i}.log" for i in range(procs)]
    ports = zk_ports(zk_hosts)
    want = sum(1 for u in urls if _host(u) in small)
    zk = ZkClient(zk_hosts, session_timeout=30).connect()
    children: list[subprocess.Popen[bytes]] = []
    try:
        IngressQueue(zk, root).offer_many(Item(url=u, producer="bench") for u in urls)
        control.set_state(zk, root, control.PAUSED, by="bench")
        for i in range(procs):
            with open(logs[i], "wb") as err:
                children.append(subprocess.Popen(
                    [sys.executable, "-m", "zkcrawl.consumer.main", "--zk", zk_hosts, "--root",
                     root,
                     "--id", f"{tag}-{i}", "--threads", str(threads), "--out", str(outs[i]),
                     "--domain-delay", f"{delay:g}", "--no-robots", "--log-format", "json",
                     "--stats-interval", "5", "--allow-private-addresses", "--grace", "2"],
                    env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=err))
        _wait_registered(zk, root, procs, children, timeout=60)
        before = zk_counters(ports)
        control.set_state(zk, root, control.RUNNING, by="bench")
        t0 = time.time()
        finished, cpu_s, after = _until_small_done(children, outs, small, want, limit_s, ports)
        for c in children:
            if c.poll() is None:
                c.send_signal(signal.SIGTERM)
        for c in children:
            try:
                c.wait(30)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
        stats = requests.get(stats_url, timeout=10).json()
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()
        zk.close()
    recs = [r for r in _read_lines(outs) if not r.get("error")]
    return _measure(recs, small, want, finished, limit_s, t0, delay, stats, cpu_s,
                    per_page(before, after, len(recs)))


def _until_small_done(children: list[subprocess.Popen[bytes]], outs: list[Path],
                      small: set[str], want: int, limit_s: float, ports: list[int]
                      ) -> tuple[bool, float, dict[str, float] | None]:
    """Sample until ``want`` small-host records are in, a consumer exits, or ``limit_s``."""
    probe = Probe(children, outs)
    meter = CpuMeter()
    for p in children:
        meter.add(p.pid)
    deadline = time.monotonic() + limit_s
    finished = False
    while time.monotonic() < deadline and all(c.poll() is None for c in children):
        meter.sample()
        if probe.sample() >= want and _small_done(outs, small) >= want:
            finished = True
            break
        time.sleep(SAMPLE_S * 4)  # sampling period; the loop is bounded by ``limit_s``
    return finished, meter.seconds(), zk_counters(ports)


def _small_done(outs: list[Path], small: set[str]) -> int:
    return len({r["url"] for r in _read_lines(outs)
                if not r.get("error") and _host(r["url"]) in small})


def _measure(recs: list[dict[str, Any]], small: set[str], want: int, finished: bool,
             limit_s: float, t0: float, delay: float, stats: dict[str, Any], cpu_s: float,
             zk: dict[str, float] | None) -> dict[str, Any]:
    small_recs = [r for r in recs if _host(r["url"]) in small]
    big_recs = [r for r in recs if _host(r["url"]) not in small]
    spans = record_spans(recs)
    start = min((s for s, _ in spans), default=t0)
    small_end = max((e for _, e in record_spans(small_recs)), default=start)
    span = (small_end - start) if finished else limit_s
    big_spans = record_spans(big_recs)
    big_window = (max(e for _, e in big_spans) - min(s for s, _ in big_spans)
                  if len(big_spans) > 1 else 0.0)
    gaps = stats.get("host_min_gap_s") or {}
    # the site keys its counts by the base URL a connection came in on
    big_gaps = [g for h, g in gaps.items() if g is not None and _host(h) not in small]
    small_gaps = [g for h, g in gaps.items() if g is not None and _host(h) in small]
    return {
        "finished": finished, "small_pages": len({r["url"] for r in small_recs}),
        "small_expected": want, "small_span_s": round(span, 3),
        "big_pages": len(big_recs),
        "big_pages_per_s": round((len(big_recs) - 1) / big_window, 3) if big_window else None,
        "big_vs_gap": (round((len(big_recs) - 1) / big_window * delay, 3)
                       if big_window else None),
        "big_min_gap_s": round(min(big_gaps), 4) if big_gaps else None,
        "small_min_gap_s": round(min(small_gaps), 4) if small_gaps else None,
        "hosts_below_delay": sum(1 for g in (*big_gaps, *small_gaps) if g < delay),
        "cpu_ms_per_page": round(cpu_s * 1000 / len(recs), 3) if recs else None,
        "zk": zk}


def run_bench(zk_hosts: str | None, small_hosts: int = 50, per_small: int = 10,
              big: int = 600, procs: int = 2, threads: int = 16, latency_ms: float = 50,
              delay: float = 1.0) -> dict[str, Any]:
    """``alone`` then ``mixed`` in one run (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-skew-") as name:
        tmp = Path(name)
        site, bases = start_site(latency_ms, max(big, per_small), hosts=small_hosts + 1)
        try:
            with zookeeper(zk_hosts, tmp) as (zkh, _server):
                big_base, small_bases = bases[0], bases[1:]
                small = {_host(b) for b in small_bases}
                small_urls = [f"{b}/a/{i}.html" for b in small_bases
                              for i in range(1, per_small + 1)]
                big_urls = [f"{big_base}/a/{i}.html" for i in range(1, big + 1)]
                mixed = small_urls + big_urls
                random.Random(SEED).shuffle(mixed)
                alone_order = list(small_urls)
                random.Random(SEED).shuffle(alone_order)
                common: dict[str, Any] = {"procs": procs, "threads": threads, "delay": delay,
                                          "tmp": tmp}
                alone_site, alone_bases = start_site(latency_ms, per_small,
                                                     hosts=small_hosts)
                try:
                    # the alone case on a site of its own: the gaps it reports are its own
                    remap = dict(zip(small_bases, alone_bases, strict=True))
                    urls = [remap[u.rsplit("/a/", 1)[0]] + "/a/" + u.rsplit("/a/", 1)[1]
                            for u in alone_order]
                    alone = case(zkh, urls, {_host(b) for b in alone_bases},
                                 limit_s=120 + per_small * delay * 4,
                                 stats_url=f"{alone_bases[0]}/stats", **common)
                finally:
                    stop_benchsite(alone_site)
                limit = max(60.0, 5 * alone["small_span_s"])
                mixed_case = case(zkh, mixed, small, limit_s=limit,
                                  stats_url=f"{big_base}/stats", **common)
        finally:
            stop_benchsite(site)
    out: dict[str, Any] = {
        "small_hosts": small_hosts, "per_small": per_small, "big": big, "consumers": procs,
        "threads": threads, "latency_ms": latency_ms, "delay": delay, "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2), "alone": alone, "mixed": mixed_case}
    a, m = alone["small_span_s"], mixed_case["small_span_s"]
    out["ratios"] = {"small_span_mixed_vs_alone": round(m / a, 3) if a else None,
                     "big_pace_vs_gap": mixed_case["big_vs_gap"]}
    return out


def render(out: dict[str, Any]) -> str:
    lines = [f"bench skew: {out['small_hosts']} small hosts x {out['per_small']} pages "
             f"+ 1 big host x {out['big']}, {out['consumers']} consumers x {out['threads']} "
             f"threads, {out['latency_ms']:g} ms per page, --domain-delay {out['delay']:g}, "
             f"{out['cpus']} CPUs, load {out['load_avg_1m']}",
             f"{'case':<12}{'finished':>9}{'small':>8}{'span s':>9}{'big pages':>11}"
             f"{'big/gap':>9}{'min gap s':>11}{'CPU ms/pg':>11}{'writes/pg':>11}"]
    for key in ("alone", "mixed"):
        c = out[key]
        zk = c["zk"] or {}
        gap = c["small_min_gap_s"] if key == "alone" else c["big_min_gap_s"]
        lines.append(f"{key:<12}{c['finished']!s:>9}{c['small_pages']:>8}"
                     f"{c['small_span_s']:>9}{c['big_pages']:>11}{_s(c['big_vs_gap']):>9}"
                     f"{_s(gap):>11}{_s(c['cpu_ms_per_page']):>11}"
                     f"{_s(zk.get('writes_per_page')):>11}")
    lines.append("ratios: " + ", ".join(f"{k}={v}" for k, v in out["ratios"].items()))
    if not out["mixed"]["finished"]:
        lines.append("the mixed case did not finish within its limit: the span ratio is a "
                     "lower bound")
    return "\n".join(lines)


def _host(url: str) -> str:
    """The host as the site counts it: one loopback address per host, the port aside."""
    return urlsplit(url).hostname or ""


def _s(v: object) -> str:
    return "-" if v is None else str(v)
