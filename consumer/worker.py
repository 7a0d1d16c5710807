"""The consumer's Worker: claim -> schedule -> pool -> fetch/extract/sink -> outcome.

Read it like rq's worker: :meth:`Worker.run` is a short loop of named steps; stopping is
decided in one place, :meth:`Worker.request_stop` (called by the signal handlers installed
in ``consumer.main``), plus the idle timer and a sink failure. Each held item is a
:class:`Task` holding one lease::

    claim -> ready -> [pool thread] admit -> running -> settling (committer) -> gone
               ^                      | host cooling: time-ordered heap, no thread waits
               +------- cooling <-----+

* **Bounded**: never more than ``threads + backlog`` leases, whatever state they are in.
* **Polite without idling**: a cooled item waits in the heap; the scheduler thread hands it
  back, ahead of fresh items, when its host's turn comes (:class:`~consumer.pipeline.HostGate`).
* **Durable before done**: the committer (:class:`~consumer.sink.GroupCommit`) writes the
  group's records in one write, fsyncs once, then completes the group in ZooKeeper.
* **Connection trouble**: SUSPENDED holds claims and completions; after LOST, items not yet
  started are dropped (others take them), the rest finish and come back as "lost" -- the
  documented at-least-once duplicates.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import structlog

from consumer.metrics import Metrics
from consumer.pipeline import COMPLETE, DEAD, EARLY, RETRY, Outcome, Pipeline
from consumer.settings import ConsumerSettings
from consumer.sink import GroupCommit, Settle, Sink
from consumer.timing import ItemTiming, Timings
from zkcrawl.errors import ExitStatus, SinkError
from zkcrawl.queue import control
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.leases import Claimed, LeaseQueue
from zkcrawl.queue.registry import Registration
from zkcrawl.web.urls import host_key
from zkcrawl.zk.client import ZkClient

# structlog.get_logger is a lazy proxy: it picks up the configuration made at start-up.
log = structlog.get_logger(__name__)

TICK = 0.5  # longest the claim loop blocks: reaction time to signals, pause and idleness
READY, COOLING, RUNNING, SETTLING, GONE = "ready", "cooling", "running", "settling", "gone"
# A cooled item leaves the heap this much before its slot; the pool thread that picks it up
# sleeps the rest (< EARLY), so the hand-over does not make it start late.
LEAD = EARLY / 2


@dataclass(eq=False)
class Task:
    """One held item on its way through the consumer."""

    claimed: Claimed
    timing: ItemTiming
    host: str
    state: str = READY
    slot: float | None = None  # politeness slot reserved for it, once asked
    gated: bool = False  # admitted by the HostGate: the fetch holds the host's turn
    cooled_at: float = 0.0

    @property
    def name(self) -> str:
        return self.claimed.name


class Worker:
    """One consumer daemon's machinery around a :class:`LeaseQueue`."""

    def __init__(self, settings: ConsumerSettings, zk: ZkClient, queue: LeaseQueue,
                 pipeline: Pipeline, sink: Sink, metrics: Metrics, consumer_id: str) -> None:
        self.s = settings
        self.zk, self.queue, self.pipeline, self.sink = zk, queue, pipeline, sink
        self.metrics = metrics
        self.id = consumer_id
        self.timings = Timings()
        self.started_at = time.time()
        self.state = "starting"
        self._lock = threading.Lock()
        self._capacity = threading.Condition(self._lock)
        self._sched = threading.Condition(self._lock)
        self._work = threading.Condition(self._lock)  # the capped backlog has items
        self._tasks: dict[str, Task] = {}
        self._ready: deque[Task] = deque()
        self._priority: deque[Task] = deque()  # cooled items whose turn came: they go first
        self._heap: list[tuple[float, int, Task]] = []
        self._seq = itertools.count()
        self._running = 0
        self._stop_claiming = False  # request_stop/fail set plain flags: signal-safe
        self._force = False
        self._closed = False
        self._failure: SinkError | None = None
        self._idle_since: float | None = None
        self._next_stats = time.monotonic() + settings.stats_interval
        self._pool = ThreadPoolExecutor(settings.threads, thread_name_prefix="fetch")
        self._committer = GroupCommit(sink, queue, live=lambda t: t.state == SETTLING,
                                      settled=self._finish, failed=self._commit_failed)
        self._scheduler = threading.Thread(target=self._schedule_loop, name="scheduler",
                                           daemon=True)
        self.control: control.ControlWatch | None = None
        self.registration: Registration | None = None

    # -- the run loop -------------------------------------------------------------------
    def run(self) -> ExitStatus:
        """Work until stopped; after a sink failure, release and raise it (exit 1)."""
        self.start()
        try:
            while not self._stop_claiming:
                self.tick()
        finally:
            self.shutdown()
        if self._failure is not None:
            raise self._failure
        return ExitStatus.OK

    def tick(self) -> None:
        """One round: connection, stats, pause, capacity, claim, idleness, schedule."""
        self.check_connection()
        self.report_stats()
        if self.check_paused():
            return
        free = self.wait_capacity(TICK)
        if free <= 0 or self._stop_claiming:
            return
        claimed = self.claim(free)
        self.check_idle(claimed)
        self.schedule(claimed)

    # -- steps --------------------------------------------------------------------------
    def start(self) -> None:
        self.zk.add_listener(self._on_zk_state)
        registration = Registration(self.zk, Layout.of(self.s.root).consumer(self.id),
                                    self.status, interval=2.0)
        # Only once it is ours: a node held by another live consumer must not be deleted.
        self.registration = registration.start(wait_free=self.s.session_timeout + 2)
        self.control = control.ControlWatch(self.zk, self.s.root, self._on_control)
        self._committer.start()
        self._scheduler.start()
        for _ in range(self.s.threads):
            self._pool.submit(self._work_loop)
        self.state = control.PAUSED if self.control.paused else control.RUNNING
        self.registration.refresh()
        log.info("consumer.started", consumer=self.id, threads=self.s.threads,
                 backlog=self.s.backlog, delivery=self.s.delivery, out=self.s.out)

    def check_connection(self) -> None:
        """Drop items whose leases died with a lost session, unless already started."""
        lost = self.queue.drain_lost()
        if not lost:
            return
        dropped = 0
        with self._lock:
            for c in lost:
                task = self._tasks.get(c.name)
                # Identity, not name: the item may already be claimed again in the new
                # session, and that claim is valid.
                if task is not None and task.claimed is c and task.state in (READY, COOLING):
                    self._gone(task)
                    dropped += 1
            self._capacity.notify_all()
        log.warning("consumer.leases_lost", consumer=self.id, items=len(lost),
                    dropped_unstarted=dropped,
                    note="records already written stay; these items may be recorded twice")

    def report_stats(self) -> None:
        now = time.monotonic()
        with self._lock:
            in_flight, backlog, held = self._running, self._backlog(), len(self._tasks)
        self.metrics.in_flight.set(in_flight)
        self.metrics.backlog.set(backlog)
        self.metrics.leases.set(held)
        if now >= self._next_stats:
            self._next_stats = now + self.s.stats_interval
            log.info("consumer.stats", consumer=self.id, state=self.state,
                     **self.timings.snapshot(in_flight, backlog, held))

    def check_paused(self) -> bool:
        assert self.control is not None
        if not self.control.paused:
            return False
        self._idle_since = None  # a paused consumer is not idle: it was told to wait
        self.control.wait_running(TICK)
        return True

    def wait_capacity(self, timeout: float) -> int:
        """Free lease slots, once a batch's worth is free (or nothing is held)."""
        want = max(1, min(self.queue.claim_batch, self.s.capacity // 4))
        deadline = time.monotonic() + timeout
        with self._capacity:
            while True:
                free = self.s.capacity - len(self._tasks)
                if free >= want or (free > 0 and not self._tasks) or self._stop_claiming:
                    return free
                left = deadline - time.monotonic()
                if left <= 0:
                    return free
                self._capacity.wait(left)

    def claim(self, n: int) -> list[Claimed]:
        # One lease transaction's worth at a time: each batch reaches the pool as soon as it
        # is leased instead of waiting for the next batches' round trips (dispatch_ms).
        return self.queue.claim(max_items=min(n, self.queue.claim_batch), timeout=TICK)

    def check_idle(self, claimed: Sequence[Claimed]) -> None:
        if claimed or self.s.exit_when_idle is None:
            self._idle_since = None
            return
        now = time.monotonic()
        with self._lock:
            busy = bool(self._tasks)
        if busy or not self.zk.connected:  # unreachable ZooKeeper is not an empty queue
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now
        elif now - self._idle_since >= self.s.exit_when_idle:
            log.info("consumer.idle_exit", consumer=self.id, idle_s=self.s.exit_when_idle)
            self._stop_claiming = True

    def schedule(self, claimed: Sequence[Claimed]) -> None:
        """Hand claimed items to the pool through the capped backlog."""
        tasks = [Task(c, ItemTiming(c.claimed_mono, c.queue_ms), host_key(c.url))
                 for c in claimed]
        now = time.monotonic()
        with self._lock:
            for t in tasks:
                t.timing.submitted = now
                self._tasks[t.name] = t
                self._ready.append(t)
            self._work.notify(len(tasks))

    # -- pool threads -------------------------------------------------------------------
    def _work_loop(self) -> None:
        """One of the pool's ``--threads`` loops: take from the backlog, run, repeat. (A
        loop per thread rather than a Future per item: no per-item executor overhead.)"""
        while (task := self._next_task()) is not None:
            self._run(task)

    def _next_task(self) -> Task | None:
        with self._lock:
            while True:
                while self._priority or self._ready:
                    task = (self._priority or self._ready).popleft()
                    if task.state == READY:  # else released or lost while it waited
                        task.state = RUNNING
                        self._running += 1
                        return task
                if self._closed:
                    return None
                self._work.wait(TICK)

    def _run(self, task: Task) -> None:
        try:
            if self.admit(task):
                self.perform(task)
        except Exception as exc:  # a bug must neither kill the thread nor drop the item
            log.exception("consumer.internal_error", item=task.name, url=task.claimed.url)
            c = task.claimed
            kind = RETRY if c.item and c.attempt + 1 < self.s.max_attempts else DEAD
            self._settle(task, Outcome(kind, None, f"internal: {type(exc).__name__}"))
        finally:
            with self._lock:
                self._running -= 1

    def admit(self, task: Task) -> bool:
        """May this item start now? If not it waits in the heap, not on this thread."""
        assert self.control is not None
        if self._stop_claiming:
            self._release([task])
            return False
        if self.control.paused:
            self._cool(task, time.monotonic())  # the scheduler holds it until resumed
            return False
        if task.claimed.abandoned(self.s.max_attempts):
            task.host = ""  # no request will be made: no robots.txt, no politeness slot
        if task.host and (task.slot is not None
                          or self.pipeline.prepare(task.claimed.url or "", task.host)):
            start, due = self.pipeline.gate.admit(task.host, task.slot)
            if due is not None:
                task.slot = start
                self._cool(task, due)
                return False
            task.gated = True
            if (delay := start - time.monotonic()) > 0:
                time.sleep(delay)  # < pipeline.EARLY: cheaper than a trip through the heap
        task.timing.started = time.monotonic()
        return True

    def perform(self, task: Task) -> None:
        """Fetch, extract, queue the record; the outcome goes to the committer."""
        outcome = self.pipeline.process(task.claimed, task.timing,
                                        task.host if task.gated else "")
        if task.timing.finished is None:
            task.timing.finished = time.monotonic()
        if task.state == GONE:
            return  # released after the grace period, or its lease was lost
        if outcome.record is not None:
            try:
                self.sink.write(outcome.record)
            except SinkError as exc:
                self.fail(exc)
                self._release([task])
                return
        self._account(task, outcome)
        self._settle(task, outcome)

    def _account(self, task: Task, outcome: Outcome) -> None:
        failed = outcome.error is not None
        label = outcome.kind if outcome.kind in (RETRY, DEAD) else outcome.error or "ok"
        t = task.timing
        dispatch, wait, process = durations = t.durations()
        self.timings.record(durations, label, final=outcome.kind in (COMPLETE, DEAD),
                            failed=failed)
        self.metrics.observe(label, dispatch, wait, process)
        log.info("item.failed" if failed else "item.done", url=task.claimed.url,
                 item=task.name, status=outcome.status, attempt=task.claimed.attempt,
                 outcome=outcome.kind, error=outcome.error, polite_ms=round(t.polite_ms, 3),
                 queue_ms=round(t.queue_ms, 3), dispatch_ms=dispatch, wait_ms=wait,
                 process_ms=process)

    def _cool(self, task: Task, due: float) -> None:
        with self._lock:
            if task.state == RUNNING:
                task.state = COOLING
                task.cooled_at = time.monotonic()
                heapq.heappush(self._heap, (due - LEAD, next(self._seq), task))
                self._sched.notify()

    # -- scheduler thread: cooled items back to the pool when their turn comes -----------
    def _schedule_loop(self) -> None:
        assert self.control is not None
        with self._sched:
            while not self._closed:
                wait = TICK
                if self._heap and not self.control.paused:
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        self._release_due()
                        continue
                self._sched.wait(min(wait, TICK))

    def _release_due(self) -> None:
        _, _, task = heapq.heappop(self._heap)
        if task.state == COOLING:
            task.state = READY
            task.timing.polite_ms += (time.monotonic() - task.cooled_at) * 1000.0
            self._priority.append(task)
            self._work.notify()

    # -- settling -------------------------------------------------------------------------
    def _settle(self, task: Task, outcome: Outcome) -> None:
        with self._lock:
            if task.state == GONE:
                return
            task.state = SETTLING
        self._committer.put(Settle(task.claimed, outcome.kind, outcome.error,
                                   outcome.record is not None, task))

    def _finish(self, tasks: Sequence[Task]) -> None:
        with self._lock:
            for task in tasks:
                self._gone(task)
            self._capacity.notify_all()

    def _commit_failed(self, exc: SinkError | None, tasks: list[Task]) -> None:
        if exc is not None:
            self.fail(exc)
        self._release(tasks)

    def _gone(self, task: Task) -> None:
        """Forget a task (lock held): its lease is settled, released or lost."""
        task.state = GONE
        if self._tasks.get(task.name) is task:  # not a newer claim of the same item
            del self._tasks[task.name]

    def _release(self, tasks: Sequence[Task]) -> None:
        """Give leases back now: claimable by others at once."""
        with self._lock:
            tasks = [t for t in tasks if t.state != GONE]
            for t in tasks:
                self._gone(t)
            self._capacity.notify_all()
        if not tasks:
            return
        try:
            self.queue.release([t.claimed for t in tasks])
        except Exception as exc:  # closing the session releases them too
            log.warning("consumer.release_deferred", items=len(tasks), error=repr(exc))
        log.info("consumer.released", consumer=self.id, items=len(tasks))

    # -- stopping -------------------------------------------------------------------------
    def request_stop(self, signum: int | None = None) -> None:
        """First call: stop claiming, finish within ``--grace``. Second call: release all
        and exit now. Sets flags only: it runs inside a signal handler."""
        if self._stop_claiming and self._failure is None:
            self._force = True
        self._stop_claiming = True

    def fail(self, exc: SinkError) -> None:
        """The sink cannot take records: stop claiming; held items are released."""
        if self._failure is None:
            self._failure = exc
        self._stop_claiming = True

    def shutdown(self) -> None:
        """Release the backlog now, let running fetches finish within the grace, release
        the rest, flush completions, deregister."""
        self.state = "draining"
        if self.registration is not None:
            self.registration.refresh()
        log.info("consumer.draining", consumer=self.id, held=len(self._tasks),
                 reason="sink failure" if self._failure else "stop")
        self._release(self._held((READY, COOLING)))
        grace = 0.0 if self._failure is not None else self.s.grace
        self._wait_drained(time.monotonic() + grace)
        self._release(self._held((RUNNING, READY, COOLING)))
        self.pipeline.fetcher.close()
        self._committer.close(1.0 if self._force else self.s.zk_timeout)
        with self._lock:
            self._closed = True
            self._sched.notify_all()
            self._work.notify_all()
        self._release(self._held((SETTLING,)))  # completions that could not go through
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.state = "stopped"
        if self.registration is not None:
            self.registration.stop()
        log.info("consumer.stopped", consumer=self.id, processed=self.timings.processed,
                 failed=self.timings.failed, forced=self._force)

    def _held(self, states: tuple[str, ...]) -> list[Task]:
        with self._lock:
            return [t for t in self._tasks.values() if t.state in states]

    def _wait_drained(self, deadline: float) -> None:
        with self._capacity:
            while self._tasks and not self._force:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._capacity.wait(min(left, TICK))

    # -- status -------------------------------------------------------------------------
    def _backlog(self) -> int:
        return sum(1 for t in self._tasks.values() if t.state in (READY, COOLING))

    def status(self) -> dict[str, Any]:
        """The JSON of ``<root>/consumers/<id>`` (refreshed every 2 s by the Registration)."""
        with self._lock:
            in_flight, backlog, held = self._running, self._backlog(), len(self._tasks)
        return {"id": self.id, "pid": os.getpid(), "started_at": round(self.started_at, 3),
                "state": self.state, "processed": self.timings.processed,
                "failed": self.timings.failed, "in_flight": in_flight, "backlog": backlog,
                "leases": held, "items_per_s": self.timings.items_per_s(),
                "control": self.control.state if self.control else control.RUNNING,
                "threads": self.s.threads, "capacity": self.s.capacity}

    def health(self) -> tuple[bool, dict[str, Any]]:
        """For ``/healthz``: connected, and in the run loop (running, or paused on purpose)."""
        ok = self.zk.connected and self.state in (control.RUNNING, control.PAUSED)
        return ok, {"zookeeper": self.zk.state, "state": self.state}

    def _on_control(self, state: str) -> None:
        # kazoo's thread: flags and a notification only, never a blocking call.
        if self.state in (control.RUNNING, control.PAUSED):
            self.state = state
        self.metrics.paused.set(1 if state == control.PAUSED else 0)
        if self.registration is not None:
            self.registration.refresh()
        with self._sched:
            self._sched.notify_all()

    def _on_zk_state(self, state: str) -> bool:
        self.metrics.set_zk_state(str(state))
        return False
