"""The consumer's Worker: claim -> schedule -> pool -> fetch/extract/sink -> outcome. The
guarantees in full are :class:`Worker`'s docstring; docs/concepts/architecture.md maps it.

:meth:`Worker.run` starts the parts (:mod:`zkcrawl.consumer.components`, stopped in reverse) and
loops on :meth:`Worker.tick`. Stopping is decided in one place,
:class:`~zkcrawl.consumer.components.Stopping`; the session in one place,
:class:`~zkcrawl.zk.session.SessionState`. Each held item is a
:class:`~zkcrawl.consumer.backlog.Task` in the :class:`~zkcrawl.consumer.backlog.Backlog`:

* **bounded** (``threads + backlog`` items), **charged only when started**, **polite without
  idling**, **no host holds back another**;
* **durable before done**: records reach the sink before the group completes in ZooKeeper;
* a lost session starts nothing more; a pause stops new requests within a moment.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import structlog

from zkcrawl import logs
from zkcrawl.consumer import components, progress
from zkcrawl.consumer.backlog import (
    COOLING,
    GONE,
    LEAD,
    READY,
    RUNNING,
    SETTLING,
    Backlog,
    Task,
    TaskState,
)
from zkcrawl.consumer.committer import Settle
from zkcrawl.consumer.components import TICK, ConsumerState, Lifecycle, Stopping
from zkcrawl.consumer.metrics import Metrics
from zkcrawl.consumer.ownership import Ownership
from zkcrawl.consumer.parking import HORIZON_S, Parking
from zkcrawl.consumer.pipeline import COMPLETE, DEAD, RETRY, ItemHandler, Outcome
from zkcrawl.consumer.processors import PROCESSOR_ERROR
from zkcrawl.consumer.queue_seam import WorkerQueue
from zkcrawl.consumer.results import ResultChain
from zkcrawl.consumer.settings import ConsumerSettings
from zkcrawl.consumer.sinks import ResultSink, SinkUnavailable
from zkcrawl.consumer.timing import ItemTiming, Timings
from zkcrawl.errors import ExitStatus, SinkError
from zkcrawl.politeness.gate import EARLY
from zkcrawl.queue.claims import Claimed
from zkcrawl.web.urls import host_key
from zkcrawl.zk import KazooException, KazooTimeoutError
from zkcrawl.zk.client import ZkClient

__all__ = ["COOLING", "GONE", "READY", "RUNNING", "SETTLING", "ConsumerState", "Task",
           "TaskState", "Worker"]

# structlog.get_logger is a lazy proxy: it picks up the configuration made at start-up.
log = structlog.get_logger(__name__)
# Start marks written ahead, per pool thread: a death is charged to each marked item, and
# with 1 the threads waited for checkpoints (bench crawl, one host at 50 ms: 0.88x the
# pages/s; 2: 1.00x).
MARKS_AHEAD = 2
# A task whose host's turn is further than this goes back to its batch (Worker._give_back):
# the per-host horizon of zkcrawl.consumer.parking (two turns at the default gap).
GIVE_BACK_S = HORIZON_S
# consumer.stats and consumer.summary: reports at info whatever --log-level (logs.reporter).
report = logs.reporter(__name__)

# /livez fails once the claim loop has not ticked for this long. A tick is bounded by TICK
# plus ZooKeeper calls (each bounded by --zk-timeout), start-up by the registration's wait
# (--session-timeout + 2 s): far below it. Never a ZooKeeper question: a loop waiting for an
# unreachable ZooKeeper still ticks.
MIN_STALL = 60.0


class Worker:
    """One consumer daemon's machinery around a :class:`~zkcrawl.consumer.queue_seam.WorkerQueue`.

    Each held item -- taken from a batch of a partition this consumer owns, in memory until it
    is settled or given back -- is a :class:`~zkcrawl.consumer.backlog.Task`, kept in the
    :class:`~zkcrawl.consumer.backlog.Backlog` (the capped queue in front of the pool: its docstring
    has the states and the guarantees)::

        claim -> ready -> [pool thread] admit -> running -> settling (committer) -> gone
          |      ^ ^                      | host cooling: time-ordered heap, no thread waits
          |      | +------- cooling <-----+
          |      |                        | admitted: its start mark written off the thread
          |      +-------- marking <------+   (then the next pool thread performs it)
          +-- [claim loop] admit ahead ---^   (planned, within mark_ahead: one trip;
                 [scheduler] admits a cooling one so when its time comes)

    * **Bounded**: never more than ``threads + backlog`` items held, whatever state they are in.
    * **Charged only when started**: a claimed item is not marked started in its batch until
      it is admitted to start now -- by the claim loop, or the scheduler when its planned
      time comes, when that costs no wait (:meth:`Worker._admit_ahead`,
      :meth:`Worker._admit_due`, within the backlog's ``mark_ahead``: the pool then takes it
      once), else by a pool thread (:meth:`Worker.admit`); then its mark is written --
      durable before its request, so a page that kills its consumers is still charged -- by
      the queue's checkpoint thread, coalesced with the other marks
      (:meth:`~zkcrawl.consumer.owned_queue.OwnedQueue.mark`), while the threads go on with
      other items; a holder's death costs an attempt only to the items it had started
      (SPEC §3), never to the ones still waiting in its backlog.
    * **Polite without idling**: a cooled item waits in the heap; the scheduler thread hands it
      back, ahead of fresh items, when its host's turn comes
      (:class:`~zkcrawl.politeness.gate.HostGate`). A fresh item whose host's turn has not
      come goes there from the claim loop, its slot reserved (:meth:`Worker._plan`), without
      a trip through the pool.
    * **No host holds back another**: the owner's pick leaves a host's items beyond a few turns'
      worth in their batches (:class:`~zkcrawl.consumer.owned_queue.HostCap`), and a claimed
      item whose host is at its cap or another consumer's now goes back to its batch at once,
      unmarked (:class:`~zkcrawl.consumer.parking.Parking`), so one big host never stops the
      claims.
    * **Durable before done**: the committer (:class:`~zkcrawl.consumer.committer.GroupCommit`)
      hands the group's records to the sink in one batch (one fsync, or one database transaction),
      then logs ``item.done``/``item.failed`` for the group (so a done line always has its record
      stored) and completes it in ZooKeeper.
    * **Sink unavailable** (its database down): nothing is claimed or started, items not
      started are released at once, running ones when their group fails to commit; the
      committer reconnects with backoff and claiming resumes by itself.
    * **Connection trouble**: SUSPENDED holds claims and completions; after LOST, items not yet
      started are never started (a pool thread checks the claim's session before it starts an
      item, the claim loop drops them from the backlog; and none starts while the server has
      been silent for longer than kazoo's read timeout -- a frozen or cut-off process is told of
      its expiry only when it reconnects), the ones running finish and come back
      as "lost" -- the documented at-least-once duplicates. ``zk.suspended``, ``zk.lost`` and
      ``zk.reconnected`` (with ``away_s``) are logged as the connection goes and comes back.
    * **Pause**: no request starts more than a moment after the pause is seen -- the pool
      threads check it before robots.txt, again before the first request, and every later
      request of a fetch (a redirect hop, robots.txt of another host) waits at the host gate
      while paused (:meth:`~zkcrawl.politeness.gate.HostGate.hold_while`).
    * **Probes**: :meth:`Worker.liveness` (the claim loop ticks: never a ZooKeeper question) and
      :meth:`Worker.readiness` (connected and claiming, or paused) for ``zkcrawl.consumer.metrics``.
    """

    def __init__(self, settings: ConsumerSettings, zk: ZkClient, queue: WorkerQueue,
                 item_handler: ItemHandler, sink: ResultSink, metrics: Metrics, consumer_id: str,
                 results: ResultChain | None = None, ownership: Ownership | None = None
                 ) -> None:
        self.s = settings
        self.zk, self.queue, self.item_handler, self.sink = zk, queue, item_handler, sink
        self.metrics, self.results = metrics, results
        self.id = consumer_id
        self.timings = Timings()
        self.console = progress.Console(
            consumer_id, self.timings, settings.stats_interval,
            progress.wants_line(settings.log_format, settings.out), report,
            time.monotonic(), checks=(item_handler.field_watch.check,))
        self.state: ConsumerState = ConsumerState.STARTING
        self.stopping = Stopping()  # request_stop/fail set plain flags: signal-safe
        self.backlog = Backlog(settings.capacity, mark_ahead=MARKS_AHEAD * settings.threads)
        self.backlog.withdraw = item_handler.gate.withdraw  # an admitted item that never started
        queue.on_marked = self.backlog.marked
        self.backlog.admit_due, self.backlog.mark = self._admit_due, self._ask_mark
        # the scheduler admits a planned task this long before its turn (_wake)
        self._mark_lead = max(LEAD, queue.mark_lead)
        self.backlog.starved = queue.mark_soon  # an idle pool thread: marks go now
        self.ownership = ownership  # --politeness owner: only the owner fetches a host
        # items settled for good (completed or dead) whose attempts include a holder's death
        # (Claimed.holder_deaths: redone after a dead holder, or dead-lettered ``abandoned``):
        # the rule of the report's ``redelivered``, counted in _account
        self.redelivered = 0
        self.given_back = 0  # items given back because their host's turn was far (_give_back)
        self._owned_generation = -1
        self.parking = Parking(self.backlog.host_load, settings.domain_delay, settings.capacity,
                               enabled=queue.delivery == "at-least-once",
                               foreign=None if ownership is None else self._foreign)
        self._idle_since: float | None = None
        self._last_tick = time.monotonic()  # the claim loop's heartbeat, for /livez
        self._stall = max(MIN_STALL, 3 * settings.zk_timeout + settings.session_timeout)
        # kazoo's read timeout: a connection this long without a reply is given up on.
        self._silence_limit = settings.session_timeout * 2 / 3
        # The parts the worker calls (zkcrawl.consumer.components.parts: all of them, in order).
        self.session_part = components.Session(self)
        self.session = self.session_part.state
        self.status = components.Status(self)
        self.control = components.Control(self)
        self.links = components.Links(self)
        self.committer = components.Committer(self, self.links)
        self.pool = components.Pool(self, self._run)
        self.parts = Lifecycle(components.parts(self))

    # -- the run loop -------------------------------------------------------------------
    def run(self) -> ExitStatus:
        """Work until stopped; after a sink failure, release and raise it (exit 1)."""
        self.start()
        try:
            while not self.stopping.requested:
                self._last_tick = time.monotonic()
                self.tick()
        finally:
            self.shutdown()
        if self.stopping.failure is not None:
            raise self.stopping.failure
        return ExitStatus.OK

    def tick(self) -> None:
        """One round: connection, ownership, stats, pause, sink, capacity, claim, idleness,
        schedule."""
        self.check_connection()
        self.check_ownership()
        self.report_stats()
        if self.check_paused() or self.check_sink():
            return
        free = self.wait_capacity(TICK)
        if free <= 0 or self.stopping.requested:
            return
        claimed = self.claim(free)
        self.check_idle(claimed)
        self.schedule(claimed)

    # -- steps --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the parts in their order (a part that fails: the started ones stopped)."""
        self.parts.start()

    def check_connection(self) -> None:
        """Drop the items the queue gave up (their partition lost: another consumer's now, or
        the session expired), unless already started: the running ones finish, and their
        completions are refused (``lost``)."""
        lost = self.queue.drain_lost()
        if not lost:
            return
        dropped = self.backlog.drop_unstarted(lost)
        log.warning("consumer.leases_lost", consumer=self.id, items=len(lost),
                    dropped_unstarted=dropped,
                    note="records already written stay; these items may be recorded twice")

    def check_ownership(self) -> None:
        """Partitions this consumer lost (a consumer joined): give back their items that have
        not started; the running ones finish (their requests began before the change)."""
        own = self.ownership
        if own is None:
            return
        own.refresh()
        if own.generation == self._owned_generation:
            return
        self._owned_generation = own.generation
        lost = [t for t in self.backlog.held(READY, COOLING) if not own.owns(t.host)]
        if lost:
            self.release(lost)
            log.info("ownership.released", consumer=self.id, items=len(lost))

    def _foreign(self, host: str) -> bool:
        return self.ownership is not None and not self.ownership.owns(host)

    def report_stats(self) -> None:
        now = time.monotonic()
        in_flight, backlog, held = self.backlog.stats()
        self.timings.sample_fill(held, self.s.capacity, now)
        self.metrics.in_flight.set(in_flight)
        self.metrics.backlog.set(backlog)
        self.metrics.leases.set(held)
        self.console.tick(now, str(self.state), self.session.away_for(now), in_flight,
                          backlog, held)

    def check_paused(self) -> bool:
        if not self.control.paused:
            return False
        self._idle_since = None  # a paused consumer is not idle: it was told to wait
        self.control.wait_running(TICK)
        return True

    def check_sink(self) -> bool:
        """The sink takes no records for now (its database is down): claim nothing, give
        back what has not started, wait for it (the committer reconnects)."""
        if self.sink.available:
            return False
        self._idle_since = None  # waiting for the sink is not an empty queue
        self.release(self.backlog.held(READY, COOLING))
        self.sink.wait_available(TICK)
        return True

    def wait_capacity(self, timeout: float) -> int:
        """Free places in the table, once a batch's worth is free (or nothing is held)."""
        want = max(1, min(self.queue.claim_batch, self.s.capacity // 4))
        return self.backlog.wait_capacity(want, timeout, self._stop_requested)

    def _stop_requested(self) -> bool:
        return self.stopping.requested

    def claim(self, n: int) -> list[Claimed]:
        # One claim batch's worth at a time: each reaches the pool as soon as it is taken
        # instead of waiting for the next ones (dispatch_ms).
        return self.queue.claim(max_items=min(n, self.queue.claim_batch), timeout=TICK)

    def check_idle(self, claimed: Sequence[Claimed]) -> None:
        if claimed or self.s.exit_when_idle is None:
            self._idle_since = None
            return
        now = time.monotonic()
        if len(self.backlog) or not self.zk.connected:  # unreachable ZK is not an empty queue
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now
        elif now - self._idle_since >= self.s.exit_when_idle:
            if not self._queue_empty():
                # SPEC §4: idle means the queue held no item at all. Items in the partitions
                # of a consumer that died keep us until its session expires and their next
                # owner has settled them.
                self._idle_since = now
                return
            log.info("consumer.idle_exit", consumer=self.id, idle_s=self.s.exit_when_idle)
            self.stopping.request()

    def _queue_empty(self) -> bool:
        """No item queued anywhere: the ingress and every partition's batches, held by a
        consumer or not (the queue's ``depth``)."""
        try:
            return self.queue.depth() == 0
        except (KazooException, KazooTimeoutError):
            return False  # cannot tell: not idle

    def schedule(self, claimed: Sequence[Claimed]) -> None:
        """Hand claimed items to the pool through the capped backlog; those of a host that
        holds its share already are given back (:class:`~zkcrawl.consumer.parking.Parking`)."""
        now = time.monotonic()
        # an item out of attempts makes no request (admit): no host to count it under
        tasks = [Task(c, ItemTiming(c.claimed_mono, c.queue_ms, submitted=now),
                      "" if c.abandoned(self.s.max_attempts) else host_key(c.url))
                 for c in claimed]
        keep, park = self.parking.split(tasks)
        if park:
            self.queue.release([t.claimed for t in park])
        ready: list[Task] = []
        soon: list[tuple[Task, float]] = []  # turn within mark_lead: admitted now if room
        cooled: list[tuple[Task, float]] = []
        for t in keep:
            due = self._plan(t)
            if due is None or (left := due - time.monotonic()) <= EARLY:
                ready.append(t)
            elif left <= self._mark_lead:
                soon.append((t, due))
            else:
                cooled.append((t, self._wake(due)))
        room = self.backlog.reserve_marks(len(soon) + sum(1 for t in ready if t.slot is not None))
        ahead: list[Task] = []
        for t, due in soon:  # first: their marks are due soonest
            if len(ahead) >= room or not self._admit_ahead(t, ahead, cooled, self._mark_lead):
                cooled.append((t, self._wake(due)))
        if len(ahead) < room:
            unmarked = []
            for t in ready:
                if len(ahead) >= room or t.slot is None or not self._admit_ahead(t, ahead,
                                                                                 cooled):
                    unmarked.append(t)
            ready = unmarked
        self.backlog.put(ready, cooled, ahead, room)
        self.backlog.ask_marks(ahead)  # through _ask_mark (Backlog.mark)

    def _ask_mark(self, claimed: Claimed, by: float | None) -> bool:
        """The queue's ``mark`` asked off the pool (the claim loop, the scheduler), where a
        bug must not stop the loop: it is logged and the item performed unmarked (True), as
        a pool thread's internal error would settle it rather than drop it."""
        try:
            return self.queue.mark(claimed, by)
        except Exception:
            log.exception("consumer.internal_error", item=claimed.name, url=claimed.url)
            return True

    def _admit_due(self, task: Task) -> tuple[float | None, float | None] | None:
        """The scheduler's admission of a planned task whose time came (under the backlog's
        lock: flags and the gate only): :meth:`_admit_now`'s answer, or None when a pool
        thread should decide (also stopping, paused, the host not ours or in its hand-over
        wait -- what the claim loop's :meth:`_plan` checked when it planned the task)."""
        if self.stopping.requested or self.control.paused:
            return None
        own = self.ownership
        if own is not None and (not own.owns(task.host)
                                or own.not_before(task.host) > time.monotonic()):
            return None
        return self._admit_now(task, self._mark_lead)

    def _admit_now(self, task: Task, ahead: float = EARLY
                   ) -> tuple[float | None, float | None] | None:
        """The gate's ``(start, None)`` -- admitted, to start within ``ahead`` -- or
        ``(slot, when to look again)`` for a planned task; None when a pool thread should
        decide (the sink down, the session in doubt)."""
        if not self.sink.available or self.session.stale(task.claimed.session) \
                or self._unheard(task.claimed.session):
            return None
        start, due = self.item_handler.gate.admit(task.host, task.slot, ahead)
        return start, None if due is None else self._wake(due)  # cooled: back in the heap

    def _wake(self, due: float) -> float:
        """When a task whose host's turn comes at ``due`` leaves the heap: ``mark_lead``
        before it, for the scheduler to admit it and ask its mark in time (:meth:`_admit_due`:
        the request starts on time, not a checkpoint's wait late -- bench hosts' pages were
        1.13 s apart at a 1 s gap, ~60 ms of it waiting for marks), or -- that moment past --
        LEAD before it: the pool thread that takes it admits it at once."""
        early = due - self._mark_lead
        return early if early - time.monotonic() > EARLY else due - LEAD

    def _unheard(self, session: int | None) -> bool:
        """The server has been silent past kazoo's read timeout while ``session`` holds the
        item: its session may be gone already (SIGSTOP, a partition) -- start nothing."""
        return session is not None and self.session.silent_for() > self._silence_limit

    def _admit_ahead(self, task: Task, ahead: list[Task],
                     cooled: list[tuple[Task, float]], horizon: float = EARLY) -> bool:
        """Admit a planned task at the gate here, as :meth:`admit` would on a pool thread,
        so that its start mark is asked now and the pool takes it once, marked (bench
        recrawl: 2 trips through the pool a page before, 1 now) -- at its turn, if that
        comes within ``horizon`` (its mark is written meanwhile; it waits in the heap for
        the rest). Into ``ahead`` (admitted) or ``cooled`` (the gate said later) and True;
        False: the pool admits it as ever."""
        verdict = self._admit_now(task, horizon)  # _plan has just checked the rest
        if verdict is None:
            return False
        task.slot, due = verdict
        if due is not None:
            cooled.append((task, due))
        else:
            task.gated = True
            ahead.append(task)
        return True

    def _plan(self, task: Task) -> float | None:
        """Reserve a fresh task's politeness slot here, as :meth:`admit` would on a pool
        thread, and return when it comes: a task whose host's turn has not come goes
        straight to the heap instead of being taken by a pool thread only to be cooled (bench
        hosts: 0.95 such trips a page), and the slots of one host's fresh tasks follow each
        other, a gap apart (Mercator's back queues). Only when it costs no wait -- robots.txt's
        verdict in memory, the host owned and past its hand-over wait, the cluster running;
        else None, and the pool admits it as ever."""
        host = task.host
        if not host or self.control.paused or self.stopping.requested:
            return None
        own = self.ownership
        if own is not None and (not own.owns(host) or own.not_before(host) > time.monotonic()):
            return None
        handler = self.item_handler
        allowed = handler.prepare_cached(task.claimed.url or "", host)
        task.robots = handler.fetcher.robots_read()  # the fetch reuses it (perform)
        if not allowed:
            return None  # robots.txt to read, or it says no: no slot needed
        task.slot, due = handler.gate.plan(host)
        return due

    # -- pool threads (zkcrawl.consumer.components.Pool runs these) ------------------------------
    def _run(self, task: Task) -> None:
        try:
            if task.marked:
                self.perform_marked(task)
            elif self.admit(task) and self.begin(task):
                self.perform(task)
        except Exception as exc:  # a bug must neither kill the thread nor drop the item
            log.exception("consumer.internal_error", item=task.name, url=task.claimed.url)
            c = task.claimed
            kind = RETRY if c.may_retry(self.s.max_attempts) else DEAD
            self._settle(task, Outcome(kind, None, f"internal: {type(exc).__name__}"))
        finally:
            self.backlog.task_done()
            self.queue.room_freed()
    def admit(self, task: Task) -> bool:
        """May this item start now? If not it waits in the heap, not on this thread."""
        if not self._may_start(task):
            return False
        if task.claimed.abandoned(self.s.max_attempts):
            task.host = ""  # no request will be made: no robots.txt, no politeness slot
        if task.host and self.ownership is not None and not self._owner_ready(task):
            return False
        if task.host and (task.slot is not None
                          or self._prepare(task)):
            # robots.txt may have taken seconds: the world may have changed meanwhile.
            if not self._may_start(task):
                return False
            start, due = self.item_handler.gate.admit(task.host, task.slot)
            if due is not None:
                task.slot = start
                if not self._give_back(task, due):
                    self.backlog.cool(task, self._wake(due))
                return False
            task.gated, task.slot = True, start
            assert start is not None  # admitted: the start is known
            if (delay := start - time.monotonic()) > 0:
                time.sleep(delay)  # < EARLY: cheaper than a trip through the heap
        return True

    def _give_back(self, task: Task, due: float) -> bool:
        """A task whose host's turn is more than GIVE_BACK_S away (a Retry-After, a down
        back-off or a Crawl-delay learnt after its claim) goes back to its batch, unmarked --
        its reserved slot given back too -- rather than hold a place of the table that long
        in front of hosts that are ready; the claim's pick leaves it there until the host's
        turn is near (``HostCap.ready_at``). Not with ``--delivery at-most-once`` (nothing
        can go back) nor once marked."""
        if (task.marked or self.queue.delivery != "at-least-once"
                or due - time.monotonic() <= GIVE_BACK_S):
            return False
        if task.slot is not None:
            self.item_handler.gate.unreserve(task.host, task.slot)
        if self.release([task], announce=False):
            self.given_back += 1
            log.debug("item.given_back", item=task.name, url=task.claimed.url, host=task.host,
                      turn_in_s=round(due - time.monotonic(), 3))
        return True

    def _prepare(self, task: Task) -> bool:
        """robots.txt's verdict for the task, read once (cached per host): kept with the
        task for its fetch, which may run on another thread after a cool-down or its mark."""
        allowed = self.item_handler.prepare(task.claimed.url or "", task.host)
        task.robots = self.item_handler.fetcher.robots_read()
        return allowed

    def begin(self, task: Task) -> bool:
        """An admitted item: its start mark first. True: none to write (already marked, or
        at-most-once) -- performed on this thread now. False: it waits MARKING, off this
        thread, until the queue's checkpoint has written it (within MARK_S, one write for
        every mark waiting); the next pool thread then performs it
        (:meth:`perform_marked`). The host's admission is the task's meanwhile (the gate's
        table: busy), so no other request to it starts, and the gap to the next counts from
        this one's actual end."""
        if not self.backlog.await_mark(task):
            return False  # released meanwhile
        if self.queue.mark(task.claimed):
            return self.backlog.resume(task)
        return False  # lost meanwhile: drain_lost has it, and drop_unstarted finds it MARKING

    def perform_marked(self, task: Task) -> None:
        """A task admitted and marked, taken again: performed now -- unless its session is
        lost (dropped, its admission given back: start nothing once the session is in
        doubt), the server silent too long or the cluster paused (cooled: it keeps its
        admission and its mark until it may start)."""
        session = task.claimed.session
        if self.session.stale(session):
            if self.backlog.forget([task]):
                log.info("item.dropped", item=task.name, url=task.claimed.url,
                         reason="session lost before it started")
            if task.gated:
                task.gated = False
                self.item_handler.gate.withdraw(task.host)
            return
        if self._unheard(session) or self.control.paused:
            self.backlog.cool(task, time.monotonic() + (0.0 if self.control.paused
                                                        else TICK / 5))
            return
        if task.gated and task.slot is not None and (delay := task.slot - time.monotonic()) > 0:
            time.sleep(delay)  # admitted by the claim loop for a start < EARLY ahead
        self.perform(task)

    def _owner_ready(self, task: Task) -> bool:
        """--politeness owner: the host is this consumer's (else the item is given back) and
        its hand-over wait is over (else it cools until then)."""
        assert self.ownership is not None
        if not self.ownership.owns(task.host):
            self.release([task])
            return False
        if (due := self.ownership.not_before(task.host)) > time.monotonic():
            self.backlog.cool(task, due)
            return False
        return True

    def _may_start(self, task: Task) -> bool:
        """Not stopping (else: released), not paused (else: cooled, held by the scheduler
        until resumed), and its claim's session not expired (else: forgotten -- its
        partition's next owner, maybe this consumer in its new session, takes it again)."""
        if self.stopping.requested or not self.sink.available:
            self.release([task])
            return False
        session = task.claimed.session
        if self.session.stale(session):
            if self.backlog.forget([task]):
                log.info("item.dropped", item=task.name, url=task.claimed.url,
                         reason="session lost before it started")
            return False
        if self._unheard(session):
            # Unheard from the server that long, the session may be gone already (SIGSTOP,
            # a partition): wait for word -- LOST drops the item above, a reply starts it.
            self.backlog.cool(task, time.monotonic() + TICK / 5)
            return False
        if self.control.paused:
            self.backlog.cool(task, time.monotonic())  # the scheduler holds it until resumed
            return False
        return True

    def perform(self, task: Task) -> None:
        """Fetch, extract, build the record; record and outcome go to the committer."""
        if task.gated:
            self.item_handler.gate.pay(task.host)  # this thread makes the admitted request
        if task.robots is not None:  # read when its slot was reserved: not read again
            self.item_handler.fetcher.robots_use(task.robots)
            task.robots = None
        task.timing.started = time.monotonic()
        outcome = self.item_handler.process(task.claimed, task.timing,
                                        task.host if task.gated else "")
        if task.timing.finished is None:
            task.timing.finished = time.monotonic()
        if task.state is GONE:
            return  # released after the grace period, or its partition was lost
        self._settle(task, outcome)

    # -- committer hooks (committer thread) ----------------------------------------------
    def durable(self, settles: Sequence[Settle[Task]]) -> None:
        """The committer stored these tasks' records: count them and log
        ``item.done``/``item.failed`` -- never before their record is stored. A record the
        sink refused comes back as a dead letter with the sink's reason."""
        now = time.monotonic()
        # Asked once per group: the per-item item.done event is debug (usually off), and its
        # fields are not even computed then.
        debug = logs.enabled(log, logging.DEBUG)
        for s in settles:
            task, outcome = s.token, s.token.outcome
            if outcome is None:
                continue
            if s.kind != outcome.kind:  # refused by the sink
                outcome = task.outcome = Outcome(s.kind, None, s.error, outcome.status)
            task.timing.written = now
            self._account(task, outcome, debug)

    def _account(self, task: Task, outcome: Outcome, debug: bool = True) -> None:
        failed = outcome.error is not None
        label = outcome.kind if outcome.kind in (RETRY, DEAD) else outcome.error or (
            "skipped" if outcome.skipped else "ok")
        if label.startswith(PROCESSOR_ERROR):  # one metrics label, not one per message
            label = PROCESSOR_ERROR.rstrip(":")
        t = task.timing
        values = t.stage_values()  # every stage once; the durations are three of them
        dispatch, wait, process = durations = values[0], values[7], values[6]
        reason = outcome.error
        if reason is not None and reason.startswith(PROCESSOR_ERROR):  # one reason label
            reason = PROCESSOR_ERROR.rstrip(":")
        final = outcome.kind in (COMPLETE, DEAD)
        self.timings.record(durations, label, final=final,
                            failed=failed, extract=t.extract_ms, timing=t, reason=reason,
                            values=values)
        if final and task.claimed.holder_deaths:  # a holder died on it: counted once, here
            self.redelivered += 1
        self.metrics.observe(outcome.kind, reason, t.queue_ms, dispatch, wait, process,
                             skipped=outcome.skipped)
        if not debug:
            return
        # Per item: debug (a terminal shows the progress line, JSON logs consumer.stats).
        log.debug("item.failed" if failed else "item.done", url=task.claimed.url,
                  item=task.name, status=outcome.status, attempt=task.claimed.attempt,
                  outcome=outcome.kind, error=outcome.error, polite_ms=round(t.polite_ms, 3),
                  queue_ms=round(t.queue_ms, 3), dispatch_ms=dispatch, wait_ms=wait,
                  process_ms=process, extract_ms=round(t.extract_ms, 3),
                  links=len(outcome.links), skipped=outcome.skipped)

    def forget(self, tasks: Sequence[Task]) -> None:
        """Settled: out of the backlog."""
        self.backlog.forget(tasks)

    def commit_failed(self, exc: SinkError | None, tasks: list[Task]) -> None:
        if exc is not None and not isinstance(exc, SinkUnavailable):
            self.fail(exc)  # broken for good; unavailable: released, claiming waits for it
        self.release(tasks)

    # -- settling -------------------------------------------------------------------------
    def _settle(self, task: Task, outcome: Outcome) -> None:
        task.outcome = outcome
        if self.backlog.settle(task):
            self.committer.put(Settle(task.claimed, outcome.kind, outcome.error,
                                      outcome.record, task))

    def release(self, tasks: Sequence[Task], announce: bool = True) -> list[Task]:
        """Give items back to their batches now (in memory, no write of their own; one marked
        started already is unmarked with the next checkpoint): the pick takes them again, or
        their partition's next owner does. Returns those still held (the others were gone
        already); ``announce``: an info line says how many. At-most-once they left their
        batches on the take: they are offered again, and what ZooKeeper does not take is
        lost (``queue.release_lost``, said by the queue)."""
        tasks = self.backlog.forget(tasks)
        if not tasks:
            return tasks
        self.queue.release([t.claimed for t in tasks])
        if announce:
            log.info("consumer.released", consumer=self.id, items=len(tasks))
        return tasks

    # -- stopping -------------------------------------------------------------------------
    def request_stop(self, force: bool = False) -> None:
        """Stop claiming, finish what runs within ``--grace``; ``force``: release all and
        exit now. Sets flags only: it runs inside a signal handler (:mod:`zkcrawl.signals`:
        the first SIGTERM/SIGINT asks to drain, the second forces)."""
        self.stopping.request(force)

    def fail(self, exc: SinkError) -> None:
        """The sink cannot take records: stop claiming; held items are released."""
        self.stopping.fail(exc)

    def shutdown(self) -> None:
        """Stop the parts in reverse order (:mod:`zkcrawl.consumer.components`: the drain first,
        deregistering last), then the closing report."""
        self.parts.stop()
        log.info("consumer.stopped", consumer=self.id, processed=self.timings.processed,
                 failed=self.timings.failed, forced=self.stopping.forced,
                 parked=self.parking.parked_total)
        self.console.summarize(time.monotonic())

    # -- probes -------------------------------------------------------------------------
    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """For ``/livez``: the process works -- its claim loop ticked lately and its
        committer runs. Never asks ZooKeeper: a consumer waiting for it is alive. Draining
        and stopped are alive too (bounded by --grace and --zk-timeout, then the process
        exits by itself)."""
        since = time.monotonic() - self._last_tick
        in_loop = self.state in (ConsumerState.RUNNING, ConsumerState.PAUSED)
        ticking = not in_loop or since < self._stall
        committing = not in_loop or self.committer.alive
        return ticking and committing, {"state": self.state,
                                        "last_tick_s": round(since, 3),
                                        "committer": self.committer.alive}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """For ``/readyz`` (and ``/healthz``): connected, and in the run loop -- running, or
        paused on purpose (the operator's choice, not a fault: it resumes within 1 s)."""
        ok = (self.session.connected and self.sink.available
              and self.state in (ConsumerState.RUNNING, ConsumerState.PAUSED))
        return ok, {"zookeeper": self.zk.state, "state": self.state,
                    "sink": "up" if self.sink.available else "unavailable"}

    health = readiness  # the older name
