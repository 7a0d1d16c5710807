"""Soak: 50,000 items through a producer (back-pressure at --max-depth) and 4 consumer
processes on a fast local site, no fault: 0 lost, 0 duplicates, nothing left in ZooKeeper,
and no leak -- each consumer's RSS and the server's watch count (``mntr``
``zk_watch_count``: a ZooKeeper of the test's own, so only these clients count) are the same
once warm and at the end. Prints a ``FIGURE`` line (``pytest -s``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.faults.books import check_books
from tests.faults.conftest import no_traceback
from tests.test_consumer_support import ROOT
from zkcrawl.admin.localzk import ZkServer, four_letter
from zkcrawl.bench.site import start_benchsite, stop_benchsite
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS
from zkcrawl.zk.client import ZkClient

pytestmark = [pytest.mark.faults, pytest.mark.slow]

ITEMS, CONSUMERS = 50_000, 4


@pytest.fixture
def soak_zk(tmp_path: Path) -> Iterator[ZkServer]:
    server = ZkServer(tmp_path / "zk", quick_jit=True).start(wait=60)
    yield server
    server.stop()


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def watches(port: int) -> int:
    for line in four_letter(port, "mntr").splitlines():
        if line.startswith("zk_watch_count"):
            return int(line.split()[1])
    return -1


def lines(paths: list[Path]) -> int:
    n = 0
    for p in paths:
        try:
            with open(p, "rb") as fh:
                n += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
        except OSError:
            pass
    return n


@dataclass
class Sample:
    done: int
    rss: list[float]
    watches: int


@dataclass
class Sampler:
    """Samples progress, RSS and watches every ``interval`` s on a thread of its own."""

    port: int
    pids: list[int]
    outs: list[Path]
    interval: float = 0.5
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = [rss_mb(p) for p in self.pids]
            if not all(rss):
                continue  # a consumer exiting: no sample
            self.samples.append(Sample(lines(self.outs), rss, watches(self.port)))

    def stop(self) -> None:
        self._stop.set()


def test_soak_50k_items_4_consumers(soak_zk, tmp_path):
    site, base = start_benchsite(latency_ms=2, articles=ITEMS)
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = ["--zk", soak_zk.hosts, "--root", "/soak", "--log-format", "json",
              "--allow-private-addresses", "--session-timeout", "10"]
    urls = [f"{base}/a/{i}.html" for i in range(1, ITEMS + 1)]
    src = tmp_path / "urls.txt"
    src.write_text("\n".join(urls) + "\n")
    outs = [tmp_path / f"c{i}.jsonl" for i in range(CONSUMERS)]
    errs = [tmp_path / f"c{i}.err" for i in range(CONSUMERS)]
    try:
        t0 = time.monotonic()
        perr = tmp_path / "producer.err"
        with open(perr, "wb") as fh:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "zkcrawl.producer.main", *common, "--from-file", str(src),
                 "--seen", str(tmp_path / "seen"), "--max-depth", "10000", "--batch", "200"],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=fh))
        for i in range(CONSUMERS):
            with open(errs[i], "wb") as fh:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "zkcrawl.consumer.main", *common, "--id", f"c{i}",
                     "--out", str(outs[i]), "--no-robots", "--domain-delay", "0",
                     "--threads", "16", "--exit-when-idle", "3"],
                    cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=fh))
        sampler = Sampler(soak_zk.port, [p.pid for p in procs[1:]], outs)
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        try:
            assert procs[0].wait(300) == 0, perr.read_text()[-3000:]
            for proc in procs[1:]:
                assert proc.wait(300) == 0
        finally:
            sampler.stop()
            thread.join(5)
        elapsed = time.monotonic() - t0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        stop_benchsite(site)
    zk = ZkClient(soak_zk.hosts, zk_timeout=30).connect()
    try:
        books = check_books(zk, "/soak", urls, outs)
        assert books.extra == 0 and books.dead == 0  # no fault: exactly once
    finally:
        zk.close()
    no_traceback(perr, *errs)
    # Flat: from the first sample past 20 % of the items (warm: pools, caches) to the last
    # one past 80 % while still crawling, per consumer.
    warm = [s for s in sampler.samples if ITEMS // 5 <= s.done < ITEMS]
    late = [s for s in warm if s.done >= ITEMS * 4 // 5]
    assert warm and late, [s.done for s in sampler.samples]
    first, last = warm[0], late[-1]
    growth = [round(b - a, 1) for a, b in zip(first.rss, last.rss, strict=True)]
    assert max(growth) < 8.0, (first.rss, last.rss)  # MB; a leak of 100 B/item is 5 MB
    # Watches come and go as owners list their partitions with one (per partition: its
    # children for its owner, its owner node for a consumer waiting to take it, the
    # partition node; plus control, the ingress and the members per consumer); a leak would
    # pass that bound within the first thousands of items.
    bound = 3 * DEFAULT_PARTITIONS + 3 * CONSUMERS
    crawling = [s.watches for s in warm]
    assert all(0 < w <= bound for w in crawling), crawling
    # Idle at the end (all done, waiting to exit): the same bound.
    idle = [s.watches for s in sampler.samples if s.done >= ITEMS]
    assert all(0 < w <= bound for w in idle), idle
    print(f"FIGURE soak: {books.line()}, {elapsed:.0f} s ({ITEMS / elapsed:.0f} items/s), "
          f"RSS MB at {first.done} {[round(r, 1) for r in first.rss]} and at {last.done} "
          f"{[round(r, 1) for r in last.rss]}, watches while crawling "
          f"{min(crawling)}-{max(crawling)}, idle at the end {idle[-1:] or '-'}")
