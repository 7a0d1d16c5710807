"""Per-item timings and the periodic ``consumer.stats`` payload.

Every item carries four durations (SPEC §4), all from ``time.monotonic()`` except
``queue_ms`` (the item znode's ctime on the server to our claim, wall clock):

* ``dispatch_ms`` -- the take from ZooKeeper until the item is handed to the pool;
* ``wait_ms``     -- handed to the pool until a worker starts it (the capped queue, plus a
  host's politeness cool-down when the item had to wait for its turn);
* ``process_ms``  -- fetch + parse + write of the record;
  ``extract_ms`` is the part of it spent in the page processor (shown apart in the stats);
* ``queue_ms``    -- how long the item sat in the queue before we took it.

The seed measured dispatch against crawl time and found the queue was the bottleneck. The
stats event keeps that comparison in front of the operator: the ratio of dispatch p95 to
process p50, with a one-line verdict.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

WINDOW = 4096  # recent items the percentiles are computed over
# Below this ratio (dispatch p95 / process p50) the queue is not what limits throughput.
QUEUE_BOUND_RATIO = 0.05


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

    @staticmethod
    def _ms(a: float | None, b: float | None) -> float:
        if a is None or b is None:
            return 0.0
        return round(max(0.0, b - a) * 1000.0, 3)

    @property
    def dispatch_ms(self) -> float:
        return self._ms(self.claimed, self.submitted)

    @property
    def wait_ms(self) -> float:
        return self._ms(self.submitted, self.started)

    @property
    def process_ms(self) -> float:
        return self._ms(self.started, self.finished)

    def fields(self) -> dict[str, float]:
        """The four record / log fields (a new dict each call, same values once finished)."""
        return {"queue_ms": round(self.queue_ms, 3), "dispatch_ms": self.dispatch_ms,
                "wait_ms": self.wait_ms, "process_ms": self.process_ms}

    def durations(self) -> tuple[float, float, float]:
        """``(dispatch_ms, wait_ms, process_ms)``."""
        return self.dispatch_ms, self.wait_ms, self.process_ms


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of unsorted ``values`` (0.0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(pct / 100.0 * len(ordered)) - 1))
    return ordered[rank]


def verdict(dispatch_p95: float, process_p50: float, wait_p50: float) -> str:
    """One line an operator can act on: which side limits throughput."""
    if process_p50 <= 0:
        return "idle: nothing processed in this interval"
    ratio = dispatch_p95 / process_p50
    if ratio >= QUEUE_BOUND_RATIO:
        return (f"queue-bound: dispatch p95 is {ratio:.0%} of process p50; ZooKeeper or the "
                "claim loop is the bottleneck, more threads will not help")
    if wait_p50 > process_p50:
        return ("worker-bound: items wait longer in the backlog than they take to process; "
                "add --threads or consumers (mind --domain-delay)")
    return "worker-bound: the queue keeps up; throughput is threads / fetch time"


@dataclass
class _Interval:
    started: float = field(default_factory=time.monotonic)
    items: int = 0


class Timings:
    """Thread-safe rolling windows and counters behind ``consumer.stats`` and the status node."""

    def __init__(self, window: int = WINDOW) -> None:
        self._lock = threading.Lock()
        self._dispatch: deque[float] = deque(maxlen=window)
        self._wait: deque[float] = deque(maxlen=window)
        self._process: deque[float] = deque(maxlen=window)
        self._extract: deque[float] = deque(maxlen=window)
        self.outcomes: Counter[str] = Counter()
        self.processed = 0  # items with a final outcome (done, failed record, dead letter)
        self.failed = 0  # of which had an error
        self._interval = _Interval()
        self._rate = 0.0

    def record(self, durations: tuple[float, float, float], outcome: str, final: bool,
               failed: bool, extract: float = 0.0) -> None:
        """Account one processed item: its ``(dispatch_ms, wait_ms, process_ms)`` and the
        processor's part ``extract``; ``outcome`` is ok / retry / dead / an error reason."""
        dispatch, wait, process = durations
        with self._lock:
            self._dispatch.append(dispatch)
            self._wait.append(wait)
            self._process.append(process)
            self._extract.append(extract)
            self.outcomes[outcome] += 1
            if final:
                self.processed += 1
                self.failed += int(failed)
                self._interval.items += 1

    def items_per_s(self) -> float:
        """Throughput over the current interval (the last one while it is young)."""
        with self._lock:
            elapsed = time.monotonic() - self._interval.started
            if elapsed < 1.0:
                return self._rate
            return round(self._interval.items / elapsed, 3)

    def snapshot(self, in_flight: int, backlog: int, held: int) -> dict[str, Any]:
        """The ``consumer.stats`` payload; starts a new interval."""
        with self._lock:
            now = time.monotonic()
            elapsed = max(1e-9, now - self._interval.started)
            rate = self._interval.items / elapsed
            dispatch, wait, process = list(self._dispatch), list(self._wait), list(self._process)
            extract = list(self._extract)
            self._interval = _Interval(started=now)
            self._rate = round(rate, 3)
            totals = {"processed": self.processed, "failed": self.failed}
        d95, p50 = percentile(dispatch, 95), percentile(process, 50)
        w50 = percentile(wait, 50)
        return {
            "items_per_s": round(rate, 3), **totals, "in_flight": in_flight,
            "backlog": backlog, "leases": held,
            "dispatch_p50_ms": round(percentile(dispatch, 50), 3),
            "dispatch_p95_ms": round(d95, 3),
            "wait_p50_ms": round(w50, 3), "wait_p95_ms": round(percentile(wait, 95), 3),
            "process_p50_ms": round(p50, 3),
            "process_p95_ms": round(percentile(process, 95), 3),
            "extract_p50_ms": round(percentile(extract, 50), 3),
            "extract_p95_ms": round(percentile(extract, 95), 3),
            "dispatch_process_ratio": round(d95 / p50, 4) if p50 > 0 else None,
            "verdict": verdict(d95, p50, w50),
        }
