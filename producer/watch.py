"""``zkcrawl-producer --watch INTERVAL``: a producer that keeps a site's new articles coming
(SPEC §4). Passes start ``INTERVAL`` apart (an overrunning pass is followed at once).

* The first pass is an ordinary run; each later one re-reads at most ``--watch-depth``
  listing pages per walk and stops a walk at the first page with no new URL (a quiet blog
  costs one fetch per walk per pass); sitemaps are read again, child sitemaps dated as at
  the previous pass are not. Nothing offered before is offered again.
* A signal ends the wait between passes at once and cuts a pass short at its next fetch
  (what it extracted is still offered).
* The last pass is published under ``watch`` in the status node (:func:`last_pass` decodes
  it, untrusted) and logged as ``watch.pass``.

Also :func:`parse_duration` and :func:`parse_since` (``--since``: a date or an age).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from zkcrawl.errors import UsageError

log = structlog.get_logger(__name__)  # lazy: bound after logs.configure()

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)?\s*", re.IGNORECASE)
MIN_INTERVAL = 1.0
MAX_INTERVAL = 366 * 86400.0
#: A ``--since`` before this is surely a typo (the web did not exist).
EARLIEST_SINCE = datetime(1990, 1, 1, tzinfo=UTC).timestamp()


def parse_duration(text: str, flag: str = "--watch", *,
                   max_seconds: float = MAX_INTERVAL) -> float:
    """Seconds of ``30s``, ``10m`` (or ``10min``), ``1h``, ``2d``, ``1w`` or plain seconds,
    within [:data:`MIN_INTERVAL`, ``max_seconds``]; else :class:`UsageError`. The producer's
    one duration parser: ``--watch``, ``--since`` (an age) and, with their own bound,
    ``--recrawl-min``/``--recrawl-max`` (:func:`zkcrawl.producer.recrawl.parse_duration`)."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise UsageError(f"{flag}: expected a duration such as 30s, 10m, 1h or 2d, got "
                         f"{str(text)[:40]!r}")
    seconds = float(match.group(1)) * _UNITS[(match.group(2) or "").lower()]
    if not (math.isfinite(seconds) and MIN_INTERVAL <= seconds <= max_seconds):
        raise UsageError(f"{flag}: must be between {MIN_INTERVAL:g} s and "
                         f"{max_seconds / 86400:g} days, got {text[:40]!r}")
    return seconds


def parse_since(text: str, flag: str = "--since", now: float | None = None) -> float:
    """A Unix time from an ISO 8601 date/datetime (UTC when no zone) or an age (``7d``
    ago); between 1990 and now, else :class:`UsageError`."""
    now = time.time() if now is None else now
    text = (text or "").strip()
    if (age := age_of(text)) is not None:
        return now - age
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{flag}: expected a date (2026-01-31), a datetime "
                         f"(2026-01-31T08:00:00Z) or an age (7d), got {text[:40]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    stamp = when.timestamp()
    if not EARLIEST_SINCE <= stamp <= now + 86400:
        raise UsageError(f"{flag}: {text[:40]!r} is not between 1990 and now")
    return stamp


def age_of(since: str | None) -> float | None:
    """Seconds of a ``--since`` given as an age (``7d``), else None (a date, or none)."""
    text = (since or "").strip()
    if not text or text.isdigit() or not _DURATION.fullmatch(text):
        return None
    return parse_duration(text, "--since")


@dataclass
class Pass:
    """One pass of a watching producer."""

    number: int
    started_at: float  # Unix time
    pages: int = 0  # listing pages read
    sitemaps: int = 0  # sitemap files read
    new: int = 0  # URLs offered that were not offered before
    failed: int = 0  # listing pages and sitemaps that could not be read
    duration_s: float = 0.0

    def as_status(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["duration_s"] = round(self.duration_s, 3)
        doc["started_at"] = round(self.started_at, 3)
        return doc


class PassRunner(Protocol):
    """What the producer gives the watcher: one pass, filling in ``p``'s counts."""

    def __call__(self, p: Pass, first: bool) -> None: ...


class Watcher:
    """Run passes ``interval`` seconds apart (start to start) until ``stop`` is set."""

    def __init__(self, run_pass: PassRunner, interval: float, stop: threading.Event,
                 on_pass: Callable[[], None] | None = None) -> None:
        self.run_pass = run_pass
        self.interval = interval
        self.stop = stop
        self.on_pass = on_pass or (lambda: None)
        self.last: Pass | None = None
        self.passes = 0
        self.next_at: float | None = None  # monotonic time of the next pass

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            p = Pass(self.passes + 1, time.time())
            self.run_pass(p, first=self.passes == 0)
            p.duration_s = time.monotonic() - started
            self.passes += 1
            self.last = p
            self.next_at = started + self.interval
            log.info("watch.pass", **p.as_status(), next_in_s=round(self.wait_left(), 3))
            self.on_pass()
            if self.stop.wait(self.wait_left()):
                break

    def wait_left(self) -> float:
        return 0.0 if self.next_at is None else max(0.0, self.next_at - time.monotonic())

    def status(self) -> dict[str, Any]:
        """The ``watch`` object of the status node."""
        return {"interval_s": self.interval, "passes": self.passes,
                "next_pass_in_s": round(self.wait_left(), 3),
                "last_pass": self.last.as_status() if self.last else None}


_PASS_FIELDS = ("number", "pages", "sitemaps", "new", "failed")
_MAX_COUNT = 2**53


def last_pass(producer: object) -> dict[str, Any] | None:
    """The last pass a producer's status document publishes, decoded: ``{"started_at",
    "duration_s", "number", "pages", "sitemaps", "new", "failed", "interval_s"}`` with
    finite non-negative numbers only, or ``None`` when it publishes none or a malformed one
    (the node is untrusted: never raises)."""
    watch = producer.get("watch") if isinstance(producer, dict) else None
    if not isinstance(watch, dict):
        return None
    lp = watch.get("last_pass")
    if not isinstance(lp, dict):
        return None
    out: dict[str, Any] = {}
    for name in _PASS_FIELDS:
        value = lp.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
            return None
        out[name] = value
    for name, doc in (("started_at", lp), ("duration_s", lp), ("interval_s", watch)):
        value = doc.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value) or not 0 <= value <= 1e11:
            return None
        out[name] = float(value)
    return out
