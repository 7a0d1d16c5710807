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


def configure(fmt: str = "auto", level: str = "info", stream: IO[str] | None = None) -> None:
    """Configure structlog and stdlib logging to write to ``stream`` (stderr)."""
    stream = stream or sys.stderr
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    _renderer(fmt, stream)],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS.get(level, logging.INFO))
    # kazoo is chatty at INFO about every reconnect attempt; keep its warnings.
    logging.getLogger("kazoo.client").setLevel(max(root.level, logging.WARNING))
    logging.getLogger("urllib3.connectionpool").setLevel(max(root.level, logging.WARNING))


def get_logger(name: str, **context: Any) -> Any:
    """A structlog logger with bound context (consumer id, producer id...)."""
    # Initial values, not .bind(): bind() would build the logger now, before
    # configure() runs, and module-level loggers would keep structlog's defaults.
    return structlog.get_logger(name, **context)
