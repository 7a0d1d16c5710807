"""``zkcrawl bench rebalance``: hosts have owners, and a consumer joins, then one leaves,
mid-crawl.

One case crawls ``hosts`` x ``per_host`` pages of the synthetic many-host site
(:func:`zkcrawl.bench.site.start_site`) with two consumers; at a third of the pages a third
joins, at two thirds one leaves (SIGTERM in case ``term``, SIGKILL in case ``kill``).
Reported from the records' ``fetched_at`` in 1 s windows: the rate, per event its dip and
``recovery_s`` against a baseline measured in the same run (:func:`recovery`,
:func:`attainable`), the partitions ``moved`` against rendezvous hashing's exact figure,
the books (``missing`` must be 0; duplicates only from a killed consumer) and the smallest
gap between two requests to one host as the server saw them.

Timings depend on the machine and its load: read them, do not assert them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from zkcrawl.bench.crawl import _read_lines, _wait_registered
from zkcrawl.bench.hosts import env, log_events, record_spans, zookeeper
from zkcrawl.bench.site import start_site, stop_benchsite
from zkcrawl.queue import control
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partitions import assign, decode_root, moved
from zkcrawl.zk.client import ZkClient

SAMPLE_S = 0.05
STEADY_S = 5.0  # the steady rate before an event: this many seconds just before it
WARM_S = 2.0  # and not the first seconds after the resume (connections, first turns)
SUSTAIN = 3  # recovered: this many 1 s windows in a row at >= 90 % of the baseline
RECOVERED = 0.9
COST_S = 10  # an event's cost: the pages short of the baseline in this many seconds after it
CASES = ("term", "kill")


# -- the windows -------------------------------------------------------------------------
def rate_series(ends: Sequence[float], t0: float, width: float = 1.0) -> list[int]:
    """Pages ending in each ``width`` window from ``t0`` (the last window may be partial)."""
    if not ends:
        return []
    counts = [0] * (int((max(ends) - t0) // width) + 1)
    for e in ends:
        if e >= t0:
            counts[int((e - t0) // width)] += 1
    return counts


def rate_between(ends: Sequence[float], a: float, b: float) -> float:
    """Pages per second ending within ``[a, b)``."""
    return sum(1 for e in ends if a <= e < b) / (b - a) if b > a else 0.0


def recovery(ends: Sequence[float], event: float, baseline: float, until: float
             ) -> tuple[float | None, float | None]:
    """(recovery_s, dip): the start of the first 1 s window after ``event`` from which
    :data:`SUSTAIN` windows in a row reach ``RECOVERED x baseline`` (None: not before
    ``until``), and the lowest window rate before then (None: no whole window)."""
    need = RECOVERED * baseline
    k, run, dip = 0, 0, None
    while event + k + 1 <= until:
        r = rate_between(ends, event + k, event + k + 1)
        if r >= need:
            run += 1
            if run == SUSTAIN:
                return float(k + 1 - SUSTAIN), dip
        else:
            run = 0
            dip = r if dip is None else min(dip, r)
        k += 1
    return None, dip


def lost_seconds(ends: Sequence[float], event: float, baseline: float, until: float) -> float:
    """What the event cost, in seconds of the baseline rate: the pages short of it in the
    1 s windows of the :data:`COST_S` after ``event`` (not past ``until``), / baseline."""
    if baseline <= 0:
        return 0.0
    short, k = 0.0, 0
    while k < COST_S and event + k + 1 <= until:
        short += max(0.0, baseline - rate_between(ends, event + k, event + k + 1))
        k += 1
    return short / baseline


def below_share(ends: Sequence[float], a: float, b: float) -> float | None:
    """The share of the whole 1 s windows of ``[a, b)`` below 90 % of the rate over it: how
    noisy the recovery criterion is with no event at all."""
    mean, n = rate_between(ends, a, b), int(b - a)
    if n <= 0:
        return None
    low = sum(1 for k in range(n) if rate_between(ends, a + k, a + k + 1) < RECOVERED * mean)
    return low / n


def attainable(consumers: int, threads: int, latency_ms: float, hosts: int, delay: float
               ) -> float:
    return min(consumers * threads / max(latency_ms / 1000, 1e-6), hosts / delay)


# -- one case ----------------------------------------------------------------------------
class _CaseConsumers:
    """The processes of one case: consumers started, stopped, waited for."""

    def __init__(self, zk_hosts: str, root: str, tag: str, tmp: Path, *, threads: int,
                 delay: float, session_timeout: float, partitions: int, backlog: int = 0
                 ) -> None:
        self.zk_hosts, self.root, self.tag, self.tmp = zk_hosts, root, tag, tmp
        self.threads, self.delay = threads, delay
        self.backlog = backlog or threads * 2
        self.session_timeout, self.partitions = session_timeout, partitions
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outs: list[Path] = []
        self.logs: list[Path] = []

    def spawn(self) -> None:
        i = len(self.procs)
        self.outs.append(self.tmp / f"{self.tag}-{i}.jsonl")
        self.logs.append(self.tmp / f"{self.tag}-{i}.log")
        with open(self.logs[i], "wb") as err:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "zkcrawl.consumer.main", "--zk", self.zk_hosts, "--root",
                 self.root, "--id", f"bench-{i}", "--threads", str(self.threads),
                 "--backlog", str(self.backlog), "--out", str(self.outs[i]),
                 "--exit-when-idle", "2", "--domain-delay", f"{self.delay:g}",
                 "--politeness", "owner", "--session-timeout", f"{self.session_timeout:g}",
                 *(["--partitions", str(self.partitions)] if self.partitions else []),
                 "--no-robots", "--log-format", "json", "--stats-interval", "5",
                 "--allow-private-addresses"],
                env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err))

    def pages(self) -> int:
        n = 0
        for path in self.outs:
            with contextlib.suppress(OSError), open(path, "rb") as fh:
                n += fh.read().count(b"\n")
        return n

    def finish(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _members(zk: ZkClient, root: str) -> int:
    path = Layout.of(root).consumers
    return len(zk.get_children(path)) if zk.exists(path) else 0


def _wait_members(zk: ZkClient, root: str, n: int, deadline: float) -> float | None:
    """The wall-clock time the member list first had ``n`` members (None: not by then)."""
    while time.monotonic() < deadline:
        if _members(zk, root) == n:
            return time.time()
        time.sleep(SAMPLE_S)  # polling period; bounded by ``deadline``
    return None


def case(zk_hosts: str, how: str, *, hosts: int, per_host: int, threads: int,
         latency_ms: float, delay: float, session_timeout: float, partitions: int,
         tmp: Path, backlog: int = 0) -> dict[str, Any]:
    """One crawl with a join at 1/3 and a leave (``how``: ``term`` or ``kill``) at 2/3."""
    site, bases = start_site(latency_ms, max(per_host, 1), hosts=hosts)
    tag = f"rebalance-{how}-{uuid.uuid4().hex[:6]}"
    root = f"/bench-{tag}"
    urls = [f"{bases[h]}/a/{i}.html" for i in range(1, per_host + 1) for h in range(hosts)]
    run = _CaseConsumers(zk_hosts, root, tag, tmp, threads=threads, delay=delay,
                         session_timeout=session_timeout, partitions=partitions,
                         backlog=backlog)
    ev: dict[str, float | None] = {}
    timeout = 90 + per_host * delay * 3 + len(urls) * latency_ms / 1000 + 3 * session_timeout
    zk = ZkClient(zk_hosts, session_timeout=30).connect()
    try:
        IngressQueue(zk, root).offer_many(Item(url=u, producer="bench") for u in urls)
        control.set_state(zk, root, control.PAUSED, by="bench")
        run.spawn()
        run.spawn()
        _wait_registered(zk, root, 2, run.procs, timeout=60)
        control.set_state(zk, root, control.RUNNING, by="bench")
        ev["t0"] = time.time()
        _drive(zk, run, len(urls), how, ev, time.monotonic() + timeout)
        stats = requests.get(f"{bases[0]}/stats", timeout=10).json()
        p_recorded, _ = decode_root(zk.get(Layout.of(root).root or "/")[0])
        dead = len(zk.get_children(Layout.of(root).dead)) if zk.exists(
            Layout.of(root).dead) else 0
    finally:
        run.finish()
        zk.close()
        stop_benchsite(site)
    return _report(how, run, urls, ev, stats, p_recorded or 0, dead, threads=threads,
                   latency_ms=latency_ms, hosts=hosts, per_host=per_host, delay=delay,
                   session_timeout=session_timeout)


def _drive(zk: ZkClient, run: _CaseConsumers, expected: int, how: str, ev: dict[str, float | None],
           deadline: float) -> None:
    """Join at 1/3 of the pages, leave at 2/3 (once the joiner is a member), then wait for
    every consumer to exit (bounded by ``deadline``)."""
    while time.monotonic() < deadline:
        pages = run.pages()
        if "join_launch" not in ev and pages >= expected / 3:
            ev["join_launch"] = time.time()
            run.spawn()
            ev["join"] = _wait_members(zk, run.root, 3, min(deadline, time.monotonic() + 60))
            continue
        if "leave" not in ev and ev.get("join") is not None and pages >= 2 * expected / 3:
            ev["leave"] = time.time()
            run.procs[0].send_signal(signal.SIGTERM if how == "term" else signal.SIGKILL)
            ev["left"] = _wait_members(zk, run.root, 2,
                                       min(deadline, time.monotonic() + 3 * 30))
            continue
        if all(p.poll() is not None for p in run.procs):
            return
        time.sleep(SAMPLE_S)  # sampling period; the loop is bounded by ``deadline``


def _stamp(rec: dict[str, Any]) -> float:
    try:
        return datetime.fromisoformat(str(rec["timestamp"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return 0.0


def _moved_by_logs(run: _CaseConsumers, ev: dict[str, float | None]) -> dict[str, int]:
    """Partitions gained and lost per event, from the ``ownership.changed`` log events:
    at the join, those logged between the launch and the leave; at the leave, the
    survivors' after it (with 2 members: not those of consumers exiting at the end)."""
    changes = [(i, e) for i, log in enumerate(run.logs)
               for e in log_events([log], "ownership.changed")]
    out = {"join_gained": 0, "join_lost": 0, "leave_gained": 0, "leave_lost": 0}
    join, leave = ev.get("join_launch"), ev.get("leave")
    for i, e in changes:
        t = _stamp(e)
        members = e.get("members")
        if (join is not None and t >= join and (leave is None or t < leave)
                and members == 3):
            out["join_gained"] += int(e.get("gained", 0))
            out["join_lost"] += int(e.get("lost", 0))
        elif leave is not None and t >= leave and i != 0 and members == 2:
            out["leave_gained"] += int(e.get("gained", 0))
            out["leave_lost"] += int(e.get("lost", 0))
    return out


def _report(how: str, run: _CaseConsumers, urls: list[str], ev: dict[str, float | None],
            stats: dict[str, Any], p: int, dead: int, *, threads: int, latency_ms: float,
            hosts: int, per_host: int, delay: float, session_timeout: float
            ) -> dict[str, Any]:
    recs_by = [_read_lines([o]) for o in run.outs]
    recs = [r for rs in recs_by for r in rs]
    ends = sorted(e for _, e in record_spans(recs))
    t0 = ev["t0"] or 0.0
    counts = Counter(r["url"] for r in recs)
    offered = set(urls)
    dups = {u for u, n in counts.items() if n > 1}
    killed_urls = {r["url"] for r in recs_by[0]}
    a2 = attainable(2, threads, latency_ms, hosts, delay)
    a3 = attainable(3, threads, latency_ms, hosts, delay)
    last = ends[-1] if ends else t0
    events: dict[str, Any] = {}
    before2 = None
    join, leave = ev.get("join"), ev.get("leave")
    if join is not None:
        before2 = rate_between(ends, max(t0 + WARM_S, join - STEADY_S), join)
        base = before2 * a3 / a2
        until = leave if leave is not None else last
        rec_s, dip = recovery(ends, join, base, until)
        events["join"] = _event(join - t0, before2, base, rec_s, dip, members=3,
                                lost_s=lost_seconds(ends, join, base, until),
                                launched_at_s=(ev["join_launch"] or join) - t0)
    if leave is not None and before2 is not None:
        steady3 = rate_between(ends, max(leave - STEADY_S, join or t0), leave)
        rec_s, dip = recovery(ends, leave, before2, last)
        left = ev.get("left")
        events["leave"] = _event(leave - t0, steady3, before2, rec_s, dip, members=2,
                                 lost_s=lost_seconds(ends, leave, before2, last),
                                 member_gone_after_s=None if left is None else
                                 round(left - leave, 2))
    ids = [f"bench-{i}" for i in range(3)]
    logged = _moved_by_logs(run, ev)
    if p:
        exact_join = moved(assign(p, ids[:2]), assign(p, ids))
        exact_leave = moved(assign(p, ids), assign(p, ids[1:]))
        if "join" in events:
            events["join"].update(moved=logged["join_gained"], lost=logged["join_lost"],
                                  p_over_n=round(p / 3, 1), rendezvous=exact_join)
        if "leave" in events:
            events["leave"].update(moved=logged["leave_gained"], lost=logged["leave_lost"],
                                   p_over_n=round(p / 3, 1), rendezvous=exact_leave)
    gaps = [g for g in stats["host_min_gap_s"].values() if g is not None]
    return {
        "case": how, "partitions": p, "session_timeout_s": session_timeout,
        "expected": len(urls), "records": len(recs), "unique_urls": len(counts),
        "missing": len(offered - counts.keys()), "extra": len(counts.keys() - offered),
        "duplicates": sum(n - 1 for n in counts.values()),
        "dups_not_from_killed": len(dups - killed_urls) if how == "kill" else None,
        "errors": sum(1 for r in recs if r.get("error")), "dead_letters": dead,
        "exit_codes": [c.returncode for c in run.procs],
        "seconds": round(last - t0, 2),
        "attainable_2": round(a2, 1), "attainable_3": round(a3, 1),
        "server_requests": stats["requests"],
        "min_gap_s": round(min(gaps), 4) if gaps else None,
        "hosts_below_delay": sum(1 for g in gaps if g < delay),
        "steady_windows_below_90pct": None if join is None else _r(
            below_share(ends, t0 + WARM_S, join)),
        "events": events, "rate_per_s": rate_series(ends, t0)}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def _event(at_s: float, steady: float, baseline: float, rec_s: float | None,
           dip: float | None, **extra: Any) -> dict[str, Any]:
    return {"at_s": round(at_s, 2), "steady_before": round(steady, 1),
            "baseline": round(baseline, 1), "dip": None if dip is None else round(dip, 1),
            "recovery_s": rec_s, **{k: round(v, 2) if isinstance(v, float) else v
                                    for k, v in extra.items()}}


# -- the bench -----------------------------------------------------------------------------
def run_bench(zk_hosts: str | None, *, hosts: int = 300, per_host: int = 45, threads: int = 32,
              latency_ms: float = 50, delay: float = 1.0, session_timeout: float = 4.0,
              partitions: int = 0, cases: Sequence[str] = CASES, backlog: int = 0
              ) -> dict[str, Any]:
    """The cases in one run (module docstring); ``backlog``: each consumer's --backlog (0:
    twice --threads)."""
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-rebalance-") as name:
        tmp = Path(name)
        with zookeeper(zk_hosts, tmp) as (zkh, _server):
            out: dict[str, Any] = {"hosts": hosts, "per_host": per_host, "threads": threads,
                                   "backlog": backlog or threads * 2,
                                   "latency_ms": latency_ms, "delay": delay,
                                   "session_timeout_s": session_timeout,
                                   "cpus": os.cpu_count(),
                                   "load_avg_1m": round(os.getloadavg()[0], 2)}
            for how in cases:
                out[how] = case(zkh, how, hosts=hosts, per_host=per_host, threads=threads,
                                latency_ms=latency_ms, delay=delay,
                                session_timeout=session_timeout, partitions=partitions,
                                tmp=tmp, backlog=backlog)
    return out


def render(out: dict[str, Any]) -> str:
    """A table for humans (``--json`` prints the dict instead)."""
    lines = [f"bench rebalance: {out['hosts']} hosts x {out['per_host']} pages, "
             f"{out['latency_ms']:g} ms per page, --domain-delay {out['delay']:g}, "
             f"{out['threads']} threads per consumer, --session-timeout "
             f"{out['session_timeout_s']:g}, {out['cpus']} CPUs, load {out['load_avg_1m']}",
             "2 consumers; a 3rd joins at 1/3 of the pages; one leaves at 2/3. Rates in "
             "pages/s (1 s windows); recovered: 3 windows in a row >= 90 % of the baseline",
             f"{'case':<6}{'event':<7}{'at s':>6}{'steady':>8}{'baseline':>10}{'dip':>7}"
             f"{'back s':>8}{'lost s':>8}{'moved':>7}{'P/n':>7}{'exact':>7}"]
    for how in CASES:
        c = out.get(how)
        if c is None:
            continue
        for name, e in c["events"].items():
            lines.append(f"{how:<6}{name:<7}{e['at_s']:>6}{e['steady_before']:>8}"
                         f"{e['baseline']:>10}{_s(e['dip']):>7}{_s(e['recovery_s']):>8}"
                         f"{_s(e.get('lost_s')):>8}"
                         f"{_s(e.get('moved')):>7}{_s(e.get('p_over_n')):>7}"
                         f"{_s(e.get('rendezvous')):>7}")
        lines.append(f"{'':<6}books: {c['records']} records of {c['expected']} offered, "
                     f"missing {c['missing']}, duplicates {c['duplicates']}"
                     + (f" (not from the killed one: {c['dups_not_from_killed']})"
                        if c["dups_not_from_killed"] is not None else "")
                     + f", errors {c['errors']}, dead {c['dead_letters']}; P={c['partitions']}"
                     f"; min gap {_s(c['min_gap_s'])} s, {c['hosts_below_delay']} hosts "
                     f"below the delay; {c['seconds']} s; windows below 90 % with no "
                     f"event: {_s(c['steady_windows_below_90pct'])}")
        lines.append(f"{'':<6}pages/s: " + " ".join(str(n) for n in c["rate_per_s"]))
    return "\n".join(lines)


def _s(v: object) -> str:
    return "-" if v is None else str(v)
