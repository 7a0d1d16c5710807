"""Logging set up once at start-up: structlog for our events, stdlib merged in.

Our code logs named events with key/value pairs (``item.done url=... process_ms=...``).
kazoo and urllib3 log through the standard library; their records go through the
same processors and renderer, so an operator reads one stream: JSON lines when
stderr is not a TTY (production, journald, Kubernetes), a console renderer on a TTY.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def _renderer(fmt: str, stream: IO[str]) -> Any:
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    if fmt == "console":
        return structlog.dev.ConsoleRenderer(colors=stream.isatty())
    return structlog.processors.JSONRenderer()


class _CurrentStderr:
    """Whatever ``sys.stderr`` is at write time (tests and the demo swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


class _NamedWriteLogger(structlog.WriteLogger):
    """structlog's fast file logger, with the name ``add_logger_name`` reads."""

    def __init__(self, file: IO[str], name: str | None) -> None:
        super().__init__(file)
        self.name = name or "zkcrawl"


def configure(fmt: str = "auto", level: str = "info", stream: IO[str] | None = None) -> None:
    """Configure structlog and stdlib logging to write to ``stream`` (stderr).

    Our events take structlog's own path (a filtering bound logger writing lines:
    ~4x cheaper per event than routing through stdlib logging, which matters on a
    consumer logging every item); kazoo's and urllib3's stdlib records are rendered
    by the same processors into the same stream.
    """
    stream = stream or _CurrentStderr()  # type: ignore[assignment]
    lvl = _LEVELS.get(level, logging.INFO)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = _renderer(fmt, stream)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        logger_factory=lambda *args: _NamedWriteLogger(stream, args[0] if args else None),
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    )
    handler = logging.StreamHandler(stream)
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
