"""The consumer's capped queue (zkcrawl.consumer.backlog): states, order, bounds and waits, with no
ZooKeeper and no HTTP (tasks are built the way the Worker builds them)."""

from __future__ import annotations

import threading
import time

from zkcrawl.consumer.backlog import (
    COOLING,
    GONE,
    MARKING,
    READY,
    RUNNING,
    SETTLING,
    Backlog,
    Task,
    TaskState,
)
from zkcrawl.consumer.timing import ItemTiming
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.claims import Claimed


def task(i: int, host: str = "h:1") -> Task:
    data = item_codec.Item(url=f"http://{host}/{i}").encode()
    c = Claimed(name=f"qn-{i:010d}", seq=i, data=data, item=item_codec.decode(data).item,
                error=None, ctime=time.time())
    return Task(c, ItemTiming(c.claimed_mono, 0.0), host)


def never() -> bool:
    return False


def test_states_are_strings_with_the_values_of_the_logs():
    assert [str(s) for s in TaskState] == ["ready", "cooling", "running", "marking", "settling",
                                           "gone"]
    assert READY == "ready" and f"{COOLING}" == "cooling" and GONE is TaskState.GONE


def test_fresh_tasks_come_out_in_order_and_running_is_counted():
    b = Backlog(4)
    ts = [task(i) for i in range(3)]
    b.put(ts)
    assert len(b) == 3 and b.stats() == (0, 3, 3)
    got = [b.take(0.1) for _ in range(3)]
    assert got == ts and all(t is not None and t.state is RUNNING for t in got)
    assert b.stats() == (3, 0, 3)
    b.task_done()
    assert b.stats() == (2, 0, 3)


def test_take_waits_at_most_its_timeout_and_wakes_on_put():
    b = Backlog(2)
    t0 = time.monotonic()
    assert b.take(0.1) is None
    assert 0.09 <= time.monotonic() - t0 < 1.0
    t = task(1)
    threading.Timer(0.05, b.put, ([t],)).start()
    t0 = time.monotonic()
    assert b.take(5.0) is t and time.monotonic() - t0 < 1.0


def test_a_cooled_task_comes_back_at_its_time_ahead_of_fresh_ones():
    b = Backlog(4)
    first, fresh = task(1), task(2)
    b.put([first])
    assert b.take(0.1) is first
    b.cool(first, time.monotonic() + 0.1)
    assert first.state is COOLING and b.stats() == (1, 1, 1)
    b.put([fresh])
    assert b.release_due(never, 0.01)  # not due yet: nothing moves
    assert first.state is COOLING
    time.sleep(0.11)
    assert b.release_due(never, 0.01)
    assert first.state is READY and first.timing.polite_ms >= 100.0
    assert b.take(0.1) is first  # ahead of the fresh task put before it came back
    assert b.take(0.1) is fresh


def test_a_fresh_task_put_cooling_is_taken_only_after_its_time():
    """The claim loop knew its host's turn had not come (Worker._plan): no pool thread
    takes it before it is due, and it then goes ahead of fresh tasks."""
    b = Backlog(4)
    later, fresh = task(1), task(2, host="other:1")
    b.put([fresh], [(later, time.monotonic() + 0.1)])
    assert later.state is COOLING and fresh.state is READY
    assert b.stats() == (0, 2, 2) and b.host_load("h:1") == 1
    assert b.take(0.01) is fresh and b.take(0.01) is None
    assert b.release_due(never, 0.01)  # not due yet
    assert later.state is COOLING
    time.sleep(0.11)
    assert b.release_due(never, 0.01)
    assert later.state is READY and later.timing.polite_ms >= 100.0
    assert b.take(0.1) is later
    b.put([], [])  # nothing: no notification, no change
    assert b.stats() == (2, 0, 2)


def test_release_due_holds_cooled_tasks_while_paused_and_waits_for_the_next():
    b = Backlog(2)
    t = task(1)
    b.put([t])
    assert b.take(0.1) is t
    b.cool(t, time.monotonic())
    assert b.release_due(lambda: True, 0.05)
    assert t.state is COOLING  # paused: held
    b.cool(task(2), 0.0)  # not RUNNING: ignored
    assert b.release_due(never, 0.01) and t.state is READY  # resumed: released at once
    later = task(3)
    b.put([later])
    assert b.take(0.1) is t and b.take(0.1) is later
    b.cool(later, time.monotonic() + 0.2)
    t0 = time.monotonic()
    b.release_due(never, 5.0)  # waits until the next one is due, not for the timeout
    assert time.monotonic() - t0 < 1.0
    assert b.release_due(never, 0.01) and later.state is READY


def test_gone_tasks_are_skipped_and_never_settled():
    b = Backlog(4)
    a, c = task(1), task(2)
    b.put([a, c])
    assert b.forget([a]) == [a] and a.state is GONE
    assert b.forget([a]) == []  # already gone
    assert b.take(0.1) is c  # a was skipped
    assert b.settle(c) and c.state is SETTLING
    assert b.held(SETTLING) == [c]
    assert b.forget([c]) == [c] and not b.settle(c) and len(b) == 0


def test_lost_leases_drop_only_unstarted_tasks_of_that_claim():
    b = Backlog(4)
    waiting, running = task(1), task(2)
    b.put([running])
    assert b.take(0.1) is running
    b.put([waiting])
    again = task(1)  # the same item claimed again in a new session: a different claim
    assert b.drop_unstarted([again.claimed]) == 0
    assert b.drop_unstarted([waiting.claimed, running.claimed]) == 1
    assert waiting.state is GONE and running.state is RUNNING and b.held(RUNNING) == [running]


def test_wait_capacity_returns_a_batch_worth_or_anything_when_empty_or_stopping():
    b = Backlog(4)
    assert b.wait_capacity(2, 1.0, never) == 4
    b.put([task(i) for i in range(3)])
    t0 = time.monotonic()
    assert b.wait_capacity(2, 0.1, never) == 1  # timed out with one place
    assert time.monotonic() - t0 >= 0.09
    assert b.wait_capacity(2, 5.0, lambda: True) == 1  # stopping: at once
    held = b.held(READY)
    threading.Timer(0.05, b.forget, (held[:1],)).start()
    t0 = time.monotonic()
    assert b.wait_capacity(2, 5.0, never) == 2 and time.monotonic() - t0 < 1.0


def test_never_more_than_capacity_with_a_claimer_and_a_pool():
    cap, total = 6, 300
    b = Backlog(cap)
    seen_max = 0
    done: list[Task] = []
    lock = threading.Lock()

    def pool() -> None:
        while not b.closed:
            t = b.take(0.05)
            if t is None:
                continue
            if t.claimed.seq % 3 == 0 and t.slot is None:  # one in three cools once
                t.slot = 0.0
                b.cool(t, time.monotonic() + 0.002)
            elif b.settle(t):
                b.forget([t])
                with lock:
                    done.append(t)
            b.task_done()

    def scheduler() -> None:
        while b.release_due(never, 0.05):
            pass

    threads = [threading.Thread(target=pool) for _ in range(3)]
    threads.append(threading.Thread(target=scheduler))
    for th in threads:
        th.start()
    i = 0
    while i < total:
        free = b.wait_capacity(2, 0.5, never)
        n = min(free, total - i)
        b.put([task(j) for j in range(i, i + n)])
        i += n
        seen_max = max(seen_max, len(b))
    deadline = time.monotonic() + 10
    while len(done) < total and time.monotonic() < deadline:
        time.sleep(0.01)
    b.close()
    for th in threads:
        th.join(5)
    assert len(done) == total and len({t.name for t in done}) == total
    assert seen_max <= cap and len(b) == 0 and b.stats() == (0, 0, 0)


def test_wait_empty_and_close():
    b = Backlog(2)
    t = task(1)
    b.put([t])
    t0 = time.monotonic()
    b.wait_empty(time.monotonic() + 0.1, never, 0.02)
    assert 0.09 <= time.monotonic() - t0 < 1.0
    flag = threading.Event()
    threading.Timer(0.05, flag.set).start()
    t0 = time.monotonic()
    b.wait_empty(time.monotonic() + 5, flag.is_set, 0.02)  # a flag, no notification
    assert time.monotonic() - t0 < 1.0
    b.close()
    assert b.take(0.1) is t  # what is READY still comes out ...
    assert b.take(5.0) is None and not b.release_due(never, 5.0)  # ... then none, at once


def test_wait_empty_leaves_settling_tasks_to_the_committer_while_zookeeper_is_away():
    """Stopping with ZooKeeper away: the grace is for fetches on a pool thread; a task
    SETTLING can be completed only once ZooKeeper is back, which the committer waits for."""
    b = Backlog(3)
    running, settling = task(1), task(2)
    b.put([running, settling])
    assert b.take(0.1) is running and b.take(0.1) is settling
    assert b.settle(settling)
    b.task_done()  # the settling task's pool thread let go of it
    away = threading.Event()
    away.set()
    t0 = time.monotonic()
    b.wait_empty(time.monotonic() + 0.2, never, 0.02, settling_left=away.is_set)
    assert time.monotonic() - t0 >= 0.19  # a fetch still runs: its grace is waited
    assert b.settle(running)
    b.task_done()
    t0 = time.monotonic()
    b.wait_empty(time.monotonic() + 5, never, 0.02, settling_left=away.is_set)
    assert time.monotonic() - t0 < 1.0  # only settling tasks left, ZooKeeper away: go on
    away.clear()  # connected: the completions will go through, so they are waited for
    t0 = time.monotonic()
    b.wait_empty(time.monotonic() + 0.2, never, 0.02, settling_left=away.is_set)
    assert time.monotonic() - t0 >= 0.19


def test_an_admitted_task_waits_for_its_mark_off_the_thread_then_goes_first():
    b = Backlog(4)
    admitted, fresh = task(1), task(2)
    b.put([admitted, fresh])
    assert b.take(0.1) is admitted
    admitted.gated = True  # its host's admission taken at the gate
    assert b.await_mark(admitted) and admitted.state is MARKING
    assert b.host_load("h:1") == 2 and b.stats()[1] == 2  # still the host's, still waiting
    b.marked([task(1).claimed])  # another claim of the same name: not this task's mark
    assert admitted.state is MARKING and not admitted.marked
    b.marked([admitted.claimed])
    assert admitted.state is READY and admitted.marked
    assert b.take(0.1) is admitted  # ahead of the fresh one
    assert b.take(0.1) is fresh


def test_a_task_whose_mark_needs_no_write_is_performed_by_its_thread():
    b = Backlog(2)
    t = task(1)
    b.put([t])
    assert b.take(0.1) is t
    assert b.await_mark(t) and b.resume(t) and t.state is RUNNING  # perform it now, here
    b.forget([t])
    assert not b.resume(t) and not b.await_mark(t)  # gone: nothing to perform


def test_an_admission_is_given_back_when_its_task_leaves_before_its_start():
    withdrawn: list[str] = []
    b = Backlog(4)
    b.withdraw = withdrawn.append
    marking, marked, running = task(1, "a:1"), task(2, "b:1"), task(3, "c:1")
    b.put([marking, marked, running])
    for t in (marking, marked, running):
        assert b.take(0.1) is t
        t.gated = True
    assert b.await_mark(marking) and b.await_mark(marked)
    b.marked([marked.claimed])
    assert b.drop_unstarted([marking.claimed]) == 1  # its partition lost: never started
    assert b.forget([marked, running]) == [marked, running]  # released
    assert withdrawn == ["a:1", "b:1"]  # the running one's fetch ends it at the gate itself
    assert not marking.gated and not marked.gated and running.gated


def test_an_idle_pool_thread_asks_for_the_marks_it_waits_for_and_only_then():
    """A pool thread that finds nothing to take while tasks wait MARKING calls ``starved``
    (the queue writes the marks now instead of at the end of its coalescing window); with
    nothing MARKING -- or once every mark is in -- an idle thread asks nothing."""
    asked: list[int] = []
    b = Backlog(4)
    b.starved = lambda: asked.append(1)
    one, two, three = task(1), task(2), task(3)
    b.put([one, two, three])
    assert b.take(0.01) is one and b.take(0.01) is two and b.take(0.01) is three
    assert b.take(0.01) is None and asked == []  # idle, but no mark to wait for
    assert b.await_mark(one) and b.await_mark(two) and b.await_mark(three)
    assert b.take(0.01) is None and len(asked) == 1  # idle while marks wait: now, please
    b.marked([one.claimed])
    assert b.take(0.01) is one
    assert b.resume(two)  # needed no write after all
    b.drop_unstarted([three.claimed])  # its partition lost
    asked.clear()
    assert b.take(0.01) is None and asked == []  # every MARKING task left: no more asking


def test_no_more_tasks_are_marked_ahead_than_mark_ahead():
    """A death is charged to every marked item: with ``mark_ahead`` 2 a pool thread takes no
    fresh task while two wait MARKING or marked; a marked one is still taken, and each one
    that goes on a thread (or leaves) lets one fresh task through again."""
    b = Backlog(8, mark_ahead=2)
    ts = [task(i) for i in range(5)]
    b.put(ts)
    one, two = b.take(0.1), b.take(0.1)
    assert one is ts[0] and two is ts[1]
    assert b.await_mark(one) and b.await_mark(two)  # two MARKING: the cap
    assert b.take(0.05) is None  # fresh ones wait, though three are READY
    b.marked([one.claimed])
    assert b.take(0.05) is one and one.marked  # a marked one goes on a thread ...
    three = b.take(0.05)
    assert three is ts[2]  # ... and one fresh task may be taken again
    assert b.await_mark(three)
    assert b.take(0.05) is None
    b.forget([two])  # a MARKING task that leaves frees its place too
    assert b.take(0.05) is ts[3]


def test_the_claim_loop_marks_ahead_within_the_room_it_reserved():
    """``reserve_marks`` counts its room as MARKING at once (no pool thread takes it too);
    ``put`` adds the admitted tasks MARKING and gives the room it did not use back; a task
    marked by the claim loop reaches a pool thread once, marked."""
    b = Backlog(8, mark_ahead=3)
    first = task(1)
    b.put([first])
    assert b.take(0.1) is first and b.await_mark(first)  # one MARKING on a thread's way
    assert b.reserve_marks(5) == 2  # the cap is 3: room for two more
    assert b.reserve_marks(1) == 0  # the room is taken until put says what it used
    ahead, fresh = task(10), task(11)
    b.put([fresh], marking=[ahead], reserved=2)  # one of the two used: one goes back
    assert ahead.state is MARKING and fresh.state is READY and b.stats() == (1, 3, 3)
    assert b.take(0.05) is fresh  # the room given back lets a fresh task be admitted
    assert b.await_mark(fresh)
    assert b.reserve_marks(5) == 0  # three MARKING now (first, ahead, fresh)
    b.marked([ahead.claimed])
    assert b.take(0.05) is ahead and ahead.marked  # its one trip through the pool
    assert b.reserve_marks(5) == 1
    b.put([], reserved=1)
    assert b.reserve_marks(5) == 1
    assert Backlog(4).reserve_marks(3) == 0  # no mark_ahead: the pool admits everything


def test_the_scheduler_admits_a_planned_task_whose_time_came_and_asks_its_mark():
    """With ``admit_due``, a due cooled task with a reserved slot is admitted on the
    scheduler's thread (MARKING, gated, its mark asked): the pool takes it once, marked. The
    gate may say later (back in the heap), the worker may leave it to the pool (None), a mark
    may need no write (READY and marked at once); past ``mark_ahead`` the pool admits it."""
    b = Backlog(8, mark_ahead=2)
    verdicts: dict[str, tuple[float | None, float | None] | None] = {}
    b.admit_due = lambda t: verdicts[t.name]
    asked: list[str] = []
    written: set[str] = set()
    b.mark = lambda c, _by: (asked.append(c.name), c.name in written)[1]
    now = time.monotonic()
    admitted, later, left, unwritten, over = ts = [task(i) for i in range(5)]
    for t in ts:
        t.slot = now
    verdicts.update({admitted.name: (now, None), later.name: (now, now + 60),
                     left.name: None, unwritten.name: (now, None), over.name: (now, None)})
    written.add(unwritten.name)
    b.put([], [(t, now) for t in ts])
    b.release_due(never, 0.01)
    assert admitted.state is MARKING and admitted.gated and asked == [admitted.name,
                                                                       unwritten.name]
    assert later.state is COOLING and not later.gated  # the gate said later: in the heap
    assert left.state is READY and not left.marked  # the worker left it to the pool
    assert unwritten.state is READY and unwritten.marked  # its mark needed no write
    assert over.state is READY and not over.marked and not over.gated  # two marked ahead
    b.marked([admitted.claimed])
    taken = [b.take(0.01) for _ in range(4)]
    assert taken[0] is admitted and set(taken) == {admitted, unwritten, left, over}
    assert [t for t in taken if t.marked] == [admitted, unwritten]  # taken once, marked
    assert b.take(0.01) is None  # later still cools


def test_a_task_admitted_ahead_of_its_turn_waits_for_it_marked_in_the_heap():
    """The scheduler admits a planned task before its slot (its mark asked with the slot:
    written by then); once written, the task waits in the heap, marked and still counted
    ahead against ``mark_ahead``, and goes to the pool, in front, only at its slot. One
    that leaves meanwhile gives its admission back."""
    b = Backlog(8, mark_ahead=2)
    asked: list[tuple[str, float | None]] = []
    b.mark = lambda c, by: (asked.append((c.name, by)), False)[1]
    withdrawn: list[str] = []
    b.withdraw = withdrawn.append
    now = time.monotonic()
    soon, gone, fresh = task(0), task(1, host="other:1"), task(2, host="third:1")
    slots = {soon.name: now + 0.3, gone.name: now + 60}
    b.admit_due = lambda t: (slots[t.name], None)  # admitted, to start at its slot
    for t in (soon, gone):
        t.slot = now
    b.put([], [(soon, now), (gone, now)])
    b.release_due(never, 0.01)
    assert asked == [(soon.name, slots[soon.name]), (gone.name, slots[gone.name])]
    b.marked([soon.claimed, gone.claimed])
    assert soon.state is COOLING and soon.marked and soon.gated
    b.put([fresh])
    assert b.take(0.01) is None  # fresh waits: two marked ahead (the cap), none due yet
    b.forget([gone])
    assert withdrawn == ["other:1"]  # its admission given back
    assert b.take(0.01) is fresh  # one ahead now: room again
    deadline = time.monotonic() + 10
    while soon.state is COOLING and time.monotonic() < deadline:  # bounded: due in 0.3 s
        b.release_due(never, 0.05)
    assert soon.state is READY and time.monotonic() >= slots[soon.name] - 0.01
    assert b.take(0.01) is soon


def test_a_marked_task_cooled_and_due_again_goes_in_front_of_fresh_ones():
    b = Backlog(8, mark_ahead=1)
    ts = [task(i) for i in range(3)]
    b.put(ts)
    t = b.take(0.1)
    assert t is ts[0] and b.await_mark(t)
    b.marked([t.claimed])
    assert b.take(0.1) is t
    b.cool(t, time.monotonic())  # paused after its mark: back to the heap, still marked
    b.release_due(never, 0.01)
    assert b.take(0.1) is t  # at the cap, the marked one is found in front
    assert b.take(0.1) is ts[1]


def test_the_backlog_count_follows_every_state_change():
    """stats() keeps the count of unstarted tasks (READY, COOLING, MARKING) as the states
    change instead of walking the table: the same figure as the walk, step by step."""
    b = Backlog(16)

    def check() -> None:
        walk = sum(1 for t in b.held(READY, COOLING, MARKING))
        assert b.stats()[1] == walk and b.stats()[2] == len(b)

    ts = [task(i, host=f"h{i % 3}:1") for i in range(8)]
    b.put(ts)
    check()
    a, c, d, e, f = (b.take(0.1) for _ in range(5))
    assert a and c and d and e and f
    check()
    b.cool(a, time.monotonic())  # RUNNING -> COOLING
    check()
    b.release_due(never, 0.01)  # COOLING -> READY (priority)
    check()
    assert b.await_mark(c)  # RUNNING -> MARKING
    check()
    b.marked([c.claimed])  # MARKING -> READY
    check()
    assert b.await_mark(d) and b.resume(d)  # MARKING -> RUNNING
    check()
    assert b.settle(d)  # RUNNING -> SETTLING
    check()
    b.forget([d, ts[7]])  # SETTLING and READY -> GONE
    check()
    assert b.await_mark(e)
    b.drop_unstarted([e.claimed, f.claimed, ts[6].claimed])  # MARKING, RUNNING, READY
    check()
    b.forget(list(ts))
    check()
    assert b.stats() == (b.stats()[0], 0, 0)


def test_below_mark_ahead_fresh_tasks_are_admitted_before_marked_ones_run():
    """Marks are written ahead of the threads that need them: while fewer than
    ``mark_ahead`` wait for or hold a mark, a thread takes an unmarked task (to admit it
    and ask its mark) before a marked one, so the threads rarely wait for a checkpoint."""
    b = Backlog(8, mark_ahead=2)
    ts = [task(i) for i in range(4)]
    b.put(ts)
    first = b.take(0.1)
    assert first is ts[0] and b.await_mark(first)
    b.marked([first.claimed])  # one marked, READY: below the cap of 2
    assert b.take(0.1) is ts[1]  # a fresh one first ...
    assert b.await_mark(ts[1])  # ... now two ahead: the cap
    assert b.take(0.1) is first  # then the marked one


def test_a_busy_pool_asks_for_the_next_marks_before_its_marked_tasks_run_out():
    """Taking a marked task that leaves fewer than ``low_water`` (a quarter of
    ``mark_ahead``) marked and ready while others wait MARKING calls ``starved``: the next
    marks are written while the pool still has marked work, not once a thread idles. Above
    the low water, or with nothing MARKING, a take asks nothing; ``ask_marks`` (marks
    asked off the pool) asks by the same rule once it asked them."""
    asked: list[int] = []
    b = Backlog(16, mark_ahead=8)
    assert b.low_water == 2 and Backlog(4).low_water == 0
    b.starved = lambda: asked.append(1)
    b.mark = lambda _c, _by: False  # every mark needs a write

    def ahead(*ids: int) -> list[Task]:  # the claim loop admits these: MARKING
        ts = [task(i) for i in ids]
        assert b.reserve_marks(len(ts)) == len(ts)
        b.put([], marking=ts, reserved=len(ts))
        waiting.extend(ts)
        return ts

    def take_marked() -> None:
        t = b.take(0.01)
        assert t is not None and t.marked

    waiting: list[Task] = []
    ahead(0, 1, 2, 3)
    b.marked([t.claimed for t in waiting])  # four marked and ready, none MARKING
    waiting.clear()
    for _ in range(3):
        take_marked()
    assert asked == []  # one left, but no mark waits
    b.ask_marks(ahead(10, 11, 12))
    assert asked == [1]  # one marked ready (< 2) while three wait MARKING: write them now
    asked.clear()
    b.marked([t.claimed for t in waiting])  # four ready now
    waiting.clear()
    take_marked()
    assert asked == []  # three left: above the low water
    b.ask_marks(ahead(20))
    assert asked == []  # three marked ready: enough for now
    take_marked()
    assert asked == []  # two left: not below the low water
    take_marked()
    assert asked == [1]  # one left while one waits MARKING


def test_with_a_pool_thread_idle_marks_keep_the_coalescing_window():
    """The low water is a busy pool's rule: while a pool thread waits in ``take``, marks
    asked off the pool do not hurry the checkpoint (the thread asked when it began to wait,
    with nothing MARKING then: nothing); once no thread waits, the same marks do."""
    asked: list[int] = []
    b = Backlog(16, mark_ahead=8)
    b.starved = lambda: asked.append(1)
    b.mark = lambda _c, _by: False
    got: list[Task | None] = []
    waiter = threading.Thread(target=lambda: got.append(b.take(10.0)))
    waiter.start()
    deadline = time.monotonic() + 10
    while b._idle == 0 and time.monotonic() < deadline:  # bounded: the thread is waiting
        time.sleep(0.001)
    ts = [task(i) for i in range(3)]
    assert b.reserve_marks(3) == 3
    b.put([], marking=ts, reserved=3)
    b.ask_marks(ts)
    assert asked == []  # a thread is idle: the queue's window, not the low water
    b.marked([ts[0].claimed])
    waiter.join(10)
    assert not waiter.is_alive() and got == [ts[0]]
    assert asked == [1]  # that take left none marked, two waiting, and no thread idle
