"""The status node's Registration on a real ZooKeeper of the test's own, stopped under it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.queue.registry import Registration
from zkcrawl.zk.client import ZkClient


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[ZkServer]:
    server = ZkServer(tmp_path / "zk", quick_jit=True)
    server.start(wait=60)
    yield server
    server.stop()


def test_a_publish_caught_by_zookeepers_leaving_does_not_hold_up_the_stop(own_zk):
    """CI of session 7: a consumer drained with the ensemble down took 8.6 s instead of
    ~3.5 s -- its last status publish sat out --zk-timeout in kazoo's queue, and the stop
    waited for it. Disconnected, the node goes with the session: nothing to wait for."""
    zk_timeout = 6.0
    zk = ZkClient(own_zk.hosts, zk_timeout=zk_timeout, session_timeout=20).connect()
    calls, gone = [0], threading.Event()

    def status() -> dict[str, Any]:
        calls[0] += 1
        if calls[0] == 2:  # the second publish: ZooKeeper leaves while it is being made
            gone.wait(30)
        return {"calls": calls[0]}

    reg = Registration(zk, "/reg/consumers/c", status, interval=0.05).start()
    try:
        wait_for(lambda: calls[0] >= 2, 10, "the second publish under way")
        own_zk.stop()
        wait_for(lambda: not zk.connected, 20, "the client sees the server gone")
        gone.set()  # now the publish calls ZooKeeper, which is away
        t0 = time.monotonic()
        reg.stop(wait=zk_timeout + 2)
        # A bound, not a speed figure: without the fix this waits out the zk timeout.
        assert time.monotonic() - t0 < zk_timeout / 2
    finally:
        zk.close()
