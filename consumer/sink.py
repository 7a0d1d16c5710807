"""Result sinks: the interface (:class:`ResultSink`) and the default, JSON Lines appended to
a file or stdout (:class:`Sink`); ``--out postgresql://...`` selects
:class:`consumer.sink_postgres.PostgresSink` (:func:`open_sink`).

The interface is small on purpose: the committer thread
(:class:`consumer.committer.GroupCommit`) is its only writer, and calls
:meth:`ResultSink.write_batch` once per group of finished items with their records. When
it returns, every record it did not refuse is **durable** (fsynced, or committed), and only
then are those items completed in ZooKeeper (SPEC §3: durable first). A record lost with a
crashed process was never completed: its item is taken again, nothing is lost.

JSON Lines: :meth:`Sink.write_batch` encodes the group's records, writes them in one
``write`` and makes them durable with one ``fsync`` -- per group of items, not per item.
One writer and one system call per group also means worker threads never queue up behind
a lock held across a disk write. It refuses no record (every record encodes: see
:meth:`Sink.encode`).

A write or fsync failure (disk full, file size limit, a closed pipe) raises
:class:`SinkError`; the consumer then stops claiming, releases the items it holds and exits 1.
The file is truncated back to its last complete line, so a half-written record is not left
behind for the next run to append after. stdout cannot be fsynced: flushing is all it gets.

**Reopening** (SIGHUP, for logrotate without ``copytruncate``): :meth:`Sink.request_reopen`
only sets a flag (it runs in a signal handler); the committer calls
:meth:`Sink.reopen_if_requested` between two groups, which opens ``path`` again -- a new
file if the old one was renamed away -- fsyncs its directory, and closes the old one (every
line written to it was already synced). Queued lines go to the new file at the next sync, so
no record is split across two files and none is lost. If the path cannot be opened, the old
file is kept and the error logged. ``-`` (stdout) ignores it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

import structlog

from zkcrawl.errors import SinkError, UsageError
from zkcrawl.postgres import is_database_url
from zkcrawl.textsafe import printable, scrub

__all__ = ["Entry", "Record", "ResultSink", "Sink", "SinkUnavailable", "open_sink"]

# structlog.get_logger is a lazy proxy: it picks up the configuration made at start-up.
log = structlog.get_logger(__name__)

Record = dict[str, Any]  # one result record (SPEC §4 "Output record")


@dataclass(frozen=True, slots=True)
class Entry:
    """A record on its way to the sink, with the identity of the item it is for: the
    item's znode name and creation time (ms, ZooKeeper's clock). A redelivered item has
    both unchanged; a queue recreated from scratch reuses names, never both."""

    item: str
    created_ms: int
    record: Record
    outcome: str = "complete"  # what the committer does next: complete, or dead (a letter)


class SinkUnavailable(SinkError):
    """The sink cannot take records for now (its database is unreachable): the consumer
    stops claiming, releases what it holds and waits for :attr:`ResultSink.available`."""


class ResultSink(Protocol):
    """What the committer needs of a sink. Only the committer thread calls
    :meth:`write_batch` and :meth:`between_groups`; the others may be called from any
    thread (:meth:`request_reopen` from a signal handler)."""

    #: ``--out`` as it may be shown in logs (no credentials).
    describe: str

    def write_batch(self, entries: Sequence[Entry]) -> list[str | None]:
        """Store the records durably; per entry None (stored) or the reason it was refused
        (that item becomes a dead letter with it). Raises :class:`SinkError` when nothing
        was stored: :class:`SinkUnavailable` for a passing failure, else for good."""
        ...

    def between_groups(self) -> None:
        """Housekeeping between two groups: reopen a file when asked (SIGHUP), reconnect a
        database when its backoff is due. Never raises."""
        ...

    def request_reopen(self) -> None:
        """SIGHUP: reopen at the next group boundary. Sets a flag, nothing else."""
        ...

    @property
    def reopen_requested(self) -> bool: ...

    @property
    def available(self) -> bool:
        """Takes records now (False: unreachable, reconnecting)."""
        ...

    def wait_available(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for :attr:`available`."""
        ...

    def close(self) -> None: ...


def open_sink(out: str, root: str) -> ResultSink:
    """The sink ``--out`` names: a PostgreSQL URL (rows keyed by ``root`` and item), else a
    JSON Lines path or ``-``. A bad value is a :class:`UsageError` (exit 2)."""
    if is_database_url(out):
        try:
            from consumer.sink_postgres import PostgresSink
        except ImportError:  # psycopg missing: the optional extra
            raise UsageError("--out postgresql://...: the PostgreSQL driver is not installed:"
                             " pip install 'zkcrawl[postgres]'") from None
        return PostgresSink(out, root)
    return Sink(out)

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
    """JSON Lines with group commit (a :class:`ResultSink`): :meth:`write_batch` is
    :meth:`write` for each record (encode and queue) then one :meth:`sync`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.describe = path
        self._lock = threading.Lock()  # guards the queued lines only, never held across I/O
        self._lines: list[bytes] = []
        self._broken: str | None = None
        self._reopen = False  # set by a signal handler: a plain flag, no lock
        self.records = 0
        self.syncs = 0
        self.reopens = 0
        if path == "-":
            self._fh: IO[bytes] = sys.stdout.buffer
            self._durable = False
            self._good = 0
            return
        try:
            # Unbuffered: after a failed write no half record waits in a buffer to be
            # flushed behind the truncation at close.
            self._fh = _open_out(path)
        except OSError as exc:
            why = ("a symbolic link: never written through" if exc.errno == errno.ELOOP
                   else exc.strerror or exc)
            raise UsageError(f"--out: cannot open {path}: {why}") from None
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

    def write_batch(self, entries: Sequence[Entry]) -> list[str | None]:
        """Every record in one write and one fsync. Only a record that is no JSON at all
        is refused (a result pipeline put a date or a set in it): its reason, and that
        item becomes a dead letter; NaN and lone surrogates are cleaned, not refused."""
        refused: list[str | None] = [None] * len(entries)
        for i, entry in enumerate(entries):
            try:
                self.write(entry.record)
            except (TypeError, ValueError, RecursionError) as exc:
                refused[i] = f"not JSON: {printable(str(exc) or type(exc).__name__, 200)}"
        self.sync()
        return refused

    @property
    def available(self) -> bool:
        return True  # a file is there or broken for good (SinkError): never "for now"

    def wait_available(self, timeout: float) -> bool:
        return True

    def between_groups(self) -> None:
        self.reopen_if_requested()

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

    # -- reopening (SIGHUP) --------------------------------------------------------------------
    def request_reopen(self) -> None:
        """Ask for :meth:`reopen_if_requested` at the next group boundary. Signal-safe: sets
        a flag and nothing else."""
        self._reopen = True

    @property
    def reopen_requested(self) -> bool:
        return self._reopen

    def reopen_if_requested(self) -> bool:
        """Reopen ``path`` if asked to; called by the committer between groups (the one thread
        that writes the file). True when a new file handle is in use."""
        if not self._reopen:
            return False
        self._reopen = False
        if not self._durable:
            log.info("sink.reopen_ignored", path=self.path, reason="stdout")
            return False
        if self._broken is not None:
            return False
        fh: IO[bytes] | None = None
        try:
            fh = _open_out(self.path)
            good = fh.seek(0, os.SEEK_END)
            _fsync_dir(self.path)  # the new file's name is durable before a record is
        except OSError as exc:
            if fh is not None:
                fh.close()
            log.error("sink.reopen_failed", path=self.path, error=exc.strerror or str(exc),
                      note="still writing to the file opened before")
            return False
        old, self._fh, self._good = self._fh, fh, good
        try:
            old.close()
        except OSError:
            pass
        self.reopens += 1
        log.info("sink.reopened", path=self.path, size=good)
        return True

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


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_out(path: str) -> IO[bytes]:
    """``--out`` for appending, unbuffered (after a failed write no half record waits in a
    buffer to be flushed behind the truncation at close). Never through a symlink planted
    at the path (``O_NOFOLLOW``: a results file is not a way to write elsewhere); a new file
    gets mode 0640 (less the umask), never world-readable."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o640)
    try:
        return os.fdopen(fd, "ab", buffering=0)
    except BaseException:
        os.close(fd)
        raise
