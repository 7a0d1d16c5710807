"""The producer checkpoints its seen state while offers commit (README, Reliability): a
SIGKILL at any moment re-offers at most what committed since the last checkpoint, and
nothing while it was held by back-pressure. Real producer processes, a real ZooKeeper."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.queue_view import queued_count, queued_counter
from tests.test_producer_cli import _producer, _summary
from zkcrawl.producer.offerer import partition_bound
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS
from zkcrawl.seen import SeenSet
from zkcrawl.zk.client import ZkClient


def saved(path: Path) -> int:
    """URLs in the seen file right now (0 before its first checkpoint)."""
    return SeenSet.open(path, expected=100_000, fp_rate=0.001).count if path.exists() else 0


def depth(zk: ZkClient, root: str) -> int:
    """Items queued right now: the ingress and the partitions' batches (SPEC §2)."""
    return queued_count(zk, root)


def queued_urls(zk: ZkClient, root: str) -> Counter[str]:
    """URLs queued, read with multi-reads in chunks (20,000 gets one by one are slow)."""
    return queued_counter(zk, root)


def write_urls(path: Path, n: int, tag: str) -> list[str]:
    urls = [f"http://example.com/{tag}/{i}" for i in range(n)]
    path.write_text("\n".join(urls) + "\n")
    return urls


# One host is one partition: its bound, by default a quarter of --max-depth, would hold
# a rerun's copies (nobody consumes here) and its end would wait for room forever.
UNBOUNDED = ("--max-depth", "100000", "--max-partition-depth", "100000")


def rerun(zk_hosts: str, zk_root: str, src: Path, seen: Path) -> dict[str, object]:
    proc = _producer(zk_hosts, zk_root, "--from-file", str(src), "--seen", str(seen),
                     *UNBOUNDED)
    try:
        _out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate(timeout=30)
        raise AssertionError("the rerun did not end: " + err.decode()[-6000:]) from None
    assert proc.returncode == 0, err.decode()[-2000:]
    return _summary(err)


def test_a_kill_while_held_by_backpressure_re_offers_nothing(zk, zk_hosts, zk_root, tmp_path):
    seen, src = tmp_path / "seen", tmp_path / "urls.txt"
    urls = write_urls(src, 3000, "bp")
    proc = _producer(zk_hosts, zk_root, "--from-file", str(src), "--seen", str(seen),
                     "--max-depth", "1000", "--batch", "100", "--id", "held")

    def held() -> bool:
        node = f"{zk_root}/producers/held"
        return bool(zk.exists(node)) and json.loads(zk.get(node)[0])["state"] == "waiting"

    bound = partition_bound(1000, DEFAULT_PARTITIONS)  # one host: its partition's bound bites
    try:
        wait_for(held, what="the producer held by back-pressure")
        wait_for(lambda: saved(seen) == bound, what="a checkpoint while held")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    s = rerun(zk_hosts, zk_root, src, seen)
    assert depth(zk, zk_root) == 3000 and bound == 250
    assert (s["offered"], s["duplicates"]) == (3000 - bound, bound)
    assert queued_urls(zk, zk_root) == Counter(urls)  # each once


@pytest.mark.parametrize("kill_at", [2000, 9000, 16000])
def test_a_kill_mid_run_re_offers_only_the_last_checkpoint_window(kill_at, zk, zk_hosts,
                                                                  zk_root, tmp_path):
    """The books after a SIGKILL at ``kill_at`` items of a 20,000-URL run: nothing lost, and
    the copies are exactly the items committed after the last checkpoint."""
    seen, src = tmp_path / "seen", tmp_path / "urls.txt"
    urls = write_urls(src, 20_000, "run")
    proc = _producer(zk_hosts, zk_root, "--from-file", str(src), "--seen", str(seen),
                     *UNBOUNDED)
    try:
        wait_for(lambda: depth(zk, zk_root) >= kill_at or proc.poll() is not None,
                 timeout=60, what=f"{kill_at} items offered")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    committed, checkpointed = depth(zk, zk_root), saved(seen)
    rerun(zk_hosts, zk_root, src, seen)
    counts = queued_urls(zk, zk_root)
    assert set(counts) == set(urls)  # nothing lost
    copies = sum(counts.values()) - len(urls)
    assert copies == committed - checkpointed
    print(f"kill at {committed} committed: {checkpointed} checkpointed, {copies} re-offered")
