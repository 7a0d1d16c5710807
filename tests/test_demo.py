"""`zkcrawl demo` end to end, as an operator runs it: a real subprocess that starts a real
ZooKeeper, the sample site, the producer and two consumers; and Ctrl-C in the middle of it.

Both tests collect every descendant of the demo while it runs (psutil) and check that none
of them is alive afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_for
from zkcrawl.admin.demo import owner_runs
from zkcrawl.admin.samplesite import GBK_ARTICLE, GBK_TITLE, article_path, expected_articles

SRC = str(Path(__file__).resolve().parent.parent)
pytestmark = pytest.mark.slow


class Descendants:
    """Every process below ``pid`` seen while it runs, sampled from a thread."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.seen: dict[int, psutil.Process] = {}
        self.names: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for child in self.root.children(recursive=True):
                    # Re-read the command line: right after fork it is still the parent's.
                    self.seen.setdefault(child.pid, child)
                    self._name(self.seen[child.pid])
            except psutil.NoSuchProcess:
                return
            self._stop.wait(0.05)  # sampling period of the process tree

    def _name(self, p: psutil.Process) -> None:
        try:
            name = " ".join(p.cmdline())
        except psutil.Error:
            return
        if name:  # a zombie's command line is empty: keep what it ran
            self.names[p.pid] = name

    def cmdlines(self) -> list[str]:
        return list(self.names.values())

    def alive(self) -> list[str]:
        self._stop.set()
        self._thread.join(5)
        left = []
        for p in self.seen.values():
            try:  # same pid *and* creation time: not a recycled pid
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        return left


def start_demo(out_dir: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    env = {k: v for k, v in env.items() if not k.startswith("ZKCRAWL_")}
    return subprocess.Popen([sys.executable, "-m", "zkcrawl.cli", "demo", "--out-dir",
                             str(out_dir), "--progress", "lines", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=out_dir.parent)


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"demo did not finish within {timeout}s\n{out}\n{err}") from None


def test_demo_crawls_the_sample_site_and_explains_it(tmp_path: Path):
    out_dir = tmp_path / "zkcrawl-demo"
    t0 = time.monotonic()
    proc = start_demo(out_dir)
    tree = Descendants(proc.pid)
    out, err = finish(proc, 120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, f"{out}\n{err}"
    assert elapsed < 60, f"the demo took {elapsed:.0f}s"
    assert tree.alive() == []
    names = " ".join(tree.cmdlines())
    assert "zkcrawl.producer.main" in names and names.count("zkcrawl.consumer.main") == 2
    assert "ZooKeeperServerMain" in names and "zkcrawl.admin.samplesite" in names

    records = [json.loads(line) for line in (out_dir / "results.jsonl").open()]
    base = records[0]["url"].split("/blog/")[0]
    expected = expected_articles(base)
    got = {r["url"]: r["error"] or "ok" for r in records}
    assert got == expected  # every item once, each with the right outcome
    assert len(records) == len(expected)
    by_url = {r["url"]: r for r in records}
    assert by_url[base + article_path(GBK_ARTICLE)]["title"] == GBK_TITLE
    assert by_url[base + article_path(1)]["fields"]["author"]
    # One host: one owner at a time (SPEC §2). Who it is is rendezvous hashing's choice; the
    # owner changes at most once (when the second consumer joined), never back and forth.
    runs = owner_runs(records)
    assert {c for c, _ in runs} <= {"consumer-1", "consumer-2"} and 1 <= len(runs) <= 2, runs
    assert all(r["dispatch_ms"] is not None and r["process_ms"] is not None for r in records)

    html = (out_dir / "report.html").read_text()
    assert 'data-chart="hist-process_ms"' in html and 'data-chart="throughput-all"' in html
    for log in ("producer", "consumer-1", "consumer-2", "zookeeper", "site"):
        assert (out_dir / "logs" / f"{log}.log").exists()

    assert f"{len(expected)} items crawled" in out
    for needle in ("Outcomes", "http-404", "robots", "content-type", "dispatch", "p95",
                   "Results    zkcrawl-demo/results.jsonl", "zkcrawl-demo/report.html",
                   "zkcrawl-consumer --out", "zkcrawl-producer --start", "offered 43 items",
                   "Owners     one host here, so one owner at a time: consumer-",
                   "with more hosts their partitions spread over the consumers"):
        assert needle in out, needle
    assert " then ".join(f"{c} ({n})" for c, n in runs) in out  # the summary says who
    assert "Traceback" not in err and "demo: crawling" in err


def test_ctrl_c_mid_crawl_leaves_no_process_behind(tmp_path: Path):
    out_dir = tmp_path / "interrupted"
    proc = start_demo(out_dir, "--domain-delay", "0.5")  # slow enough to be mid-crawl
    tree = Descendants(proc.pid)
    try:
        wait_for(lambda: " ".join(tree.cmdlines()).count("zkcrawl.consumer.main") == 2
                 and (out_dir / "parts" / "consumer-1.jsonl").exists(), 60,
                 "both consumers crawling")
    finally:
        proc.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C delivers to the demo
    out, err = finish(proc, 60)
    assert proc.returncode == 1, f"{out}\n{err}"
    assert "interrupted" in err and "Traceback" not in err
    assert tree.alive() == []
    assert not (out_dir / "results.jsonl").exists()
