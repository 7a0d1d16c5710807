"""Bounded shutdown while ZooKeeper is gone (SPEC §4): SIGTERM ends a producer within
``--zk-timeout`` (plus its own wind-down) even when the ensemble was killed under it, and it
saves its seen state on the way out. A ZooKeeper of its own per test, killed for real."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.test_producer_cli import _events, _producer
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.seen import SeenSet
from zkcrawl.zk import ZkClient

pytestmark = pytest.mark.faults
ZK_TIMEOUT = 3.0


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[ZkServer]:
    server = ZkServer(tmp_path / "zk", quick_jit=True).start(wait=60)
    yield server
    server.stop()


def test_sigterm_while_zookeeper_is_gone_exits_in_bounded_time_and_saves_seen(own_zk,
                                                                               tmp_path):
    seen, src = tmp_path / "seen", tmp_path / "urls.txt"
    src.write_text("\n".join(f"http://example.com/z/{i}" for i in range(3000)) + "\n")
    proc = _producer(own_zk.hosts, "/gone", "--from-file", str(src), "--seen", str(seen),
                     "--max-depth", "1000", "--max-partition-depth", "1000",  # one host
                     "--batch", "100", "--id", "p",
                     "--zk-timeout", str(ZK_TIMEOUT), "--session-timeout", "4")
    zk = ZkClient(own_zk.hosts).connect()
    try:
        def held() -> bool:
            node = "/gone/producers/p"
            return bool(zk.exists(node)) and json.loads(zk.get(node)[0])["state"] == "waiting"

        wait_for(held, what="the producer held by back-pressure")
    finally:
        zk.close()
    own_zk.kill()  # SIGKILL: no goodbye to the clients
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _out, err = proc.communicate(timeout=ZK_TIMEOUT * 3 + 10)
    finally:
        proc.kill()
    elapsed = time.monotonic() - t0
    assert proc.returncode in (0, 1, 75), err.decode()[-2000:]
    assert "Traceback" not in err.decode(), err.decode()[-4000:]
    assert elapsed < ZK_TIMEOUT * 3 + 5, elapsed  # a bound, not a speed figure
    # Everything committed before the outage is in the saved seen state.
    assert SeenSet.open(seen, expected=1_000_000).count == 1000
    assert any(e["event"] == "producer.summary" for e in _events(err))
