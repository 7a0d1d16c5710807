"""The calls that make paths end within ``--zk-timeout`` while ZooKeeper is frozen.

A dedicated server, never the session's: it is frozen (SIGSTOP) under a client. Frozen, it
answers nothing while kazoo still believes the connection is up (its read timeout is 2/3 of
the 30 s session here): the worst case for an unbounded wait, which would last until kazoo
gives up on the connection. (The settles' bounded waits are tests/test_owned_queue.py's and
the fault suite's.)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import wait_for
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.zk import ConnectionLoss
from zkcrawl.zk.client import ZkClient

BOUND = 1.0  # the client's --zk-timeout
SLACK = 0.75  # scheduling and the interpreter; far below kazoo's 20 s read timeout
SESSION = 30.0  # kazoo notices a silent server after 2/3 of it: never within a test


@pytest.fixture(scope="module")
def own_zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    server = ZkServer(tmp_path_factory.mktemp("bounded"), quick_jit=True).start(wait=60)
    yield server
    server.stop()


@pytest.fixture
def server(own_zk: ZkServer) -> Iterator[ZkServer]:
    """The module's server, running and not frozen after the test whatever happened."""
    yield own_zk
    if own_zk.proc is not None:
        os.kill(own_zk.proc.pid, signal.SIGCONT)
    if not own_zk.serving():
        own_zk.stop()
        own_zk.start(wait=60)


@pytest.fixture
def clients(server: ZkServer) -> Iterator[Callable[..., ZkClient]]:
    made: list[ZkClient] = []

    def make(zk_timeout: float = 15.0) -> ZkClient:
        made.append(ZkClient(server.hosts, zk_timeout=zk_timeout,
                             session_timeout=SESSION).connect())
        return made[-1]

    yield make
    for client in made:
        client.close()


def thaw(server: ZkServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGCONT)


def answering(zk: ZkClient) -> None:
    """Once thawed, the server answers this client again (its frozen requests first)."""
    wait_for(lambda: zk.exists("/") is not None, 20, "answers after the thaw")


def test_path_making_calls_end_in_time_against_a_frozen_server(server, clients, zk_root):
    """``ensure_path`` and ``create(makepath=True)`` -- which ``zkcrawl pause``/``resume``
    use through ``control.set_state`` -- wait at most --zk-timeout per try (kazoo's own
    versions wait for the server however long it takes)."""
    from zkcrawl.queue import control

    zk = clients(BOUND)
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        for call in (lambda: zk.ensure_path(f"{zk_root}/a/b"),
                     lambda: zk.create(f"{zk_root}/c/d", b"x", makepath=True),
                     lambda: control.set_state(zk, zk_root, control.PAUSED)):
            t0 = time.monotonic()
            with pytest.raises(ConnectionLoss):
                call()
            # ensure_path: the command-retry policy's tries, within its deadline
            assert time.monotonic() - t0 < 3 * BOUND + SLACK
    finally:
        thaw(server)
    answering(zk)
    zk.ensure_path(f"{zk_root}/a/b")
    assert zk.create(f"{zk_root}/e/f", b"x", makepath=True) == f"{zk_root}/e/f"
