"""zkcrawl.zk.poll: kazoo's select answered with one poll(2) -- the same answers as kazoo's
own selector_select on real sockets, and a real ZooKeeper session through it."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zkcrawl.zk.client import ZkClient
from zkcrawl.zk.poll import PollHandler, poll_select, selector_select

PAIRS = 4
# What happens to a pair before the select: nothing, the peer sends a byte, the peer
# closes (a hang-up: readable), the peer shuts its writing side down.
STATES = ("idle", "data", "closed", "shutdown")


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made = [socket.socketpair() for _ in range(PAIRS)]
    yield made
    for a, b in made:
        a.close()
        b.close()


def _prepare(pairs: list[tuple[socket.socket, socket.socket]], states: list[str]) -> None:
    for (_, peer), state in zip(pairs, states, strict=True):
        if state == "data":
            peer.send(b"x")
        elif state == "closed":
            peer.close()
        elif state == "shutdown":
            peer.shutdown(socket.SHUT_WR)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(states=st.lists(st.sampled_from(STATES), min_size=PAIRS, max_size=PAIRS),
       reads=st.lists(st.integers(0, PAIRS - 1), max_size=PAIRS),
       writes=st.lists(st.integers(0, PAIRS - 1), max_size=PAIRS),
       as_fd=st.booleans())
def test_poll_select_answers_as_kazoos_selector_select(states, reads, writes, as_fd):
    made = [socket.socketpair() for _ in range(PAIRS)]
    try:
        _prepare(made, states)
        ours = [a.fileno() if as_fd else a for a, _ in made]
        rlist, wlist = [ours[i] for i in reads], [ours[i] for i in writes]
        assert poll_select(rlist, wlist, [], 0) == selector_select(rlist, wlist, [], 0)
    finally:
        for a, b in made:
            a.close()
            b.close()


def test_poll_select_waits_out_its_timeout_and_wakes_on_data(pairs):
    (a, b), *_ = pairs
    assert poll_select([a], [], [], 0.05) == ([], [], [])
    b.send(b"x")
    assert poll_select([a], [], [], None) == ([a], [], [])  # no timeout: data is there


def test_poll_select_refuses_what_kazoos_refuses(pairs):
    (a, _), *_ = pairs
    closed = socket.socket()
    closed.close()  # fileno() -1
    spare = socket.socket()
    stale = spare.detach()
    socket.close(stale)  # a number that names no open descriptor
    for rlist, timeout, error in (([a], "1", TypeError), ([a], -1, ValueError),
                                  ([closed], 0, TypeError), ([stale], 0, ValueError)):
        for select in (poll_select, selector_select):
            with pytest.raises(error):
                select(rlist, [], [], timeout)


def test_a_zookeeper_session_runs_through_the_poll_handler(zk_hosts, zk_root):
    client = ZkClient(zk_hosts, zk_timeout=15).connect()
    try:
        assert isinstance(client._kazoo.handler, PollHandler)
        client.ensure_path(zk_root)
        client.create(f"{zk_root}/n", b"v" * 100_000)  # a reply read in several chunks
        assert client.get(f"{zk_root}/n")[0] == b"v" * 100_000
    finally:
        client.close()
