"""Where URLs come from: the walk over listing pages (``--start`` + ``--next``, or ``--pages`` +
``--page-range``), or a URL list (``--from-file``), read without fetching. Pure apart from
fetching through :class:`zkcrawl.web.fetch.Fetcher`; the caller filters, de-duplicates and
offers.

* The walk reads a listing URL at most once per run (normalized, after redirects too), so a
  loop ends; at most ``max_pages`` pages; a set ``stop`` ends it before the next fetch.
* Nothing raises for network or HTTP trouble: a page comes back ``failed`` (exit 1) or
  ``skipped`` (robots.txt, not HTML).
* A listing page gives at most :data:`MAX_PAGE_LINKS` links (one ``listing.links_capped``
  warning beyond) and its ``<a>`` statistics (:func:`anchor_stats`).
* A URL list is read in chunks by a reader thread and checked by :func:`check_chunk`, in
  worker processes once the list is long enough to pay for them.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as stdqueue
import re
import signal
import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import lxml.etree
import structlog

from zkcrawl.errors import UsageError
from zkcrawl.web.extract import (
    DEFAULT_LINKS_XPATH,
    compile_css,
    compile_xpath,
    first_http_link,
    links_from_doc,
    parse_html,
)
from zkcrawl.web.fetch import Fetcher, FetchResult
from zkcrawl.web.urls import LinkFilter, normalize_url

log = structlog.get_logger(__name__)  # lazy: bound after logs.configure()

_PAGE_FIELD = re.compile(r"\{page(?::([^{}]*))?\}")
MAX_RANGE = 1_000_000
MAX_PAGE_LINKS = 10_000  # links kept from one listing page
# Fetch outcomes that mean "not a listing we can read" rather than "the site is down".
_SKIPPED = {"robots": "robots", "content-type": "not-html"}


@dataclass(frozen=True)
class Selectors:
    """Compiled ``--links`` / ``--links-css`` and ``--next`` expressions."""

    links: lxml.etree.XPath
    next: lxml.etree.XPath | None = None


@dataclass
class ListingPage:
    """What one listing URL gave: its links (absolute, not normalized) or why none."""

    url: str
    final_url: str
    status: int | None = None
    links: list[str] = field(default_factory=list)
    next_url: str | None = None
    error: str | None = None  # fetch error of a failed page (http-503, connection...)
    skipped: str | None = None  # robots, not-html, loop
    elapsed_ms: float = 0.0
    first: bool = False  # the first page of a --start (its --next must find something)
    anchors: int = 0  # <a> elements on the page (diagnostics of a selector)
    anchor_classes: list[tuple[str, int]] = field(default_factory=list)  # most common first

    @property
    def ok(self) -> bool:
        return self.error is None and self.skipped is None


def compile_selectors(links: str | None, links_css: str | None,
                      next_xpath: str | None) -> Selectors:
    """Compile the user's expressions once; a bad one is a :class:`UsageError` (exit 2)."""
    if links_css is not None:
        expr = compile_css(links_css, "--links-css")
    else:
        expr = compile_xpath(links or DEFAULT_LINKS_XPATH, "--links")
    nxt = compile_xpath(next_xpath, "--next") if next_xpath else None
    return Selectors(expr, nxt)


def check_start_urls(urls: Iterable[str]) -> tuple[str, ...]:
    """Each ``--start`` must be an absolute http(s) URL (else exit 2 now, not later)."""
    checked = []
    for url in urls:
        if normalize_url(url) is None:
            raise UsageError(f"--start: not an absolute http(s) URL: {url!r}")
        checked.append(url.strip())
    return tuple(checked)


def parse_range(text: str) -> range:
    """``"A-B"`` (inclusive, 0 <= A <= B) to a range; anything else is a UsageError."""
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    if not match:
        raise UsageError(f"--page-range: expected A-B (e.g. 1-50), got {text!r}")
    first, last = int(match.group(1)), int(match.group(2))
    if first > last:
        raise UsageError(f"--page-range: {first} is after {last}")
    if last - first + 1 > MAX_RANGE:
        raise UsageError(f"--page-range: more than {MAX_RANGE} pages")
    return range(first, last + 1)


def expand_template(template: str, pages: range) -> list[str]:
    """Listing URLs of ``--pages TEMPLATE`` for each page number.

    ``{page}`` (optionally with a format spec, ``{page:03d}``) is the only placeholder;
    other characters, braces included, are kept as they are. The result must be an
    absolute http(s) URL for every page, else UsageError.
    """
    fields = _PAGE_FIELD.findall(template)
    if not fields:
        raise UsageError(f"--pages: template has no {{page}} placeholder: {template!r}")
    urls = []
    for page in pages:
        def fill(m: re.Match[str], p: int = page) -> str:
            return format(p, m.group(1) or "")

        try:
            url = _PAGE_FIELD.sub(fill, template)
        except ValueError as exc:
            raise UsageError(f"--pages: bad format in {template!r}: {exc}") from None
        if normalize_url(url) is None:
            raise UsageError(f"--pages: template does not give an http(s) URL: {url!r}")
        urls.append(url)
    return urls


def _key(url: str) -> str:
    return normalize_url(url) or url


def read_page(fetcher: Fetcher, url: str, selectors: Selectors) -> ListingPage:
    """Fetch one listing page and extract its item links and next-page link."""
    return page_from_result(url, fetcher.fetch(url), selectors)


def page_from_result(url: str, res: FetchResult, selectors: Selectors) -> ListingPage:
    """What the producer takes from listing ``url`` fetched as ``res`` (also ``zkcrawl try``'s
    producer view)."""
    page = ListingPage(url=url, final_url=res.final_url or url, status=res.status,
                       elapsed_ms=res.elapsed_ms)
    if res.error in _SKIPPED and not res.retryable:
        page.skipped = _SKIPPED[res.error]
        return page
    if res.error == "too-large":
        # The first --max-bytes are still a listing: use them, but say so.
        log.warning("listing.truncated", url=url, bytes=len(res.body))
    elif res.error is not None:
        page.error = res.error  # robots.txt unreachable: its reason (connection...)
        return page
    if not _looks_like_html(res.body, res.content_type):
        page.skipped = "not-html"
        return page
    doc = parse_html(res.body, page.final_url, res.content_type)
    page.links = _capped(url, links_from_doc(doc, page.final_url, selectors.links))
    page.anchors, page.anchor_classes = anchor_stats(doc)
    if selectors.next is not None:
        page.next_url = first_http_link(links_from_doc(doc, page.final_url, selectors.next))
    return page


def _capped(url: str, links: list[str]) -> list[str]:
    if len(links) <= MAX_PAGE_LINKS:
        return links
    log.warning("listing.links_capped", url=url, kept=MAX_PAGE_LINKS,
                dropped=len(links) - MAX_PAGE_LINKS,
                reason=f"more than {MAX_PAGE_LINKS} links on one listing page")
    return links[:MAX_PAGE_LINKS]


#: How many of the most common ``<a>`` classes :func:`anchor_stats` keeps.
TOP_CLASSES = 5
_CLASS_SHOWN = 60  # characters of one class name kept (a page's classes are untrusted)


def anchor_stats(doc: lxml.etree._Element | None) -> tuple[int, list[tuple[str, int]]]:
    """(number of ``<a>`` elements, their :data:`TOP_CLASSES` most common classes with
    counts, most common first): what a ``--links-css`` could select. Never raises."""
    if doc is None:
        return 0, []
    count = 0
    classes: Counter[str] = Counter()
    for element in doc.iter("a"):
        count += 1
        value = element.get("class")
        if value:
            classes.update({c[:_CLASS_SHOWN] for c in value.split()})
    return count, classes.most_common(TOP_CLASSES)


def describe_anchors(anchors: int, classes: list[tuple[str, int]]) -> str:
    """``the page has 14 <a> elements; most common classes: post-link (6), nav (3)``."""
    text = f"the page has {anchors} <a> element{'s' if anchors != 1 else ''}"
    if classes:
        text += "; most common classes: " + ", ".join(f"{c} ({n})" for c, n in classes)
    elif anchors:
        text += ", none with a class"
    return text


def _looks_like_html(body: bytes, content_type: str | None) -> bool:
    """The fetcher rejects declared non-HTML types; an undeclared one must look like markup."""
    if content_type and content_type.split(";", 1)[0].strip():
        return True
    return b"<" in body[:2048]


class Walk:
    """Iterate over listing pages without ever reading one URL twice."""

    def __init__(self, fetcher: Fetcher, selectors: Selectors, max_pages: int,
                 stop: threading.Event) -> None:
        self.fetcher = fetcher
        self.selectors = selectors
        self.max_pages = max_pages
        self.stop = stop
        self.fetched = 0
        self._visited: set[str] = set()

    def _budget_left(self) -> bool:
        return not self.stop.is_set() and (self.max_pages == 0 or self.fetched < self.max_pages)

    def _visit(self, url: str) -> ListingPage:
        """Read ``url``; one already read comes back unfetched, ``skipped="loop"``."""
        key = _key(url)
        if key in self._visited:
            log.info("listing.loop", url=url, hint="this listing was already read in this run")
            return ListingPage(url=url, final_url=url, skipped="loop")
        self._visited.add(key)
        self.fetched += 1
        page = read_page(self.fetcher, url, self.selectors)
        final = _key(page.final_url)
        if final != key:
            if final in self._visited:
                # Redirected to a page we already read: its links are already offered.
                page.links, page.next_url, page.skipped = [], None, "loop"
            self._visited.add(final)
        return page

    def follow(self, starts: Iterable[str]) -> Iterator[ListingPage]:
        """From each start, follow the next-page link until none, a loop or the budget."""
        for start in starts:
            url: str | None = start
            first = True
            while url is not None and self._budget_left():
                page = self._visit(url)
                page.first, first = first, False
                yield page
                url = page.next_url if page.ok else None
        if not self._budget_left() and not self.stop.is_set():
            log.info("listing.max_pages", max_pages=self.max_pages)

    def template(self, urls: Iterable[str]) -> Iterator[ListingPage]:
        """Each URL of an expanded ``--pages`` template, once."""
        for url in urls:
            if not self._budget_left():
                if not self.stop.is_set():
                    log.info("listing.max_pages", max_pages=self.max_pages)
                return
            yield self._visit(url)


# -- URL lists (--from-file) ------------------------------------------------------------

LINES_PER_CHUNK = 2000
#: Lines checked in the producer thread before worker processes are worth starting
#: (their start-up costs about a second); a file at least POOL_FILE_BYTES long gets
#: them at once.
POOL_AFTER_LINES = 20_000
POOL_FILE_BYTES = 1_000_000
_CHUNKS_IN_FLIGHT = 4

Lines = list[tuple[int, bytes]]  # (line number, stripped line)
#: (line number, normalized URL or None, drop reason or None, text of a rejected line)
Checked = list[tuple[int, str | None, str | None, str]]

_worker_filter: LinkFilter | None = None


class LineReader:
    """Lines of a URL list in chunks, from a reader thread of its own.

    The thread exists because a read from stdin cannot be interrupted: on a stop the
    producer stops taking chunks and the (daemon) thread ends with the process. A long
    file arrives in full chunks; a slow stream (``tail -f urls | zkcrawl-producer
    --from-file -``) is handed over line by line within ``_LINGER`` seconds.
    """

    _LINGER = 0.2

    def __init__(self, stream: Iterable[bytes], stop: threading.Event) -> None:
        self.stream = stream
        self.stop = stop
        self._full: stdqueue.Queue[Lines | None] = stdqueue.Queue(maxsize=8)
        self._partial: Lines = []
        # Held while a chunk is cut and queued, so chunks are handed over in line order.
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, name="reader", daemon=True)

    def _read(self) -> None:
        try:
            for lineno, raw in enumerate(self.stream, 1):
                line = raw.strip()
                if not line or line.startswith(b"#"):
                    continue
                with self._lock:
                    self._partial.append((lineno, line))
                    if len(self._partial) >= LINES_PER_CHUNK:
                        self._full.put(self._partial)
                        self._partial = []
                if self.stop.is_set():
                    return
        except (OSError, ValueError) as exc:
            log.error("producer.read_failed", error=str(exc))
        finally:
            with self._lock:
                if self._partial:
                    self._full.put(self._partial)
                    self._partial = []
                self._full.put(None)

    def chunks(self) -> Iterator[Lines]:
        """Chunks in line order until the end of the input or a stop."""
        self._thread.start()
        while not self.stop.is_set():
            try:
                chunk = self._full.get(timeout=self._LINGER)
            except stdqueue.Empty:
                with self._lock:  # the input is slow: hand over what there is
                    chunk, self._partial = self._partial, []
                if not chunk:
                    continue
            if chunk is None:
                return
            yield chunk


def check_chunk(link_filter: LinkFilter | None, chunk: Lines) -> Checked:
    """Decode, normalize and filter lines (``None``: the worker's filter). Never raises."""
    check = (link_filter or _worker_filter or LinkFilter()).check
    out: Checked = []
    for lineno, raw in chunk:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            out.append((lineno, None, "not-utf8", raw.decode("utf-8", "backslashreplace")))
            continue
        norm, reason = check(text, "")
        out.append((lineno, norm, reason, "" if norm else text))
    return out


def _init_worker(link_filter: LinkFilter) -> None:
    # Ctrl-C reaches the whole process group; the producer process decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _worker_filter
    _worker_filter = link_filter


def _pool_size() -> int:
    """Leave one CPU to this process (de-duplication, transactions); at most two workers."""
    try:
        cpus = len(os.sched_getaffinity(0))  # what this process may use, not the host's
    except AttributeError:
        cpus = os.cpu_count() or 1
    return min(2, cpus - 1)


def checked_chunks(chunks: Iterable[Lines], link_filter: LinkFilter,
                   stop: threading.Event, size_hint: int = 0) -> Iterator[Checked]:
    """:func:`check_chunk` over ``chunks``, in order; worker processes for long lists.

    If the worker processes cannot start or die, the rest is checked in this thread
    (a warning says so): slower, never lost.
    """
    lines = POOL_AFTER_LINES if size_hint >= POOL_FILE_BYTES else 0
    pending: deque[tuple[Lines, Future[Checked] | None]] = deque()
    pool: ProcessPoolExecutor | None = None
    broken = False
    try:
        for chunk in chunks:
            if pool is None and not broken and lines >= POOL_AFTER_LINES and _pool_size() > 0:
                pool = _start_pool(link_filter)
            lines += len(chunk)
            future = _submit(pool, chunk)
            if pool is not None and future is None:  # unusable: go on without it
                pool.shutdown(wait=False, cancel_futures=True)
                pool, broken = None, True
            pending.append((chunk, future))
            if len(pending) >= _CHUNKS_IN_FLIGHT or pool is None:
                yield _result(link_filter, *pending.popleft())
            if stop.is_set():
                break
        while pending:  # already read, so extracted: offered too (the stop semantics)
            yield _result(link_filter, *pending.popleft())
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


_POOL_ERRORS = (BrokenProcessPool, RuntimeError, OSError, EOFError)


def _submit(pool: ProcessPoolExecutor | None, chunk: Lines) -> Future[Checked] | None:
    if pool is None:
        return None
    try:
        return pool.submit(check_chunk, None, chunk)
    except _POOL_ERRORS as exc:
        log.warning("producer.pool_failed", error=repr(exc), hint="checking in-process")
        return None


def _result(link_filter: LinkFilter, chunk: Lines, future: Future[Checked] | None) -> Checked:
    if future is not None:
        try:
            return future.result()
        except _POOL_ERRORS as exc:
            log.warning("producer.pool_failed", error=repr(exc), hint="checking in-process")
    return check_chunk(link_filter, chunk)


def _start_pool(link_filter: LinkFilter) -> ProcessPoolExecutor:
    # forkserver, not fork: this process runs kazoo and committer threads, and a fork
    # could copy a lock that one of them holds.
    ctx = multiprocessing.get_context("forkserver")
    log.debug("producer.pool", workers=_pool_size())
    return ProcessPoolExecutor(_pool_size(), mp_context=ctx, initializer=_init_worker,
                               initargs=(link_filter,))
