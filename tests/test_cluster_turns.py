"""Cluster turns (zkcrawl.politeness.cluster.ClusterPoliteness.take_turn): the consumer's way
to the cluster-wide gap -- a turn taken now, never a slot booked ahead -- against a real
ZooKeeper."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import wait_for
from zkcrawl.politeness.cluster import _HERD_SPREAD, ClusterPoliteness
from zkcrawl.politeness.local import SLOT_SLACK
from zkcrawl.zk.client import ZkClient

HOST = "turns.example:80"


def node_time(zk: ZkClient, root: str, host: str = HOST) -> float:
    return float(zk.get(f"{root}/hosts/{host.replace(':', '%3A')}")[0])


def test_a_host_held_by_another_consumer_waits_for_its_turn_to_end_without_a_write(
        zk: ZkClient, zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    a = ClusterPoliteness(zk_factory(), zk_root, 0.3)
    b = ClusterPoliteness(zk_factory(), zk_root, 0.3)
    start, due = a.take_turn(HOST)
    assert due is None and start is not None and abs(start - time.monotonic()) < 0.05
    ends = node_time(zk, zk_root)
    assert ends - time.time() == pytest.approx(0.3 + SLOT_SLACK, abs=0.05)
    turn, due = b.take_turn(HOST)
    assert turn is None and due is not None
    # a's turn: at least a gap after a's start (which may come up to SLOT_SLACK into the
    # turn, when the write was answered late), at most the turn plus the waiters' random
    # spread (clocks converted: 2 ms)
    assert 0.3 - 0.002 <= due - start <= 0.3 + SLOT_SLACK + _HERD_SPREAD + 0.002
    assert b.counts["writes"] == 0 and b.counts["reservations"] == 0
    wait_for(lambda: time.monotonic() >= due, timeout=5, what="a's turn to end")
    second, wait = b.take_turn(HOST)
    assert wait is None and second is not None and second - start >= 0.3 + SLOT_SLACK - 0.002
    assert b.counts["writes"] == 1
    assert a.take_turn(HOST)[0] is None  # now b holds it, for a as well


def test_a_host_only_this_consumer_crawls_costs_one_write_per_turn(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    a = ClusterPoliteness(zk_factory(), zk_root, 0.0)
    for _ in range(5):
        # its own turn (SLOT_SLACK long) is known here: asked meanwhile, it is not written
        wait_for(lambda: a.take_turn("solo.example:80")[1] is None, timeout=5, what="a turn")
    assert a.counts["writes"] == 5 and a.counts["races"] == 0 and a.counts["reservations"] == 5


def test_a_turn_lasts_the_gap_plus_the_response_time_here(
        zk: ZkClient, zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    a = ClusterPoliteness(zk_factory(), zk_root, 0.05)
    start, _ = a.take_turn(HOST)
    assert start is not None
    wait_for(lambda: time.monotonic() >= start + 0.2, timeout=5, what="the response time")
    a.request_done(HOST)  # the request took 0.2 s
    wait_for(lambda: a.take_turn(HOST)[1] is None, timeout=5, what="the next turn")
    begun = time.time()
    assert node_time(zk, zk_root) - begun == pytest.approx(0.05 + 0.2 + SLOT_SLACK, abs=0.05)


class SlowAnswers(ClusterPoliteness):
    """A consumer whose next write's answer comes late: a real write, delayed after it."""

    late = 0.0

    def _write(self, path: str, after: float, version: int | None) -> int:
        written = super()._write(path, after, version)
        time.sleep(self.late)  # the answer is late (a loaded machine); the write is real
        self.late = 0.0
        return written


def test_a_turn_whose_write_was_answered_too_late_is_moved_to_now(
        zk: ZkClient, zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    a = SlowAnswers(zk_factory(), zk_root, 0.2)
    a.late = 0.1  # later than the turn's slack: a start now would crowd the next consumer
    start, due = a.take_turn(HOST)
    assert due is None and start is not None
    # moved (once; twice if the machine is loaded enough to make the next answer late too)
    assert a.counts["moves"] >= 1 and a.counts["writes"] == a.counts["moves"] + 1
    # the turn was written again from when the request can really start
    assert node_time(zk, zk_root) - (start + time.time() - time.monotonic()) >= 0.2


def test_without_zookeeper_a_turn_is_the_local_gap_only(
        zk_factory: Callable[..., ZkClient], zk_root: str) -> None:
    client = zk_factory()
    p = ClusterPoliteness(client, zk_root, 0.2)
    client.close()
    start, due = p.take_turn(HOST)
    assert due is None and start is not None and p.counts["fallbacks"] == 1


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=80), st.just(b"1e300"), st.just(b"nan"),
                      st.just(b"-inf"), st.just(b"9" * 64), st.just(b"x" * 70_000)))
def test_a_host_node_anyone_wrote_never_breaks_a_turn(
        zk: ZkClient, zk_factory: Callable[..., ZkClient], zk_root: str, data: bytes) -> None:
    """SPEC §2: the host node is untrusted. Whatever it holds, a turn is taken now (not a
    time: overwritten) or waited for at most MAX_AHEAD -- never an exception or a wait
    beyond it."""
    from zkcrawl.politeness.cluster import MAX_AHEAD

    path = f"{zk_root}/hosts/{HOST.replace(':', '%3A')}"
    zk.ensure_path(f"{zk_root}/hosts")
    if zk.exists(path) is None:
        zk.create(path, data)
    else:
        zk.set(path, data)
    pol = ClusterPoliteness(zk_factory(), zk_root, 0.05)
    start, due = pol.take_turn(HOST)
    now = time.monotonic()
    if start is not None:
        assert due is None and start - now < 0.2 and pol.counts["fallbacks"] == 0
        assert float(zk.get(path)[0]) > time.time()  # the turn is written over it
    else:
        assert due is not None and now < due <= now + MAX_AHEAD + 1
