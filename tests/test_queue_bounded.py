"""Every pipelined wait of the lease queue ends within ``--zk-timeout`` while ZooKeeper is away,
and the books are right once it is back (zkcrawl/queue/leases.py, "Every wait on ZooKeeper is
bounded").

A dedicated server, never the session's: it is frozen (SIGSTOP) or stopped under a client.
Frozen, it answers nothing while kazoo still believes the connection is up (its read timeout
is 2/3 of the 30 s session here): the worst case for an unbounded wait, which would last until
kazoo gives up on the connection. Each test freezes it at the one point a fallback's requests
are about to be sent -- a :class:`Freezing` queue does that from inside the named step, so the
timing is exact -- then lets it go and checks that nothing was lost, nothing counted twice,
and no lease is left with nobody working on it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.conftest import wait_for
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.queue.items import Item
from zkcrawl.queue.leases import AT_MOST_ONCE, Claimed, LeaseQueue, QueueSuspended
from zkcrawl.zk import ConnectionLoss
from zkcrawl.zk.client import ZkClient

BOUND = 1.0  # the queue client's --zk-timeout
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


class Freezing(LeaseQueue):
    """A lease queue whose server is frozen (SIGSTOP) on entering the step named
    ``freeze_at`` -- right before that step sends its requests. Records how long the step
    took and what it raised."""

    def __init__(self, server: ZkServer, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server = server
        self.freeze_at = ""
        self.step_s: float | None = None
        self.step_error: BaseException | None = None

    @contextmanager
    def _step(self, name: str) -> Iterator[None]:
        if name != self.freeze_at:
            yield
            return
        self.freeze_at = ""  # once
        assert self.server.proc is not None
        os.kill(self.server.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            yield
        except BaseException as exc:
            self.step_error = exc
            raise
        finally:
            self.step_s = time.monotonic() - t0

    def _lease_each(self, cands: list[tuple[int, str]], body: bytes) -> list[tuple[int, str]]:
        with self._step("lease_each"):
            return super()._lease_each(cands, body)

    def _complete_each(self, chunk: list[Claimed], build: Any) -> list[bool]:
        with self._step("complete_each"):
            return super()._complete_each(chunk, build)

    def _take_each(self, live: list[Any]) -> list[Any]:
        with self._step("take_each"):
            return super()._take_each(live)


def thaw(server: ZkServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGCONT)


def offer(q: LeaseQueue, n: int) -> list[str]:
    return q.offer_many([Item(url=f"http://127.0.0.1/b/{i}", producer="t") for i in range(n)])


def queued(zk: ZkClient, root: str) -> set[str]:
    return set(zk.get_children(f"{root}/queue"))


def leases(zk: ZkClient, root: str) -> dict[str, int]:
    """Lease name -> the session that holds it."""
    out = {}
    for name in zk.get_children(f"{root}/leases"):
        stat = zk.exists(f"{root}/leases/{name}")
        if stat is not None:
            out[name] = stat.ephemeralOwner
    return out


def answering(zk: ZkClient) -> None:
    """Once thawed, the server answers this client again (its frozen requests first)."""
    wait_for(lambda: zk.exists("/") is not None, 20, "answers after the thaw")


def test_per_item_completion_cut_short_is_held_then_completed_once(server, clients, zk_root):
    admin = clients()
    q = Freezing(server, clients(BOUND), zk_root, "c")
    names = offer(q, 6)
    held = q.claim(6, timeout=5)
    assert [c.name for c in held] == names
    # The lease of the first is gone (an operator's purge): the batch fails, so the
    # completion falls back to one transaction per item -- and the server freezes there.
    admin.delete(f"{zk_root}/leases/{names[0]}")
    q.freeze_at = "complete_each"
    t0 = time.monotonic()
    with pytest.raises(QueueSuspended):
        q.complete(held)
    took = time.monotonic() - t0
    assert q.step_s is not None and BOUND * 0.9 <= q.step_s < BOUND + SLACK, q.step_s
    assert isinstance(q.step_error, ConnectionLoss)
    assert took < BOUND + SLACK + 0.5, took
    # Neither done nor given up: nothing counted, every item still held.
    assert q.held == 6 and q.stats.completed == 0
    thaw(server)
    answering(q.zk)
    # The single transactions sent into the frozen server went through after all: the
    # committer's retry finds those items gone and counts each done, once.
    assert queued(admin, zk_root) == {names[0]}
    result = q.complete(held)
    assert [c.name for c in result.done] == names[1:]
    assert [c.name for c in result.lost] == [names[0]]  # its lease was gone: not ours
    assert q.stats.completed == 5 and q.held == 0
    assert queued(admin, zk_root) == {names[0]}  # still there for anyone
    assert leases(admin, zk_root) == {}
    [again] = LeaseQueue(admin, zk_root, "other").claim(1, timeout=5)
    assert again.name == names[0]


@pytest.mark.parametrize("count_claims", [True, False], ids=["claim-records", "no-records"])
def test_release_cut_short_returns_in_time_and_the_leases_go(server, clients, zk_root,
                                                             count_claims):
    admin = clients()
    q = LeaseQueue(clients(BOUND), zk_root, "c", count_claims=count_claims)
    other = LeaseQueue(admin, zk_root, "other")
    names = offer(q, 3)
    held = q.claim(3, timeout=5)
    session = q.zk.session_id
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    q.release(held)  # never raises for the connection
    took = time.monotonic() - t0
    assert took < BOUND + SLACK, took
    assert q.held == 0
    thaw(server)
    answering(q.zk)
    if count_claims:
        # The claim record's update was cut short, so the deletes were never sent: the
        # leases are still this live session's, with nobody working on them...
        assert leases(admin, zk_root) == dict.fromkeys(names, session)
        assert other.claim(3, timeout=0.3) == []
        # ... until this queue's claim loop deletes them (and may take one again itself).
        mine = q.claim(1, timeout=5)
        assert len(mine) == 1 and mine[0].session == session
    else:
        # The deletes were sent into the frozen server and applied once it woke up.
        wait_for(lambda: leases(admin, zk_root) == {}, 10, "the leases released")
        mine = []
    theirs = other.claim(3, timeout=5)
    assert sorted(c.name for c in mine + theirs) == names
    assert leases(admin, zk_root) == {**{c.name: session for c in mine},
                                      **{c.name: admin.session_id for c in theirs}}
    assert q.complete(mine).done == mine and other.complete(theirs).done == theirs
    assert queued(admin, zk_root) == set() and leases(admin, zk_root) == {}


def test_release_while_zookeeper_is_stopped_is_deferred_then_done(server, clients, zk_root):
    admin = clients()
    qzk = clients(BOUND)
    q = LeaseQueue(qzk, zk_root, "c")
    names = offer(q, 3)
    held = q.claim(3, timeout=5)
    session = qzk.session_id
    admin.close()
    server.stop()  # the process is gone: the client is disconnected at once
    wait_for(lambda: not qzk.connected, 10, "disconnected")
    t0 = time.monotonic()
    q.release(held)  # before: QueueSuspended, the items held for ever after
    assert time.monotonic() - t0 < SLACK
    assert q.held == 0
    server.start(wait=60)
    # A reconnect that met the server still starting (under load: CI with two workers)
    # waits out kazoo's read timeout on the handshake, 2/3 of the session, then tries again.
    assert q.wait_connected(2 * SESSION)
    assert qzk.session_id == session  # the session outlived the restart, and its leases
    admin = clients()
    assert set(leases(admin, zk_root)) == set(names)
    mine = q.claim(3, timeout=5)  # deletes them first, then claims afresh
    assert sorted(c.name for c in mine) == names
    assert q.complete(mine).done == mine
    assert queued(admin, zk_root) == set() and leases(admin, zk_root) == {}


def test_single_leases_cut_short_are_adopted_once_connected(server, clients, zk_root):
    admin = clients()
    foreign = clients()
    q = Freezing(server, clients(BOUND), zk_root, "c")
    names = offer(q, 10)
    first = q.claim(1, timeout=5)  # lists: the other nine are cached
    assert [c.name for c in first] == names[:1]
    # Another consumer leases the next four behind the cache's back: the batch and its
    # three retries each meet one, so the claim falls back to single creates.
    for name in names[1:5]:
        foreign.create(f"{zk_root}/leases/{name}", b'{"consumer": "x"}', ephemeral=True)
    q.freeze_at = "lease_each"
    t0 = time.monotonic()
    assert q.claim(8, timeout=0) == []
    took = time.monotonic() - t0
    assert q.step_s is not None and BOUND * 0.9 <= q.step_s < BOUND + SLACK, q.step_s
    assert isinstance(q.step_error, ConnectionLoss)
    # The singles' wait, the check of the batch's leases, one listing: each bounded.
    assert took < 3 * BOUND + 2 * SLACK, took
    assert q.held == 1
    thaw(server)
    answering(q.zk)
    session = q.zk.session_id
    # The singles went through once the server woke: leases of this session nobody holds...
    assert leases(admin, zk_root) == {names[0]: session,
                                      **dict.fromkeys(names[1:5], foreign.session_id),
                                      **dict.fromkeys(names[5:9], session)}
    # ... adopted by the next claim (queue.leases_recovered), not left to the session's end.
    adopted = q.claim(8, timeout=5)
    assert [c.name for c in adopted] == names[5:9]
    assert q.held == 5
    done = [c.name for c in q.complete(first + adopted).done]
    foreign.close()  # its leases go with its session
    while len(done) < 10:
        got = q.claim(10, timeout=5)
        assert got, done
        done += [c.name for c in q.complete(got).done]
    assert sorted(done) == names  # each completed exactly once
    assert q.stats.completed == 10
    assert q.claim(1, timeout=0.2) == []  # lists once more: drops the adopted ones' records
    assert queued(admin, zk_root) == set() and leases(admin, zk_root) == {}
    wait_for(lambda: admin.get_children(f"{zk_root}/claims") == [], 10, "no claim record")


def test_at_most_once_take_cut_short_keeps_the_claims_earlier_batches(server, clients,
                                                                      zk_root):
    admin = clients()
    q = Freezing(server, clients(BOUND), zk_root, "c", delivery=AT_MOST_ONCE, claim_batch=3)
    names = offer(q, 9)
    assert [c.name for c in q.claim(1, timeout=5)] == names[:1]  # the rest cached
    # names[4] cannot be deleted (it has a child): the second batch's delete transaction
    # fails, and the take falls back to one delete per item -- into a frozen server.
    admin.create(f"{zk_root}/queue/{names[4]}/pin")
    q.freeze_at = "take_each"
    t0 = time.monotonic()
    got = q.claim(6, timeout=0)
    took = time.monotonic() - t0
    assert q.step_s is not None and BOUND * 0.9 <= q.step_s < BOUND + SLACK, q.step_s
    assert isinstance(q.step_error, ConnectionLoss)
    assert took < BOUND + 2 * SLACK, took
    # The first batch's items were taken (deleted) before: the claim still hands them out.
    assert [c.name for c in got] == names[1:4]
    thaw(server)
    answering(q.zk)
    # The cut-short deletes were applied once the server woke: at-most-once's documented
    # loss at a failure (names[5:7]); names[4] and the rest stay queued for anyone.
    assert queued(admin, zk_root) == {names[4], names[7], names[8]}
    assert leases(admin, zk_root) == {}


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
