"""Issue #26, item 5: a calm console, read as a person reads it -- a real consumer process
on a real pty (80 columns), a real ZooKeeper (one of its own, stopped and started again for
the outage), a real HTTP server: the start-up banner, a progress line that fits the width,
no stats blocks under it, ``consumer.idle`` said once per idle spell, ``[suspended Ns]``
while ZooKeeper is away and kazoo's reconnect lines folded into zkcrawl's."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.httpd import TestServer, delayed, html
from tests.test_consumer_support import ROOT, offer, records
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.zk.client import ZkClient

pytestmark = pytest.mark.slow
_SPLIT = re.compile(r"\r\x1b\[K|\r?\n")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class Screen:
    """A consumer on a pty of ``columns`` columns; what it wrote, read as it comes."""

    def __init__(self, argv: Sequence[str], columns: int = 80) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm", "COLUMNS": "300"}
        self.proc = subprocess.Popen([sys.executable, "-m", "zkcrawl.consumer.main", *argv],
                                     cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        self.master = master
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if not ready:
                if self.proc.poll() is not None:
                    return
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the other side is closed
                return
            if not data:
                return
            with self._lock:
                self._chunks.append(data)

    @property
    def text(self) -> str:
        with self._lock:
            raw = b"".join(self._chunks)
        return _ANSI.sub("", raw.decode("utf-8", "replace"))

    def wait(self, pattern: str, timeout: float = 30.0, count: int = 1) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(re.findall(pattern, self.text)) >= count:
                return self.text
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)  # polling a growing buffer, bounded by the deadline
        raise AssertionError(f"{pattern!r} x{count} not on the screen:\n{self.text}")

    def finish(self, timeout: float = 30.0) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            self._reader.join(5)
            os.close(self.master)
        return code

    def progress_lines(self) -> list[str]:
        return [x for x in _SPLIT.split(self.text) if re.match(r"\[(running|suspended)", x)]


def argv(zk_hosts: str, zk_root: str, out: Path, *extra: str) -> list[str]:
    return ["--zk", zk_hosts, "--root", zk_root, "--out", str(out), "--no-robots",
            "--allow-private-addresses", "--threads", "2", *extra]


def test_banner_width_calm_stats_and_idle_once(zk, zk_hosts, zk_root, tmp_path):
    with TestServer({"/p/*": delayed(0.02, html("<title>p</title>"))}) as srv:
        out = tmp_path / "o.jsonl"
        screen = Screen(argv(zk_hosts, zk_root, out, "--stats-interval", "0.3",
                             "--exit-when-idle", "2.5", "--session-timeout", "4",
                             "--domain-delay", "0.05"))
        screen.wait(r"consumer\.idle ")  # nothing queued yet: said once
        offer(zk, zk_root, [srv.url(f"/p/{i}") for i in range(20)])
        screen.wait(r"consumer\.idle ", count=2)  # worked, then idle again: said again
        assert screen.finish(60) == 0
    text = screen.text
    assert len(records(out)) == 20
    # The banner: what it runs with, before anything else.
    banner = text[text.index("starting"):text.index("consumer.idle")]
    for label, value in [("ZooKeeper", zk_hosts), ("root", zk_root),
                         ("threads", "2, backlog 256, at-least-once"),
                         ("politeness", "--domain-delay 0.05s"),
                         ("robots.txt", "ignored (--no-robots)"),
                         ("addresses", "private addresses allowed"), ("out", str(out)),
                         ("processors", "default: title"), ("pipelines", "none")]:
        assert re.search(rf"^  {re.escape(label)} +.*{re.escape(value)}", banner, re.M), banner
    # Every idle interval (2.5 s of 0.3 s intervals at the end) said idle twice in all.
    assert len(re.findall(r"consumer\.idle ", text)) == 2, text
    assert "consumer.stats" not in text  # under a minute, no stats lines under the line
    lines = screen.progress_lines()
    assert lines and all(len(x) <= 79 for x in lines), [x for x in lines if len(x) > 79]
    assert any(re.match(r"\[running\] [\d.]+ items/s · ok 20 · failed 0", x) for x in lines)


def test_suspended_while_zookeeper_is_away_and_kazoo_folded(tmp_path):
    server = ZkServer(tmp_path / "zk", quick_jit=True).start(wait=60)
    screen: Screen | None = None
    try:
        with TestServer({"/p/*": html("<title>p</title>")}) as srv:
            with ZkClient(server.hosts, zk_timeout=10.0).connect() as zk:
                offer(zk, "/diag", [srv.url("/p/0")])
            out = tmp_path / "o.jsonl"
            screen = Screen(argv(server.hosts, "/diag", out, "--session-timeout", "30",
                                 "--domain-delay", "0"), columns=120)
            screen.wait(r"ok 1 ")
            server.stop()
            screen.wait(r"\[suspended \d+s\]")
            screen.wait(r"\[suspended [2-9]s\]")  # counting while it is away
            server.start(wait=60)
            screen.wait(r"zk\.reconnected")
            screen.wait(r"\[running\]", count=len(re.findall(r"\[running\]", screen.text)) + 1)
            screen.proc.send_signal(signal.SIGTERM)
            assert screen.finish(60) == 0
    finally:
        if screen is not None and screen.proc.poll() is None:
            screen.proc.kill()
        server.stop()
    text = screen.text
    assert re.search(r"zk\.suspended .*kazoo='?Connection dropped", text), text
    assert re.search(r"zk\.reconnected .*kazoo_lines=\d+", text), text
    # kazoo's own lines are folded: none of them is a line of its own.
    for chatter in ("Connection dropped", "Transition to CONNECTING", "Connection time-out"):
        assert not [x for x in _SPLIT.split(text) if chatter in x and "zk." not in x], text
