"""The consumer's parts, each started and stopped in one order: :data:`ORDER`. A part has
``name``, ``start()`` and ``stop()``; :class:`Lifecycle` starts them in order and stops the
ones it started in reverse -- on a clean stop, a sink failure, a second signal or a part
that fails to start. Every stop runs even when one before it raised; the first error is
raised afterwards.

The stop order is the drain SPEC §4 promises: ``claims`` (nothing more claimed, the backlog
released, running fetches get ``--grace``), ``pool`` (transfers cancelled), ``scheduler``,
``committer`` (completions flushed within ``--zk-timeout``), ``links``, ``backlog`` (what
could not complete released), then ``ownership``, ``control``, ``status``, ``session``. A
forced stop (:attr:`Stopping.forced`, the second signal) skips the waits.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from zkcrawl import logs
from zkcrawl.consumer import banner
from zkcrawl.consumer.backlog import COOLING, MARKING, READY, RUNNING, SETTLING, Task
from zkcrawl.consumer.committer import GroupCommit, Settle
from zkcrawl.errors import SinkError
from zkcrawl.queue import control
from zkcrawl.queue.discovered import DiscoveredWriter, Link, link_depth
from zkcrawl.queue.fetched import close_reports, report_outcomes
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.registry import Registration
from zkcrawl.textsafe import redact_userinfo
from zkcrawl.zk.session import SessionState
from zkcrawl.zk.types import ZkState

if TYPE_CHECKING:
    from zkcrawl.consumer.worker import Worker

__all__ = ["ORDER", "Component", "ConsumerState", "Lifecycle", "Stopping", "parts"]

# The events keep the logger name they always had.
log = structlog.get_logger("consumer.worker")

TICK = 0.5  # longest any consumer thread blocks: reaction time to signals, pause, idleness

# The start order; the stop order is its reverse.
ORDER = ("session", "status", "control", "ownership", "backlog", "links", "committer",
         "scheduler", "pool", "claims")


class ConsumerState(StrEnum):
    """The consumer's own state, ``state`` in ``<root>/consumers/<id>`` and in
    ``consumer.stats`` (a ``str``: the values are what status readers compare with)."""

    STARTING = "starting"  # connecting, registering: /healthz says 503
    RUNNING = "running"  # claiming and fetching (== zkcrawl.queue.control.RUNNING)
    PAUSED = "paused"  # the cluster is paused: nothing claimed or started (== control.PAUSED)
    DRAINING = "draining"  # stopping: nothing claimed, running fetches get --grace
    STOPPED = "stopped"  # everything released or settled, deregistering


class Component(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Stopping:
    """Whether and how the worker stops. Plain attributes: set from a signal handler."""

    def __init__(self) -> None:
        self.requested = False  # stop claiming: drain (first signal, idle, sink failure)
        self.forced = False  # skip the waits (second signal)
        self.failure: SinkError | None = None  # the sink cannot take records (exit 1)

    def request(self, force: bool = False) -> None:
        if force:
            self.forced = True
        self.requested = True

    def fail(self, exc: SinkError) -> None:
        if self.failure is None:
            self.failure = exc
        self.requested = True


class Lifecycle:
    """Start ``parts`` in order, stop the started ones in reverse (module docstring)."""

    def __init__(self, parts: Sequence[Component]) -> None:
        self.parts = tuple(parts)
        self._started: list[Component] = []

    def start(self) -> None:
        for part in self.parts:
            try:
                part.start()
            except BaseException:
                self._stop_all()  # the start's error is the one raised
                raise
            self._started.append(part)

    def stop(self) -> None:
        first = self._stop_all()
        if first is not None:
            raise first

    def _stop_all(self) -> BaseException | None:
        """Stop the started parts, newest first, each even when one before it raised;
        returns the first error (later ones are logged)."""
        first: BaseException | None = None
        while self._started:
            part = self._started.pop()
            try:
                part.stop()
            except BaseException as exc:
                if first is None:
                    first = exc
                else:
                    log.warning("consumer.stop_failed", part=part.name, error=repr(exc))
        return first


class Session:
    """The ZooKeeper session, tracked once (:class:`~zkcrawl.zk.session.SessionState`):
    ``zk.suspended``, ``zk.lost`` and ``zk.reconnected`` (with ``away_s``) logged as the
    connection goes and comes back, ``zkcrawl_consumer_zookeeper_state`` set."""

    name = "session"

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.state = SessionState(w.zk, self._changed)

    def start(self) -> None:
        self.state.start()
        logs.fold_zk_chatter()  # kazoo's reconnect lines go into zk.suspended/reconnected

    def stop(self) -> None:
        self.state.stop()

    def _changed(self, state: str, away_s: float | None, new_session: bool) -> None:
        # kazoo's thread: a gauge and log lines only (logging only enqueues).
        self.w.metrics.set_zk_state(state)
        if state == ZkState.CONNECTED:
            if away_s is not None:
                log.info("zk.reconnected", consumer=self.w.id, away_s=round(away_s, 3),
                         new_session=new_session, **logs.zk_chatter())
        elif state == ZkState.LOST:
            log.warning("zk.lost", consumer=self.w.id, note="session expired: its partitions "
                        "went with it (their next owners redo what it had not settled); items "
                        "not started are dropped, running ones may be recorded twice",
                        **logs.zk_chatter())
        else:
            log.warning("zk.suspended", consumer=self.w.id, note="disconnected: claims and "
                        "completions held until reconnected", **logs.zk_chatter())


class Status:
    """``<root>/consumers/<id>``: created at start (an id held by another live consumer is
    a usage error), refreshed every 2 s and on each state change, deleted at the stop."""

    name = "status"

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.started_at = time.time()
        self.registration: Registration | None = None

    def start(self) -> None:
        w = self.w
        registration = Registration(w.zk, Layout.of(w.s.root).consumer(w.id), self.status,
                                    interval=2.0)
        # Only once it is ours: a node held by another live consumer must not be deleted.
        self.registration = registration.start(wait_free=w.s.session_timeout + 2)

    def stop(self) -> None:
        if self.registration is not None:  # forced: not after a publish stuck in ZooKeeper
            self.registration.stop(wait=0.1 if self.w.stopping.forced else 5.0)

    def refresh(self) -> None:
        if self.registration is not None:
            self.registration.refresh()

    def status(self) -> dict[str, Any]:
        """The JSON of ``<root>/consumers/<id>``."""
        w = self.w
        in_flight, backlog, held = w.backlog.stats()
        ownership = w.ownership
        return {"id": w.id, "pid": os.getpid(), "started_at": round(self.started_at, 3),
                "state": w.state, "processed": w.timings.processed,
                "failed": w.timings.failed, "in_flight": in_flight, "backlog": backlog,
                "leases": held, "items_per_s": w.timings.items_per_s(),
                "control": w.control.state, "threads": w.s.threads,
                "capacity": w.s.capacity, "parked": w.parking.parked_total,
                "redelivered": w.redelivered, "given_back": w.given_back,
                **({"ownership": ownership.snapshot()} if ownership else {}),
                "domain_delay": w.s.domain_delay}


class Control:
    """The cluster's pause/resume (``<root>/control``): ``consumer.paused``/``resumed``,
    the ``paused`` gauge; a running fetch's later requests wait while paused."""

    name = "control"

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.watch: control.ControlWatch | None = None

    @property
    def state(self) -> str:
        return self.watch.state if self.watch is not None else control.RUNNING

    @property
    def paused(self) -> bool:
        return self.watch is not None and self.watch.paused

    def wait_running(self, timeout: float | None) -> bool:
        return self.watch.wait_running(timeout) if self.watch is not None else True

    def start(self) -> None:
        w = self.w
        self.watch = control.ControlWatch(w.zk, w.s.root, self._changed)
        # Every request a running fetch makes after its first (a redirect hop, robots.txt
        # of another host) waits while paused; a draining consumer lets it finish instead.
        w.item_handler.gate.hold_while(lambda: self.paused and not w.stopping.requested,
                                   self.wait_running)

    def stop(self) -> None:
        pass  # the watch ends with the session

    def _changed(self, state: str) -> None:
        # kazoo's thread: flags and a notification only, never a blocking call.
        w = self.w
        paused = state == control.PAUSED
        if w.state in (ConsumerState.RUNNING, ConsumerState.PAUSED):
            new = ConsumerState.PAUSED if paused else ConsumerState.RUNNING
            if new != w.state:  # logging only enqueues: fine on kazoo's thread
                log.info("consumer.paused" if paused else "consumer.resumed", consumer=w.id)
            w.state = new
        w.metrics.paused.set(1 if paused else 0)
        w.status.refresh()
        w.backlog.wake_scheduler()


class OwnershipPart:
    """``--politeness owner``: membership and the partitions this consumer owns."""

    name = "ownership"

    def __init__(self, w: Worker) -> None:
        self.w = w

    def start(self) -> None:
        if self.w.ownership is not None:
            self.w.ownership.start(self.w.backlog.wake_scheduler)

    def stop(self) -> None:
        if self.w.ownership is not None:
            self.w.ownership.stop()


class BacklogPart:
    """The capped queue in front of the pool (:class:`~zkcrawl.consumer.backlog.Backlog`): closed
    last of the item parts; what is still SETTLING then is released."""

    name = "backlog"

    def __init__(self, w: Worker) -> None:
        self.w = w

    def start(self) -> None:
        pass  # made with the worker: the claim loop and the pool share it

    def stop(self) -> None:
        w = self.w
        w.backlog.close()
        w.release(w.backlog.held(SETTLING))  # completions that could not go through
        w.state = ConsumerState.STOPPED


class Links:
    """What the committer writes before completing a group: the links the page processors
    found (``<root>/discovered/``) and the re-crawl reports (``<root>/fetched/``)."""

    name = "links"

    def __init__(self, w: Worker) -> None:
        self.w = w
        self.zk, self.s, self.id = w.zk, w.s, w.id  # what the reports' buffer reads
        self._discovered: DiscoveredWriter | None = None  # made on the first links

    def start(self) -> None:
        pass

    def stop(self) -> None:
        close_reports(self)  # the re-crawl reports still gathering

    def write(self, tasks: Sequence[Task]) -> None:
        """Committer thread, before completing ``tasks`` (at-least-once: never completed
        without their links)."""
        # "from" is the page that linked (credentials never leave the process: redacted).
        links = [Link(url, redact_userinfo(task.claimed.url or ""), link_depth(task.claimed))
                 for task in tasks if task.outcome is not None
                 for url in task.outcome.links]
        report_outcomes(self, tasks)  # issue #23: re-crawl outcomes, same hook
        if not links:
            return
        if self._discovered is None:
            self._discovered = DiscoveredWriter(self.zk, self.s.root, self.id)
        self._discovered.write(links)


class Committer:
    """The group commit (:class:`~zkcrawl.consumer.committer.GroupCommit`): records to the sink in
    one batch, then completions in ZooKeeper."""

    name = "committer"

    def __init__(self, w: Worker, links: Links) -> None:
        self.w = w
        self.commit: GroupCommit[Task] = GroupCommit(
            w.sink, w.queue, live=lambda t: t.state is SETTLING, settled=w.forget,
            failed=w.commit_failed, durable=w.durable, before_settle=links.write,
            results=w.results, max_attempts=w.s.max_attempts)
        self.put: Callable[[Settle[Task]], None] = self.commit.put  # a pool thread's hand-off

    @property
    def alive(self) -> bool:
        return self.commit.alive

    def start(self) -> None:
        self.commit.start()

    def stop(self) -> None:
        self.commit.close(1.0 if self.w.stopping.forced else self.w.s.zk_timeout)


class Scheduler:
    """One thread hands cooled items back to the pool when their host's turn comes."""

    name = "scheduler"

    def __init__(self, w: Worker) -> None:
        self.w = w
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        pass  # its loop ends when the backlog closes

    def _loop(self) -> None:
        backlog, paused = self.w.backlog, lambda: self.w.control.paused
        while backlog.release_due(paused, TICK):
            pass


class Pool:
    """``--threads`` loops: take from the backlog, run, repeat (a loop per thread rather
    than a Future per item: no per-item executor overhead)."""

    name = "pool"

    def __init__(self, w: Worker, run: Callable[[Task], None]) -> None:
        self.w = w
        self._run = run
        self._executor = ThreadPoolExecutor(w.s.threads, thread_name_prefix="fetch")

    def start(self) -> None:
        for _ in range(self.w.s.threads):
            self._executor.submit(self._loop)

    def stop(self) -> None:
        self.w.item_handler.fetcher.close()  # cancels the transfers still under way
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        backlog, run = self.w.backlog, self._run
        while True:
            task = backlog.take(TICK)
            if task is not None:
                run(task)
            elif backlog.closed:
                return


class Claims:
    """The claim loop's part: running (or paused) once everything else runs; its stop is
    the drain (module docstring, step 1)."""

    name = "claims"

    def __init__(self, w: Worker) -> None:
        self.w = w

    def start(self) -> None:
        w = self.w
        w.state = ConsumerState.PAUSED if w.control.paused else ConsumerState.RUNNING
        w.status.refresh()
        banner.show(w.s, w.id, w.sink.describe, terminal=w.console.progress)

    def stop(self) -> None:
        w = self.w
        w.state = ConsumerState.DRAINING
        w.status.refresh()
        failure = w.stopping.failure
        log.info("consumer.draining", consumer=w.id, held=len(w.backlog),
                 reason="sink failure" if failure else "stop")
        w.release(w.backlog.held(READY, COOLING))
        grace = 0.0 if failure is not None else w.s.grace
        # With ZooKeeper away, the grace is for the running fetches only: the completions
        # wait for it in the committer, which its stop bounds by --zk-timeout.
        w.backlog.wait_empty(time.monotonic() + grace, lambda: w.stopping.forced, TICK,
                             settling_left=lambda: w.session.away)
        w.release(w.backlog.held(RUNNING, READY, COOLING, MARKING))


def parts(w: Worker) -> list[Component]:
    """The worker's parts in :data:`ORDER`."""
    made: list[Component] = [w.session_part, w.status, w.control, OwnershipPart(w),
                             BacklogPart(w), w.links, w.committer, Scheduler(w), w.pool,
                             Claims(w)]
    assert tuple(p.name for p in made) == ORDER
    return made
