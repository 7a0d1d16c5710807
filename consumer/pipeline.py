"""The per-item handler: :class:`ItemHandler` fetches one claimed item, extracts, builds its
record and decides its outcome (SPEC §3). It talks HTTP through the shared
:class:`~zkcrawl.web.fetch.Fetcher` and never touches ZooKeeper or the sink.

* success or a page cut at ``--max-bytes``: a record, *complete*; a failure that will not
  pass (4xx but 408/429, ``content-type``, ``robots``, ``redirects``, ``bad-url``): a record,
  *complete*;
* a failure that may pass (``timeout``, ``connection``, 408/429/5xx, robots.txt unreachable):
  *retry* after the host's back-off; after ``--max-attempts`` a record and a *dead* letter;
* a malformed item or a ``blocked-address``: a record and a *dead* letter at once;
* our own shutdown cancelled the fetch: *release*.

An item's ``attempt`` counts failed fetches and holder deaths (records say which); a
re-crawl item is fetched with its validators and reports a
:class:`~zkcrawl.queue.fetched.Fetched`. (The user's ``--pipeline`` stages are
:mod:`zkcrawl.consumer.results`.)
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import structlog

from zkcrawl.backoff import HOST_RETRY
from zkcrawl.consumer.processors import FieldWatch, Processors
from zkcrawl.consumer.timing import ItemTiming
from zkcrawl.page import Page
from zkcrawl.politeness.gate import HostGate
from zkcrawl.queue.claims import ABANDONED, DEATHS_META, Claimed
from zkcrawl.queue.discovered import LinkBounds
from zkcrawl.queue.fetched import Fetched
from zkcrawl.textsafe import redact_userinfo
from zkcrawl.web.addresses import BLOCKED_ADDRESS
from zkcrawl.web.fetch import Fetcher, FetchResult
from zkcrawl.web.robots import RobotsDecision
from zkcrawl.web.urls import host_of
from zkcrawl.web.validators import (
    Validators,
    clean_etag,
    clean_last_modified,
    content_signature,
)

log = structlog.get_logger(__name__)


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

_NO_ANSWER = frozenset({"connection", "timeout"})  # the host is down (or unreachable)
BLOCKED_HOSTS_KEPT = 10_000  # hosts remembered as warned about (bounded: a hostile frontier)


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
    fetched: Fetched | None = None  # a re-crawl item's report: to <root>/fetched/


_SECOND: tuple[int, str] = (-1, "")  # the last whole second iso_now formatted, and its text


def iso_now() -> str:
    """Now in UTC, ``2026-12-01T10:00:00.123Z`` (milliseconds truncated, like
    ``datetime.isoformat(timespec="milliseconds")``); the date and time of day are
    formatted once per second, not per record."""
    global _SECOND
    now = time.time()
    second = int(now)
    cached = _SECOND
    if cached[0] != second:
        text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        cached = _SECOND = (second, text)
    return f"{cached[1]}.{min(999, int((now - second) * 1000)):03d}Z"


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
    return Extracted(title, dict(result.fields), done.error or res.error, done.links,
                     result.skip, done.extract_ms)


def page_record(url: str, res: FetchResult, fields: Mapping[str, Any], *, item: str | None,
                attempt: int, consumer: str, timing: Mapping[str, float],
                extracted: Extracted | None = None, holder_deaths: int = 0
                ) -> dict[str, Any]:
    """The output record (SPEC §4) of ``url`` fetched as ``res``: what the consumer writes
    for it, and what ``zkcrawl try`` shows. ``timing``: the record's ``*_ms`` fields;
    ``extracted``: :func:`extract_page`'s result (default: the default processor's);
    ``holder_deaths``: how many of the ``attempt`` earlier tries were holders that died."""
    ex = extracted if extracted is not None else extract_page(url, res, fields)
    return output_record(url, res.final_url, res.status, ex.title, ex.fields, len(res.body),
                         item=item, attempt=attempt, fetched=True,
                         holder_deaths=holder_deaths, consumer=consumer, timing=timing,
                         error=ex.error)


def output_record(url: str | None, final_url: str | None, status: int | None,
                  title: str | None, fields: dict[str, Any], size: int, *,
                  item: str | None, attempt: int, fetched: bool, holder_deaths: int,
                  consumer: str, timing: Mapping[str, float], error: str | None
                  ) -> dict[str, Any]:
    """The one place an output record (SPEC §4) is built, its keys in their order.
    ``fetched``: this claim made a request (``fetches`` counts it); ``size``: the body's
    bytes (an unfetched item's: its data's). Credentials inside URLs are never recorded
    (``https://***@host/...``)."""
    return {"url": url and redact_userinfo(url),
            "final_url": final_url and redact_userinfo(final_url), "status": status,
            "title": title, "fields": fields, "bytes": size, "item": item,
            "attempt": attempt, "fetches": attempt - holder_deaths + (1 if fetched else 0),
            "holder_deaths": holder_deaths, "consumer": consumer, "fetched_at": iso_now(),
            **timing, "error": error}


def holder_deaths(c: Claimed) -> int:
    """Of ``c.attempt``, the claims whose holder died (:attr:`Claimed.holder_deaths`)."""
    return c.holder_deaths


def recrawl_report(url: str, res: FetchResult, previous: Validators,
                   record: Mapping[str, Any] | None) -> Fetched:
    """What ``<root>/fetched/`` learns from this fetch of a re-crawl item: the new
    validators (the previous ones kept for a 304 that repeats none), the signature of the
    body, and ``changed`` as recorded (None on a first fetch or a failure)."""
    changed = record.get("changed") if record is not None else None
    if res.not_modified:
        etag = clean_etag(res.headers.get("etag")) or previous.etag
        last = clean_last_modified(res.headers.get("last-modified")) or previous.last_modified
        return Fetched(url, res.status, False, etag, last, previous.signature, time.time())
    if not res.ok:  # a failure: nothing learnt about the page but its status
        return Fetched(url, res.status, None, previous.etag, previous.last_modified,
                       previous.signature, time.time())
    return Fetched(url, res.status, changed if isinstance(changed, bool) else None,
                   clean_etag(res.headers.get("etag")),
                   clean_last_modified(res.headers.get("last-modified")),
                   content_signature(res.body), time.time())


class ItemHandler:
    """Fetch + extract + record for one item; thread-safe (the Fetcher keeps one transport --
    a libcurl handle or a requests Session -- per thread, extraction is pure)."""

    def __init__(self, fetcher: Fetcher, gate: HostGate, fields: dict[str, Any],
                 consumer_id: str, max_attempts: int,
                 processors: Processors | None = None,
                 links: LinkBounds | None = None) -> None:
        self.fetcher = fetcher
        self.links = links  # bounds on the links found (issue #27): per page, discovered/
        self.gate = gate
        self.fields = fields
        # The page's code (consumer/processors.py); the default is title + --field.
        self.processors = processors or Processors.default_only(fields)
        self.consumer_id = consumer_id
        self.max_attempts = max_attempts
        self.field_watch = FieldWatch(fields)  # --field null on every page: warned once
        self._blocked_hosts: set[str] = set()  # hosts whose blocked-address was warned of
        self._blocked_lock = threading.Lock()

    def prepare(self, url: str, host: str) -> bool:
        """Load robots.txt for the host (cached) so a Crawl-delay is known before a slot is
        reserved. False: robots.txt disallows ``url``, no request will be made (the fetch
        reports ``robots`` at once), so no slot is needed. An unreachable robots.txt is no
        verdict: the item takes a slot like any other, so the host's back-off holds it."""
        return self._prepared(host, self.fetcher.robots(url))  # the fetch reuses it

    def prepare_cached(self, url: str, host: str) -> bool | None:
        """:meth:`prepare` from memory only: None when robots.txt would have to be read
        (the claim loop never waits for it)."""
        verdict = self.fetcher.robots_cached(url)
        return None if verdict is None else self._prepared(host, verdict)

    def _prepared(self, host: str, verdict: RobotsDecision) -> bool:
        if not verdict.allowed:
            return verdict.temporary
        if verdict.crawl_delay:
            self.gate.set_min_delay(host, verdict.crawl_delay)
        return True

    def process(self, c: Claimed, timing: ItemTiming, host: str | None = None) -> Outcome:
        """Run one item; never raises for a network or content problem. ``host`` is the
        host whose gate slot this fetch holds (``""``: none; None: the item's own host)."""
        if c.item is None:
            return self._malformed(c, timing)
        if c.abandoned(self.max_attempts):
            return self._abandoned(c, timing)
        host = host_of(c.item.url) if host is None else host
        validators = Validators.from_meta(c.item.meta.get("recrawl"))
        try:
            res = self.fetcher.fetch(c.item.url, validators, attempt=c.attempt)
        finally:
            if host:
                self.gate.finished(host)
        timing.fetched = time.monotonic()
        if res.status is not None and host:
            self.gate.host_up(host)  # it answered: a later failure backs off from the bottom
        if res.error == "cancelled":
            return Outcome(RELEASE, None, res.error, res.status)
        if res.retryable:
            out = self._retryable(c, res, timing)
        elif res.error == BLOCKED_ADDRESS:
            out = self._blocked(c, res, timing)
        elif res.not_modified:
            out = self._unchanged(c, res, timing)
        else:
            out = self._processed(c, res, timing, validators)
        if validators is not None and out.kind in (COMPLETE, DEAD):
            out.fetched = recrawl_report(c.item.url, res, validators, out.record)
        return out

    def _unchanged(self, c: Claimed, res: FetchResult, timing: ItemTiming) -> Outcome:
        """A 304 to our validators: a record ``changed: false``, nothing downloaded or
        extracted (the page's title and fields are those of the previous fetch's record)."""
        record = self._record(c, res, timing, Extracted(None, dict.fromkeys(self.fields), None))
        record["changed"] = False
        return Outcome(COMPLETE, record, None, res.status)

    def _blocked(self, c: Claimed, res: FetchResult, timing: ItemTiming) -> Outcome:
        """SPEC §3: the guard refused the address -- the consumer's configuration, not the
        page: a dead letter (undone by ``zkcrawl dead requeue --error blocked-address``),
        and the host's first one is a warning that names the flag."""
        host = host_of(res.final_url) or host_of(c.url or "")
        self._warn_blocked(host, c.url or "")
        return Outcome(DEAD, self._record(c, res, timing), res.error, res.status)

    def _warn_blocked(self, host: str, url: str) -> None:
        with self._blocked_lock:
            if host in self._blocked_hosts or len(self._blocked_hosts) >= BLOCKED_HOSTS_KEPT:
                return
            self._blocked_hosts.add(host)
        log.warning("address.blocked", host=host, url=redact_userinfo(url),
                    note="the address guard refused this host's address (loopback, private, "
                    "link-local or reserved): its items go to the dead letters. If the "
                    "site is yours, run the consumer with --allow-private-addresses, then "
                    "`zkcrawl dead requeue --error blocked-address`")

    def _retryable(self, c: Claimed, res: FetchResult, timing: ItemTiming) -> Outcome:
        host = host_of(res.final_url) or host_of(c.item.url if c.item else "")
        if host and res.status is None and res.error in _NO_ANSWER:
            self.gate.host_down(host)  # no answer: the host's own back-off, for all its items
        elif host and not res.backed_off:  # the fetcher holds a host that answered itself
            self.gate.back_off(host, HOST_RETRY.after(c.attempt, res.retry_after))
        if not c.may_retry(self.max_attempts):
            return Outcome(DEAD, self._record(c, res, timing), res.error, res.status)
        _carry_deaths(c)
        return Outcome(RETRY, None, res.error, res.status)

    def _processed(self, c: Claimed, res: FetchResult, timing: ItemTiming,
                   previous: Validators | None = None) -> Outcome:
        """A page that will not be fetched again: its processor's record, or the error's.
        ``previous``: the item's ``meta.recrawl`` validators (read by :meth:`process`)."""
        ex = extract_page(c.url or "", res, self.fields, self.processors,
                          c.item.meta if c.item is not None else None)
        timing.extract_ms = ex.extract_ms
        if ex.links and self.links is not None:
            ex.links, full = self.links.bound(c.url or "", ex.links)
            if full is not None:  # discovered/ stayed full: try the item later
                if not c.may_retry(self.max_attempts):
                    return Outcome(DEAD, {**self._record(c, res, timing, ex), "error": full},
                                   full, res.status)
                return Outcome(RETRY, None, full, res.status)
        if ex.error is None and self.fields and self.processors.pick(c.url or "") is \
                self.processors.default:
            self.field_watch.observe(ex.fields)
        if ex.skipped:
            timing.finished = time.monotonic()
            return Outcome(COMPLETE, None, ex.error, res.status, ex.links, skipped=True)
        record = self._record(c, res, timing, ex)
        if previous is not None and previous.previous and res.ok:
            # SPEC §4: absent on a first fetch; the signature decides for a body.
            record["changed"] = content_signature(res.body) != previous.signature
        return Outcome(COMPLETE, record, ex.error, res.status, ex.links)

    def _record(self, c: Claimed, res: FetchResult, timing: ItemTiming,
                extracted: Extracted | None = None) -> dict[str, Any]:
        timing.finished = time.monotonic()
        return page_record(c.url or "", res, self.fields, item=c.name, attempt=c.attempt,
                           consumer=self.consumer_id, timing=timing.fields(),
                           extracted=extracted, holder_deaths=holder_deaths(c))

    def _abandoned(self, c: Claimed, timing: ItemTiming) -> Outcome:
        """SPEC §3: its holders died ``c.deaths`` times; no fetch (it may be what kills
        them), a record and a dead letter ``abandoned``."""
        return self._unfetched(c, timing, ABANDONED, c.url)

    def _malformed(self, c: Claimed, timing: ItemTiming) -> Outcome:
        return self._unfetched(c, timing, c.error or "malformed", None)

    def _unfetched(self, c: Claimed, timing: ItemTiming, error: str, url: str | None
                   ) -> Outcome:
        timing.finished = time.monotonic()
        record = output_record(url, None, None, None, dict.fromkeys(self.fields), len(c.data),
                               item=c.name, attempt=c.attempt, fetched=False,
                               holder_deaths=holder_deaths(c), consumer=self.consumer_id,
                               timing=timing.fields(), error=error)
        return Outcome(DEAD, record, error)


def _carry_deaths(c: Claimed) -> None:
    """Before a retry: the holder deaths so far into the item's meta, which the re-offered
    item keeps (:func:`zkcrawl.queue.claims.retry_item` copies ``meta``)."""
    if c.item is None:
        return
    deaths = holder_deaths(c)
    if deaths or DEATHS_META in c.item.meta:
        c.item = dataclasses.replace(c.item, meta={**c.item.meta, DEATHS_META: deaths})
