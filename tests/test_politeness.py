"""Per-host politeness (zkcrawl.politeness.local): pure units on a fake clock, plus one real-server
test measuring the gaps the server sees."""

from __future__ import annotations

import itertools
import math
import threading
import time

import pytest

from tests.httpd import TestServer, html
from zkcrawl.politeness.gate import DOWN_BACK_OFF_CAP, HostGate, down_back_off
from zkcrawl.politeness.local import (
    MAX_BACK_OFF,
    MAX_CRAWL_DELAY,
    LocalPoliteness,
    Politeness,
    wait_for_slot,
)
from zkcrawl.web.fetch import Fetcher, FetchSettings


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


def test_is_a_politeness() -> None:
    assert isinstance(LocalPoliteness(1.0), Politeness)


def test_reservations_for_one_host_are_delay_apart() -> None:
    clock = FakeClock()
    pol = LocalPoliteness(2.0, clock=clock)
    assert [pol.reserve("a.com") for _ in range(4)] == [1000.0, 1002.0, 1004.0, 1006.0]
    clock.advance(100)  # long idle: the next slot is now, not in the past
    assert pol.reserve("a.com") == 1100.0
    assert pol.reserve("a.com") == 1102.0


def test_slot_is_delay_after_previous_start_not_after_now() -> None:
    clock = FakeClock()
    pol = LocalPoliteness(2.0, clock=clock)
    pol.reserve("a.com")
    clock.advance(0.5)
    assert pol.reserve("a.com") == 1002.0
    clock.advance(3.0)  # now 1003.5, next free 1004
    assert pol.reserve("a.com") == 1004.0


def test_hosts_are_independent() -> None:
    clock = FakeClock()
    pol = LocalPoliteness(5.0, clock=clock)
    assert pol.reserve("a.com") == 1000.0
    assert pol.reserve("b.com") == 1000.0
    assert pol.reserve("a.com:8080") == 1000.0
    assert pol.reserve("a.com") == 1005.0
    pol.back_off("b.com", 30)
    assert pol.reserve("a.com") == 1010.0
    assert pol.reserve("b.com") == 1030.0


def test_back_off_is_honoured_never_shortens_and_is_capped() -> None:
    clock = FakeClock()
    pol = LocalPoliteness(1.0, clock=clock, max_delay=60.0)
    pol.back_off("a.com", 10)
    assert pol.reserve("a.com") == 1010.0
    assert pol.reserve("a.com") == 1011.0
    pol.back_off("a.com", 0.5)  # shorter than what is scheduled: no effect
    assert pol.reserve("a.com") == 1012.0
    pol.back_off("b.com", 100_000)
    assert pol.reserve("b.com") == 1000.0 + 3600.0
    for bad in (-5.0, 0.0, math.nan, math.inf):
        pol.back_off("c.com", bad)
    assert pol.reserve("c.com") == 1000.0


def test_set_min_delay() -> None:
    clock = FakeClock()
    pol = LocalPoliteness(1.0, clock=clock, max_delay=10.0)
    pol.set_min_delay("a.com", 3.0)
    assert pol.delay_for("a.com") == 3.0
    assert [pol.reserve("a.com") for _ in range(3)] == [1000.0, 1003.0, 1006.0]
    pol.set_min_delay("b.com", 0.2)  # below the default: the default holds
    assert pol.delay_for("b.com") == 1.0
    pol.set_min_delay("c.com", 3600)  # capped
    assert pol.delay_for("c.com") == 10.0
    pol.set_min_delay("a.com", math.nan)  # ignored
    assert pol.delay_for("a.com") == 3.0


def test_zero_delay_and_bad_delay() -> None:
    clock = FakeClock()
    pol = LocalPoliteness(0.0, clock=clock)
    assert pol.reserve("a") == pol.reserve("a") == 1000.0
    with pytest.raises(ValueError):
        LocalPoliteness(-1)


def test_concurrent_reservations_never_share_a_slot() -> None:
    clock = FakeClock()
    pol = LocalPoliteness(0.5, clock=clock)
    results: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = [pol.reserve("a.com") for _ in range(50)]
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(results) == 400
    assert sorted(results) == [1000.0 + 0.5 * i for i in range(400)]


def test_wait_for_slot_waits_and_can_be_cancelled() -> None:
    pol = LocalPoliteness(0.2)
    assert wait_for_slot(pol, "a") == 0.0
    started = time.monotonic()
    waited = wait_for_slot(pol, "a")
    assert 0.1 < waited <= 0.2
    assert time.monotonic() - started >= waited - 0.01
    cancel = threading.Event()
    pol.back_off("a", 30)
    threading.Timer(0.1, cancel.set).start()
    started = time.monotonic()
    wait_for_slot(pol, "a", cancel)
    assert cancel.is_set() and time.monotonic() - started < 5


def test_server_sees_gaps_of_at_least_delay_from_four_threads() -> None:
    delay = 0.3
    # Tolerance: slots are exactly `delay` apart, but a thread wakes for its slot a little late
    # when the CPU is busy (a loaded CI box: tens of ms), and the server stamps a request when
    # it has parsed it, so two stamps can be closer than their slots by that jitter.
    tolerance = 0.05
    with TestServer({"/*": html("<title>x</title>")}) as srv:
        fetcher = Fetcher(FetchSettings(robots=False, guard=None),
                          politeness=LocalPoliteness(delay))
        errors: list[str | None] = []
        counter = itertools.count()

        def worker() -> None:
            for _ in range(2):
                result = fetcher.fetch(srv.url(f"/page/{next(counter)}"))
                errors.append(result.error)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=15)
        fetcher.close()
        srv.wait_for_requests(8, timeout=5)
        gaps = srv.gaps()
    assert errors == [None] * 8
    assert len(gaps) == 7
    assert min(gaps) >= delay - tolerance, gaps
    assert sum(gaps) / len(gaps) >= delay - 0.01, gaps  # jitter does not accumulate


def test_idle_hosts_are_pruned_but_pending_slots_kept() -> None:
    clock = FakeClock()
    pol = LocalPoliteness(1.0, clock=clock)
    pol._PRUNE_AT = 10  # type: ignore[misc]
    pol._prune_at = 10
    for i in range(10):
        pol.reserve(f"h{i}")
    clock.advance(5)  # all idle now
    pol.reserve("busy")  # 11 entries: prune the idle ones
    assert list(pol._next_free) == ["busy"]
    assert pol.reserve("busy") == clock.now + 1.0  # the pending slot survived


def test_gate_keeps_its_state_in_the_local_table_one_lock_one_copy() -> None:
    clock = FakeClock()
    pol = LocalPoliteness(1.0, clock=clock)
    gate = HostGate(pol, 1.0)
    assert gate.table is pol and gate.delay == 1.0 and isinstance(gate, Politeness)
    gate.set_min_delay("a.com", 3600)  # capped once, at the one cap
    assert pol.delay_for("a.com") == MAX_CRAWL_DELAY == 30.0
    assert gate.admit("a.com", None) == (1000.0, None)  # reserved in the table and admitted
    slot, due = gate.admit("a.com", None)
    assert (slot, due) == (1030.0, 1030.0)  # the next slot, queued (not slept for)
    gate.finished("a.com")
    clock.advance(5)
    gate.back_off("b.com", 10)  # one back-off: the reservations and the gate both see it
    assert pol.reserve("b.com") == 1015.0
    assert gate.admit("b.com", 1005.0) == (1005.0, 1015.0)
    clock.advance(10)
    assert gate.admit("b.com", 1005.0) == (1015.0, None)
    pol.back_off("c.com", 1e9)
    assert pol.reserve("c.com") == clock.now + MAX_BACK_OFF
    with pytest.raises(ValueError, match="not its table's"):  # one gap, said once
        HostGate(LocalPoliteness(0.5), 1.0)


def test_a_down_host_is_left_alone_longer_after_each_failure_for_all_its_items() -> None:
    clock = FakeClock()
    gate = HostGate(LocalPoliteness(0.0, clock), 0.0)
    waits = [gate.host_down("down.test") for _ in range(12)]
    # 1, 2, 4 ... s: minutes after eight failures in a row, never more than the cap.
    assert waits[:4] == [1.0, 2.0, 4.0, 8.0] and waits[-1] == DOWN_BACK_OFF_CAP == 600.0
    assert waits == sorted(waits) and down_back_off(10**9) == 600.0
    # Every item of the host waits for it, not only the one that failed; others go.
    _slot, due = gate.admit("down.test", None)
    assert due is not None and due >= clock() + 600.0 - 1e-9
    assert gate.admit("up.test", None)[1] is None
    # An answer (any status) starts the count again.
    gate.host_up("down.test")
    assert gate.host_down("down.test") == 1.0


def test_an_admission_is_paid_on_the_thread_that_makes_the_request():
    clock = [1000.0]
    gate = HostGate(LocalPoliteness(10.0, clock=lambda: clock[0]), 10.0)
    assert gate.admit("a.com", None) == (1000.0, None)  # admitted here, performed elsewhere
    assert gate.admit("a.com", None)[1] is not None  # busy: no second request meanwhile
    clock[0] = 1000.1  # it waited 0.1 s for its mark
    paid: list[float] = []
    other = threading.Thread(target=lambda: (gate.pay("a.com"),
                                             paid.append(gate.reserve("a.com"))))
    other.start()
    other.join()
    assert paid == [1000.1]  # the admitted slot, no second reservation
    gate.finished("a.com")
    clock[0] = 1005.0
    _slot, due = gate.admit("a.com", None)
    assert due is not None and due >= 1000.1 + 10.0  # the gap counts from the actual request
    gate.withdraw("a.com")  # harmless on a host that is not busy
    gate.admit("b.com", None)
    gate.withdraw("b.com")  # released before its start: b is free again, a gap from now
    assert gate.admit("b.com", None)[1] == 1015.0


def test_a_plan_reserves_the_slots_admit_would_and_admits_nothing():
    """The claim loop's look at fresh items (HostGate.plan): each gets the next slot, a gap
    apart, with the time admit would let it start; the host is not made busy, so the first
    one is admitted at its slot and the next ones exactly when their slots come."""
    clock = [1000.0]
    gate = HostGate(LocalPoliteness(2.0, clock=lambda: clock[0]), 2.0)
    plans = [gate.plan("a.com") for _ in range(3)]
    assert plans == [(1000.0, 1000.0), (1002.0, 1002.0), (1004.0, 1004.0)]
    assert gate.plan("b.com") == (1000.0, 1000.0)  # hosts are independent
    assert gate.admit("a.com", 1000.0) == (1000.0, None)  # nothing was admitted before it
    clock[0] = 1000.05
    gate.finished("a.com")  # the request took 50 ms: the gap counts from its end
    assert gate.admit("a.com", 1002.0) == (1002.0, 1002.05)  # asked at the planned time
    clock[0] = 1002.05
    assert gate.admit("a.com", 1002.0) == (1002.05, None)
    # busy, or backed off: the due time says so, and the reservation is kept
    slot, due = gate.plan("a.com")
    assert slot == 1006.0 and due == 1006.0
    gate.back_off("a.com", 30.0)
    assert gate.plan("a.com") == (1032.05, 1032.05)  # a back-off moves the slots too


def test_a_plan_for_a_busy_host_is_due_no_sooner_than_a_gap_from_now():
    clock = [1000.0]
    gate = HostGate(LocalPoliteness(1.0, clock=lambda: clock[0]), 1.0)
    assert gate.admit("a.com", None) == (1000.0, None)  # in flight, its end unknown
    clock[0] = 1000.5
    slot, due = gate.plan("a.com")
    assert slot == 1001.0 and due == 1001.5  # the gap from its end at the earliest


def test_ready_at_is_when_the_next_request_could_start_by_the_table() -> None:
    """The claim loop's look (OwnedQueue._pick): an unknown host at once; a gap after the
    last request's start and end; a reserved slot; Crawl-delay; a back-off -- and the same
    time ``admit`` would give a fresh item then (so a host picked at its time starts)."""
    clock = FakeClock()
    table = LocalPoliteness(1.0, clock=clock)
    assert table.ready_at("a.com") == -math.inf
    start, due = table.admit("a.com", None, 0.002)
    assert due is None and start == 1000.0
    assert table.ready_at("a.com") == 1001.0  # a gap after its start (and its slot)
    clock.advance(0.3)
    table.finished("a.com")  # ended at 1000.3: a gap after the end
    assert table.ready_at("a.com") == 1001.3
    clock.advance(1.0)
    assert table.admit("a.com", None, 0.002) == (1001.3, None)  # ready_at's time: admitted
    table.finished("a.com")
    table.set_min_delay("b.com", 5.0)  # Crawl-delay: its own gap
    table.admit("b.com", None, 0.002)
    table.finished("b.com")
    assert table.ready_at("b.com") == pytest.approx(1001.3 + 5.0)
    table.back_off("c.com", 30.0)  # Retry-After or the down-host back-off
    assert table.ready_at("c.com") == pytest.approx(1001.3 + 30.0)
    gate = HostGate(table, 1.0)
    assert gate.ready_at("c.com") == table.ready_at("c.com")


def test_a_slot_given_back_is_the_next_one_if_it_was_the_latest() -> None:
    """unreserve: an item given back to the queue (Worker._give_back) returns its slot, so
    the host's next item is not pushed a gap later for it; a slot that is not the latest
    reservation changes nothing (the later ones stand)."""
    clock = FakeClock()
    pol = LocalPoliteness(2.0, clock=clock)
    first, _ = pol.plan("h")
    second, _ = pol.plan("h")
    assert second == first + 2.0
    pol.unreserve("h", second)
    assert pol.plan("h")[0] == second  # taken again
    pol.unreserve("h", first)  # not the latest: ignored
    assert pol.plan("h")[0] == second + 2.0
    pol.unreserve("nobody", 0.0)  # unknown host: nothing
