"""The capped queue in front of the consumer's pool: :class:`Backlog` holds every claimed
item as a :class:`Task` in exactly one :class:`TaskState` until it is gone (the state
diagram and who calls what: :class:`Backlog`'s docstring).

* **Bounded**: never more than ``capacity`` (``--threads + --backlog``) tasks in the table.
* **Marks ahead, at most ``mark_ahead``** (2 x ``--threads``): unmarked tasks (by the claim
  loop as they arrive, else by the pool: cooled, then fresh) are admitted while fewer wait
  for or hold a written mark, then the marked ones run -- the threads rarely wait for a
  checkpoint, and a death is charged to no more than the running tasks and ``mark_ahead``
  marked ones. A cooling task is a heap entry, so no thread waits for a host.
* **An admission is used or given back** (``withdraw``), and a task is handed to one pool
  thread per READY.
* **Every wait is bounded** by its ``timeout``, so flags set by a signal handler are seen.
* **Per host**: :meth:`~Backlog.host_load` is what the worker caps
  (:class:`~zkcrawl.consumer.parking.Parking`).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from zkcrawl.consumer.pipeline import Outcome
from zkcrawl.consumer.timing import ItemTiming
from zkcrawl.politeness.gate import EARLY
from zkcrawl.queue.claims import Claimed
from zkcrawl.web.robots import RobotsDecision

__all__ = ["COOLING", "GONE", "LEAD", "MARKING", "READY", "RUNNING", "SETTLING", "Backlog",
           "Task", "TaskState"]

# A cooled task leaves the heap this much before its slot; the pool thread that picks it up
# sleeps the rest (< EARLY), so the hand-over does not make it start late.
LEAD = EARLY / 2


def _ahead_of(task: Task, now: float) -> float | None:
    """The start of a task admitted ahead of its turn (its slot, more than EARLY away:
    its mark is needed by then, and it waits for the slot in the heap), else None."""
    slot = task.slot
    return slot if slot is not None and slot - now > EARLY else None


class TaskState(StrEnum):
    """Where a held item is (a ``str``: the values may appear in logs)."""

    READY = "ready"  # in the backlog, waiting for a pool thread
    COOLING = "cooling"  # its host's turn has not come: in the time-ordered heap
    RUNNING = "running"  # a pool thread has it
    MARKING = "marking"  # admitted: its start mark is being written (no thread holds it)
    SETTLING = "settling"  # processed: the committer settles it in ZooKeeper
    GONE = "gone"  # settled, released or lost: forgotten


READY = TaskState.READY
COOLING = TaskState.COOLING
RUNNING = TaskState.RUNNING
MARKING = TaskState.MARKING
SETTLING = TaskState.SETTLING
GONE = TaskState.GONE
_UNSTARTED = (READY, COOLING, MARKING)  # no request made for it yet


@dataclass(eq=False)
class Task:
    """One held item on its way through the consumer."""

    claimed: Claimed
    timing: ItemTiming
    host: str
    state: TaskState = READY
    slot: float | None = None  # politeness slot reserved for it, once asked
    gated: bool = False  # admitted by the HostGate: the fetch holds the host's turn
    marked: bool = False  # admitted and its start mark written: performed when next taken
    cooled_at: float = 0.0
    outcome: Outcome | None = None  # what processing decided, once handed to the committer
    load_key: str = ""  # the host it was counted under in Backlog.host_load (host may change)
    robots: tuple[str, RobotsDecision, float] | None = None  # the verdict read for its slot

    @property
    def name(self) -> str:
        return self.claimed.name


class Backlog:
    """The capped queue between the claim loop and the pool.

    The design's "bounded thread pool behind a capped queue", written down. Every item the
    consumer holds a lease on is a :class:`Task` in the backlog's table until it is gone, and is
    in exactly one :class:`TaskState`::

        put -> READY -> take -> RUNNING -> settle -> SETTLING -> forget -> GONE
         |       ^  ^              | cool(task, due)
         |       |  +-- release_due --+-- COOLING (time-ordered heap)
         |       |                 | await_mark (admitted: its start mark is being written)
         |       +---- marked -----+-- MARKING
         +-- put(..., cooled): COOLING at once (the claim loop knew its turn had not come)
         +-- put(..., marking): MARKING at once (the claim loop admitted it, mark asked)
         COOLING -- release_due, admit_due --> MARKING (the scheduler admitted it)

    A task admitted to start (its host's slot taken at the gate) waits MARKING, off the pool
    thread, until its start mark is written (:meth:`zkcrawl.consumer.owned_queue.OwnedQueue.mark`: a
    holder's death is charged only for the items it had started, and the mark must be durable
    before the request); :meth:`~Backlog.marked` brings it back READY at the very front, with
    ``marked`` set: the next pool thread performs it without admitting it again. A pool
    thread that finds nothing to take while tasks wait MARKING calls ``starved`` (the queue's
    ``mark_soon``): the marks go now rather than at the end of the queue's coalescing window.
    So does, while no pool thread is idle, a take that leaves fewer than
    :attr:`~Backlog.low_water` marked tasks ready while marks wait (and
    :meth:`~Backlog.ask_marks`, once it asked marks off the pool): a busy pool has the next
    marks written before its threads run out of marked tasks, not after (bench e2e: threads
    idled for a checkpoint's write, ~4 ms, several times a second).

    Who calls what:

    * the **claim loop** (one thread): :meth:`~Backlog.wait_capacity`, then
      :meth:`~Backlog.reserve_marks` and :meth:`~Backlog.put` of at most that many tasks
      (READY; COOLING when it reserved their slots for later: ``Worker._plan``; MARKING when
      it admitted them within the room reserved: ``Worker._admit_ahead``), then
      :meth:`~Backlog.ask_marks` of those;
    * the **pool threads**: :meth:`~Backlog.take`, then :meth:`~Backlog.cool` (its host's turn has
      not come), :meth:`~Backlog.await_mark` (admitted: its mark is written off the thread) or
      :meth:`~Backlog.settle` (done: the committer has it), and :meth:`~Backlog.task_done` when
      they let go of it;
    * the queue's checkpoint thread: :meth:`~Backlog.marked` (marks written);
    * the **scheduler** (one thread): :meth:`~Backlog.release_due` in a loop (admitting a
      due planned task itself through ``admit_due``, its mark asked through ``mark``);
    * the committer and the claim loop: :meth:`~Backlog.forget` (settled, released or lost),
      :meth:`~Backlog.drop_unstarted` (items lost with a session: its partitions went);
    * shutdown: :meth:`~Backlog.held`, :meth:`~Backlog.wait_empty`, :meth:`~Backlog.close`.

    Guarantees:

    * **Bounded**: never more than ``capacity`` (``--threads + --backlog``) tasks in the table,
      whatever their state: only the claim loop adds, and it adds no more than
      :meth:`~Backlog.wait_capacity` returned.
    * **Marks ahead**: with ``mark_ahead``, a cooled task whose host's turn came, then a
      fresh one, is taken while fewer than ``mark_ahead`` tasks are MARKING or marked and
      READY; then a marked one (it holds its host's admission). Without it, marked ones
      first.
    * **An admission is used or given back**: a task admitted at the gate (``gated``) that
      leaves the table while it waits (MARKING, or marked and READY or COOLING) gives its
      host's admission back (``withdraw``, set by the worker: the gate's
      :meth:`~zkcrawl.politeness.gate.HostGate.withdraw`); one on a pool thread uses it.
    * **No thread waits for a host**: a cooling task is a heap entry; the scheduler hands it back
      (at ``due``) and the pool thread that had it goes on with another.
    * **Once**: a task is taken by one pool thread per ``READY``; a task released or lost while it
      sat in a deque is skipped there, never handed out.
    * **Every wait is bounded** by its ``timeout``: flags set by a signal handler (which must not
      take this lock to notify) are seen within it.
    * **Per host**: :meth:`~Backlog.host_load` counts a host's tasks that still need the host
      (READY, COOLING, MARKING, RUNNING) -- what the worker caps so that no host fills the table
      (:class:`~zkcrawl.consumer.parking.Parking`).

    One lock guards the table, the two deques, the heap and the running count; three conditions
    share it: ``work`` (a task became READY), ``cooled`` (the heap changed, or the cluster was
    paused or resumed) and ``capacity`` (tasks left the table). No allocation or lock per item
    beyond the deque append and the one acquisition per step.
    """

    def __init__(self, capacity: int, mark_ahead: int | None = None) -> None:
        self.capacity = capacity
        # at most this many tasks MARKING or marked and not yet on a thread (None: no cap):
        # a death is charged to every marked item, so no more are marked than the pool
        # can start next
        self.mark_ahead = mark_ahead
        # fewer marked tasks ready than this while marks wait: have them written now (a
        # quarter of mark_ahead -- half the pool's threads -- lasts a full pool longer than
        # a checkpoint's write takes)
        self.low_water = 0 if mark_ahead is None else mark_ahead // 4
        self._marked_ready = 0  # tasks READY with their mark written (in _priority, first)
        # tasks COOLING with their mark written: admitted ahead of a slot still to come (the
        # scheduler, ``admit_due``), or cooled again after it (paused, the server silent)
        self._marked_cooling = 0
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._cooled = threading.Condition(self._lock)
        self._capacity = threading.Condition(self._lock)
        self._tasks: dict[str, Task] = {}  # every held task, by item name
        self._ready: deque[Task] = deque()
        self._priority: deque[Task] = deque()  # cooled tasks whose turn came: they go first
        self._heap: list[tuple[float, int, Task]] = []
        self._seq = itertools.count()
        self._running = 0
        self._closed = False
        self._per_host: dict[str, int] = {}  # tasks READY, COOLING, MARKING or RUNNING
        self._freed: set[str] | None = None  # hosts unloaded since take_freed (once asked)
        # gives back the admission of a gated task that leaves while waiting (the gate's
        # withdraw; called under this lock, takes only the politeness table's)
        self.withdraw: Callable[[str], None] | None = None
        # a pool thread found nothing to take while tasks wait MARKING: their marks should
        # be written now, not at the end of the queue's coalescing window (the queue's
        # mark_soon; called under this lock, sets an event)
        self.starved: Callable[[], None] | None = None
        # the scheduler admits a due planned task itself (Worker._admit_due: the gate's
        # (start, due), or None to leave it to the pool; called under this lock, takes only
        # the politeness table's), then asks its mark (the queue's mark, outside the lock)
        self.admit_due: Callable[[Task], tuple[float | None, float | None] | None] | None = None
        # (the claim, the time it is to start when that is ahead -- the mark is needed by
        # then -- else None)
        self.mark: Callable[[Claimed, float | None], bool] | None = None
        self._marking = 0  # tasks MARKING
        self._unstarted = 0  # tasks READY, COOLING or MARKING (stats: no walk of the table)
        self._idle = 0  # pool threads waiting in take for a task

    def __len__(self) -> int:
        """Tasks held (taken from the partitions, not settled), in any state but GONE."""
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- claim loop -----------------------------------------------------------------------
    def wait_capacity(self, want: int, timeout: float, stop: Callable[[], bool]) -> int:
        """Free places, once ``want`` are free, or any while nothing is held, or when
        ``stop()`` is true; at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._capacity:
            while True:
                free = self.capacity - len(self._tasks)
                if free >= want or (free > 0 and not self._tasks) or stop():
                    return free
                left = deadline - time.monotonic()
                if left <= 0:
                    return free
                self._capacity.wait(left)

    def reserve_marks(self, n: int) -> int:
        """Room for up to ``n`` start marks asked by the claim loop (``mark_ahead`` not yet
        reached): counted as MARKING from now, so no pool thread takes the same room; what
        :meth:`put` does not use of it (``reserved``) is given back there."""
        with self._lock:
            if self.mark_ahead is None:
                return 0
            room = max(0, min(n, self.mark_ahead - self._ahead()))
            self._marking += room
            return room

    def put(self, tasks: Sequence[Task], cooled: Sequence[tuple[Task, float]] = (),
            marking: Sequence[Task] = (), reserved: int = 0) -> None:
        """Add freshly claimed tasks, at most what :meth:`wait_capacity` returned: READY, or
        -- ``cooled``, ``(task, due)`` -- COOLING until the monotonic time ``due`` (the claim
        loop knew its host's turn had not come: no pool thread takes it before it has), or
        -- ``marking``, admitted by the claim loop within the room it :meth:`reserve_marks`
        (``reserved``) -- MARKING: its start mark is asked next (``Worker._admit_ahead``), and
        :meth:`marked` hands it to a pool thread once written (one trip through the pool)."""
        with self._lock:
            self._marking -= reserved - len(marking)  # the room not used goes back
            for t in marking:
                self._add(t)
                t.state = MARKING
            if reserved > len(marking):
                self._fresh_may_go()
            for t in tasks:
                self._add(t)
                self._ready.append(t)
            if tasks:
                self._work.notify(len(tasks))
            if cooled:
                now = time.monotonic()
                for t, due in cooled:
                    self._add(t)
                    t.state = COOLING
                    t.cooled_at = now
                    heapq.heappush(self._heap, (due, next(self._seq), t))
                self._cooled.notify()

    def _add(self, t: Task) -> None:
        self._tasks[t.name] = t
        self._unstarted += 1
        t.load_key = t.host
        self._per_host[t.host] = self._per_host.get(t.host, 0) + 1

    @property
    def per_host(self) -> Mapping[str, int]:
        """Per host, :meth:`host_load`: the live table itself, for a reader that asks of
        many hosts at once (the claim loop's pick); read it, never write it."""
        return self._per_host

    def host_load(self, host: str) -> int:
        """Tasks of ``host`` that still need it: READY, COOLING, MARKING or RUNNING (a
        lock-free read of one counter: the claim loop's estimate, exact once it has the
        lock)."""
        return self._per_host.get(host, 0)

    def take_freed(self) -> set[str]:
        """The hosts whose load went down since the last call (the first call starts the
        count): the claim loop asks again only those whose room it found none of."""
        with self._lock:
            freed, self._freed = self._freed, set()
        return freed if freed is not None else set()

    def _unload(self, task: Task) -> None:
        """``task`` stops needing its host (settling, or gone before it settled)."""
        if self._freed is not None:
            self._freed.add(task.load_key)
        n = self._per_host.get(task.load_key, 0) - 1
        if n > 0:
            self._per_host[task.load_key] = n
        else:
            self._per_host.pop(task.load_key, None)

    # -- pool threads ---------------------------------------------------------------------
    def take(self, timeout: float) -> Task | None:
        """The next READY task (:meth:`_next`) now RUNNING; None once closed, or when none
        came within ``timeout`` seconds."""
        deadline: float | None = None
        with self._lock:
            while True:
                task = self._next()
                if task is not None:
                    if task.marked:
                        self._marked_ready -= 1
                        self._fresh_may_go()
                        self._low_on_marks()
                    task.state = RUNNING
                    self._running += 1
                    self._unstarted -= 1
                    return task
                if self._closed:
                    return None
                now = time.monotonic()
                if deadline is None:
                    deadline = now + timeout
                    if self._marking and self.starved is not None:
                        self.starved()  # an idle thread: the marks it waits for go now
                elif now >= deadline:
                    return None
                self._idle += 1
                try:
                    self._work.wait(deadline - now)
                finally:
                    self._idle -= 1

    def _low_on_marks(self) -> None:
        """A busy pool (no thread waiting in :meth:`take`) about to run out of marked tasks
        while marks wait: they go now. With a thread idle, the marks keep the queue's
        coalescing window (an idle thread asked when it began to wait): a polite crawl's
        pool is mostly idle, and writing every 20 ms rather than every 0.1 s cost it ~60 %
        more ZooKeeper writes a page (bench skew 0.27 -> 0.43) for no pace."""
        if (self._marking and not self._idle and self._marked_ready < self.low_water
                and self.starved is not None):
            self.starved()

    def _next(self) -> Task | None:
        """The READY task to hand out next, or None. With ``mark_ahead``, unmarked ones
        (cooled, then fresh) while fewer than ``mark_ahead`` wait for or hold a written
        mark, so that marks are written ahead of the threads that will need them; then
        the marked ones. Without, marked ones first."""
        prio = self._priority
        while prio and prio[0].state is not READY:  # released or lost while it waited
            prio.popleft()
        while self._ready and self._ready[0].state is not READY:
            self._ready.popleft()
        if self.mark_ahead is None:
            if prio:
                return prio.popleft()
            return self._ready.popleft() if self._ready else None
        if self._ahead() >= self.mark_ahead:  # enough marked ahead
            return prio.popleft() if prio and prio[0].marked else None
        for i, task in enumerate(prio):  # marked ones are in front: the first unmarked
            if not task.marked and task.state is READY:
                del prio[i]
                return task
        if self._ready:
            return self._ready.popleft()
        return prio.popleft() if prio else None  # nothing unmarked: a marked one

    def task_done(self) -> None:
        """The pool thread that took a task is done with it (counted by :meth:`stats`)."""
        with self._lock:
            self._running -= 1

    def cool(self, task: Task, due: float) -> None:
        """A RUNNING task waits (COOLING) until the monotonic time ``due``, then goes back to
        the pool ahead of fresh tasks; nothing happens to a task no longer RUNNING."""
        with self._lock:
            if task.state is RUNNING:
                task.state = COOLING
                self._marked_cooling += task.marked
                self._unstarted += 1
                task.cooled_at = time.monotonic()
                heapq.heappush(self._heap, (due, next(self._seq), task))
                self._cooled.notify()

    def await_mark(self, task: Task) -> bool:
        """A RUNNING task admitted to start waits for its start mark (MARKING), off the pool
        thread: asked before the mark is, so that :meth:`marked` and
        :meth:`drop_unstarted` always find it there. False when it is gone meanwhile
        (released: its admission given back)."""
        with self._lock:
            if task.state is not RUNNING:
                if task.gated and self.withdraw is not None:
                    task.gated = False
                    self.withdraw(task.host)
                return False
            task.state = MARKING
            self._marking += 1
            self._unstarted += 1
            return True

    def resume(self, task: Task) -> bool:
        """Its mark needed no write after all: MARKING -> RUNNING, performed on the thread
        that has it (True); False when it left meanwhile (dropped: admission given
        back)."""
        with self._lock:
            if task.state is not MARKING:
                return False
            task.state = RUNNING
            self._marking -= 1
            self._unstarted -= 1
            self._fresh_may_go()
            return True

    def _ahead(self) -> int:
        """Tasks MARKING or marked and not yet on a thread (what ``mark_ahead`` caps)."""
        return self._marking + self._marked_ready + self._marked_cooling

    def _fresh_may_go(self) -> None:
        """One mark fewer ahead: an unmarked task may go now -- a waiting thread is woken
        only when one is READY (fresh, or cooled: in ``_priority`` beside the marked ones,
        which all are). A wake-up for nothing cost two context switches a page with 32
        threads."""
        if self._ready or len(self._priority) > self._marked_ready:
            self._work.notify()

    # -- the queue's checkpoint thread ----------------------------------------------------
    def marked(self, claims: Iterable[Claimed]) -> None:
        """The start marks of these items are written: their MARKING tasks go back to the
        pool first of all (``marked``: performed without a second admission). Matched by
        identity, as :meth:`drop_unstarted`."""
        with self._lock:
            n = 0
            now = time.monotonic()
            for c in claims:
                task = self._tasks.get(c.name)
                if task is not None and task.claimed is c and task.state is MARKING:
                    task.marked = True
                    self._marking -= 1
                    if (start := _ahead_of(task, now)) is not None:
                        # admitted ahead of its slot (admit_due): it waits for it in the heap
                        task.state = COOLING
                        task.cooled_at = now
                        self._marked_cooling += 1
                        heapq.heappush(self._heap, (start - LEAD, next(self._seq), task))
                        self._cooled.notify()
                        continue
                    task.state = READY
                    self._marked_ready += 1
                    self._priority.appendleft(task)
                    n += 1
            if n:
                self._work.notify(n)

    def settle(self, task: Task) -> bool:
        """The task goes to the committer (SETTLING); False if it is already gone."""
        with self._lock:
            if task.state is GONE:
                return False
            if task.state is not SETTLING:
                self._unload(task)
            if task.state in _UNSTARTED:
                self._unstarted -= 1
            task.state = SETTLING
            return True

    # -- scheduler thread -----------------------------------------------------------------
    def release_due(self, paused: Callable[[], bool], timeout: float) -> bool:
        """Hand every cooled task whose time came back to the pool (unless ``paused()``),
        then wait until the next one is due, a :meth:`cool`, a :meth:`wake_scheduler` or
        ``timeout``. False once closed: the scheduler's loop ends.

        With ``admit_due`` set, an unmarked task with a reserved slot is admitted here
        instead, while fewer than ``mark_ahead`` are marked ahead: MARKING, its start mark
        asked (``mark``, outside the lock) -- the pool takes it once, marked; or COOLING
        again when the gate says later. ``admit_due`` returns None to leave it to the
        pool."""
        to_mark: list[Task] = []
        with self._lock:
            if self._closed:
                return False
            wait = timeout
            if self._heap and not paused():
                now = time.monotonic()
                heap = self._heap
                later: list[tuple[float, int, Task]] = []
                while heap and heap[0][0] <= now:
                    task = heapq.heappop(heap)[2]
                    if task.state is not COOLING:  # released or lost meanwhile
                        continue
                    task.timing.polite_ms += (now - task.cooled_at) * 1000.0
                    task.cooled_at = now
                    if self._admitted_here(task, later, to_mark):
                        continue
                    task.state = READY
                    if task.marked:  # marked ones stay in front (_next)
                        self._marked_cooling -= 1
                        self._marked_ready += 1
                        self._priority.appendleft(task)
                    else:
                        self._priority.append(task)
                    self._work.notify()
                for entry in later:
                    heapq.heappush(heap, entry)
                if heap:
                    wait = min(wait, heap[0][0] - now)
            if not to_mark:
                self._cooled.wait(wait)
                return not self._closed
        self.ask_marks(to_mark)
        return not self._closed

    def _admitted_here(self, task: Task, later: list[tuple[float, int, Task]],
                       to_mark: list[Task]) -> bool:
        """Under the lock: admit a due COOLING task on the scheduler's thread (see
        :meth:`release_due`). True: handled here -- admitted, MARKING, into ``to_mark``
        (its mark to ask), or into ``later`` (COOLING again); False: to the pool as
        READY."""
        admit = self.admit_due
        if (admit is None or task.marked or task.slot is None or self.mark_ahead is None
                or self._ahead() >= self.mark_ahead):
            return False
        verdict = admit(task)
        if verdict is None:
            return False
        start, due = verdict
        task.slot = start
        if due is not None:
            later.append((due, next(self._seq), task))
            return True
        task.gated = True  # under the lock: a _gone from now on gives the admission back
        task.state = MARKING
        self._marking += 1
        to_mark.append(task)
        return True

    def ask_marks(self, tasks: Sequence[Task]) -> None:
        """Ask the start marks of tasks admitted off the pool -- by the scheduler, or by the
        claim loop (``put(..., marking)``) -- outside the lock (the queue's own); a mark that
        needs no write hands its task to the pool at once; then the marks go now if the pool
        is about to run out of marked tasks (:attr:`low_water`)."""
        if not tasks:
            return
        assert self.mark is not None
        now = time.monotonic()
        done = [t.claimed for t in tasks
                if self.mark(t.claimed, _ahead_of(t, now))]
        if done:
            self.marked(done)
        with self._lock:
            self._low_on_marks()

    def wake_scheduler(self) -> None:
        """Something :meth:`release_due` depends on changed (the cluster paused or resumed)."""
        with self._lock:
            self._cooled.notify_all()

    # -- leaving the table ----------------------------------------------------------------
    def forget(self, tasks: Iterable[Task]) -> list[Task]:
        """Tasks settled, released or lost: GONE, out of the table, their places free.
        Returns those that were still held (the others were gone already)."""
        with self._lock:
            held = [t for t in tasks if t.state is not GONE]
            for t in held:
                self._gone(t)
            self._capacity.notify_all()
        return held

    def drop_unstarted(self, lost: Iterable[Claimed]) -> int:
        """Leases lost with a session: forget their tasks not started yet (READY, COOLING or
        MARKING); returns how many. Matched by identity, not name: the item may already
        be claimed again in the new session, and that claim is valid."""
        dropped = 0
        with self._lock:
            for c in lost:
                task = self._tasks.get(c.name)
                if task is not None and task.claimed is c and task.state in _UNSTARTED:
                    self._gone(task)
                    dropped += 1
            self._capacity.notify_all()
        return dropped

    def _gone(self, task: Task) -> None:
        if task.state is MARKING:
            self._marking -= 1
            self._work.notify()  # one mark fewer ahead
        elif task.state is READY and task.marked:
            self._marked_ready -= 1
            self._work.notify()
        elif task.state is COOLING and task.marked:
            self._marked_cooling -= 1
            self._work.notify()
        if task.state in _UNSTARTED:
            self._unstarted -= 1
        if task.state is not SETTLING and task.state is not GONE:
            self._unload(task)
        if task.gated and task.state in _UNSTARTED and self.withdraw is not None:
            task.gated = False
            self.withdraw(task.host)  # admitted, never started: the host is free again
        task.state = GONE
        if self._tasks.get(task.name) is task:  # not a newer claim of the same item
            del self._tasks[task.name]

    # -- anyone ---------------------------------------------------------------------------
    def held(self, *states: TaskState) -> list[Task]:
        """The tasks held in any of ``states`` now."""
        with self._lock:
            return [t for t in self._tasks.values() if t.state in states]

    def stats(self) -> tuple[int, int, int]:
        """``(running, backlog, held)``: tasks on a pool thread, tasks waiting (READY,
        COOLING or MARKING), all tasks held."""
        with self._lock:
            return self._running, self._unstarted, len(self._tasks)

    def wait_empty(self, deadline: float, stop: Callable[[], bool], tick: float,
                   settling_left: Callable[[], bool] = lambda: False) -> None:
        """Wait until nothing is held, ``stop()`` is true (checked every ``tick``) or the
        monotonic ``deadline``. While ``settling_left()`` is true (ZooKeeper away: no
        completion or mark can go through before it is back) tasks SETTLING or MARKING are
        not waited for, only the ones on a pool thread."""
        with self._capacity:
            while self._tasks and not stop():
                if not self._running and settling_left() and all(
                        t.state is SETTLING or t.state is MARKING
                        for t in self._tasks.values()):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._capacity.wait(min(left, tick))

    def close(self) -> None:
        """Wake every waiter: :meth:`take` returns None once nothing is READY,
        :meth:`release_due` returns False."""
        with self._lock:
            self._closed = True
            self._cooled.notify_all()
            self._work.notify_all()
            self._capacity.notify_all()
