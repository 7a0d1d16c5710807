"""JSON Lines results: ``--out PATH`` (appended) or ``-`` (stdout), one line per record; a
:class:`~zkcrawl.consumer.sinks.base.ResultSink`.

* **Durable per group**: :meth:`JsonLinesSink.write_batch` writes the group's records in one
  ``write`` and one ``fsync`` (stdout is only flushed). Every record encodes (valid UTF-8,
  strict JSON); only a record that is no JSON at all is refused.
* **One writer**: only the committer thread writes, syncs or reopens; a write after
  :meth:`~JsonLinesSink.close` is a :class:`SinkError`, not a traceback.
* **Failure** (disk full, a closed pipe): :class:`SinkError`, the sink stays broken, and the
  file is truncated back to its last complete line.
* **Reopening** (SIGHUP, logrotate without ``copytruncate``): a flag; between two groups the
  committer opens ``path`` again, so no record is split across two files (an open failure
  keeps the old file).
* Never opened through a symbolic link; a new file gets mode 0640.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Sequence
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import IO, Any

import structlog

from zkcrawl.consumer.sinks.base import Entry
from zkcrawl.errors import SinkError, UsageError
from zkcrawl.jsonclean import json_clean
from zkcrawl.textsafe import printable

__all__ = ["JsonLinesSink", "Sink"]

# structlog.get_logger is a lazy proxy: it picks up the configuration made at start-up.
log = structlog.get_logger(__name__)

# Built once: json.dumps with any non-default option builds a new encoder on every call.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# And JSONEncoder.encode still builds its C encoder (and a dict for the circular check) on
# every call: this one is built once, without the check. A record it fails on -- a cycle
# (RecursionError here), a NaN, a type JSON has not -- is encoded again by _JSON, whose
# answer or error it gets: the same bytes and the same errors, without the per-record set-up.
_C_ENCODE = None if c_make_encoder is None else c_make_encoder(
    None, _JSON.default, encode_basestring, None, ":", ",", False, False, False)


def _dumps(record: dict[str, Any]) -> str:
    """``_JSON.encode(record)``."""
    if _C_ENCODE is not None:
        try:
            return "".join(_C_ENCODE(record, 0))
        except Exception:  # _JSON says what it was, or encodes it
            pass
    return _JSON.encode(record)


class JsonLinesSink:
    """JSON Lines with group commit (a :class:`~zkcrawl.consumer.sinks.base.ResultSink`):
    :meth:`write_batch` is :meth:`write` for each record (encode, add to the group) then one
    :meth:`sync`. Owned by one thread, the committer (no lock: see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.describe = path
        self._lines: list[bytes] = []  # the group being gathered, written at the next sync
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
            return (_dumps(record) + "\n").encode("utf-8")
        except ValueError:  # UnicodeEncodeError (a surrogate) or a NaN/inf float
            return (_JSON.encode(json_clean(record)) + "\n").encode("utf-8")

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
        """Add one record to the group the next :meth:`sync` writes; :class:`SinkError`
        once broken."""
        line = self.encode(record)
        if self._broken is not None:
            raise SinkError(self._broken)
        self._lines.append(line)

    def sync(self) -> None:
        """Write the group's records and make them durable: one write, one fsync."""
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
        except (OSError, ValueError):  # ValueError: closed meanwhile
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
        completed, so they will be fetched again -- a record in the file means done. A
        write after it is a :class:`SinkError`."""
        self._lines = []
        self._broken = self._broken or f"cannot write results to {self.path}: closed"
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


#: The name this sink had before the sinks got their own package (kept: user code and
#: tests subclass it).
Sink = JsonLinesSink
