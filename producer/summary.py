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
    # Items held back for full partitions, {"items", "partitions",
    # "top": [{"partition", "items"}]} (zkcrawl.producer.offerer); None in a dry run.
    held_back: dict[str, Any] | None = None
    mode: str = "partitions"  # where offers go (offers_into): the root's partitions
    listings: int = 0  # partitions listed to learn their depth (the cost of back-pressure)
    no_links: int = 0  # listing pages read on which the links selector selected nothing
    no_links_url: str | None = None  # the first of them, for `zkcrawl try URL`
    selector: str = ""  # "--links-css SELECTOR" / "--links XPATH", for the messages
    interrupted: str | None = None  # the signal that stopped the run (SIGINT, SIGTERM)
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
                "elapsed_s": round(self.elapsed, 3), "offers_into": self.mode,
                **({} if self.held_back is None else {"held_back": self.held_back})}

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
            "offers_into": self.mode,
            "partition_listings": self.listings,
            "held_back": None if self.held_back is None else self.held_back.get("items", 0),
            "pages_without_links": self.no_links,
            "interrupted": self.interrupted,
            "problem": problem(self),
            "elapsed_s": round(elapsed, 3),
            "offered_per_s": round(self.offered / elapsed, 1) if elapsed > 0 else 0.0,
        }


_MAX_COUNT = 10**12
HELD_TOP = 5  # partitions a status node names at most (zkcrawl.producer.offerer)


def held_back_of(producer: object) -> dict[str, Any] | None:
    """The ``held_back`` a producer's status node publishes (offers into partitions), decoded:
    ``{"items": n, "partitions": n, "top": [(partition, items), ...]}`` with non-negative
    integers only (at most :data:`HELD_TOP` of ``top``, malformed entries dropped), or None
    when it publishes none or a malformed one. The node is untrusted: never raises."""
    doc = producer.get("held_back") if isinstance(producer, dict) else None
    if not isinstance(doc, dict):
        return None
    out: dict[str, Any] = {}
    for name in ("items", "partitions"):
        value = doc.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
            return None
        out[name] = value
    top = doc.get("top")
    out["top"] = [(e["partition"], e["items"]) for e in (top if isinstance(top, list) else [])
                  [:HELD_TOP] if isinstance(e, dict) and _count(e.get("partition"))
                  and _count(e.get("items"))]
    return out


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_COUNT


def held_back_text(producer: object) -> str:
    """``1200 in 3 (p17 900, p4 200, p9 100)`` for ``zkcrawl status``; "-" when none."""
    held = held_back_of(producer)
    if held is None or not held["items"]:
        return "-"
    top = ", ".join(f"p{p} {n}" for p, n in held["top"])
    return f"{held['items']} in {held['partitions']}" + (f" ({top})" if top else "")


def problem(c: Counts) -> str | None:
    """Why a run that read listing pages offered nothing (SPEC §4: exit 1, naming the
    selector), else None. Nothing new because every link was offered before (duplicates)
    is no problem; a stopped run is judged by what it read before the stop."""
    if c.pages_read == 0 or c.offered or c.unoffered or c.duplicates:
        return None
    flag = c.selector.split(" ", 1)[0] or "--links"
    try_url = c.no_links_url or "URL"
    if c.links_found == 0:
        return (f"0 links on {c.no_links} of {c.pages_read} listing pages: check "
                f"`{flag}` with `zkcrawl try {try_url}`")
    return (f"{c.links_found} links found and every one dropped ({_breakdown(c.dropped)}): "
            "check --allow/--deny/--same-host with `zkcrawl try` on a listing page")


def no_links_note(c: Counts) -> str | None:
    """``0 links on 2 of 6 listing pages (--links-css .post a)`` when some pages gave none."""
    if not c.no_links:
        return None
    return f"0 links on {c.no_links} of {c.pages_read} listing pages ({c.selector})"


def continue_hint(c: Counts, seen: str | None) -> str | None:
    """How to continue an interrupted run, else None."""
    if c.interrupted is None:
        return None
    how = ("run the same command again: --seen skips what this run offered" if seen else
           "run it again with --seen PATH next time to skip what was offered (this run's "
           "offers are already in the queue; without --seen they would be offered again)")
    return f"interrupted by {c.interrupted}: {how}"


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
    if c.no_links:
        rows.insert(4 if not from_file else 2, ("pages without links", str(c.no_links),
                                                c.selector))
    width = max(len(r[0]) for r in rows)
    num = max(len(r[1]) for r in rows)
    lines = ["zkcrawl-producer summary" + (f" (interrupted by {c.interrupted})"
                                           if c.interrupted else "")]
    for label, value, note in rows:
        lines.append(f"  {label:<{width}}  {value:>{num}}" + (f"  ({note})" if note else ""))
    for url, err in c.pages_failed[:MAX_LISTED_FAILURES]:
        lines.append(f"  failed: {url} ({err})")
    return "\n".join(lines)


def report(c: Counts, from_file: bool, table_to: IO[str] | None, seen: str | None = None
           ) -> None:
    """Log ``producer.summary`` (a warning when the run is interrupted or offered nothing);
    also print the table when ``table_to`` (a TTY) is given, with how to continue an
    interrupted run."""
    hint = continue_hint(c, seen)
    event = c.as_event()
    if hint is not None:
        event["hint"] = hint
    (log.warning if hint or event["problem"] else log.info)("producer.summary", **event)
    if table_to is not None:
        table = render_table(c, from_file)
        print(table + (f"\n  {hint}" if hint else ""), file=table_to, flush=True)


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
