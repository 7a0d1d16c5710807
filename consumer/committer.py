"""The committer: durable first, then done in ZooKeeper (SPEC §3, at-least-once).

One thread, ``committer`` (:class:`GroupCommit`), takes the items the pool threads finished,
waits :data:`COMMIT_WINDOW` for a group, then: (1) writes the group -- the records through
the ``--pipeline`` chain (:mod:`zkcrawl.consumer.results`), then one sink batch (one fsync, or one
database transaction; a record the sink refuses makes its item a dead letter); (2) hands the
group to ``before_settle`` (discovered links go to ZooKeeper before their items complete;
refused links are a failed attempt of their items); (3) tells the caller the group is
durable (``item.done`` is logged only then); (4) only then settles the group in ZooKeeper.

* An item is never completed before its record is stored; a crash in between gives a
  duplicate record (at-least-once; the same key in a database).
* ZooKeeper suspended: the group is kept and retried, records not written twice. A sink
  failure hands the group back to be released.
* Between groups only: the sink's ``between_groups`` (file reopen on SIGHUP, reconnect).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from zkcrawl.consumer.pipeline import COMPLETE, DEAD, RETRY, OutcomeKind
from zkcrawl.consumer.queue_seam import WorkerQueue
from zkcrawl.consumer.results import ResultChain
from zkcrawl.consumer.sinks import Entry, Record, ResultSink
from zkcrawl.errors import SinkError
from zkcrawl.queue.batch_dir import WriteRefused
from zkcrawl.queue.claims import Claimed, QueueSuspended

__all__ = ["COMMIT_WINDOW", "GroupCommit", "Settle"]

# structlog.get_logger is a lazy proxy: it picks up the configuration made at start-up.
log = structlog.get_logger(__name__)

COMMIT_WINDOW = 0.01  # seconds a finished item may wait for others to be committed with it
LINKS_REFUSED = "discovered links not writable"  # the reason's prefix (retry, dead letter)

T = TypeVar("T")  # the caller's handle on an item (the Worker's Task)


@dataclass
class Settle(Generic[T]):
    """One item waiting for the committer: its record (None: nothing to store, e.g. a
    retry) and what to do in ZooKeeper once that record is stored. ``token`` is the
    caller's handle, given back through the callbacks. The committer changes ``kind`` and
    ``error`` when the sink refuses the record (a dead letter with the sink's reason)."""

    claimed: Claimed
    kind: OutcomeKind
    error: str | None
    record: Record | None
    token: T
    written: bool = False  # stored and announced (a group retried after SUSPENDED)
    prepared: bool = False  # before_settle() done with it (succeeded, or not to be asked)


class GroupCommit(Generic[T]):
    """The committer thread: one fsync for every record written since the last one, then
    the group's items settled in ZooKeeper (completions batched in transactions).

    ``live(token)`` says whether the item is still ours to settle (not released or lost
    meanwhile), ``settled(tokens)`` is told when items are done with, ``failed(exc, tokens)``
    when the sink failed (``exc``: broken, or unavailable for now) or a commit failed
    unexpectedly (``None``): those items were not completed and must be released.
    ``durable(settles)`` is told once per item when its record is stored (with the kind
    and error the committer settles it with). While ZooKeeper is suspended the group is
    kept and retried once reconnected.

    Worker threads hand each finished item, with its record if it has one, to
    :meth:`GroupCommit.put`. One thread, ``committer``, takes everything put since its last
    round, waits :data:`COMMIT_WINDOW` for a group to gather, then

    1. **writes** the group (:meth:`GroupCommit.write`, the one step between "records of this
       group" and "per-item results"): the records through the ``--pipeline`` chain
       (:mod:`zkcrawl.consumer.results`: dropped, changed, or a retryable failure), then every
       record in one :meth:`~zkcrawl.consumer.sinks.ResultSink.write_batch` -- one write and one
       fsync for JSON Lines, one transaction for PostgreSQL. The sink answers per record: stored
       (durable), or refused with a reason (a constraint or type error in the database), which turns
       that item into a dead letter with the reason; the rest of the group is unaffected;
    2. hands the group to ``before_settle(tokens)`` (the consumer writes the links its page
       processors found to ``<root>/discovered/`` there: in ZooKeeper before the items that
       found them are completed). An item the chain or the sink failed is not handed over: its
       links are not followed. When ZooKeeper **refuses** the links
       (:class:`~zkcrawl.queue.batch_dir.WriteRefused`: NoAuth on ``<root>/discovered``...),
       the items are handed over again one by one to find whose links were refused: those
       count a **failed attempt** (retried with ``discovered links not writable: <error>``, a
       dead letter with that reason after ``--max-attempts``), the others go on -- one
       ``consumer.links_refused`` warning per group. Their records are stored already and
       stay; each retry fetches and records the page again (up to ``--max-attempts`` records
       of it, bounded), as a refusal does not change until an operator fixes the ACL and
       requeues the dead letters (``zkcrawl dead requeue --error 'discovered links*'``);
    3. tells the caller the group is durable (``durable(settles)``, once per item, with the kind
       and error it is settled with: the consumer logs ``item.done``/``item.failed`` there, so a
       done line always has its record stored);
    4. only then settles the group in ZooKeeper: completions in batched transactions
       (:meth:`~zkcrawl.consumer.queue_seam.WorkerQueue.complete`), then each retry, dead letter or
       release.
    """

    def __init__(self, sink: ResultSink, queue: WorkerQueue, *, live: Callable[[T], bool],
                 settled: Callable[[list[T]], None],
                 failed: Callable[[SinkError | None, list[T]], None],
                 durable: Callable[[list[Settle[T]]], None] | None = None,
                 before_settle: Callable[[list[T]], None] | None = None,
                 results: ResultChain | None = None, max_attempts: int = 3) -> None:
        self.sink, self.queue = sink, queue
        self._live, self._settled, self._failed = live, settled, failed
        self._durable = durable
        self._before_settle = before_settle
        self.results = results  # --pipeline: the chain each record goes through first
        self.max_attempts = max_attempts
        self._cond = threading.Condition()
        self._pending: list[Settle[T]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="committer", daemon=True)

    def start(self) -> GroupCommit[T]:
        self._thread.start()
        return self

    def put(self, item: Settle[T]) -> None:
        with self._cond:
            self._pending.append(item)
            if len(self._pending) == 1:  # the committer waits only while nothing is pending
                self._cond.notify()

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def alive(self) -> bool:
        """The committer thread runs (for the liveness probe)."""
        return self._thread.is_alive()

    def close(self, timeout: float) -> None:
        """Commit what is pending (bounded by ``timeout``), then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():  # never started if the consumer failed to start
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            self.sink.between_groups()  # reopen (SIGHUP), reconnect: never inside a group
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait(0.5)
                    if self.sink.reopen_requested or not self.sink.available:
                        break  # an idle consumer reopens or reconnects within 0.5 s too
                if not self._pending:
                    if self._closed:
                        return
                    continue
            if not self._closed:
                # Let the group gather (a database's commit_delay): one fsync and one
                # transaction for the items of a few milliseconds, not for each item.
                time.sleep(COMMIT_WINDOW)
            with self._cond:
                group, self._pending = self._pending, []
            self._commit(group)

    def _commit(self, group: list[Settle[T]]) -> None:
        fresh = [s for s in group if not s.written]
        try:
            self.write(fresh)
        except SinkError as exc:
            self._failed(exc, [s.token for s in group])
            return
        for s in fresh:
            s.written = True
        try:
            try:
                self._prepare(group)  # a refusal turns items into retries here
            finally:  # suspended too: told now, not after the outage (nor never, if closing);
                # so an item refused only after the outage was told "done" (logs, metrics).
                self._announce(fresh)
            self._apply(group)
        except QueueSuspended:
            if self._closed:
                return  # shutting down: the caller releases what is left
            with self._cond:
                self._pending[:0] = group  # retried once reconnected, order kept
            self.queue.wait_connected(0.5)
        except Exception:  # never let the committer die: completions would stop for good
            log.exception("consumer.commit_failed", items=len(group))
            self._failed(None, [s.token for s in group])

    def _announce(self, fresh: list[Settle[T]]) -> None:
        if fresh and self._durable is not None:
            try:
                self._durable(fresh)
            except Exception:  # a logging problem must not stop completions
                log.exception("consumer.durable_callback_failed", items=len(fresh))

    def write(self, group: list[Settle[T]]) -> None:
        """The records of this group -> :meth:`ResultSink.write_batch` -> per-item results.

        One call for the whole group (one fsync, one transaction). A record the sink
        refuses makes its item a dead letter carrying the sink's reason; the others are
        stored. Raises :class:`SinkError` when nothing was stored (the sink broke, or is
        unavailable for now): then no item of the group may be completed."""
        batch = [(s, s.record) for s in group if s.record is not None]
        if self.results:
            batch = self._chain(batch)
        if not batch:
            return
        refused = self.sink.write_batch([Entry(s.claimed.name, _created_ms(s.claimed), record,
                                               s.kind) for s, record in batch])
        for (s, _), reason in zip(batch, refused, strict=True):
            if reason is not None:
                log.warning("item.refused_by_sink", item=s.claimed.name, url=s.claimed.url,
                            reason=reason)
                s.kind, s.error, s.record = DEAD, f"sink: {reason}", None
                s.prepared = True  # a dead letter: its links are not followed

    def _chain(self, batch: list[tuple[Settle[T], Record]]) -> list[tuple[Settle[T], Record]]:
        """The group's records through the ``--pipeline`` chain (consumer/results.py): the
        records to store. Dropped: completed without a record; a failure: that item retried
        (a dead letter with its record after ``--max-attempts``), the others go on."""
        assert self.results is not None
        kept: list[tuple[Settle[T], Record]] = []
        for s, record in batch:
            out = self.results.process(record)
            if out.record is not None:
                s.record = out.record
                kept.append((s, out.record))
            elif out.error is None:
                log.info("pipeline.dropped", item=s.claimed.name, url=s.claimed.url,
                         pipeline=out.dropped_by)
                s.record = None
            else:
                log.warning("pipeline.failed", item=s.claimed.name, url=s.claimed.url,
                            error=out.error, attempt=s.claimed.attempt)
                s.prepared = True  # failed: its links are not followed (a retry finds them)
                if s.claimed.may_retry(self.max_attempts):
                    s.kind, s.error, s.record = RETRY, out.error, None
                else:
                    s.kind, s.error = DEAD, out.error
                    record = s.record = {**record, "error": out.error}
                    kept.append((s, record))
        return kept

    def _prepare(self, group: list[Settle[T]]) -> None:
        """``before_settle`` for the items not prepared yet, in one call. Refused
        (:class:`WriteRefused`): asked again item by item (:meth:`_prepare_each`).
        QueueSuspended: raised, the items not prepared are asked again with the group once
        reconnected."""
        todo = [s for s in group if not s.prepared]
        if not todo or self._before_settle is None:
            return
        try:
            self._before_settle([s.token for s in todo])
        except WriteRefused:
            self._prepare_each(todo)
            return
        for s in todo:
            s.prepared = True

    def _prepare_each(self, todo: list[Settle[T]]) -> None:
        """One ``before_settle`` per item: an item without links costs nothing and goes on
        (the ones whose links went in before the refusal are written again: duplicates the
        producer's seen state drops); an item whose links are refused counts a failed
        attempt. One warning for the group, whatever the number of items."""
        assert self._before_settle is not None
        refused: list[tuple[Settle[T], WriteRefused]] = []
        try:
            for s in todo:
                try:
                    self._before_settle([s.token])
                except WriteRefused as exc:
                    refused.append((s, exc))
                    self._refuse(s, f"{LINKS_REFUSED}: {exc.cause}")
                s.prepared = True
        finally:  # suspended half-way: the refusals so far are logged all the same
            if refused:
                _, first = refused[0]
                log.warning("consumer.links_refused", items=len(refused), group=len(todo),
                            retried=sum(s.kind == RETRY for s, _ in refused),
                            dead=sum(s.kind == DEAD for s, _ in refused),
                            reason=f"{LINKS_REFUSED}: {first.cause}", error=str(first)[:300],
                            note="failed attempts, dead letters after --max-attempts: make "
                                 "<root>/discovered writable (its ACL), then requeue them")

    def _refuse(self, s: Settle[T], reason: str) -> None:
        """A failed attempt of ``s``: retried with ``reason``, a dead letter after
        ``--max-attempts`` (an item failed already keeps its own outcome and reason)."""
        if s.kind != COMPLETE:
            return
        if s.claimed.may_retry(self.max_attempts):
            s.kind, s.error = RETRY, reason
        else:
            s.kind, s.error = DEAD, reason

    def _apply(self, group: list[Settle[T]]) -> None:
        done = [s for s in group if s.kind == COMPLETE and self._live(s.token)]
        if done:
            result = self.queue.complete([s.claimed for s in done])
            if result.lost:
                log.warning("consumer.completed_lost", items=len(result.lost),
                            note="partition lost (another consumer's now, or the session "
                                 "expired): recorded, its next owner may record it again")
            self._settled([s.token for s in done])
        for s in group:
            if s.kind == COMPLETE or not self._live(s.token):
                continue
            if s.kind == RETRY:
                self.queue.retry(s.claimed, s.error or "error")
            elif s.kind == DEAD:
                self.queue.dead_letter(s.claimed, s.error or "error")
            else:
                self.queue.release([s.claimed])
            self._settled([s.token])


def _created_ms(c: Claimed) -> int:
    """The item znode's creation time in ms (ZooKeeper's clock): part of its identity."""
    return round(c.ctime * 1000)
