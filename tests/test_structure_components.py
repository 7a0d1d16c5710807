"""The consumer's parts (consumer/components.py): one start order, stopped in reverse, a
part that fails to start stops the started ones, every stop runs; the session tracked once
(zkcrawl/zk/session.py) against a real ZooKeeper; the worker's queue seam
(consumer/queue_seam.py) met by both queues."""

from __future__ import annotations

import inspect
import time

import pytest

from tests.conftest import expire_session, wait_for
from tests.test_consumer_support import Running, settings_for
from zkcrawl.consumer import components
from zkcrawl.consumer.components import ORDER, Lifecycle, Stopping
from zkcrawl.consumer.owned_queue import OwnedQueue
from zkcrawl.consumer.queue_seam import WorkerQueue
from zkcrawl.errors import SinkError, UsageError
from zkcrawl.zk.session import SessionState


class Part:
    def __init__(self, name: str, log: list[str], fail: str = "") -> None:
        self.name, self.log, self.fail = name, log, fail

    def start(self) -> None:
        if self.fail == "start":
            raise UsageError(f"{self.name} cannot start")
        self.log.append(f"start {self.name}")

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        if self.fail == "stop":
            raise RuntimeError(f"{self.name} cannot stop")


def test_parts_stop_in_the_reverse_of_their_start_once():
    log: list[str] = []
    life = Lifecycle([Part(n, log) for n in "abc"])
    life.start()
    life.stop()
    life.stop()  # a second stop finds nothing started
    assert log == ["start a", "start b", "start c", "stop c", "stop b", "stop a"]


def test_a_part_that_fails_to_start_stops_the_started_ones_and_raises():
    log: list[str] = []
    life = Lifecycle([Part("a", log), Part("b", log), Part("c", log, fail="start"),
                      Part("d", log)])
    with pytest.raises(UsageError, match="c cannot start"):
        life.start()
    assert log == ["start a", "start b", "stop b", "stop a"]


def test_a_failed_start_raises_its_own_error_even_when_a_stop_fails():
    log: list[str] = []
    life = Lifecycle([Part("a", log, fail="stop"), Part("b", log, fail="start")])
    with pytest.raises(UsageError, match="b cannot start"):
        life.start()
    assert log == ["start a", "stop a"]


def test_every_stop_runs_and_the_first_error_is_raised():
    log: list[str] = []
    life = Lifecycle([Part("a", log, fail="stop"), Part("b", log), Part("c", log, fail="stop")])
    life.start()
    with pytest.raises(RuntimeError, match="c cannot stop"):
        life.stop()
    assert log[3:] == ["stop c", "stop b", "stop a"]


def test_stopping_flags_a_second_request_forces_and_the_first_failure_stays():
    stop = Stopping()
    assert not (stop.requested or stop.forced)
    stop.request()
    assert stop.requested and not stop.forced
    stop.request(force=True)
    assert stop.forced
    first, second = SinkError("disk full"), SinkError("later")
    stop.fail(first)
    stop.fail(second)
    assert stop.failure is first


def test_the_worker_runs_its_parts_in_the_written_order(zk_hosts, zk_root, tmp_path):
    run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl"))
    try:
        wait_for(lambda: run.worker.state == "running", what="running")
        assert tuple(p.name for p in run.worker.parts.parts) == ORDER
        assert ORDER[0] == "session" and ORDER[-1] == "claims"  # drain first, session last
    finally:
        run.stop()
    assert run.worker.state == "stopped" and run.status == 0


def test_session_state_sees_a_lost_session_and_the_reconnect(zk_factory):
    zk = zk_factory(session_timeout=4.0)
    seen: list[tuple[str, bool]] = []
    state = SessionState(zk, lambda s, away, new: seen.append((s, away is not None and new)))
    state.start()
    try:
        old = state.session
        assert old is not None and state.connected and not state.away
        assert not state.stale(old) and state.away_for(time.monotonic()) is None
        expire_session(zk)
        wait_for(lambda: state.stale(old), what="the old session marked stale at LOST")
        assert not state.stale(None)
        wait_for(lambda: zk.connected and state.session not in (None, old), what="new session")
        assert not state.away and not state.stale(state.session)
        assert ("LOST", False) in seen and ("CONNECTED", True) in seen
    finally:
        state.stop()
    count = len(seen)
    expire_session(zk)  # stopped: no more news
    assert len(seen) == count


def _members(cls: type) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}


def test_the_owned_queue_meets_the_worker_queue_seam():
    # the methods (mypy checks the whole surface: zkcrawl.consumer.main's _queue returns it)
    wanted = {n for n, v in vars(WorkerQueue).items()
              if inspect.isfunction(v) and not n.startswith("_")}
    assert {"claim", "complete", "release", "drain_lost", "close"} <= wanted
    assert wanted <= _members(OwnedQueue), wanted - _members(OwnedQueue)
    source = inspect.getsource(inspect.getmodule(components.Committer) or components)
    assert "OwnedQueue" not in source  # the parts ask the seam, not one implementation
