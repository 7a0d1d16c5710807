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

:class:`~zkcrawl.politeness.gate.HostGate` is the politeness front the pipeline reports to
(``finished``, ``back_off``, ``set_min_delay``); it lives with the rest of politeness in
:mod:`zkcrawl.politeness`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from consumer.timing import ItemTiming
from zkcrawl.politeness.gate import HostGate
from zkcrawl.queue.leases import Claimed
from zkcrawl.textsafe import redact_userinfo
from zkcrawl.web.decode import html_encoding
from zkcrawl.web.extract import parse_html as _parse_html
from zkcrawl.web.extract import record_from_doc
from zkcrawl.web.fetch import Fetcher, FetchResult
from zkcrawl.web.urls import host_of


class OutcomeKind(StrEnum):
    """What the committer does with an item in ZooKeeper (a ``str``: the values are in logs
    and metrics labels)."""

    COMPLETE = "complete"  # delete it: done (its record, if any, is durable first)
    RETRY = "retry"  # back to the queue's tail with attempt + 1
    DEAD = "dead"  # to the dead letters
    RELEASE = "release"  # give the lease back untouched (our shutdown, not the item's fault)


COMPLETE = OutcomeKind.COMPLETE  # the names callers have always used
RETRY = OutcomeKind.RETRY
DEAD = OutcomeKind.DEAD
RELEASE = OutcomeKind.RELEASE

BACKOFF_BASE = 1.0  # seconds; doubled per failed attempt
BACKOFF_CAP = 60.0
ABANDONED = "abandoned"  # SPEC §3: --max-attempts holders died with it
_TITLE_END = re.compile(rb"</title\s*>", re.IGNORECASE)
_TITLE_SCAN = 64 * 1024


@dataclass
class Outcome:
    """What to do with an item after processing; ``record`` is None only for retry/release."""

    kind: OutcomeKind
    record: dict[str, Any] | None
    error: str | None
    status: int | None = None


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def backoff(attempt: int, retry_after: float | None) -> float:
    """Cool-down before a retried item's host is asked again."""
    if retry_after is not None and retry_after > 0:
        return retry_after
    # The exponent is clamped: past 2**6 the cap holds anyway, and a hostile attempt (up to
    # items.MAX_ATTEMPT) must not overflow the float.
    return min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(max(0, attempt), 32))


def page_values(res: FetchResult, fields: Mapping[str, Any]) -> tuple[str | None,
                                                                       dict[str, Any]]:
    """The title and ``--field`` values the consumer records for a fetched page (``res``
    with no error, or ``too-large``: its first ``--max-bytes``). The one place a page turns
    into values: the consumer's pool threads and ``zkcrawl try`` both come here."""
    body = res.body
    if not body:
        return None, dict.fromkeys(fields)
    if not fields:
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
    rec = record_from_doc(doc, fields)
    return rec.title, rec.fields


def page_record(url: str, res: FetchResult, fields: Mapping[str, Any], *, item: str | None,
                attempt: int, consumer: str, timing: Mapping[str, float]) -> dict[str, Any]:
    """The output record (SPEC §4) of ``url`` fetched as ``res``: what the consumer writes
    for it, and what ``zkcrawl try`` shows. ``timing``: the record's ``*_ms`` fields."""
    # A too-large page still has its first --max-bytes: its title is usually there.
    title, values = page_values(res, fields) if res.error in (None, "too-large") else (
        None, dict.fromkeys(fields))
    # Credentials inside URLs are never recorded (https://***@host/...).
    return {"url": redact_userinfo(url), "final_url": redact_userinfo(res.final_url),
            "status": res.status, "title": title, "fields": values, "bytes": len(res.body),
            "item": item, "attempt": attempt, "consumer": consumer, "fetched_at": iso_now(),
            **timing, "error": res.error}


class Pipeline:
    """Fetch + extract + record for one item; thread-safe (the Fetcher keeps one transport --
    a libcurl handle or a requests Session -- per thread, extraction is pure)."""

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

    def _record(self, c: Claimed, res: FetchResult, timing: ItemTiming) -> dict[str, Any]:
        timing.finished = time.monotonic()
        return page_record(c.url or "", res, self.fields, item=c.name, attempt=c.attempt,
                           consumer=self.consumer_id, timing=timing.fields())

    def _abandoned(self, c: Claimed, timing: ItemTiming) -> Outcome:
        """SPEC §3: its holders died ``c.deaths`` times; no fetch (it may be what kills
        them), a record and a dead letter ``abandoned``."""
        return self._unfetched(c, timing, ABANDONED, c.url)

    def _malformed(self, c: Claimed, timing: ItemTiming) -> Outcome:
        return self._unfetched(c, timing, c.error or "malformed", None)

    def _unfetched(self, c: Claimed, timing: ItemTiming, error: str, url: str | None
                   ) -> Outcome:
        timing.finished = time.monotonic()
        record = {"url": url and redact_userinfo(url), "final_url": None, "status": None,
                  "title": None,
                  "fields": dict.fromkeys(self.fields), "bytes": len(c.data), "item": c.name,
                  "attempt": c.attempt, "consumer": self.consumer_id, "fetched_at": iso_now(),
                  **timing.fields(), "error": error}
        return Outcome(DEAD, record, error)
