"""Processing one claimed item: fetch, extract, build the record, decide the outcome.

:class:`Pipeline` is pure-ish: it talks HTTP through the shared :class:`~zkcrawl.web.fetch.Fetcher`
and never touches ZooKeeper or the sink, so it is tested against real HTTP servers alone.
The outcome rules are SPEC §3's:

* success, or a page cut at ``--max-bytes`` (``too-large``): a record, then *complete*;
* a failure that will not pass (4xx other than 408/429, ``content-type``, ``robots``,
  ``redirects``, ``bad-url``): a record with the reason at once, then *complete*;
* a failure that may pass (``timeout``, ``connection``, 408/429/5xx, robots.txt unreachable
  -- which records the reason it was unreachable, never ``robots``): *retry* at the queue's
  tail, the host cooled down first: ``Retry-After`` or exponential backoff per attempt for
  an answer, and for a host that gave none (down: refused, unreachable, timeout) a back-off
  of the host's own that doubles with its failures in a row up to 10 minutes
  (:meth:`~zkcrawl.politeness.gate.HostGate.host_down`), shared by all its items; after
  ``--max-attempts`` tries a record with the error and a *dead* letter;
* a malformed item: a record with the reason and a *dead* letter at once;
* the fetch was cancelled by our own shutdown: *release* (not the item's fault).

:class:`~zkcrawl.politeness.gate.HostGate` is the politeness front the pipeline reports to
(``finished``, ``back_off``, ``set_min_delay``); it lives with the rest of politeness in
:mod:`zkcrawl.politeness`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from consumer.processors import Processors
from consumer.timing import ItemTiming
from zkcrawl.page import Page
from zkcrawl.politeness.gate import HostGate
from zkcrawl.queue.leases import Claimed
from zkcrawl.textsafe import redact_userinfo
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
_NO_ANSWER = frozenset({"connection", "timeout"})  # the host is down (or unreachable)


@dataclass
class Outcome:
    """What to do with an item after processing; ``record`` is None only for retry/release
    and for a page its processor skipped."""

    kind: OutcomeKind
    record: dict[str, Any] | None
    error: str | None
    status: int | None = None
    links: tuple[str, ...] = ()  # found by a page processor: to <root>/discovered/
    skipped: bool = False  # the processor asked for no record (completed all the same)


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def backoff(attempt: int, retry_after: float | None) -> float:
    """Cool-down before a retried item's host is asked again."""
    if retry_after is not None and retry_after > 0:
        return retry_after
    # The exponent is clamped: past 2**6 the cap holds anyway, and a hostile attempt (up to
    # items.MAX_ATTEMPT) must not overflow the float.
    return min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(max(0, attempt), 32))


@dataclass(slots=True)  # not frozen: built per page, frozen __init__ costs ~1 µs
class Extracted:
    """What a fetched page gives: the record's title and fields, the error (the fetch's, or
    the page processor's ``processor: Type: message``), the links found, skip, and the
    processor's time."""

    title: str | None
    fields: dict[str, Any]
    error: str | None
    links: tuple[str, ...] = ()
    skipped: bool = False
    extract_ms: float = 0.0


def extract_page(url: str, res: FetchResult, fields: Mapping[str, Any],
                 processors: Processors | None = None,
                 meta: Mapping[str, Any] | None = None) -> Extracted:
    """Run the page's processor (default: title + ``--field``) on ``res`` -- a page with no
    error, or ``too-large``: its first ``--max-bytes``; any other is not processed. The one
    place a page turns into values: the consumer's pool threads and ``zkcrawl try`` both
    come here. Never raises."""
    if res.error not in (None, "too-large"):
        return Extracted(None, dict.fromkeys(fields), res.error)
    processors = processors or Processors.default_only(fields)
    page = Page(url=url, final_url=res.final_url, status=res.status,
                headers=MappingProxyType(res.headers), body=res.body,
                meta=MappingProxyType(dict(meta or {})))
    done = processors.run(page)
    if done.result is None:  # the processor failed: a permanent error, recorded
        return Extracted(None, dict.fromkeys(fields), done.error, extract_ms=done.extract_ms)
    result = done.result
    # SPEC §4: title is always recorded; a processor may set it, else the page's (cached:
    # no second parse when the processor read it).
    title = result.title if result.title is not None else page.title
    return Extracted(title, dict(result.fields), res.error, done.links, result.skip,
                     done.extract_ms)


def page_record(url: str, res: FetchResult, fields: Mapping[str, Any], *, item: str | None,
                attempt: int, consumer: str, timing: Mapping[str, float],
                extracted: Extracted | None = None) -> dict[str, Any]:
    """The output record (SPEC §4) of ``url`` fetched as ``res``: what the consumer writes
    for it, and what ``zkcrawl try`` shows. ``timing``: the record's ``*_ms`` fields;
    ``extracted``: :func:`extract_page`'s result (default: the default processor's)."""
    ex = extracted if extracted is not None else extract_page(url, res, fields)
    # Credentials inside URLs are never recorded (https://***@host/...).
    return {"url": redact_userinfo(url), "final_url": redact_userinfo(res.final_url),
            "status": res.status, "title": ex.title, "fields": ex.fields, "bytes": len(res.body),
            "item": item, "attempt": attempt, "consumer": consumer, "fetched_at": iso_now(),
            **timing, "error": ex.error}


class Pipeline:
    """Fetch + extract + record for one item; thread-safe (the Fetcher keeps one transport --
    a libcurl handle or a requests Session -- per thread, extraction is pure)."""

    def __init__(self, fetcher: Fetcher, gate: HostGate, fields: dict[str, Any],
                 consumer_id: str, max_attempts: int,
                 processors: Processors | None = None) -> None:
        self.fetcher = fetcher
        self.gate = gate
        self.fields = fields
        # The page's code (consumer/processors.py); the default is title + --field.
        self.processors = processors or Processors.default_only(fields)
        self.consumer_id = consumer_id
        self.max_attempts = max_attempts

    def prepare(self, url: str, host: str) -> bool:
        """Load robots.txt for the host (cached) so a Crawl-delay is known before a slot is
        reserved. False: robots.txt disallows ``url``, no request will be made (the fetch
        reports ``robots`` at once), so no slot is needed. An unreachable robots.txt is no
        verdict: the item takes a slot like any other, so the host's back-off holds it."""
        if not self.fetcher.robots_allowed(url):
            return self.fetcher.robots_unreachable(url)
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
        timing.fetched = time.monotonic()
        if res.status is not None and host:
            self.gate.host_up(host)  # it answered: a later failure backs off from the bottom
        if res.error == "cancelled":
            return Outcome(RELEASE, None, res.error, res.status)
        if res.retryable:
            return self._retryable(c, res, timing)
        return self._processed(c, res, timing)

    def _retryable(self, c: Claimed, res: FetchResult, timing: ItemTiming) -> Outcome:
        host = host_of(res.final_url) or host_of(c.item.url if c.item else "")
        if host and res.status is None and res.error in _NO_ANSWER:
            self.gate.host_down(host)  # no answer: the host's own back-off, for all its items
        elif host:
            self.gate.back_off(host, backoff(c.attempt, res.retry_after))
        if c.attempt + 1 >= self.max_attempts:
            return Outcome(DEAD, self._record(c, res, timing), res.error, res.status)
        return Outcome(RETRY, None, res.error, res.status)

    def _processed(self, c: Claimed, res: FetchResult, timing: ItemTiming) -> Outcome:
        """A page that will not be fetched again: its processor's record, or the error's."""
        ex = extract_page(c.url or "", res, self.fields, self.processors,
                          c.item.meta if c.item is not None else None)
        timing.extract_ms = ex.extract_ms
        if ex.skipped:
            timing.finished = time.monotonic()
            return Outcome(COMPLETE, None, ex.error, res.status, ex.links, skipped=True)
        return Outcome(COMPLETE, self._record(c, res, timing, ex), ex.error, res.status,
                       ex.links)

    def _record(self, c: Claimed, res: FetchResult, timing: ItemTiming,
                extracted: Extracted | None = None) -> dict[str, Any]:
        timing.finished = time.monotonic()
        return page_record(c.url or "", res, self.fields, item=c.name, attempt=c.attempt,
                           consumer=self.consumer_id, timing=timing.fields(),
                           extracted=extracted)

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
