"""The result sink: JSON Lines appended to a file (or stdout), durable before completion.

At-least-once (SPEC §3) needs "the record is on disk" to happen before "the item is deleted
from ZooKeeper". Workers hand each record to :meth:`Sink.write`, which only encodes it and
queues the line; the committer thread (:class:`GroupCommit`) then calls :meth:`Sink.sync`,
which writes every queued line in one ``write`` and makes them durable with one ``fsync``
-- per group of items, not per item -- and only then completes those items in ZooKeeper.
One writer and one system call per group also means worker threads never queue up behind
a lock held across a disk write. A record lost with a crashed process was never completed:
its item is taken again, nothing is lost.

A write or fsync failure (disk full, file size limit, a closed pipe) raises
:class:`SinkError`; the consumer then stops claiming, releases the items it holds and exits 1.
The file is truncated back to its last complete line, so a half-written record is not left
behind for the next run to append after. stdout cannot be fsynced: flushing is all it gets.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import structlog

from consumer.pipeline import COMPLETE, DEAD, RETRY
from zkcrawl.errors import SinkError, UsageError
from zkcrawl.queue.leases import Claimed, LeaseQueue, QueueSuspended
from zkcrawl.textsafe import scrub

# structlog.get_logger is a lazy proxy: it picks up the configuration made at start-up.
log = structlog.get_logger(__name__)


COMMIT_WINDOW = 0.01  # seconds a finished item may wait for others to be committed with it


# Built once: json.dumps with any non-default option builds a new encoder on every call.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _clean(value: Any) -> Any:
    """``value`` with lone surrogates replaced (keys too) and non-finite floats nulled."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_clean_key(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _clean_key(key: Any) -> Any:
    if isinstance(key, float) and not math.isfinite(key):
        return str(key)  # "nan", "inf": json.dumps would refuse the float
    return scrub(key) if isinstance(key, str) else key


class Sink:
    """JSON Lines with group commit: many :meth:`write` callers, one :meth:`sync` caller."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()  # guards the queued lines only, never held across I/O
        self._lines: list[bytes] = []
        self._broken: str | None = None
        self.records = 0
        self.syncs = 0
        if path == "-":
            self._fh: IO[bytes] = sys.stdout.buffer
            self._durable = False
            self._good = 0
            return
        try:
            # Unbuffered: after a failed write no half record waits in a buffer to be
            # flushed behind the truncation at close.
            self._fh = open(path, "ab", buffering=0)  # noqa: SIM115 - lives with the consumer
        except OSError as exc:
            raise UsageError(f"--out: cannot open {path}: {exc.strerror or exc}") from None
        self._durable = True
        self._good = self._fh.seek(0, os.SEEK_END)  # end of the last complete line

    @staticmethod
    def encode(record: dict[str, Any]) -> bytes:
        """One JSON line, always valid UTF-8 and strict JSON (RFC 8259), whatever the record
        holds: a lone surrogate (from a ``\\ud800`` escape in a queued item, say) becomes
        U+FFFD and a NaN or infinite float becomes ``null``. The common case costs one
        ``dumps`` and one ``encode``; only a record that fails them is cleaned and redone."""
        try:
            return (_JSON.encode(record) + "\n").encode("utf-8")
        except ValueError:  # UnicodeEncodeError (a surrogate) or a NaN/inf float
            return (_JSON.encode(_clean(record)) + "\n").encode("utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """Queue one record for the next :meth:`sync`; :class:`SinkError` once broken."""
        line = self.encode(record)
        with self._lock:
            if self._broken is not None:
                raise SinkError(self._broken)
            self._lines.append(line)

    def sync(self) -> None:
        """Write every queued record and make it durable: one write, one fsync. Called by
        one thread at a time (the committer)."""
        with self._lock:
            if self._broken is not None:
                raise SinkError(self._broken)
            lines, self._lines = self._lines, []
        if not lines:
            return
        data = b"".join(lines)
        try:
            self._write_all(data)
        except (OSError, ValueError) as exc:
            raise self._fail("write", exc) from None
        self._good += len(data)
        self.records += len(lines)
        if self._durable:
            try:
                os.fsync(self._fh.fileno())
            except OSError as exc:
                raise self._fail("fsync", exc) from None
        self.syncs += 1

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._fh.write(view)  # a raw file may take part of it (file size limit)
            if n is None:
                raise BlockingIOError("sink is non-blocking")
            view = view[n:]
        self._fh.flush()

    def _fail(self, what: str, exc: BaseException) -> SinkError:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        with self._lock:
            self._broken = f"cannot {what} results to {self.path}: {reason}"
            self._lines = []
        if self._durable:
            self._truncate()
        log.error("sink.failed", path=self.path, op=what, error=reason)
        return SinkError(self._broken)

    def _truncate(self) -> None:
        # A partial line left at the end would glue onto the next run's first record.
        try:
            os.ftruncate(self._fh.fileno(), self._good)
        except OSError:
            pass

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def close(self) -> None:
        """Close (stdout stays open). Lines never synced are dropped: their items were not
        completed, so they will be fetched again -- a record in the file means done."""
        with self._lock:
            self._lines = []
        if self._durable:
            try:
                self._fh.close()
            except OSError:
                pass


@dataclass
class Settle:
    """One item waiting for the committer: what to do in ZooKeeper once its record (if any)
    is durable. ``token`` is the caller's handle, given back through the callbacks."""

    claimed: Claimed
    kind: str  # complete / retry / dead / release (consumer.pipeline)
    error: str | None
    durable: bool  # a record was written for it: fsync before touching ZooKeeper
    token: Any


class GroupCommit:
    """The committer thread: one fsync for every record written since the last one, then
    the group's items settled in ZooKeeper (completions batched in transactions).

    ``live(token)`` says whether the item is still ours to settle (not released or lost
    meanwhile), ``settled(tokens)`` is told when items are done with, ``failed(exc, tokens)``
    when the sink broke (``exc``) or a commit failed unexpectedly (``None``): those items
    were not completed and must be released. While ZooKeeper is suspended the group is kept
    and retried once reconnected.
    """

    def __init__(self, sink: Sink, queue: LeaseQueue, *, live: Callable[[Any], bool],
                 settled: Callable[[list[Any]], None],
                 failed: Callable[[SinkError | None, list[Any]], None]) -> None:
        self.sink, self.queue = sink, queue
        self._live, self._settled, self._failed = live, settled, failed
        self._cond = threading.Condition()
        self._pending: list[Settle] = []
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="committer", daemon=True)

    def start(self) -> GroupCommit:
        self._thread.start()
        return self

    def put(self, item: Settle) -> None:
        with self._cond:
            self._pending.append(item)
            self._cond.notify()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def close(self, timeout: float) -> None:
        """Commit what is pending (bounded by ``timeout``), then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():  # never started if the consumer failed to start
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait(0.5)
                if not self._pending:
                    return
            if not self._closed:
                # Let the group gather (a database's commit_delay): one fsync and one
                # transaction for the items of a few milliseconds, not for each item.
                time.sleep(COMMIT_WINDOW)
            with self._cond:
                group, self._pending = self._pending, []
            self._commit(group)

    def _commit(self, group: list[Settle]) -> None:
        if any(s.durable for s in group):
            try:
                self.sink.sync()
            except SinkError as exc:
                self._failed(exc, [s.token for s in group])
                return
        try:
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

    def _apply(self, group: list[Settle]) -> None:
        done = [s for s in group if s.kind == COMPLETE and self._live(s.token)]
        if done:
            result = self.queue.complete([s.claimed for s in done])
            if result.lost:
                log.warning("consumer.completed_lost", items=len(result.lost),
                            note="lease gone (session lost): recorded, may be recorded twice")
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
