"""``zkcrawl bench hosts``: politeness on many hosts, 1 and 4 owners and under contention, one
run; and ``zkcrawl bench ensemble`` (:func:`run_ensemble`), the at-least-once drain with 1,
2 and 4 consumers on a 3-node ensemble.

Each case offers ``per_host`` URLs on every host of the synthetic site
(:mod:`zkcrawl.bench.site`, ``hosts`` loopback addresses) to a fresh root, resumes its
paused consumers once all are registered, and reports: ``pages_per_s`` against the
attainable ``min(consumers x threads / latency, hosts / delay)``; ``min_gap_s`` and
``hosts_below_delay`` as the server saw requests arrive (none should be below
``--domain-delay``); ZooKeeper requests, reads and writes per page from the servers'
``mntr`` counters; client CPU per page. Cases: ``owner_1``, ``owner_4`` and
``contention`` (4 consumers on 5 hosts).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import requests

from zkcrawl.admin.localzk import Ensemble, ZkServer, four_letter
from zkcrawl.bench.crawl import Probe, _read_lines, _wait_registered
from zkcrawl.bench.site import start_site, stop_benchsite
from zkcrawl.queue import control
from zkcrawl.queue.items import Item
from zkcrawl.queue.partition_offers import recorded_partitions
from zkcrawl.queue.partition_queue import PartitionQueue
from zkcrawl.zk.client import ZkClient

SAMPLE_S = 0.05
# The throwaway server's heap: a checkpoint is a transaction of up to 512 KiB and the server
# keeps its last 500 committed in memory (for followers), so at 2,500 hosts x 2 consumers a
# 512 MiB heap ran out (OutOfMemoryError in its SyncThread ~30 s in, the consumers left
# disconnected) -- measured on the tree of 2026-12-02.
HOSTS_HEAP_MB = 1024
_ROOT = Path(__file__).resolve().parents[2]
CONTENTION_HOSTS = 5
# mntr keys: packets received (every request, pings included), reads and writes served
# (the read / update latency summaries count one per request; a multi is one write), and the
# leader's proposals (every write of the ensemble, whichever server took it).
_MNTR = {"requests": "zk_packets_received", "reads": "zk_cnt_readlatency",
         "writes": "zk_cnt_updatelatency", "proposals": "zk_proposal_count"}


# -- ZooKeeper's own counters ------------------------------------------------------------
def zk_ports(hosts: str) -> list[int]:
    """The client ports of the loopback servers in a connect string (others are skipped:
    ``mntr`` is only asked of this machine)."""
    ports = []
    for part in hosts.split("/", 1)[0].split(","):
        host, _, port = part.strip().rpartition(":")
        if host in ("127.0.0.1", "localhost") and port.isdigit():
            ports.append(int(port))
    return ports


def parse_mntr(text: str) -> dict[str, float]:
    """The numeric ``key<TAB>value`` lines of a ``mntr`` reply (anything else is skipped:
    the reply comes from a server, not from us)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        key, tab, value = line.partition("\t")
        if not tab or not key.startswith("zk_"):
            continue
        with contextlib.suppress(ValueError):
            number = float(value)
            if math.isfinite(number):
                out[key] = number
    return out


def mntr(port: int) -> dict[str, float]:
    """A server's ``mntr`` counters (numeric ones); {} when it does not answer."""
    return parse_mntr(four_letter(port, "mntr", timeout=2.0))


def zk_counters(ports: list[int]) -> dict[str, float] | None:
    """requests / reads / writes summed over ``ports``, proposals of the leader (max)."""
    snaps = [mntr(p) for p in ports]
    if not snaps or not all(snaps):
        return None
    out = {k: sum(s.get(key, 0.0) for s in snaps) for k, key in _MNTR.items()}
    out["proposals"] = max(s.get(_MNTR["proposals"], 0.0) for s in snaps)
    return out


def per_page(before: dict[str, float] | None, after: dict[str, float] | None,
             pages: int) -> dict[str, float] | None:
    if before is None or after is None or pages <= 0:
        return None
    return {f"{k}_per_page": round((after[k] - before[k]) / pages, 3) for k in _MNTR
            if k != "proposals"}


@contextlib.contextmanager
def zookeeper(hosts: str | None, tmp: Path, heap_mb: int = 512
              ) -> Iterator[tuple[str, ZkServer | None]]:
    """``hosts``, or a throwaway local server (full JIT) for the bench."""
    if hosts:
        yield hosts, None
        return
    server = ZkServer(tmp / "zk", heap_mb=heap_mb).start(wait=60)
    try:
        yield server.hosts, server
    finally:
        server.stop()


def env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def log_events(paths: list[Path], event: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``event`` in the consumers' logs."""
    found = []
    for path in paths:
        with contextlib.suppress(OSError), open(path, "rb") as fh:
            for line in fh:
                if event.encode() in line:
                    with contextlib.suppress(ValueError):
                        rec = json.loads(line)
                        if rec.get("event") == event:
                            found.append(rec)
    return found


def record_spans(recs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(start, end) wall-clock seconds of each record's fetch."""
    spans = []
    for r in recs:
        end = datetime.fromisoformat(r["fetched_at"].replace("Z", "+00:00")).timestamp()
        spans.append((end - r["process_ms"] / 1000, end))
    return spans


class CpuMeter:
    """CPU seconds of a set of processes, sampled until each exits (the last sample of a
    process is its total: psutil cannot read a reaped child)."""

    def __init__(self) -> None:
        self.procs: list[psutil.Process] = []
        self.last: dict[int, float] = {}
        self.base: dict[int, float] = {}

    def add(self, pid: int, from_now: bool = False) -> None:
        """Count ``pid``; with ``from_now`` only what it spends from now on."""
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            self.procs.append(p)
            self.base[pid] = _cpu_of(p) if from_now else 0.0
            self.last[pid] = self.base[pid]

    def sample(self) -> None:
        for p in self.procs:
            with contextlib.suppress(psutil.Error):
                self.last[p.pid] = _cpu_of(p)

    def seconds(self, pid: int | None = None) -> float:
        pids = [pid] if pid is not None else list(self.last)
        return sum(self.last[p] - self.base[p] for p in pids if p in self.last)


def _cpu_of(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


# -- one case ----------------------------------------------------------------------------
def case(zk_hosts: str, *, hosts: int, per_host: int, procs: int, threads: int,
         latency_ms: float, delay: float, tmp: Path, backlog: int | None = None
         ) -> dict[str, Any]:
    """One crawl of ``hosts`` x ``per_host`` pages by ``procs`` consumers; see the module
    docstring for what is measured."""
    site, bases = start_site(latency_ms, max(per_host, 1), hosts=hosts)
    tag = f"owner{procs}-{hosts}h-{uuid.uuid4().hex[:6]}"
    root = f"/bench-hosts-{tag}"
    urls = [f"{bases[h]}/a/{i}.html" for i in range(1, per_host + 1) for h in range(hosts)]
    ports = zk_ports(zk_hosts)
    outs = [tmp / f"{tag}-{i}.jsonl" for i in range(procs)]
    logs = [tmp / f"{tag}-{i}.log" for i in range(procs)]
    try:
        zk = ZkClient(zk_hosts, session_timeout=30).connect()
        offer(zk, root, urls)
        control.set_state(zk, root, control.PAUSED, by="bench")
        children = []
        for i in range(procs):
            with open(logs[i], "wb") as err:
                children.append(subprocess.Popen(
                    [sys.executable, "-m", "zkcrawl.consumer.main", "--zk", zk_hosts, "--root",
                     root,
                     "--id", f"bench-{i}", "--threads", str(threads),
                     "--backlog", str(threads * 2 if backlog is None else backlog),
                     "--out", str(outs[i]),
                     "--exit-when-idle", "2", "--domain-delay", f"{delay:g}",
                     "--no-robots", "--log-format", "json",
                     "--stats-interval", "5", "--allow-private-addresses"],
                    env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=err))
        try:
            _wait_registered(zk, root, procs, children, timeout=60)
            before = zk_counters(ports)
            control.set_state(zk, root, control.RUNNING, by="bench")
        finally:
            zk.close()
        probe = Probe(children, outs)
        after, cpu_s = _run(probe, len(urls), ports,
                            timeout=60 + per_host * delay * 3 + len(urls) * latency_ms / 1000)
        stats = requests.get(f"{bases[0]}/stats", timeout=10).json()
    finally:
        stop_benchsite(site)
    recs = _read_lines(outs)
    spans = record_spans(recs)
    pages = len(spans)
    seconds = (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else 0.0
    rate = pages / seconds if seconds > 0 else 0.0
    thread_bound = procs * threads / (latency_ms / 1000)
    host_bound = hosts / delay if delay > 0 else float("inf")
    # the edge of a finite run: one host's pages are (per_host - 1) gaps apart at least
    floor_s = max(len(urls) / thread_bound, (per_host - 1) * delay + latency_ms / 1000)
    attainable = len(urls) / floor_s
    gaps = [g for g in stats["host_min_gap_s"].values() if g is not None]
    first_polite, later_polite = _polite(recs)
    return {
        "consumers": procs, "hosts": hosts, "per_host": per_host,
        "pages": pages, "expected": len(urls), "unique_urls": len({r["url"] for r in recs}),
        "errors": sum(1 for r in recs if r.get("error")),
        "exit_codes": [c.returncode for c in children],
        "seconds": round(seconds, 3), "pages_per_s": round(rate, 1),
        "attainable_pages_per_s": round(attainable, 1),
        "pct_attainable": round(100 * rate / attainable, 1) if attainable else None,
        "bound_threads_per_s": round(thread_bound, 1),
        "bound_hosts_per_s": round(host_bound, 1),
        "server_requests": stats["requests"],
        "server_connections": stats["connections"],
        "min_gap_s": round(min(gaps), 4) if gaps else None,
        "hosts_below_delay": sum(1 for g in gaps if g < delay),
        # how long pages waited in a consumer for their host's turn -- the table's places a
        # host in its gap holds -- each host's first apart (on a fresh root it waits for
        # nothing: its partition's first owner, Ownership.not_before)
        "polite_ms_p50": _percentile(later_polite, 50),
        "polite_ms_p90": _percentile(later_polite, 90),
        "polite_ms_first_p90": _percentile(first_polite, 90),  # each host's first
        "cpu_ms_per_page": round(cpu_s * 1000 / (pages - 1), 3) if pages > 1 else None,
        "zk": per_page(before, after, pages)}


def _polite(recs: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """``polite_ms`` of each host's first record (by ``fetched_at``), and of the others."""
    seen: set[str] = set()
    first: list[float] = []
    later: list[float] = []
    for r in sorted(recs, key=lambda r: str(r.get("fetched_at"))):
        host = urlsplit(str(r.get("url"))).netloc
        (later if host in seen else first).append(float(r.get("polite_ms") or 0.0))
        seen.add(host)
    return first, later


def _percentile(values: list[float], pct: int) -> float | None:
    """The ``pct``-th percentile of ``values`` (nearest rank), None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))],
                 1)


def offer(zk: ZkClient, root: str, urls: list[str]) -> None:
    """Queue ``urls`` as the producer does: straight into their partitions, in batches
    (:class:`~zkcrawl.queue.partition_queue.PartitionQueue` with the root's P). The ingress
    ``<root>/queue``, which other clients write and the owner of partition 0 moves, is
    ``bench frontier``'s and the tests' business: here it would time the mover."""
    pq = PartitionQueue(zk, root, recorded_partitions(zk, root))
    now = time.time()  # stamped as the producer stamps them: the claim serves oldest first
    pq.offer(Item(url=u, producer="bench", enqueued_at=now) for u in urls)


def _run(probe: Probe, expected: int, ports: list[int], timeout: float
         ) -> tuple[dict[str, float] | None, float]:
    """Sample the consumers until they exit; returns ZooKeeper's counters when the last page
    is in (the idle seconds before the consumers exit are not counted) and the consumers' CPU
    seconds from the first page to the last (a consumer that exited keeps its last sample)."""
    deadline = time.monotonic() + timeout
    after = None
    meter = CpuMeter()
    for p in probe.procs:
        meter.add(p.pid)
    pages_seen, cpu_first, cpu_last = 0, None, 0.0
    while time.monotonic() < deadline:
        meter.sample()
        pages = probe.sample()
        if pages and cpu_first is None:
            cpu_first = meter.seconds()
        if pages > pages_seen:
            pages_seen, cpu_last = pages, meter.seconds()
        if pages >= expected and after is None:
            after = zk_counters(ports)
        if all(p.poll() is not None for p in probe.procs):
            break
        time.sleep(SAMPLE_S)  # sampling period; the loop is bounded by ``timeout``
    for p in probe.procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    cpu = cpu_last - cpu_first if cpu_first is not None else 0.0
    return (after if after is not None else zk_counters(ports)), cpu


# -- the bench -----------------------------------------------------------------------------
def run_bench(zk_hosts: str | None, hosts: int = 500, per_host: int = 10, threads: int = 32,
              latency_ms: float = 50, delay: float = 1.0, contention_pages: int = 60, *,
              consumers: int = 4, backlog: int | None = None) -> dict[str, Any]:
    """The three cases in one run (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-hosts-") as name:
        tmp = Path(name)
        with zookeeper(zk_hosts, tmp, heap_mb=HOSTS_HEAP_MB) as (zkh, _server):
            out: dict[str, Any] = {"hosts": hosts, "per_host": per_host, "threads": threads,
                                   "latency_ms": latency_ms, "delay": delay,
                                   "cpus": os.cpu_count(),
                                   "load_avg_1m": round(os.getloadavg()[0], 2)}
            common: dict[str, Any] = {"threads": threads, "latency_ms": latency_ms,
                                      "delay": delay, "tmp": tmp, "backlog": backlog}
            out["backlog"] = threads * 2 if backlog is None else backlog
            out["consumers"] = consumers
            for key, procs in (("owner_1", 1), (f"owner_{consumers}", consumers)):
                out[key] = case(zkh, hosts=hosts, per_host=per_host, procs=procs, **common)
            out["contention"] = case(zkh, hosts=CONTENTION_HOSTS,
                                     per_host=max(2, contention_pages // CONTENTION_HOSTS),
                                     procs=4, **common)
    out["ratios"] = _ratios(out)
    return out


def _ratios(out: dict[str, Any]) -> dict[str, float | None]:
    def r(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    c = out["contention"]
    ideal = CONTENTION_HOSTS / out["delay"] if out["delay"] else 0.0
    many = _many_key(out)
    return {"owner_1_vs_attainable": r(out["owner_1"]["pages_per_s"],
                                       out["owner_1"]["attainable_pages_per_s"]),
            f"{many}_vs_attainable": r(out[many]["pages_per_s"],
                                       out[many]["attainable_pages_per_s"]),
            f"{many}_vs_owner_1": r(out[many]["pages_per_s"],
                                    out["owner_1"]["pages_per_s"]),
            "contention_vs_hosts_per_delay": r(c["pages_per_s"], ideal)}


def _many_key(out: dict[str, Any]) -> str:
    """The many-consumer case's key: ``owner_N`` for ``--consumers N`` (default 4)."""
    return f"owner_{out.get('consumers', 4)}"


def render(out: dict[str, Any]) -> str:
    """A table for humans (``--json`` prints the dict instead)."""
    lines = [f"bench hosts: {out['hosts']} hosts x {out['per_host']} pages, "
             f"{out['latency_ms']:g} ms per page, --domain-delay {out['delay']:g}, "
             f"{out['threads']} threads per consumer, {out['cpus']} CPUs, "
             f"--backlog {out.get('backlog', out['threads'] * 2)}, "
             f"load {out['load_avg_1m']}",
             f"{'case':<11}{'pages/s':>9}{'attain.':>9}{'%':>7}{'min gap s':>11}"
             f"{'<delay':>8}{'CPU ms/pg':>11}{'ZK req/pg':>11}{'writes/pg':>11}"
             f"{'polite p50/p90 ms':>19}"]
    for key in dict.fromkeys(("owner_1", _many_key(out), "contention")):
        c = out[key]
        zk = c["zk"] or {}
        lines.append(f"{key:<11}{c['pages_per_s']:>9}{c['attainable_pages_per_s']:>9}"
                     f"{c['pct_attainable']:>7}{_s(c['min_gap_s']):>11}"
                     f"{c['hosts_below_delay']:>8}{_s(c['cpu_ms_per_page']):>11}"
                     f"{_s(zk.get('requests_per_page')):>11}{_s(zk.get('writes_per_page')):>11}"
                     f"{_s(c.get('polite_ms_p50')) + ' / ' + _s(c.get('polite_ms_p90')):>19}")
    lines.append("ratios: " + ", ".join(f"{k}={v}" for k, v in out["ratios"].items()))
    return "\n".join(lines)


def _s(v: object) -> str:
    return "-" if v is None else str(v)


# -- the ensemble's ceiling ------------------------------------------------------------------
def run_ensemble(n: int = 20_000, procs: tuple[int, ...] = (1, 2, 4)) -> dict[str, Any]:
    """At-least-once drains of ``n`` items by 1, 2 and 4 processes on a 3-node ensemble on
    loopback (full JIT, like the benches' standalone server), with the ensemble's write rate:
    the leader's proposals per second over each drain, and the CPU of the three servers."""
    from zkcrawl.bench.drain import bench_procs

    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-ensemble-") as name:
        ens = Ensemble(name, 3)
        for s in ens.servers:
            s.quick_jit, s.heap_mb = False, 512
        ens.start(wait=90)
        zk = ZkClient(ens.hosts, session_timeout=30)
        try:
            zk.connect()
            ports = [s.port for s in ens.servers]
            pids = [psutil.Process(s.proc.pid) for s in ens.servers if s.proc is not None]
            out: dict[str, Any] = {"n": n, "servers": 3, "cpus": os.cpu_count(),
                                   "load_avg_1m": round(os.getloadavg()[0], 2)}
            bench_procs(zk, min(n, 2000), 1)  # warm-up: the servers' JIT
            for p in procs:
                before, cpu0, t0 = zk_counters(ports), _cpu(pids), time.monotonic()
                res = bench_procs(zk, n, p)
                after, cpu1, t1 = zk_counters(ports), _cpu(pids), time.monotonic()
                span = res["items"] / res["items_per_s"] if res["items_per_s"] else 0.0
                if before and after:
                    # filling the queue and cleaning up are writes too; the rate is over the
                    # whole case, the count per item over the drained items
                    res["proposals_per_item"] = round(
                        (after["proposals"] - before["proposals"]) / max(res["items"], 1), 3)
                    res["writes_per_s_during_drain"] = round(
                        res["items_per_s"] * (after["writes"] - before["writes"])
                        / max(res["items"], 1), 1)
                res["zk_cpu_s"] = round(cpu1 - cpu0, 2)
                res["case_s"] = round(t1 - t0, 2)
                res["drain_s"] = round(span, 2)
                out[f"alo_{p}proc"] = res
        finally:
            zk.close()
            ens.stop()
    return out


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def render_ensemble(out: dict[str, Any]) -> str:
    lines = [f"bench ensemble: 3 servers on loopback, N={out['n']}, {out['cpus']} CPUs, "
             f"load {out['load_avg_1m']}",
             f"{'case':<10}{'items/s':>10}{'writes/s':>10}{'props/item':>12}{'ZK CPU s':>10}"
             f"{'wasted/item':>13}"]
    for key in sorted(k for k in out if k.startswith("alo_")):
        c = out[key]
        lines.append(f"{key:<10}{c['items_per_s']:>10}{_s(c.get('writes_per_s_during_drain')):>10}"
                     f"{_s(c.get('proposals_per_item')):>12}{c['zk_cpu_s']:>10}"
                     f"{_s(c.get('wasted_requests_per_item')):>13}")
    return "\n".join(lines)
