"""What a person watching a consumer sees: a refreshing progress line on a terminal, and a
summary when it stops. Only counts and times of this process, and error reasons shown through
:func:`zkcrawl.textsafe.printable`.

* :class:`Console`, the claim loop's one call per tick: the periodic ``consumer.stats``, one
  ``consumer.idle`` when there was nothing to do for an interval, and the progress line.
* :func:`progress_line`: state, items/s, ok/failed, in flight, backlog, the pace-setter --
  redrawn every :data:`REDRAW` seconds below the log lines, fitted to the terminal's width
  (never wrapped), ``[suspended 12s]`` while ZooKeeper is away.
* :func:`summary_text` (the closing table) and :func:`summary_event` (``consumer.summary``).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from zkcrawl import logs
from zkcrawl.consumer.timing import Timings
from zkcrawl.textsafe import printable

__all__ = ["REDRAW", "SHORT_STATS", "Console", "progress_line", "summary_event",
           "summary_text", "terminal_width", "wants_line"]

REDRAW = 1.0  # seconds between two draws of the progress line
SHORT_STATS = 60.0  # seconds between two short consumer.stats lines under a progress line
_WIDTH = 160  # the width assumed when the terminal does not say
_DROP_ORDER = (6, 4, 3, 5)  # progress-line segments a narrow terminal loses, in this order
_NOT_ERRORS = frozenset({"ok", "retry", "dead"})  # outcome labels that are no error reason


def _duration(seconds: float) -> str:
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{seconds:.1f}s")


def wants_line(log_format: str, out: str) -> bool:
    """A terminal gets the refreshing line, unless the records go to the same terminal
    (``--out -``: they would run through it); JSON logs get ``consumer.stats``."""
    return (log_format != "json" and sys.stderr.isatty()
            and not (out == "-" and sys.stdout.isatty()))


def terminal_width() -> int:
    """Columns of the terminal on stderr (:data:`_WIDTH` when it does not say)."""
    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return _WIDTH
    return columns if columns > 0 else _WIDTH


def progress_line(state: str, items_per_s: float, processed: int, failed: int,
                  in_flight: int, backlog: int, pace: dict[str, Any], elapsed: float,
                  *, away_s: float | None = None, failing: tuple[str, float] | None = None,
                  width: int = _WIDTH) -> str:
    """``[running] 12.3 items/s · ok 340 · failed 5 · in flight 16 · backlog 32 ·
    pace: politeness 92% · 1m20s``, at most ``width - 1`` columns (the last column would
    wrap on some terminals): the elapsed time, the backlog, in flight and the pace go first,
    then the line is cut. ``away_s``: ZooKeeper is away (``[suspended 12s]``); ``failing``:
    the reason most items failed with and its share (``failed 5 (blocked-address 100%)``)."""
    setter = pace.get("pace", "idle")
    share = f" {pace['share']:.0%}" if setter not in ("idle", "supply") and pace.get(
        "share") else ""
    head = f"[{state}]" if away_s is None else (
        f"[suspended {round(away_s)}s]" if away_s < 59.5 else f"[suspended {_duration(away_s)}]")
    why = f" ({printable(failing[0], 30)} {failing[1]:.0%})" if failing else ""
    parts = [f"{head} {items_per_s:.1f} items/s", f"ok {processed - failed}",
             f"failed {failed}{why}", f"in flight {in_flight}", f"backlog {backlog}",
             f"pace: {setter}{share}", _duration(elapsed)]
    parts = [printable(p) for p in parts]  # escaped first: the width is what is shown
    limit = max(20, width - 1)
    for drop in _DROP_ORDER:  # the least useful segment first, the order of the rest kept
        if len(" · ".join(p for p in parts if p)) <= limit:
            break
        parts[drop] = ""
    parts = [p for p in parts if p]
    line = " · ".join(parts)
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _reasons(outcomes: Counter[str]) -> str:
    errors = Counter({k: v for k, v in outcomes.items() if k not in _NOT_ERRORS})
    return ", ".join(f"{printable(k, 40)} {v}" for k, v in errors.most_common(6))


def summary_event(consumer: str, elapsed: float, processed: int, failed: int,
                  outcomes: Counter[str], pace: dict[str, Any],
                  timing: dict[str, float]) -> dict[str, Any]:
    """The key/values of ``consumer.summary`` (JSON logs)."""
    return {"consumer": consumer, "elapsed_s": round(elapsed, 3), "processed": processed,
            "ok": processed - failed, "failed": failed,
            "items_per_s": round(processed / elapsed, 3) if elapsed > 0 else 0.0,
            "retried": outcomes.get("retry", 0), "dead": outcomes.get("dead", 0),
            "errors": dict(pace.get("failures") or {k: v for k, v in outcomes.items()
                                                    if k not in _NOT_ERRORS}),
            "pace": pace.get("pace"), "verdict": pace.get("text"),
            "failing": pace.get("failure"), **timing}


def summary_text(event: dict[str, Any], outcomes: Counter[str]) -> str:
    """The closing table for a terminal (from :func:`summary_event`'s values)."""
    e = event
    reasons = _reasons(Counter(e.get("errors") or {})) if "errors" in e else _reasons(outcomes)
    rows = [
        ("processed", f"{e['processed']}  (ok {e['ok']}, failed {e['failed']}"
                      + (f": {reasons})" if reasons else ")")),
        ("retried", f"{e['retried']} tries put back, {e['dead']} dead letters"),
        ("rate", f"{e['items_per_s']:.2f} items/s over {_duration(e['elapsed_s'])}"),
        ("timing p50", " · ".join(f"{name} {e[key]:.0f} ms" for name, key in (
            ("dispatch", "dispatch_p50_ms"), ("polite", "polite_p50_ms"),
            ("pool", "pool_p50_ms"), ("fetch", "fetch_p50_ms"), ("parse", "parse_p50_ms"),
            ("write", "write_p50_ms")) if key in e)),
        ("verdict" if e.get("failing") else "pace",
         printable(str(e.get("verdict") or "idle: nothing processed"))),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"zkcrawl-consumer {printable(e['consumer'], 80)} stopped"]
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    return "\n".join(lines) + "\n"


class Console:
    """What the claim loop shows, once per tick (:meth:`tick`): see the module docstring.
    ``progress``: a terminal gets the progress line (the caller decided); ``report``: the
    logger of ``consumer.stats`` (:func:`zkcrawl.logs.reporter`)."""

    def __init__(self, consumer: str, timings: Timings, interval: float, progress: bool,
                 report: Any, started: float, checks: Sequence[Callable[[], object]] = ()
                 ) -> None:
        self.checks = tuple(checks)  # run at each stats interval (--field null warnings)
        self.consumer, self.timings, self.interval = consumer, timings, interval
        self.progress, self.report, self.started = progress, report, started
        self._next_stats = started + interval
        self._next_short = started + SHORT_STATS
        self._next_draw = 0.0
        self._seen = 0  # items with a final outcome at the last stats
        self._idle_said = False
        self._quiet = False  # the last stats found nothing done and nothing held

    def tick(self, now: float, state: str, away_s: float | None, in_flight: int,
             backlog: int, held: int) -> None:
        if now >= self._next_stats:
            self._next_stats = now + self.interval
            self._stats(now, state, in_flight, backlog, held, away=away_s is not None)
        if self.progress and now >= self._next_draw:
            self._next_draw = now + REDRAW
            t = self.timings
            logs.status(progress_line(
                state, t.items_per_s(), t.processed, t.failed, in_flight, backlog,
                t.current_pace(), now - self.started, away_s=away_s, failing=t.failing(),
                width=terminal_width()))

    def _stats(self, now: float, state: str, in_flight: int, backlog: int, held: int,
               away: bool = False) -> None:
        snap = self.timings.snapshot(in_flight, backlog, held)
        for check in self.checks:
            check()
        # ZooKeeper away is no empty queue: not idle (the progress line says suspended).
        quiet = snap["processed"] == self._seen and held == 0 and not away
        self._seen = snap["processed"]
        # Idle: two quiet looks in a row (a whole interval), not a moment between claims.
        idle, self._quiet = quiet and self._quiet, quiet
        if idle and not self._idle_said:
            self._idle_said = True
            self.report.info("consumer.idle", consumer=self.consumer,
                             note="nothing to do: the queue holds no item for this consumer; "
                             "waiting for items (said once until there is work again)")
        elif not quiet:
            self._idle_said = False
        if not self.progress:
            self.report.info("consumer.stats", consumer=self.consumer, state=state, **snap)
        elif not idle and now >= self._next_short:
            self._next_short = now + SHORT_STATS
            self.report.info("consumer.stats", consumer=self.consumer, state=state,
                             items_per_s=snap["items_per_s"], processed=snap["processed"],
                             failed=snap["failed"], pace=snap["pace"],
                             failing=snap["failing"])

    def summarize(self, now: float) -> None:
        """The closing summary: a table on a terminal (the progress line removed first),
        the ``consumer.summary`` event otherwise."""
        t = self.timings
        event = summary_event(self.consumer, now - self.started, t.processed, t.failed,
                              t.outcomes, t.run_verdict(), t.p50s())
        if self.progress:
            logs.status("")
            logs.write(summary_text(event, t.outcomes))
        else:
            self.report.info("consumer.summary", **event)
