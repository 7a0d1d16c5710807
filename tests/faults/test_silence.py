"""``ZkClient.silent_for()``: what lets a frozen or cut-off consumer start none of its held
items (consumer/worker.py). It hooks kazoo internals (``_read_socket``, ``_connect``), so this
is also the contract test that kazoo still calls them: an idle client hears the server's ping
replies, and a server frozen with SIGSTOP leaves it silent."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.zk.client import ZkClient

pytestmark = pytest.mark.faults
SESSION = 3.0  # kazoo pings every ~1 s (read timeout 2 s / 2) on an idle connection


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[ZkServer]:
    server = ZkServer(tmp_path / "zk", quick_jit=True).start(wait=60)
    yield server
    if server.proc is not None:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


def test_silent_for_follows_the_servers_replies(own_zk):
    zk = ZkClient(own_zk.hosts, zk_timeout=5, session_timeout=SESSION).connect()
    try:
        t0 = time.monotonic()
        assert zk.silent_for() < SESSION
        # Idle past a whole session: only pings and their replies pass, and they are heard
        # (without the hook, silent_for would be the time since the client was made).
        wait_for(lambda: time.monotonic() - t0 > SESSION + 0.5, SESSION + 5, "idle")
        assert zk.silent_for() < SESSION * 2 / 3
        assert own_zk.proc is not None
        os.kill(own_zk.proc.pid, signal.SIGSTOP)  # the server hears and says nothing
        wait_for(lambda: zk.silent_for() > SESSION * 2 / 3, SESSION + 5, "silence")
        os.kill(own_zk.proc.pid, signal.SIGCONT)
        # kazoo reconnects (its read timeout dropped the connection): the handshake and
        # the replies after it are word from the server again.
        wait_for(lambda: zk.connected and zk.silent_for() < 1.0, 20, "heard again")
    finally:
        zk.close()
