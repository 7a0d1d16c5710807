"""What the producer did, for operators: counters, the ``producer.summary`` event, and on a
TTY a progress line while it runs and a table at the end.

Counters are written by the one producer thread and read by the registry and progress
threads; single int reads are atomic under the GIL, so no lock is taken.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import IO, Any

import structlog

log = structlog.get_logger(__name__)  # lazy: bound after logs.configure()

#: How many failed listing URLs the summary event names (the count is always exact).
MAX_LISTED_FAILURES = 20


@dataclass
class Counts:
    """Counters of one run."""

    pages_read: int = 0
    pages_failed: list[tuple[str, str]] = field(default_factory=list)  # (url, error)
    pages_skipped: Counter[str] = field(default_factory=Counter)  # robots, not-html, loop
    lines_read: int = 0  # --from-file lines (blank and comment lines excluded)
    rejected: int = 0  # --from-file lines that are not an http(s) URL
    links_found: int = 0
    discovered: int = 0  # --follow: <root>/discovered/ nodes drained
    dropped: Counter[str] = field(default_factory=Counter)  # javascript, deny, other-host...
    duplicates: int = 0
    offered: int = 0
    unoffered: int = 0  # extracted but not offered: stopped while the queue was full
    waits: int = 0  # times back-pressure held the producer
    state: str = "starting"
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def status(self) -> dict[str, Any]:
        """Progress for ``<root>/producers/<id>`` (refreshed by the registration)."""
        return {"state": self.state, "pages": self.pages_read, "links": self.links_found,
                "lines": self.lines_read, "duplicates": self.duplicates,
                "offered": self.offered, "failed_pages": len(self.pages_failed),
                "elapsed_s": round(self.elapsed, 3)}

    def as_event(self) -> dict[str, Any]:
        """Key/values of the ``producer.summary`` event."""
        elapsed = self.elapsed
        return {
            "pages_read": self.pages_read,
            "pages_failed": len(self.pages_failed),
            "failed": [f"{url} ({err})" for url, err in self.pages_failed[:MAX_LISTED_FAILURES]],
            "pages_skipped": dict(self.pages_skipped),
            "lines_read": self.lines_read,
            "rejected": self.rejected,
            "links_found": self.links_found,
            "discovered_nodes": self.discovered,
            "dropped": dict(self.dropped),
            "duplicates": self.duplicates,
            "offered": self.offered,
            "unoffered": self.unoffered,
            "backpressure_waits": self.waits,
            "elapsed_s": round(elapsed, 3),
            "offered_per_s": round(self.offered / elapsed, 1) if elapsed > 0 else 0.0,
        }


def _breakdown(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.most_common())


def render_table(c: Counts, from_file: bool) -> str:
    """A readable end-of-run table (for a TTY)."""
    rows: list[tuple[str, str, str]] = []
    if from_file:
        rows += [("lines read", str(c.lines_read), ""),
                 ("rejected (not a URL)", str(c.rejected), "")]
    else:
        rows += [("pages read", str(c.pages_read), ""),
                 ("pages failed", str(len(c.pages_failed)), ""),
                 ("pages skipped", str(sum(c.pages_skipped.values())),
                  _breakdown(c.pages_skipped)),
                 ("links found", str(c.links_found), "")]
    if c.discovered:
        rows.append(("discovered nodes drained", str(c.discovered), "--follow"))
    rows += [("dropped", str(sum(c.dropped.values())), _breakdown(c.dropped)),
             ("duplicates skipped", str(c.duplicates), ""),
             ("items offered", str(c.offered), ""),
             ("elapsed", f"{c.elapsed:.1f} s", f"{c.offered / max(c.elapsed, 1e-9):.0f} items/s")]
    if c.unoffered:
        rows.insert(-1, ("not offered (stopped)", str(c.unoffered), "re-offered by the next run"))
    width = max(len(r[0]) for r in rows)
    num = max(len(r[1]) for r in rows)
    lines = ["zkcrawl-producer summary"]
    for label, value, note in rows:
        lines.append(f"  {label:<{width}}  {value:>{num}}" + (f"  ({note})" if note else ""))
    for url, err in c.pages_failed[:MAX_LISTED_FAILURES]:
        lines.append(f"  failed: {url} ({err})")
    return "\n".join(lines)


def report(c: Counts, from_file: bool, table_to: IO[str] | None) -> None:
    """Log ``producer.summary``; also print the table when ``table_to`` (a TTY) is given."""
    log.info("producer.summary", **c.as_event())
    if table_to is not None:
        print(render_table(c, from_file), file=table_to, flush=True)


class Progress:
    """A one-line progress display on a TTY, redrawn twice a second from its own thread."""

    def __init__(self, counts: Counts, stream: IO[str], interval: float = 0.5) -> None:
        self.counts = counts
        self.stream = stream
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)

    def line(self) -> str:
        c = self.counts
        rate = c.offered / max(c.elapsed, 1e-9)
        read = f"pages {c.pages_read}" if c.pages_read or not c.lines_read else \
            f"lines {c.lines_read}"
        return (f"[{c.state}] {read} · links {c.links_found} · dup {c.duplicates} · "
                f"offered {c.offered} ({rate:.0f}/s)")

    def _draw(self, end: str = "\r") -> None:
        # Erase to end of line first: a log line may have been printed over ours.
        self.stream.write("\x1b[K" + self.line() + end)
        self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._draw()

    def start(self) -> Progress:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.stream.write("\x1b[K")
        self.stream.flush()
