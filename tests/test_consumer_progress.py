"""A consumer you can watch: real consumer processes against a real ZooKeeper and a real
HTTP server. On a terminal (a real pty) one refreshing progress line and a closing summary,
no per-item lines; in JSON logs the periodic ``consumer.stats`` and the closing
``consumer.summary`` whatever ``--log-level``, per-item events at debug only."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.httpd import TestServer, delayed, html
from tests.test_consumer_support import ROOT, offer, records, spawn


def consumer_argv(zk_hosts: str, zk_root: str, out: Path, *extra: str) -> list[str]:
    return ["--zk", zk_hosts, "--root", zk_root, "--out", str(out), "--no-robots",
            "--allow-private-addresses", "--exit-when-idle", "1", "--session-timeout", "4",
            *extra]


def read_pty(master: int, proc: subprocess.Popen[bytes], timeout: float) -> str:
    """Everything the process writes to the terminal until it exits (bounded)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    else:
        proc.kill()
        raise AssertionError("the consumer did not exit in time")
    return b"".join(chunks).decode("utf-8", "replace")


def test_a_terminal_gets_a_progress_line_and_a_summary(zk, zk_hosts, zk_root, tmp_path):
    with TestServer({"/p/*": delayed(0.01, html("<title>p</title>"))}) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(12)]
        offer(zk, zk_root, urls)
        out = tmp_path / "o.jsonl"
        master, slave = pty.openpty()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "zkcrawl.consumer.main",
             *consumer_argv(zk_hosts, zk_root, out, "--threads", "2", "--domain-delay",
                            "0.2")],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=slave)
        os.close(slave)
        try:
            screen = read_pty(master, proc, 60)
            assert proc.wait(10) == 0
        finally:
            os.close(master)
    assert len(records(out)) == len(urls)
    # The line is redrawn in place (erase, carriage return) and says what the SPEC asks.
    lines = [x for x in re.split(r"\r\x1b\[K|\r?\n", screen) if x.startswith("[running]")]
    assert len(lines) >= 2, screen
    assert re.search(r"\[running\] [\d.]+ items/s · ok \d+ · failed 0 · in flight \d+ · "
                     r"backlog \d+ · pace: \w+", lines[-1]), lines[-1]
    assert "pace: politeness" in screen  # one host, 0.2 s apart: items wait for their turn
    assert "item.done" not in screen  # per-item events are debug
    summary = screen[screen.index("stopped"):]
    assert re.search(r"processed\s+12\s+\(ok 12, failed 0\)", summary), summary
    assert "politeness sets the pace" in summary


def test_json_logs_keep_stats_and_summary_at_any_level(zk, zk_hosts, zk_root, tmp_path):
    with TestServer({"/p/*": delayed(0.05, html("<title>p</title>"))}) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(20)] + [srv.url("/missing")]
        offer(zk, zk_root, urls)
        out, err = tmp_path / "o.jsonl", tmp_path / "err.log"
        proc = spawn(consumer_argv(zk_hosts, zk_root, out, "--log-format", "json",
                                   "--log-level", "warning", "--stats-interval", "0.5",
                                   "--threads", "2", "--domain-delay", "0"), err)
        assert proc.wait(60) == 0
    events = [json.loads(x) for x in err.read_text().splitlines() if x.startswith("{")]
    names = [e["event"] for e in events]
    assert "consumer.stats" in names  # --log-level warning no longer silences them
    assert not {"item.done", "item.failed", "consumer.started"} & set(names)
    [summary] = [e for e in events if e["event"] == "consumer.summary"]
    assert summary["processed"] == 21 and summary["failed"] == 1
    # 21 items claimed at once by 2 threads: they wait for a thread.
    assert summary["errors"] == {"http-404": 1} and summary["pace"] == "pool"
    stats = [e for e in events if e["event"] == "consumer.stats"]
    assert all(e["level"] == "info" and "pace" in e and "verdict" in e for e in stats)
    assert len(records(out)) == 21
