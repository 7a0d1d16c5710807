"""Processing one claimed item: fetch, extract, build the record, decide the outcome.

:class:`Pipeline` is pure-ish: it talks HTTP through the shared :class:`~zkcrawl.web.fetch.Fetcher`
and never touches ZooKeeper or the sink, so it is tested against real HTTP servers alone.
The outcome rules are SPEC §3's:

* success, or a page cut at ``--max-bytes`` (``too-large``): a record, then *complete*;
* a failure that will not pass (4xx other than 408/429, ``content-type``, ``robots``,
  ``redirects``, ``bad-url``): a record with the reason at once, then *complete*;
* a failure that may pass (``timeout``, ``connection``, 408/429/5xx, robots.txt unreachable):
  *retry* at the queue's tail, the host cooled down first (``Retry-After`` or exponential
  backoff); after ``--max-attempts`` tries a record with the error and a *dead* letter;
* a malformed item: a record with the reason and a *dead* letter at once;
* the fetch was cancelled by our own shutdown: *release* (not the item's fault).

:class:`HostGate` is the politeness front: it wraps the
:class:`~zkcrawl.politeness.Politeness` protocol (so a ZooKeeper-backed implementation can
replace the local one) and adds what a scheduler that never sleeps on a host needs -- see its
docstring.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from consumer.timing import ItemTiming
from zkcrawl.politeness.local import Politeness
from zkcrawl.queue.leases import Claimed
from zkcrawl.web.decode import html_encoding
from zkcrawl.web.extract import parse_html as _parse_html
from zkcrawl.web.extract import record_from_doc
from zkcrawl.web.fetch import Fetcher, FetchResult
from zkcrawl.web.urls import host_of

COMPLETE, RETRY, DEAD, RELEASE = "complete", "retry", "dead", "release"
BACKOFF_BASE = 1.0  # seconds; doubled per failed attempt
BACKOFF_CAP = 60.0
ABANDONED = "abandoned"  # SPEC §3: --max-attempts holders died with it
EARLY = 0.002  # a slot this close is slept for on the worker thread; farther ones are queued
_PRUNE_AT = 10_000
_TITLE_END = re.compile(rb"</title\s*>", re.IGNORECASE)
_TITLE_SCAN = 64 * 1024


@dataclass
class Outcome:
    """What to do with an item after processing; ``record`` is None only for retry/release."""

    kind: str
    record: dict[str, Any] | None
    error: str | None
    status: int | None = None


class HostGate:
    """Politeness for a scheduler whose worker threads never wait for a host.

    ``admit(host, slot)`` is called by a worker thread as it picks an item: the first call
    reserves the host's next slot from the wrapped :class:`Politeness`; if that slot is
    more than a couple of milliseconds away the item goes back to the scheduler's time-ordered
    heap (carrying its slot) instead of idling the thread. Because an item can start a little
    *after* its slot (all threads busy at that moment), the gate also keeps the time of the
    last request per host -- its actual start, then its end -- and the ``Retry-After``
    deadlines it has seen, and admits an item only when ``now >= last + gap``: the gap holds
    between requests as the server sees them, not just between reservations.

    The gate is also the :class:`Politeness` given to the Fetcher: the first ``reserve`` of a
    fetch on a thread that was just admitted is the slot already paid for; later ones (a
    redirect to the same host, robots.txt) reserve and are waited for by the Fetcher.
    """

    def __init__(self, inner: Politeness, domain_delay: float, crawl_delay_cap: float,
                 clock: Any = time.monotonic) -> None:
        self.inner = inner
        self.delay = domain_delay
        self.cap = crawl_delay_cap
        self._clock = clock
        self._lock = threading.Lock()
        self._gap: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._cool: dict[str, float] = {}
        self._busy: dict[str, int] = {}  # requests in flight per host
        self._paid = threading.local()

    # -- Politeness protocol (the Fetcher's side) -----------------------------------------
    def reserve(self, host: str) -> float:
        if getattr(self._paid, "host", None) == host:
            self._paid.host = None
            return self._clock()
        start = self.inner.reserve(host)
        with self._lock:
            self._last[host] = max(self._last.get(host, -math.inf), start)
        return start

    def back_off(self, host: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        self.inner.back_off(host, seconds)
        with self._lock:
            until = self._clock() + seconds
            self._cool[host] = max(self._cool.get(host, -math.inf), until)

    def set_min_delay(self, host: str, seconds: float) -> None:
        seconds = min(seconds, self.cap)
        self.inner.set_min_delay(host, seconds)
        with self._lock:
            if seconds > self.delay:
                self._gap[host] = seconds
            else:
                self._gap.pop(host, None)

    # -- scheduler side -------------------------------------------------------------------
    def admit(self, host: str, slot: float | None) -> tuple[float, float | None]:
        """Decide whether an item for ``host`` may start now.

        ``slot`` is the reservation the item already holds (None the first time). Returns
        ``(start, None)`` when it may go -- the caller sleeps until ``start``, at most
        ``EARLY`` seconds -- or ``(slot, due)``: queue the item until ``due``, keeping ``slot``.
        """
        if slot is None:
            slot = self.inner.reserve(host)
        with self._lock:
            now = self._clock()
            gap = self._gap.get(host, self.delay)
            due = max(slot, self._last.get(host, -math.inf) + gap,
                      self._cool.get(host, -math.inf))
            if gap > 0 and self._busy.get(host):
                # One request at a time to a polite host: the gap counts from its end, which
                # is at least a gap from now.
                due = max(due, now + gap)
            if due - now > EARLY:
                return slot, due
            start = max(now, due)
            self._last[host] = start
            self._busy[host] = self._busy.get(host, 0) + 1
            if len(self._last) > _PRUNE_AT:
                self._prune(now)
        self._paid.host = host
        return start, None

    def _prune(self, now: float) -> None:
        horizon = now - max(self.delay, self.cap)
        for host in [h for h, t in self._last.items() if t < horizon]:
            del self._last[host]
        for host in [h for h, t in self._cool.items() if t < now]:
            del self._cool[host]

    def finished(self, host: str) -> None:
        """A request to ``host`` is over: the next one waits a gap from *now*.

        Counting the gap from the end of the previous request, not only from its start, is
        what makes it hold where the server measures it: a request that had to open a new
        connection reaches the server late, and the next one must not arrive early."""
        self._paid.host = None  # an unused prepaid slot (robots said no) is not kept
        with self._lock:
            self._last[host] = max(self._last.get(host, -math.inf), self._clock())
            left = self._busy.get(host, 0) - 1
            if left > 0:
                self._busy[host] = left
            else:
                self._busy.pop(host, None)


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def backoff(attempt: int, retry_after: float | None) -> float:
    """Cool-down before a retried item's host is asked again."""
    if retry_after is not None and retry_after > 0:
        return retry_after
    return min(BACKOFF_CAP, BACKOFF_BASE * 2 ** max(0, attempt))


class Pipeline:
    """Fetch + extract + record for one item; thread-safe (the Fetcher keeps a Session per
    thread, extraction is pure)."""

    def __init__(self, fetcher: Fetcher, gate: HostGate, fields: dict[str, Any],
                 consumer_id: str, max_attempts: int) -> None:
        self.fetcher = fetcher
        self.gate = gate
        self.fields = fields
        self.consumer_id = consumer_id
        self.max_attempts = max_attempts

    def prepare(self, url: str, host: str) -> bool:
        """Load robots.txt for the host (cached) so a Crawl-delay is known before a slot is
        reserved. False: robots.txt disallows ``url``, no request will be made (the fetch
        reports ``robots`` at once), so no slot is needed."""
        if not self.fetcher.robots_allowed(url):
            return False
        delay = self.fetcher.crawl_delay(url)
        if delay:
            self.gate.set_min_delay(host, delay)
        return True

    def process(self, c: Claimed, timing: ItemTiming, host: str | None = None) -> Outcome:
        """Run one item; never raises for a network or content problem. ``host`` is the
        host whose gate slot this fetch holds (``""``: none; None: the item's own host)."""
        if c.item is None:
            return self._malformed(c, timing)
        if c.abandoned(self.max_attempts):
            return self._abandoned(c, timing)
        host = host_of(c.item.url) if host is None else host
        try:
            res = self.fetcher.fetch(c.item.url)
        finally:
            if host:
                self.gate.finished(host)
        if res.error == "cancelled":
            return Outcome(RELEASE, None, res.error, res.status)
        if res.retryable:
            return self._retryable(c, res, timing)
        return Outcome(COMPLETE, self._record(c, res, timing), res.error, res.status)

    def _retryable(self, c: Claimed, res: FetchResult, timing: ItemTiming) -> Outcome:
        host = host_of(res.final_url) or host_of(c.item.url if c.item else "")
        if host:
            self.gate.back_off(host, backoff(c.attempt, res.retry_after))
        if c.attempt + 1 >= self.max_attempts:
            return Outcome(DEAD, self._record(c, res, timing), res.error, res.status)
        return Outcome(RETRY, None, res.error, res.status)

    def _extract(self, res: FetchResult) -> tuple[str | None, dict[str, Any]]:
        body = res.body
        if not body:
            return None, dict.fromkeys(self.fields)
        if not self.fields:
            # Only the title is wanted: parse up to the first </title> (a few hundred bytes
            # instead of the whole page). If that prefix yields no title -- the tag was in a
            # comment or a script, say -- the whole page is parsed as usual.
            end = _TITLE_END.search(body, 0, _TITLE_SCAN)
            if end is not None:
                # The encoding is decided on the whole body (detection needs it), the parse
                # is done on the prefix only.
                encoding, _ = html_encoding(body, res.content_type)
                doc = _parse_html(body[:end.end()], res.final_url,
                                  f"text/html; charset={encoding}")
                title = record_from_doc(doc).title
                if title is not None:
                    return title, {}
        doc = _parse_html(body, res.final_url, res.content_type)
        rec = record_from_doc(doc, self.fields)
        return rec.title, rec.fields

    def _record(self, c: Claimed, res: FetchResult, timing: ItemTiming) -> dict[str, Any]:
        # A too-large page still has its first --max-bytes: its title is usually there.
        title, fields = self._extract(res) if res.error in (None, "too-large") else (
            None, dict.fromkeys(self.fields))
        timing.finished = time.monotonic()
        return {"url": c.url, "final_url": res.final_url, "status": res.status,
                "title": title, "fields": fields, "bytes": len(res.body), "item": c.name,
                "attempt": c.attempt, "consumer": self.consumer_id, "fetched_at": iso_now(),
                **timing.fields(), "error": res.error}

    def _abandoned(self, c: Claimed, timing: ItemTiming) -> Outcome:
        """SPEC §3: its holders died ``c.deaths`` times; no fetch (it may be what kills
        them), a record and a dead letter ``abandoned``."""
        return self._unfetched(c, timing, ABANDONED, c.url)

    def _malformed(self, c: Claimed, timing: ItemTiming) -> Outcome:
        return self._unfetched(c, timing, c.error or "malformed", None)

    def _unfetched(self, c: Claimed, timing: ItemTiming, error: str, url: str | None
                   ) -> Outcome:
        timing.finished = time.monotonic()
        record = {"url": url, "final_url": None, "status": None, "title": None,
                  "fields": dict.fromkeys(self.fields), "bytes": len(c.data), "item": c.name,
                  "attempt": c.attempt, "consumer": self.consumer_id, "fetched_at": iso_now(),
                  **timing.fields(), "error": error}
        return Outcome(DEAD, record, error)
