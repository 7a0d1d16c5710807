"""Real ZooKeeper for the tests: one standalone server per session, a 3-node ensemble
on demand, a fresh root path per test, and the server log shown when a test fails."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from zkcrawl import logs
from zkcrawl.admin.localpg import PgServer
from zkcrawl.admin.localzk import Ensemble, ZkServer
from zkcrawl.zk.client import ZkClient

_SERVERS: list[ZkServer] = []


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    server = ZkServer(tmp_path_factory.mktemp("zk"), quick_jit=True).start(wait=60)
    _SERVERS.append(server)
    yield server
    server.stop()
    _SERVERS.remove(server)


@pytest.fixture(scope="session")
def zk_hosts(zk_server: ZkServer) -> str:
    return zk_server.hosts


@pytest.fixture
def zk_root() -> str:
    """A fresh root per test so tests never see each other's znodes."""
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def zk_factory(zk_hosts: str) -> Iterator[Callable[..., ZkClient]]:
    made: list[ZkClient] = []

    def make(hosts: str | None = None, session_timeout: float = 10.0) -> ZkClient:
        client = ZkClient(hosts or zk_hosts, zk_timeout=15, session_timeout=session_timeout)
        made.append(client.connect())
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started: killed (SIGKILL) if it failed half-way."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def zk(zk_factory: Callable[..., ZkClient]) -> ZkClient:
    return zk_factory()


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    ens = Ensemble(tmp_path_factory.mktemp("ensemble"), 3).start(wait=90)
    _SERVERS.extend(ens.servers)
    yield ens
    ens.stop()
    for s in ens.servers:
        _SERVERS.remove(s)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A real PostgreSQL server for the session (zkcrawl/admin/localpg.py); each test gets its
    own table through ``pg_server.url()``."""
    server = PgServer().start()
    yield server
    server.destroy()


def expire_session(client: ZkClient, timeout: float = 20.0) -> None:
    """Expire ``client``'s session the way kazoo's own test harness does: a second
    client attaches to the same session and closes it. (A raw KazooClient on purpose:
    ZkClient cannot attach to another's session; an exception to the banned-import rule.)"""
    lost = threading.Event()

    def watch(state: str) -> bool:
        if state == "LOST":
            lost.set()
            return True
        return False

    client.add_listener(watch)
    other = KazooClient(hosts=client.hosts, client_id=client.client_id, timeout=10)
    other.start(timeout=timeout)
    other.stop()
    other.close()
    if not lost.wait(timeout):
        raise AssertionError("session did not expire")


def wait_for(cond: Callable[[], object], timeout: float = 20.0, what: str = "condition",
             interval: float = 0.05) -> object:
    """Await a condition that has no event to wait on, with a bound."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and _SERVERS:
        for server in _SERVERS:
            report.sections.append((f"ZooKeeper log {server.hosts}", server.log_tail(40)))


def read_path(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.fixture(autouse=True)
def _no_consumer_outlives_its_test() -> Iterator[None]:
    """A consumer process a test spawned and did not stop (its test failed before) is
    killed when the test ends."""
    yield
    from tests.test_consumer_support import reap_spawned

    reap_spawned()


@pytest.fixture(autouse=True)
def _log_lines_stay_with_their_test() -> Iterator[None]:
    """The log writer thread writes in batches (zkcrawl.logs): a test's last lines must be
    out before the next test's stderr is captured (a producer test once read a processor
    test's lines as its own)."""
    yield
    logs.flush()
