"""The lease queue with several real consumer processes, SIGKILL and server fail-over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import wait_for
from zkcrawl.admin.localzk import Ensemble
from zkcrawl.queue.items import Item
from zkcrawl.queue.leases import LeaseQueue
from zkcrawl.zk.client import ZkClient

ROOT_DIR = str(Path(__file__).resolve().parent.parent)
pytestmark = pytest.mark.slow


def fill(zk: ZkClient, root: str, n: int) -> set[str]:
    names = LeaseQueue(zk, root, "filler").offer_many(
        Item(url=f"http://127.0.0.1/i/{i}") for i in range(n))
    return set(names)


def spawn(hosts: str, root: str, wid: str, out: Path, session_timeout: float = 10.0
          ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": ROOT_DIR}
    return subprocess.Popen([sys.executable, "-m", "tests.queue_worker", hosts, root, wid,
                             str(out), str(session_timeout)], env=env, cwd=ROOT_DIR)


def seen(outs: list[Path]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for out in outs:
        if out.exists():
            counts.update(line.split()[0] for line in out.read_text().splitlines() if line)
    return counts


def start(zk: ZkClient, root: str, hosts: str, tmp_path: Path, n_workers: int,
          session_timeout: float = 10.0) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    outs = [tmp_path / f"w{i}.txt" for i in range(n_workers)]
    procs = [spawn(hosts, root, f"w{i}", outs[i], session_timeout) for i in range(n_workers)]
    wait_for(lambda: zk.exists(f"{root}/consumers") and
             len(zk.get_children(f"{root}/consumers")) == n_workers, 60, "workers registered")
    zk.create(f"{root}/go", b"")
    return procs, outs


def finish(procs: list[subprocess.Popen[bytes]], timeout: float = 180) -> None:
    for p in procs:
        assert p.wait(timeout) in (0, -signal.SIGKILL)


def test_four_processes_drain_every_item_exactly_once(zk, zk_root, zk_hosts, tmp_path):
    names = fill(zk, zk_root, 5000)
    procs, outs = start(zk, zk_root, zk_hosts, tmp_path, 4)
    finish(procs)
    counts = seen(outs)
    assert set(counts) == names
    assert max(counts.values()) == 1
    assert zk.get_children(f"{zk_root}/leases") == []
    assert zk.get_children(f"{zk_root}/queue") == []
    shares = [len(o.read_text().splitlines()) for o in outs]
    assert all(s > 0 for s in shares), shares


def test_sigkill_mid_drain_loses_nothing(zk, zk_root, zk_hosts, tmp_path):
    names = fill(zk, zk_root, 5000)
    procs, outs = start(zk, zk_root, zk_hosts, tmp_path, 4, session_timeout=2.0)
    victim = procs[0]
    wait_for(lambda: outs[0].exists() and len(outs[0].read_text().splitlines()) >= 300,
             60, "victim made progress")
    victim.send_signal(signal.SIGKILL)
    finish(procs)
    counts = seen(outs)
    assert set(counts) == names, "an item was lost"
    dups = [n for n, c in counts.items() if c > 1]
    assert len(dups) <= 25, f"{len(dups)} duplicates: more than the victim held"
    assert zk.get_children(f"{zk_root}/leases") == []


@pytest.mark.ensemble
def test_ensemble_server_stopped_during_drain(tmp_path, zk_root):
    ens = Ensemble(tmp_path / "ens", 3).start(wait=120)
    try:
        zk = ZkClient(ens.hosts, zk_timeout=30).connect()
        names = fill(zk, zk_root, 3000)
        procs, outs = start(zk, zk_root, ens.hosts, tmp_path, 2)
        wait_for(lambda: sum(len(o.read_text().splitlines()) for o in outs if o.exists())
                 >= 500, 60, "drain under way")
        victim = ens.leader() or ens.servers[0]
        victim.stop()
        finish(procs, timeout=240)
        counts = seen(outs)
        assert set(counts) == names
        wait_for(lambda: zk.connected, 30, "admin client reconnected")
        assert zk.get_children(f"{zk_root}/queue") == []
        zk.close()
    finally:
        ens.stop()
