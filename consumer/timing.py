"""Per-item timings and the periodic ``consumer.stats`` payload. Every item carries (SPEC §4),
from ``time.monotonic()`` but ``queue_ms`` (the znode's ctime to our claim, wall clock):

* ``queue_ms`` in the queue; ``dispatch_ms`` from the take to the pool; ``wait_ms`` in the
  pool's queue, of which ``polite_ms`` waiting for the host's slot; ``process_ms`` fetch +
  parse + write (``extract_ms`` the page processor's part).

The record and ``item.done`` carry all five; the stats split ``process_ms`` into fetch and
parse, measure the write, count failure reasons per interval and over the run, and name the
stage that sets the pace with :func:`zkcrawl.verdict.judge` (the report's and the demo's
function too).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from zkcrawl.verdict import Stages, failures_of, judge

WINDOW = 4096  # recent items the percentiles are computed over
# The stages kept per item, in the order an item meets them (each a window of the last
# WINDOW items).
STAGES = ("dispatch", "polite", "pool", "fetch", "parse", "write", "process", "wait",
          "extract")


@dataclass
class ItemTiming:
    """Monotonic stamps of one item's way through the consumer."""

    claimed: float
    queue_ms: float
    submitted: float | None = None
    started: float | None = None
    finished: float | None = None
    polite_ms: float = 0.0  # part of wait_ms spent waiting for the host's next slot
    extract_ms: float = 0.0  # part of process_ms spent in the page processor
    fetched: float | None = None  # the response is in (parsing starts)
    written: float | None = None  # the record is durable (or the item settled without one)

    @staticmethod
    def _ms(a: float | None, b: float | None) -> float:
        return _ms(a, b)

    @property
    def dispatch_ms(self) -> float:
        return self._ms(self.claimed, self.submitted)

    @property
    def wait_ms(self) -> float:
        return self._ms(self.submitted, self.started)

    @property
    def process_ms(self) -> float:
        return self._ms(self.started, self.finished)

    @property
    def pool_ms(self) -> float:
        """The part of ``wait_ms`` spent waiting for a free thread."""
        return round(max(0.0, self.wait_ms - self.polite_ms), 3)

    def fields(self) -> dict[str, float]:
        """The record / log fields (a new dict each call, same values once finished)."""
        wait = _ms(self.submitted, self.started)
        return {"queue_ms": round(self.queue_ms, 3),
                "dispatch_ms": _ms(self.claimed, self.submitted), "wait_ms": wait,
                "polite_ms": round(min(self.polite_ms, wait), 3),
                "process_ms": _ms(self.started, self.finished)}

    def durations(self) -> tuple[float, float, float]:
        """``(dispatch_ms, wait_ms, process_ms)``."""
        return self.dispatch_ms, self.wait_ms, self.process_ms

    def stages(self) -> dict[str, float]:
        """Every stage of :data:`STAGES` in ms, to the microsecond (fetch is all of process
        when the response time was not stamped)."""
        return {k: round(v, 3) for k, v in zip(STAGES, self.stage_values(), strict=True)}

    def stage_values(self) -> tuple[float, ...]:
        """:meth:`stages`' values in :data:`STAGES` order, per item, so computed once each:
        ``dispatch_ms``, ``wait_ms`` and ``process_ms`` (items 0, 7 and 6: the record's,
        the event's and the metrics') to the microsecond like :meth:`fields`; the others,
        which only feed the windows (whose percentiles and means are rounded where shown),
        unrounded -- ``round`` is most of the cost of this per-item call."""
        ms, started, finished = _ms, self.started, self.finished
        wait = ms(self.submitted, started)
        polite = min(self.polite_ms, wait)
        fetched = self.fetched if self.fetched is not None else finished
        return (ms(self.claimed, self.submitted), polite, max(0.0, wait - polite),
                _raw_ms(started, fetched), _raw_ms(fetched, finished),
                _raw_ms(finished, self.written), ms(started, finished), wait, self.extract_ms)


def _ms(a: float | None, b: float | None) -> float:
    """Milliseconds from ``a`` to ``b`` (monotonic stamps), 0.0 when one is missing."""
    if a is None or b is None:
        return 0.0
    return round(max(0.0, b - a) * 1000.0, 3)


def _raw_ms(a: float | None, b: float | None) -> float:
    """:func:`_ms` unrounded."""
    if a is None or b is None:
        return 0.0
    return max(0.0, b - a) * 1000.0


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of unsorted ``values`` (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(pct / 100.0 * len(ordered)) - 1))
    return ordered[rank]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclass
class _Interval:
    started: float = field(default_factory=time.monotonic)
    items: int = 0
    failures: Counter[str] = field(default_factory=Counter)


class Timings:
    """Thread-safe rolling windows and counters behind ``consumer.stats`` and the status node."""

    def __init__(self, window: int = WINDOW) -> None:
        self._lock = threading.Lock()
        self._stages: dict[str, deque[float]] = {k: deque(maxlen=window) for k in STAGES}
        self._windows = [self._stages[k] for k in STAGES]  # in STAGES order
        self.outcomes: Counter[str] = Counter()
        self.processed = 0  # items with a final outcome (done, failed record, dead letter)
        self.failed = 0  # of which had an error
        self._interval = _Interval()
        self._rate = 0.0
        self._fill = [0.0, 0.0]  # this interval: integral of held/capacity dt, seconds
        self._last_fill: tuple[float, float] | None = None  # (time, fill) of the last look
        self._run = [0.0] * len(STAGES)  # sums since the start, in STAGES order
        self._run_items = 0
        self.failures: Counter[str] = Counter()  # reasons of the failed final outcomes

    def record(self, durations: tuple[float, float, float], outcome: str, final: bool,
               failed: bool, extract: float = 0.0, timing: ItemTiming | None = None,
               reason: str | None = None, values: tuple[float, ...] | None = None) -> None:
        """Account one processed item: its ``(dispatch_ms, wait_ms, process_ms)``, the
        processor's part ``extract`` (and, with ``timing``, every stage); ``outcome`` is
        ok / retry / dead / an error reason, ``reason`` the error (default: ``outcome``).
        ``values``: ``timing.stage_values()`` when the caller computed them already."""
        if values is None:
            dispatch, wait, process = durations
            values = timing.stage_values() if timing is not None else (
                dispatch, 0.0, wait, process, 0.0, 0.0, process, wait, extract)
        with self._lock:
            run = self._run
            for i, window in enumerate(self._windows):
                value = values[i]
                window.append(value)
                run[i] += value
            self._run_items += 1
            self.outcomes[outcome] += 1
            if final:
                self.processed += 1
                self.failed += int(failed)
                self._interval.items += 1
                if failed:
                    why = reason or outcome
                    self.failures[why] += 1
                    self._interval.failures[why] += 1

    def sample_fill(self, held: int, capacity: int, now: float | None = None) -> None:
        """One look at how full the consumer is (the claim loop calls it every tick); the
        interval's fill is the time-weighted mean of these looks (trapezoids between two
        looks: ticks come faster while claiming than while full)."""
        if capacity <= 0:
            return
        now = time.monotonic() if now is None else now
        fill = min(1.0, held / capacity)
        with self._lock:
            if self._last_fill is not None:
                at, before = self._last_fill
                self._fill[0] += (before + fill) / 2 * max(0.0, now - at)
                self._fill[1] += max(0.0, now - at)
            self._last_fill = (now, fill)

    def items_per_s(self) -> float:
        """Throughput over the current interval (the last one while it is young)."""
        with self._lock:
            elapsed = time.monotonic() - self._interval.started
            if elapsed < 1.0:
                return self._rate
            return round(self._interval.items / elapsed, 3)

    def _window_means(self) -> tuple[int, dict[str, float]]:
        with self._lock:
            values = {k: list(v) for k, v in self._stages.items()}
        return len(values["process"]), {k: _mean(v) for k, v in values.items()}

    def current_pace(self) -> dict[str, Any]:
        """The pace-setter of the recent items (the window), with the consumer's fill in
        the current interval once it covers a second (for the progress line)."""
        items, means = self._window_means()
        with self._lock:
            fill = self._fill[0] / self._fill[1] if self._fill[1] >= 1.0 else None
        return judge(_stages(items, means, fill)).as_dict()

    def failing(self) -> tuple[str, float] | None:
        """``(reason, share)`` of the reason most final outcomes of the run failed with,
        once it is more than half of them (the progress line shows it); else None."""
        with self._lock:
            if not self.failures or not self.processed:
                return None
            reason, count = self.failures.most_common(1)[0]
            share = count / self.processed
        return (reason, share) if share > 0.5 else None

    def p50s(self) -> dict[str, float]:
        """``<stage>_p50_ms`` of every stage over the window (the closing summary)."""
        with self._lock:
            values = {k: list(v) for k, v in self._stages.items()}
        return {f"{k}_p50_ms": round(percentile(v, 50), 3) for k, v in values.items()}

    def run_verdict(self) -> dict[str, Any]:
        """The pace-setter over the whole run so far (means of every item's stages; the
        consumer's fill is left out: a run's tail always drains it)."""
        with self._lock:
            n = self._run_items
            means = {k: v / n if n else 0.0 for k, v in zip(STAGES, self._run, strict=True)}
            failures, final = failures_of(self.failures), self.processed
        verdict = judge(_stages(n, means, None, failures, final)).as_dict()
        return {**verdict, "failures": dict(failures)}

    def snapshot(self, in_flight: int, backlog: int, held: int) -> dict[str, Any]:
        """The ``consumer.stats`` payload; starts a new interval."""
        with self._lock:
            now = time.monotonic()
            elapsed = max(1e-9, now - self._interval.started)
            rate = self._interval.items / elapsed
            values = {k: list(v) for k, v in self._stages.items()}
            fill = self._fill[0] / self._fill[1] if self._fill[1] > 0 else None
            self._fill = [0.0, 0.0]
            failures, final = failures_of(self._interval.failures), self._interval.items
            self._interval = _Interval(started=now)
            self._rate = round(rate, 3)
            totals = {"processed": self.processed, "failed": self.failed}
        dispatch, process = values["dispatch"], values["process"]
        d95, p50 = percentile(dispatch, 95), percentile(process, 50)
        verdict = judge(_stages(len(process), {k: _mean(v) for k, v in values.items()}, fill,
                                failures, final))
        p50s = {f"{k}_p50_ms": round(percentile(values[k], 50), 3)
                for k in ("polite", "pool", "fetch", "parse", "write")}
        return {
            "items_per_s": round(rate, 3), **totals, "in_flight": in_flight,
            "backlog": backlog, "leases": held,
            "fill": None if fill is None else round(fill, 3),
            "dispatch_p50_ms": round(percentile(dispatch, 50), 3),
            "dispatch_p95_ms": round(d95, 3),
            "wait_p50_ms": round(percentile(values["wait"], 50), 3),
            "wait_p95_ms": round(percentile(values["wait"], 95), 3),
            "process_p50_ms": round(p50, 3),
            "process_p95_ms": round(percentile(process, 95), 3), **p50s,
            "extract_p50_ms": round(percentile(values["extract"], 50), 3),
            "extract_p95_ms": round(percentile(values["extract"], 95), 3),
            "dispatch_process_ratio": round(d95 / p50, 4) if p50 > 0 else None,
            "pace": str(verdict.pace), "pace_share": round(verdict.share, 3),
            "verdict": verdict.text, "failing": verdict.failure,
            "failures": dict(failures),
        }


def _stages(items: int, means: dict[str, float], fill: float | None,
            failures: tuple[tuple[str, int], ...] = (), final: int = 0) -> Stages:
    """The verdict's input; ``failures`` among ``final`` items with a final outcome (the
    stage windows also hold retried tries)."""
    return Stages(items=items, dispatch=means["dispatch"], polite=means["polite"],
                  pool=means["pool"], fetch=means["fetch"], parse=means["parse"],
                  write=means["write"], fill=fill, failures=failures, finals=final or None)
