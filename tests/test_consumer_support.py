"""Shared helpers of the consumer tests (no tests here): run a consumer in-process (a
thread) or as a real process, offer items, read records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zkcrawl.consumer.main import build_parser, open_consumer
from zkcrawl.consumer.settings import ConsumerSettings
from zkcrawl.consumer.sinks import Sink
from zkcrawl.consumer.worker import Worker
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.settings import parse
from zkcrawl.zk.client import ZkClient

ROOT = Path(__file__).resolve().parents[1]


def settings_for(zk_hosts: str, zk_root: str, out: Path, *extra: str) -> ConsumerSettings:
    argv = ["--zk", zk_hosts, "--root", zk_root, "--out", str(out), "--no-robots",
            "--domain-delay", "0", "--log-format", "json", "--session-timeout", "4",
            "--allow-private-addresses", *extra]
    settings, _ = parse(ConsumerSettings, build_parser(), argv, {})
    return settings


class Running:
    """A consumer running on a thread of this process; ``stop()`` is a SIGTERM."""

    def __init__(self, settings: ConsumerSettings, sink: Sink | None = None) -> None:
        self.settings = settings
        self.sink = Sink(settings.out) if sink is None else sink
        self._ctx = open_consumer(settings, self.sink)
        self.worker: Worker = self._ctx.__enter__()
        self.error: BaseException | None = None
        self.status: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.status = self.worker.run()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "consumer did not stop in time"

    def stop(self, timeout: float = 20.0) -> None:
        if self.thread.is_alive():
            self.worker.request_stop()
            self.join(timeout)
        self.close()

    def close(self) -> None:
        self._ctx.__exit__(None, None, None)
        self.sink.close()


def offer(zk: ZkClient, root: str, urls: Sequence[str]) -> list[str]:
    return IngressQueue(zk, root).offer_many(Item(url=u) for u in urls)


def left(zk: ZkClient, root: str) -> list[str]:
    """What is still queued: ingress items, and batch nodes of the partitions (a batch goes
    once every item of it is settled)."""
    layout = Layout.of(root)
    out = zk.get_children(layout.queue) if zk.exists(layout.queue) else []
    if zk.exists(layout.partitions):
        out += [f"{p}/{n}" for p in zk.get_children(layout.partitions)
                for n in zk.get_children(layout.partition(int(p))) if n.startswith("qn-")]
    return out


def records(*paths: Path, strict: bool = True) -> list[dict[str, Any]]:
    """Records of JSON Lines files; ``strict=False`` skips a line cut by a SIGKILL."""
    out = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                if strict:
                    raise
    return out


SPAWNED: list[subprocess.Popen[bytes]] = []  # killed after each test (tests/conftest.py)


def spawn(args: Sequence[str], stderr: Path | int, **kw: Any) -> subprocess.Popen[bytes]:
    """``python -m zkcrawl.consumer.main ARGS`` as a real process (stderr to a file, or a pipe);
    one still running when its test ends is killed then (a failed wait must not leave a
    consumer working through the next tests' ZooKeeper)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "zkcrawl.consumer.main", *args]
    kw.setdefault("stdout", subprocess.DEVNULL)
    if not isinstance(stderr, Path):
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                stderr=stderr, **kw)
    else:
        with open(stderr, "wb") as err:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                    stderr=err, **kw)
    SPAWNED.append(proc)
    return proc


def reap_spawned() -> None:
    """Kill what :func:`spawn` started and is still running."""
    while SPAWNED:
        proc = SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def stats_held(err: Path) -> int:
    """Items a consumer held -- running, marked or waiting in its backlog -- in the last
    ``consumer.stats`` line of its JSON stderr (run it with a short ``--stats-interval``);
    0 before the first. (ZooKeeper shows only the items marked started.)"""
    held = 0
    for line in err.read_text(errors="replace").splitlines():
        if '"consumer.stats"' in line:
            try:
                held = int(json.loads(line).get("leases", 0))
            except ValueError:
                continue  # a line being written
    return held
