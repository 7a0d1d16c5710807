"""Logging set up once at start-up: structlog for our named events, the standard library's
records (kazoo's) merged into the same stream -- JSON lines when stderr is not a TTY, a
console renderer on one.

* Hostile values are safe: the console escapes control, ANSI and bidi characters and lone
  surrogates (:func:`zkcrawl.textsafe.printable`); JSON lines are ASCII; a line that would
  not encode as UTF-8 is scrubbed, never lost with its batch.
* kazoo's reconnect chatter is folded into the ``zk.suspended`` / ``zk.reconnected`` line
  (:func:`fold_zk_chatter`, :func:`zk_chatter`) unless ``--log-level debug``; every other
  kazoo warning and error is written as it comes.
* Under systemd (``JOURNAL_STREAM``) every line starts with its syslog priority (``<4>``...)
  for journald to file it by; elsewhere no prefix.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import sys
import threading
import time
from typing import IO, Any, Protocol

import structlog

from zkcrawl.jsonclean import json_clean
from zkcrawl.textsafe import printable, redact_userinfo, scrub

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


# syslog priorities (RFC 5424) of our level names and of the log methods' names.
PRIORITIES = {"debug": 7, "info": 6, "warning": 4, "warn": 4, "error": 3, "exception": 3,
              "critical": 2, "fatal": 2}


_JOURNAL_STREAM = re.compile(r"[0-9]{1,20}:[0-9]{1,20}")  # DEVICE:INODE, ASCII digits


class TextSink(Protocol):
    """What the log writer uses of its stream: an ``IO[str]``, or :class:`_CurrentStderr`."""

    def write(self, text: str, /) -> int: ...
    def flush(self) -> None: ...
    def isatty(self) -> bool: ...
    def fileno(self) -> int: ...


def journald_stream(stream: TextSink, env: dict[str, str] | None = None) -> bool:
    """``stream`` is connected to journald: ``JOURNAL_STREAM`` (``DEVICE:INODE``, set by
    systemd for a unit's stdout/stderr) names the file ``stream`` writes to. A child that
    inherited the variable but writes elsewhere (a pipe, a file) gets no prefix."""
    value = (os.environ if env is None else env).get("JOURNAL_STREAM", "")
    if not _JOURNAL_STREAM.fullmatch(value):
        return False
    dev, _, ino = value.partition(":")
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no file behind it (a StringIO)
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def _with_priority(renderer: Any) -> Any:
    """The renderer, its line prefixed with ``<N>``, the syslog priority of its level."""

    def render(logger: Any, name: str, event_dict: dict[str, Any]) -> str:
        level = str(event_dict.get("level") or name).lower()
        line = renderer(logger, name, event_dict)
        return f"<{PRIORITIES.get(level, 6)}>{line}"

    return render


_MULTILINE = ("exception", "stack")  # keep their line breaks: escape each line


def _escape_values(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Console only: string values (and the event) escaped by :func:`printable`. Other
    values are shown by the renderer as ``repr``, which escapes non-printables itself."""
    for key, value in event_dict.items():
        if key in _MULTILINE and isinstance(value, str):
            event_dict[key] = "\n".join(printable(line) for line in value.split("\n"))
        elif isinstance(value, str) or key == "event":
            event_dict[key] = printable(str(value))
    return event_dict


def _redact_urls(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Credentials inside URLs (``https://user:pass@host``, ``?password=``) never reach a
    log line."""
    for key, value in event_dict.items():
        if isinstance(value, str) and "://" in value:
            event_dict[key] = redact_userinfo(value)
    return event_dict


def _renderer(fmt: str, stream: TextSink, journald: bool) -> list[Any]:
    """The last processors: value escaping (console only) and the renderer (with the
    journald priority prefix when ``journald``)."""
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    if fmt == "console":
        console = structlog.dev.ConsoleRenderer(colors=stream.isatty() and not journald)
        return [_escape_values, _with_priority(console) if journald else console]
    # allow_nan=False with a fallback: a NaN from hostile input must not make a line that
    # is not JSON.
    json_renderer = structlog.processors.JSONRenderer(serializer=_json_line)
    return [_with_priority(json_renderer) if journald else json_renderer]


class _CurrentStderr:
    """Whatever ``sys.stderr`` is at write time (tests and the demo swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()

    def fileno(self) -> int:
        return sys.stderr.fileno()


BATCH_WINDOW = 0.02  # seconds a line may wait for others to be written with it


class _Writer:
    """One thread writes every log line, in batches.

    A lock around each write (structlog's WriteLogger, logging.StreamHandler) made
    the consumer's 32 workers queue behind one another on every ``item.done``: a
    convoy that cost half the CPU of a crawl. ``SimpleQueue.put`` never blocks.
    """

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[str | threading.Event | _Status] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.stream: TextSink = _CurrentStderr()
        self._status = ""  # the refreshing line under the log lines (a TTY's), "" = none

    def put(self, line: str | _Status) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="log-writer",
                                                    daemon=True)
                    self._thread.start()
        self._q.put(line)

    def _run(self) -> None:
        while True:
            first = self._q.get()
            if isinstance(first, str):
                # Let a burst gather: one wake-up and one write per batch instead of a
                # thread switch per line (a crawl logs hundreds of item.done a second).
                time.sleep(BATCH_WINDOW)
            batch = [first]
            while len(batch) < 2000:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            lines = [b for b in batch if isinstance(b, str)]
            statuses = [b for b in batch if isinstance(b, _Status)]
            before = self._status
            if statuses:
                self._status = statuses[-1].line
            if lines or statuses:
                # Erase the status line, write the log lines, draw the (new) status again:
                # a log line never lands in the middle of it.
                erase = "\r\x1b[K" if before or statuses else ""
                self._write(erase + "".join(lines) + self._status)
            for b in batch:
                if isinstance(b, threading.Event):
                    b.set()

    def _write(self, text: str) -> None:
        try:
            try:
                self.stream.write(text)
            except UnicodeEncodeError:  # a lone surrogate: nothing was written yet
                self.stream.write(scrub(text))
            self.stream.flush()
        except (OSError, ValueError):
            pass  # stderr closed or full: logging must never take the process down

    def flush(self, timeout: float = 2.0) -> None:
        """Wait until every line logged so far is written."""
        if self._thread is None or not self._thread.is_alive():
            return
        done = threading.Event()
        self._q.put(done)
        done.wait(timeout)


class _Status:
    """A new status line for the writer (see :func:`status`)."""

    __slots__ = ("line",)

    def __init__(self, line: str) -> None:
        self.line = line


_WRITER = _Writer()
atexit.register(_WRITER.flush)


def status(line: str) -> None:
    """Show ``line`` as a refreshing status line below the log lines (for a terminal: the
    caller decides); ``""`` removes it. Drawn by the writer thread, so log lines written
    meanwhile go above it and never through it. ``line`` must be one printable line."""
    _WRITER.put(_Status(line))


def write(text: str) -> None:
    """Write ``text`` as it is to the log stream, in order with the log lines (a closing
    summary for a terminal)."""
    _WRITER.put(text)


def reporter(name: str, **context: Any) -> Any:
    """A logger for periodic reports (``consumer.stats``, ``consumer.summary``): they are
    written at ``info`` whatever ``--log-level`` says -- their rhythm is the program's own
    setting (``--stats-interval``), not a severity threshold, so ``--log-level warning``
    quiets the events and keeps the reports."""
    return structlog.wrap_logger(_NamedLogger(name),
                                 wrapper_class=structlog.make_filtering_bound_logger(
                                     logging.INFO), **context)


def flush() -> None:
    """Write out pending log lines (call before ``os._exit``)."""
    _WRITER.flush()


class _NamedLogger:
    """structlog's logger interface, handing rendered lines to the writer thread."""

    def __init__(self, name: str | None) -> None:
        self.name = name or "zkcrawl"

    def msg(self, message: str) -> None:
        _WRITER.put(message + "\n")

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


#: kazoo's messages about a connection going and coming back (folded, see the docstring).
_CHATTER = ("Connection dropped", "Connection time-out", "Transition to CONNECTING",
            "Failed connecting to Zookeeper", "Cannot resolve", "Zookeeper connection lost",
            "Session has expired", "socket connection error", "Connection stopped")


class _Chatter:
    """kazoo's reconnect messages since :func:`zk_chatter` was last asked (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.first: str | None = None
        self.count = 0
        self.enabled = False

    def fold(self, record: logging.LogRecord) -> bool:
        """Keep ``record`` if it is reconnect chatter (True: not to be written)."""
        if not self.enabled or not record.name.startswith("kazoo") \
                or record.levelno >= logging.ERROR:
            return False
        message = record.getMessage()
        if not any(message.startswith(c) or c in message[:80] for c in _CHATTER):
            return False
        with self._lock:  # the first of a spell says why; the rest are its retries
            if self.first is None:
                self.first = message[:300]
            self.count += 1
        return True

    def take(self) -> dict[str, Any]:
        with self._lock:
            first, count = self.first, self.count
            self.first, self.count = None, 0
        return {"kazoo": first, "kazoo_lines": count} if count else {}


_CHATTER_FOLD = _Chatter()


def fold_zk_chatter(on: bool = True) -> None:
    """Fold kazoo's reconnect chatter from now on (the caller's ``zk.*`` lines carry it,
    :func:`zk_chatter`); not at ``--log-level debug``."""
    _CHATTER_FOLD.enabled = on


def zk_chatter() -> dict[str, Any]:
    """``{"kazoo": first message, "kazoo_lines": n}`` of kazoo's reconnect messages folded
    since the last call (``{}``: none), for a ``zk.*`` line."""
    return _CHATTER_FOLD.take()


class _QueueHandler(logging.Handler):
    """stdlib records (kazoo's, any library's) rendered by the same processors and writer;
    kazoo's reconnect chatter folded (:func:`zk_chatter`) unless the level is debug."""

    fold = True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.fold and _CHATTER_FOLD.fold(record):
                return
            _WRITER.put(self.format(record) + "\n")
        except Exception:  # logging's contract: never raise from emit
            self.handleError(record)


def configure(fmt: str = "auto", level: str = "info", stream: IO[str] | None = None,
              journald: bool | None = None) -> None:
    """Configure structlog and stdlib logging to write to ``stream`` (stderr).

    ``journald``: prefix lines with their syslog priority; default: when ``JOURNAL_STREAM``
    says ``stream`` is journald's (:func:`journald_stream`).

    Our events take structlog's own path (a filtering bound logger writing lines:
    ~4x cheaper per event than routing through stdlib logging, which matters on a
    consumer logging every item); kazoo's stdlib records (and any other library's) are rendered
    by the same processors into the same stream.
    """
    _WRITER.flush()
    _WRITER.stream = sink = stream or _CurrentStderr()
    lvl = _LEVELS.get(level, logging.INFO)
    shared: list[Any] = [
        _redact_urls,
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if journald is None:
        journald = journald_stream(sink)
    renderer = _renderer(fmt, sink, journald)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, *renderer],
        logger_factory=lambda *args: _NamedLogger(args[0] if args else None),
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, *renderer],
    )
    handler = _QueueHandler()
    handler.fold = lvl > logging.DEBUG  # at debug, kazoo's own lines as they come
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(lvl)
    # kazoo is chatty at INFO about every reconnect attempt; keep its warnings.
    logging.getLogger("kazoo.client").setLevel(max(lvl, logging.WARNING))
    logging.getLogger("urllib3.connectionpool").setLevel(max(lvl, logging.WARNING))


def get_logger(name: str, **context: Any) -> Any:
    """A structlog logger with bound context (consumer id, producer id...)."""
    # Initial values, not .bind(): bind() would build the logger now, before
    # configure() runs, and module-level loggers would keep structlog's defaults.
    return structlog.get_logger(name, **context)


def enabled(logger: Any, level: int) -> bool:
    """Whether ``logger`` (a structlog logger or lazy proxy) emits events at ``level`` (a
    ``logging`` level): a caller asks once for a batch of per-item debug events instead of
    building each one's fields for a filtering logger to drop. True when the logger cannot
    tell (a wrapper class without ``is_enabled_for``)."""
    check = getattr(logger, "is_enabled_for", None)
    return True if check is None else bool(check(level))


def _json_line(event: Any, **kw: Any) -> str:
    try:
        return json.dumps(event, allow_nan=False, **kw)
    except ValueError:  # a non-finite float somewhere: null it, keep the line
        return json.dumps(json_clean(event, str), **kw)  # zkcrawl.jsonclean's rule
