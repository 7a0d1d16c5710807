"""Result pipelines: ``--pipeline module:Class`` (repeatable), a chain before the sink.

Each class is instantiated once, without arguments, when the consumer starts
(:class:`zkcrawl.page.ResultPipeline`): ``open()`` then, ``process(record) -> record | None``
for every record, ``close()`` when the consumer stops. The chain runs in the committer thread,
one group (batch) at a time, just before the group goes to the sink (JSON Lines, PostgreSQL):
so a pipeline needs no lock, and what it returns is what is stored.

Guarantees:

* a bad spec (not ``module:Class``, not importable, no ``process``), a constructor or an
  ``open()`` that raises: one line at start-up (exit 2), before ZooKeeper is asked anything;
* ``process`` returning None drops the record: the item is completed without one (logged as
  ``pipeline.dropped``); a record that is not a dict is a failure like an exception;
* an exception in ``process`` makes that item a **retryable** failure (``pipeline: Type:
  message``; a dead letter after ``--max-attempts``, with its record) -- the group's other
  items go on; the chain is never left half-applied to the stored record;
* ``close()`` is called once, its exceptions logged (``pipeline.close_failed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from zkcrawl.consumer.processors import ERROR_LIMIT, FailureLog, failure_text, load_object
from zkcrawl.errors import UsageError
from zkcrawl.page import ResultPipeline

__all__ = ["Chained", "ResultChain"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Chained:
    """One record after the chain: the record to store (None: dropped or failed) and the
    failure ``pipeline: Type: message``, if any."""

    record: dict[str, Any] | None
    error: str | None = None
    dropped_by: str | None = None


class ResultChain:
    """The ``--pipeline`` classes, in order. Used by the committer thread only."""

    def __init__(self, stages: Sequence[tuple[str, ResultPipeline]]) -> None:
        self.stages = tuple(stages)
        self._opened = 0
        self.failures = FailureLog()  # tracebacks once per (stage, type, line)

    @classmethod
    def load(cls, specs: Sequence[str]) -> ResultChain:
        """Import and instantiate every ``--pipeline`` (UsageError on any problem)."""
        stages: list[tuple[str, ResultPipeline]] = []
        for spec in specs:
            obj = load_object(spec.strip(), "--pipeline")
            if not isinstance(obj, type):
                raise UsageError(f"--pipeline: {spec} is not a class")
            try:
                stage = obj()
            except Exception as exc:
                raise UsageError(f"--pipeline: {spec}() failed: {type(exc).__name__}: {exc}"
                                 ) from None
            if not callable(getattr(stage, "process", None)):
                raise UsageError(f"--pipeline: {spec} has no process(record) method")
            stages.append((spec.strip(), stage))
        return cls(stages)

    def __bool__(self) -> bool:
        return bool(self.stages)

    def open(self) -> None:
        """``open()`` each stage in order; one that raises is a UsageError (the ones opened
        before it are closed)."""
        for name, stage in self.stages:
            opener = getattr(stage, "open", None)
            try:
                if callable(opener):
                    opener()
            except Exception as exc:
                self.close()
                raise UsageError(f"--pipeline: {name}.open() failed: {type(exc).__name__}: "
                                 f"{exc}") from None
            self._opened += 1

    def process(self, record: dict[str, Any]) -> Chained:
        """``record`` through every stage; never raises."""
        # A copy (the record and its fields): a stage that changes it and then raises leaves
        # the caller's record as it was.
        current: Any = dict(record, fields=dict(record.get("fields") or {}))
        for name, stage in self.stages:
            try:
                current = stage.process(current)
            except Exception as exc:
                error = failure_text(f"pipeline {name}", exc)  # with its place (file:line)
                self.failures.report("pipeline.traceback", name, exc, error)
                return Chained(None, error)
            if current is None:
                return Chained(None, dropped_by=name)
            if not isinstance(current, dict):
                return Chained(None, f"pipeline {name}: returned {type(current).__name__}, "
                               "not a record (dict) or None")
        return Chained(current)

    def close(self) -> None:
        """``close()`` the stages opened, in reverse order; failures logged."""
        opened, self._opened = self.stages[:self._opened], 0
        for name, stage in reversed(opened):
            closer = getattr(stage, "close", None)
            try:
                if callable(closer):
                    closer()
            except Exception as exc:
                log.warning("pipeline.close_failed", pipeline=name,
                            error=f"{type(exc).__name__}: {exc}"[:ERROR_LIMIT])
