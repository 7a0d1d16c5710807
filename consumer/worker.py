"""The consumer's Worker: claim -> schedule -> pool -> fetch/extract/sink -> outcome.

Read it like rq's worker: :meth:`Worker.run` is a short loop of named steps; stopping is
decided in one place, :meth:`Worker.request_stop` (called by the signal handlers of
:mod:`zkcrawl.signals`, installed in ``consumer.main``), plus the idle timer and a sink
failure. Each held item is a :class:`~consumer.backlog.Task` holding one lease, kept in the
:class:`~consumer.backlog.Backlog` (the capped queue in front of the pool: its docstring has
the states and the guarantees)::

    claim -> ready -> [pool thread] admit -> running -> settling (committer) -> gone
               ^                      | host cooling: time-ordered heap, no thread waits
               +------- cooling <-----+

* **Bounded**: never more than ``threads + backlog`` leases, whatever state they are in.
* **Polite without idling**: a cooled item waits in the heap; the scheduler thread hands it
  back, ahead of fresh items, when its host's turn comes
  (:class:`~zkcrawl.politeness.gate.HostGate`).
* **Durable before done**: the committer (:class:`~consumer.committer.GroupCommit`) hands the
  group's records to the sink in one batch (one fsync, or one database transaction), then
  logs ``item.done``/``item.failed`` for the group (so a done line always has its record
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
  :meth:`Worker.readiness` (connected and claiming, or paused) for ``consumer.metrics``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import Any

import structlog

from consumer import progress
from consumer.backlog import COOLING, GONE, READY, RUNNING, SETTLING, Backlog, Task, TaskState
from consumer.committer import GroupCommit, Settle
from consumer.metrics import Metrics
from consumer.pipeline import COMPLETE, DEAD, RETRY, Outcome, Pipeline
from consumer.processors import PROCESSOR_ERROR
from consumer.results import ResultChain
from consumer.settings import ConsumerSettings
from consumer.sink import ResultSink, SinkUnavailable
from consumer.timing import ItemTiming, Timings
from zkcrawl import logs
from zkcrawl.errors import ExitStatus, SinkError
from zkcrawl.politeness.gate import EARLY
from zkcrawl.queue import control
from zkcrawl.queue.discovered import DiscoveredWriter, Link, link_depth
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.leases import Claimed, LeaseQueue
from zkcrawl.queue.registry import Registration
from zkcrawl.textsafe import redact_userinfo
from zkcrawl.web.urls import host_key
from zkcrawl.zk import KazooException, KazooTimeoutError
from zkcrawl.zk.client import ZkClient
from zkcrawl.zk.types import ZkState

__all__ = ["COOLING", "GONE", "READY", "RUNNING", "SETTLING", "ConsumerState", "Task",
           "TaskState", "Worker"]

# structlog.get_logger is a lazy proxy: it picks up the configuration made at start-up.
log = structlog.get_logger(__name__)
# consumer.stats and consumer.summary: reports at info whatever --log-level (logs.reporter).
report = logs.reporter(__name__)

TICK = 0.5  # longest any consumer thread blocks: reaction time to signals, pause, idleness
# /livez fails once the claim loop has not ticked for this long. A tick is bounded by TICK
# plus ZooKeeper calls (each bounded by --zk-timeout), start-up by the registration's wait
# (--session-timeout + 2 s): far below it. Never a ZooKeeper question: a loop waiting for an
# unreachable ZooKeeper still ticks.
MIN_STALL = 60.0
# A cooled item leaves the heap this much before its slot; the pool thread that picks it up
# sleeps the rest (< EARLY), so the hand-over does not make it start late.
LEAD = EARLY / 2


class ConsumerState(StrEnum):
    """The consumer's own state, ``state`` in ``<root>/consumers/<id>`` and in
    ``consumer.stats`` (a ``str``: the values are what status readers compare with)."""

    STARTING = "starting"  # connecting, registering: /healthz says 503
    RUNNING = "running"  # claiming and fetching (== zkcrawl.queue.control.RUNNING)
    PAUSED = "paused"  # the cluster is paused: nothing claimed or started (== control.PAUSED)
    DRAINING = "draining"  # stopping: nothing claimed, running fetches get --grace
    STOPPED = "stopped"  # everything released or settled, deregistering


class Worker:
    """One consumer daemon's machinery around a :class:`LeaseQueue`."""

    def __init__(self, settings: ConsumerSettings, zk: ZkClient, queue: LeaseQueue,
                 pipeline: Pipeline, sink: ResultSink, metrics: Metrics, consumer_id: str,
                 results: ResultChain | None = None) -> None:
        self.s = settings
        self.zk, self.queue, self.pipeline, self.sink = zk, queue, pipeline, sink
        self.metrics = metrics
        self.id = consumer_id
        self.timings = Timings()
        self.started_at = time.time()
        self._started = time.monotonic()
        # A terminal gets a refreshing progress line, unless the records go to the same
        # terminal (--out -: they would run through it); JSON logs get consumer.stats.
        self._progress = (settings.log_format != "json" and sys.stderr.isatty()
                          and not (settings.out == "-" and sys.stdout.isatty()))
        self._next_draw = 0.0
        self.state: ConsumerState = ConsumerState.STARTING
        self.backlog = Backlog(settings.capacity)
        self._stop_claiming = False  # request_stop/fail set plain flags: signal-safe
        self._force = False
        self._failure: SinkError | None = None
        self._idle_since: float | None = None
        self._next_stats = time.monotonic() + settings.stats_interval
        self._last_tick = time.monotonic()  # the claim loop's heartbeat, for /livez
        self._stall = max(MIN_STALL, 3 * settings.zk_timeout + settings.session_timeout)
        # kazoo's read timeout: a connection this long without a reply is given up on.
        self._silence_limit = settings.session_timeout * 2 / 3
        # Connection bookkeeping, written on kazoo's thread (_on_zk_state), read anywhere.
        self._session: int | None = zk.session_id  # the session claims are made in
        self._expired: frozenset[int] = frozenset()  # sessions lost: their claims are stale
        self._away_since: float | None = None  # monotonic time the connection went
        self._pool = ThreadPoolExecutor(settings.threads, thread_name_prefix="fetch")
        self._committer: GroupCommit[Task] = GroupCommit(
            sink, queue, live=lambda t: t.state is SETTLING, settled=self._finish,
            failed=self._commit_failed, durable=self._durable, before_settle=self._links,
            results=results, max_attempts=settings.max_attempts)
        self._discovered: DiscoveredWriter | None = None  # made on the first links
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
                self._last_tick = time.monotonic()
                self.tick()
        finally:
            self.shutdown()
        if self._failure is not None:
            raise self._failure
        return ExitStatus.OK

    def tick(self) -> None:
        """One round: connection, stats, pause, sink, capacity, claim, idleness, schedule."""
        self.check_connection()
        self.report_stats()
        if self.check_paused() or self.check_sink():
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
        # Every request a running fetch makes after its first (a redirect hop, robots.txt
        # of another host) waits while paused; a draining consumer lets it finish instead.
        self.pipeline.gate.hold_while(lambda: self._paused() and not self._stop_claiming,
                                      self.control.wait_running)
        self._committer.start()
        self._scheduler.start()
        for _ in range(self.s.threads):
            self._pool.submit(self._work_loop)
        self.state = ConsumerState.PAUSED if self.control.paused else ConsumerState.RUNNING
        self.registration.refresh()
        log.info("consumer.started", consumer=self.id, threads=self.s.threads,
                 backlog=self.s.backlog, delivery=self.s.delivery, out=self.sink.describe)

    def check_connection(self) -> None:
        """Drop items whose leases died with a lost session, unless already started."""
        lost = self.queue.drain_lost()
        if not lost:
            return
        dropped = self.backlog.drop_unstarted(lost)
        log.warning("consumer.leases_lost", consumer=self.id, items=len(lost),
                    dropped_unstarted=dropped,
                    note="records already written stay; these items may be recorded twice")

    def report_stats(self) -> None:
        now = time.monotonic()
        in_flight, backlog, held = self.backlog.stats()
        self.timings.sample_fill(held, self.s.capacity, now)
        self.metrics.in_flight.set(in_flight)
        self.metrics.backlog.set(backlog)
        self.metrics.leases.set(held)
        if now >= self._next_stats:
            self._next_stats = now + self.s.stats_interval
            report.info("consumer.stats", consumer=self.id, state=self.state,
                        **self.timings.snapshot(in_flight, backlog, held))
        if self._progress and now >= self._next_draw:
            self._next_draw = now + progress.REDRAW
            t = self.timings
            logs.status(progress.progress_line(
                str(self.state), t.items_per_s(), t.processed, t.failed, in_flight, backlog,
                t.current_pace(), now - self._started))

    def check_paused(self) -> bool:
        assert self.control is not None
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
        self._release(self.backlog.held(READY, COOLING))
        self.sink.wait_available(TICK)
        return True

    def wait_capacity(self, timeout: float) -> int:
        """Free lease slots, once a batch's worth is free (or nothing is held)."""
        want = max(1, min(self.queue.claim_batch, self.s.capacity // 4))
        return self.backlog.wait_capacity(want, timeout, self._stopping)

    def claim(self, n: int) -> list[Claimed]:
        # One lease transaction's worth at a time: each batch reaches the pool as soon as it
        # is leased instead of waiting for the next batches' round trips (dispatch_ms).
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
                # SPEC §4: idle means the queue held no item at all. Items leased by a
                # consumer that died keep us until its session expires and they come back.
                self._idle_since = now
                return
            log.info("consumer.idle_exit", consumer=self.id, idle_s=self.s.exit_when_idle)
            self._stop_claiming = True

    def _queue_empty(self) -> bool:
        """No item in the queue, claimable or leased (one stat of the parent)."""
        try:
            return self.queue.depth() == 0
        except (KazooException, KazooTimeoutError):
            return False  # cannot tell: not idle

    def schedule(self, claimed: Sequence[Claimed]) -> None:
        """Hand claimed items to the pool through the capped backlog."""
        now = time.monotonic()
        tasks = [Task(c, ItemTiming(c.claimed_mono, c.queue_ms, submitted=now),
                      host_key(c.url)) for c in claimed]
        self.backlog.put(tasks)

    # -- pool threads -------------------------------------------------------------------
    def _work_loop(self) -> None:
        """One of the pool's ``--threads`` loops: take from the backlog, run, repeat. (A
        loop per thread rather than a Future per item: no per-item executor overhead.)"""
        backlog = self.backlog
        while True:
            task = backlog.take(TICK)
            if task is not None:
                self._run(task)
            elif backlog.closed:
                return

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
            self.backlog.task_done()

    def admit(self, task: Task) -> bool:
        """May this item start now? If not it waits in the heap, not on this thread."""
        if not self._may_start(task):
            return False
        if task.claimed.abandoned(self.s.max_attempts):
            task.host = ""  # no request will be made: no robots.txt, no politeness slot
        if task.host and (task.slot is not None
                          or self.pipeline.prepare(task.claimed.url or "", task.host)):
            # robots.txt may have taken seconds: the world may have changed meanwhile.
            if not self._may_start(task):
                return False
            start, due = self.pipeline.gate.admit(task.host, task.slot)
            if due is not None:
                task.slot = start
                self.backlog.cool(task, due - LEAD)
                return False
            task.gated = True
            assert start is not None  # admitted: the start is known
            if (delay := start - time.monotonic()) > 0:
                time.sleep(delay)  # < EARLY: cheaper than a trip through the heap
        task.timing.started = time.monotonic()
        return True

    def _may_start(self, task: Task) -> bool:
        """Not stopping (else: released), not paused (else: cooled, held by the scheduler
        until resumed), and its lease not lost with an expired session (else: forgotten --
        another consumer, or this one in its new session, claims it again)."""
        assert self.control is not None
        if self._stop_claiming or not self.sink.available:
            self._release([task])
            return False
        session = task.claimed.session
        if session is not None and session in self._expired:
            if self.backlog.forget([task]):
                log.info("item.dropped", item=task.name, url=task.claimed.url,
                         reason="session lost before it started")
            return False
        if session is not None and self.zk.silent_for() > self._silence_limit:
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
        outcome = self.pipeline.process(task.claimed, task.timing,
                                        task.host if task.gated else "")
        if task.timing.finished is None:
            task.timing.finished = time.monotonic()
        if task.state is GONE:
            return  # released after the grace period, or its lease was lost
        self._settle(task, outcome)

    def _durable(self, settles: Sequence[Settle[Task]]) -> None:
        """The committer stored these tasks' records: count them and log
        ``item.done``/``item.failed`` -- never before their record is stored. A record the
        sink refused comes back as a dead letter with the sink's reason."""
        now = time.monotonic()
        for s in settles:
            task, outcome = s.token, s.token.outcome
            if outcome is None:
                continue
            if s.kind != outcome.kind:  # refused by the sink
                outcome = task.outcome = Outcome(s.kind, None, s.error, outcome.status)
            task.timing.written = now
            self._account(task, outcome)

    def _links(self, tasks: Sequence[Task]) -> None:
        """Committer thread, before completing ``tasks``: the links their page processors
        found go to ``<root>/discovered/`` (at-least-once: never completed without them)."""
        # "from" is the page that linked (credentials never leave the process: redacted).
        links = [Link(url, redact_userinfo(task.claimed.url or ""), link_depth(task.claimed))
                 for task in tasks if task.outcome is not None
                 for url in task.outcome.links]
        if not links:
            return
        if self._discovered is None:
            self._discovered = DiscoveredWriter(self.zk, self.s.root, self.id)
        self._discovered.write(links)

    def _account(self, task: Task, outcome: Outcome) -> None:
        failed = outcome.error is not None
        label = outcome.kind if outcome.kind in (RETRY, DEAD) else outcome.error or (
            "skipped" if outcome.skipped else "ok")
        if label.startswith(PROCESSOR_ERROR):  # one metrics label, not one per message
            label = PROCESSOR_ERROR.rstrip(":")
        t = task.timing
        dispatch, wait, process = durations = t.durations()
        self.timings.record(durations, label, final=outcome.kind in (COMPLETE, DEAD),
                            failed=failed, extract=t.extract_ms, timing=t)
        reason = outcome.error
        if reason is not None and reason.startswith(PROCESSOR_ERROR):  # one reason label
            reason = PROCESSOR_ERROR.rstrip(":")
        self.metrics.observe(outcome.kind, reason, t.queue_ms, dispatch, wait, process,
                             skipped=outcome.skipped)
        # Per item: debug (a terminal shows the progress line, JSON logs consumer.stats).
        log.debug("item.failed" if failed else "item.done", url=task.claimed.url,
                  item=task.name, status=outcome.status, attempt=task.claimed.attempt,
                  outcome=outcome.kind, error=outcome.error, polite_ms=round(t.polite_ms, 3),
                  queue_ms=round(t.queue_ms, 3), dispatch_ms=dispatch, wait_ms=wait,
                  process_ms=process, extract_ms=round(t.extract_ms, 3),
                  links=len(outcome.links), skipped=outcome.skipped)

    # -- scheduler thread: cooled items back to the pool when their turn comes -----------
    def _schedule_loop(self) -> None:
        while self.backlog.release_due(self._paused, TICK):
            pass

    def _paused(self) -> bool:
        return self.control is not None and self.control.paused

    # -- settling -------------------------------------------------------------------------
    def _settle(self, task: Task, outcome: Outcome) -> None:
        task.outcome = outcome
        if self.backlog.settle(task):
            self._committer.put(Settle(task.claimed, outcome.kind, outcome.error,
                                       outcome.record, task))

    def _finish(self, tasks: Sequence[Task]) -> None:
        self.backlog.forget(tasks)

    def _commit_failed(self, exc: SinkError | None, tasks: list[Task]) -> None:
        if exc is not None and not isinstance(exc, SinkUnavailable):
            self.fail(exc)  # broken for good; unavailable: released, claiming waits for it
        self._release(tasks)

    def _release(self, tasks: Sequence[Task]) -> None:
        """Give leases back now: claimable by others at once."""
        tasks = self.backlog.forget(tasks)
        if not tasks:
            return
        try:
            self.queue.release([t.claimed for t in tasks])
        except Exception as exc:  # closing the session releases them too
            log.warning("consumer.release_deferred", items=len(tasks), error=repr(exc))
        log.info("consumer.released", consumer=self.id, items=len(tasks))

    # -- stopping -------------------------------------------------------------------------
    def request_stop(self, force: bool = False) -> None:
        """Stop claiming, finish what runs within ``--grace``; ``force``: release all and
        exit now. Sets flags only: it runs inside a signal handler (:mod:`zkcrawl.signals`:
        the first SIGTERM/SIGINT asks to drain, the second forces)."""
        if force:
            self._force = True
        self._stop_claiming = True

    def _stopping(self) -> bool:
        return self._stop_claiming

    def fail(self, exc: SinkError) -> None:
        """The sink cannot take records: stop claiming; held items are released."""
        if self._failure is None:
            self._failure = exc
        self._stop_claiming = True

    def shutdown(self) -> None:
        """Release the backlog now, let running fetches finish within the grace, release
        the rest, flush completions, deregister."""
        self.state = ConsumerState.DRAINING
        if self.registration is not None:
            self.registration.refresh()
        log.info("consumer.draining", consumer=self.id, held=len(self.backlog),
                 reason="sink failure" if self._failure else "stop")
        self._release(self.backlog.held(READY, COOLING))
        grace = 0.0 if self._failure is not None else self.s.grace
        # With ZooKeeper away, the grace is for the running fetches only: the completions
        # wait for it in the committer, which close() bounds by --zk-timeout.
        self.backlog.wait_empty(time.monotonic() + grace, self._forced, TICK,
                                settling_left=lambda: self._away_since is not None)
        self._release(self.backlog.held(RUNNING, READY, COOLING))
        self.pipeline.fetcher.close()
        self._committer.close(1.0 if self._force else self.s.zk_timeout)
        self.backlog.close()
        self._release(self.backlog.held(SETTLING))  # completions that could not go through
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.state = ConsumerState.STOPPED
        self.zk.remove_listener(self._on_zk_state)  # closing the session is no news
        if self.registration is not None:  # forced: not after a publish stuck in ZooKeeper
            self.registration.stop(wait=0.1 if self._force else 5.0)
        log.info("consumer.stopped", consumer=self.id, processed=self.timings.processed,
                 failed=self.timings.failed, forced=self._force)
        self.summarize()

    def summarize(self) -> None:
        """The closing summary: a table on a terminal (the progress line removed first),
        the ``consumer.summary`` event otherwise."""
        t = self.timings
        event = progress.summary_event(self.id, time.monotonic() - self._started, t.processed,
                                       t.failed, t.outcomes, t.run_verdict(), t.p50s())
        if self._progress:
            logs.status("")
            logs.write(progress.summary_text(event, t.outcomes))
        else:
            report.info("consumer.summary", **event)

    def _forced(self) -> bool:
        return self._force

    # -- status -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The JSON of ``<root>/consumers/<id>`` (refreshed every 2 s by the Registration)."""
        in_flight, backlog, held = self.backlog.stats()
        return {"id": self.id, "pid": os.getpid(), "started_at": round(self.started_at, 3),
                "state": self.state, "processed": self.timings.processed,
                "failed": self.timings.failed, "in_flight": in_flight, "backlog": backlog,
                "leases": held, "items_per_s": self.timings.items_per_s(),
                "control": self.control.state if self.control else control.RUNNING,
                "threads": self.s.threads, "capacity": self.s.capacity,
                "domain_delay": self.s.domain_delay}

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """For ``/livez``: the process works -- its claim loop ticked lately and its
        committer runs. Never asks ZooKeeper: a consumer waiting for it is alive. Draining
        and stopped are alive too (bounded by --grace and --zk-timeout, then the process
        exits by itself)."""
        since = time.monotonic() - self._last_tick
        in_loop = self.state in (ConsumerState.RUNNING, ConsumerState.PAUSED)
        ticking = not in_loop or since < self._stall
        committing = not in_loop or self._committer.alive
        return ticking and committing, {"state": self.state,
                                        "last_tick_s": round(since, 3),
                                        "committer": self._committer.alive}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """For ``/readyz`` (and ``/healthz``): connected, and in the run loop -- running, or
        paused on purpose (the operator's choice, not a fault: it resumes within 1 s)."""
        ok = (self.zk.connected and self.sink.available
              and self.state in (ConsumerState.RUNNING, ConsumerState.PAUSED))
        return ok, {"zookeeper": self.zk.state, "state": self.state,
                    "sink": "up" if self.sink.available else "unavailable"}

    health = readiness  # the older name

    def _on_control(self, state: str) -> None:
        # kazoo's thread: flags and a notification only, never a blocking call.
        paused = state == control.PAUSED
        if self.state in (ConsumerState.RUNNING, ConsumerState.PAUSED):
            new = ConsumerState.PAUSED if paused else ConsumerState.RUNNING
            if new != self.state:  # logging only enqueues: fine on kazoo's thread
                log.info("consumer.paused" if paused else "consumer.resumed", consumer=self.id)
            self.state = new
        self.metrics.paused.set(1 if paused else 0)
        if self.registration is not None:
            self.registration.refresh()
        self.backlog.wake_scheduler()

    def _on_zk_state(self, state: str) -> bool:
        # kazoo's thread: flags and log lines only (logging only enqueues), never a blocking
        # call. LOST marks the session's claims stale at once, so no pool thread starts one
        # of them even before the claim loop drops them from the backlog.
        self.metrics.set_zk_state(str(state))
        now = time.monotonic()
        if state == ZkState.CONNECTED:
            session = self.zk.session_id
            if self._away_since is not None:
                log.info("zk.reconnected", consumer=self.id,
                         away_s=round(now - self._away_since, 3),
                         new_session=session != self._session)
                self._away_since = None
            self._session = session
            return False
        if self._away_since is None:
            self._away_since = now
        if state == ZkState.LOST:
            if self._session is not None:
                self._expired = self._expired | {self._session}
            log.warning("zk.lost", consumer=self.id, note="session expired: its leases are "
                        "gone; items not started are dropped, running ones may be recorded "
                        "twice")
        else:
            log.warning("zk.suspended", consumer=self.id, note="disconnected: claims and "
                        "completions held until reconnected")
        return False
