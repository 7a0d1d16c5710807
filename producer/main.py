"""``zkcrawl-producer``: listing pages and sitemaps (or a URL list) to normalized,
de-duplicated, batched offers with back-pressure into the root's partitions (SPEC §4;
:mod:`zkcrawl.producer.offerer`); with ``--watch``, again every INTERVAL until a signal
(:mod:`zkcrawl.producer.watch`).

``main(argv, env) -> ExitStatus`` runs in-process (tests); :func:`run` is the console entry.
Exit status, always with one line on stderr: 0 done or stopped by a signal (the summary says
how to continue; ``--watch`` too); 1 a listing page or sitemap could not be read, pages were
read and nothing offered (naming the selector), or the queue failed mid-run; 2 bad usage;
75 ZooKeeper unreachable.

The work runs in one producer thread; the main thread turns the first SIGINT/SIGTERM into
"stop reading" (what was extracted is offered, the seen state saved, exit 0); a second one
has its default action. Signal handling is :mod:`zkcrawl.signals`'s, set up here only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, BinaryIO

import structlog

from zkcrawl import runner
from zkcrawl.errors import ExitStatus, UsageError, ZkCrawlError, ZkUnavailable
from zkcrawl.politeness.local import LocalPoliteness
from zkcrawl.producer import dryrun, listing, watch
from zkcrawl.producer.dryrun import DryOfferer
from zkcrawl.producer.follow import Follower
from zkcrawl.producer.offerer import Offerer, held_bound, partition_bound
from zkcrawl.producer.recrawl import Recrawler, RecrawlStore, Schedule, parse_duration, store_path
from zkcrawl.producer.settings import ProducerSettings
from zkcrawl.producer.sitemaps import SitemapFile, SitemapSource
from zkcrawl.producer.summary import Counts, Progress, problem, report
from zkcrawl.queue.discovered import DiscoveredReader
from zkcrawl.queue.fetched import FetchedReader
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_offers import PartitionOffers, recorded_partitions
from zkcrawl.queue.registry import Registration, default_id
from zkcrawl.seen import SeenSet
from zkcrawl.settings import ArgumentParser, add_options, parse
from zkcrawl.signals import StopSignals, thread_dump_on_sigusr1
from zkcrawl.textsafe import printable
from zkcrawl.web.addresses import BLOCKED_ADDRESS
from zkcrawl.web.extract import DEFAULT_LINKS_XPATH
from zkcrawl.web.fetch import Fetcher, FetchSettings
from zkcrawl.web.urls import LinkFilter, compile_patterns, drop_reason, host_of, normalize_url
from zkcrawl.zk import ConnectionLoss, SessionExpiredError, ZkClient

PROG = "zkcrawl-producer"
STDIN_SOURCE = "stdin"
_LOGGED_REJECTS = 20  # rejected --from-file lines logged one by one; the rest are counted

log = structlog.get_logger("producer")  # lazy: bound after logs.configure()

def use_partitions(zk: ZkClient, root: str, wanted: int) -> int:
    """The root's P to offer into; a new root gets ``wanted`` (0: the default P) recorded;
    hostile root data is exit 2."""
    return recorded_partitions(zk, root, wanted)


@dataclass(frozen=True)
class Plan:
    """Everything validated before any connection is made (bad input: exit 2 at once)."""

    settings: ProducerSettings
    producer_id: str
    link_filter: LinkFilter
    selectors: listing.Selectors | None
    starts: tuple[str, ...]
    template_urls: tuple[str, ...]
    follow_filter: LinkFilter  # --follow: --same-host compares with the linking page
    since: float | None = None  # --since as a Unix time
    watch_interval: float | None = None  # --watch in seconds


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog=PROG, description="Offer item URLs from listing pages (or a file) to the "
        "zkcrawl queue: normalized, de-duplicated, batched, with back-pressure.")
    add_options(parser, ProducerSettings)
    return parser


def make_plan(s: ProducerSettings) -> Plan:
    """Compile and check every user expression now: one line and exit 2 if any is bad."""
    from_file = s.from_file is not None
    link_filter = LinkFilter(allow=compile_patterns(s.allow, "--allow"),
                             deny=compile_patterns(s.deny, "--deny"),
                             same_host=s.same_host and not from_file,
                             strip_params=tuple(p for p in s.strip_param if p))
    if s.from_file not in (None, "-") and not os.access(s.from_file, os.R_OK):
        raise UsageError(f"--from-file: cannot read {s.from_file}")
    selectors = None if from_file else listing.compile_selectors(s.links, s.links_css, s.next)
    starts = listing.check_start_urls(s.start)
    template: tuple[str, ...] = ()
    if s.pages:
        template = tuple(listing.expand_template(s.pages,
                                                 listing.parse_range(s.page_range or "")))
    follow_filter = dataclasses.replace(link_filter, same_host=s.same_host)
    for url in (*s.sitemap, *s.sitemaps_from_robots):
        if normalize_url(url) is None:
            raise UsageError(f"--sitemap/--sitemaps-from-robots: not an absolute http(s) "
                             f"URL: {url!r}")
    since = watch.parse_since(s.since) if s.since is not None else None
    interval = watch.parse_duration(s.watch) if s.watch is not None else None
    return Plan(s, s.id or default_id(), link_filter, selectors, starts, template,
                follow_filter, since, interval)


def classify_link(link_filter: LinkFilter, link: str, source: str) -> tuple[str | None, str]:
    """``(normalized URL, "")`` for a link found on listing ``source`` that passes the
    filters, else ``(None, reason)``: javascript, mailto, data, scheme, invalid, too-long,
    deny, not-allowed, other-host (``zkcrawl try`` shows the same reasons)."""
    norm, reason = link_filter.check(link, source)
    if norm is not None:
        return norm, ""
    if reason == "scheme":  # say which: javascript, mailto, data, other
        reason = drop_reason(link, source) or "scheme"
    return None, reason or "invalid"


#: The note of a listing page or sitemap the address guard refused (the first of each host).
BLOCKED_NOTE = ("the address guard refused this host's address (loopback, private, "
                "link-local or reserved). If the site is yours, run the producer with "
                "--allow-private-addresses (and the consumers too)")


class Producer:
    """One run: read listings or lines, filter, de-duplicate, offer. Runs in one thread."""

    def __init__(self, plan: Plan, offerer: Offerer | DryOfferer, counts: Counts,
                 fetcher: Fetcher | None, stop: threading.Event) -> None:
        self.plan = plan
        self.offerer = offerer
        self.counts = counts
        self.fetcher = fetcher
        self.stop = stop
        self.new = 0  # URLs offered that were not offered before (--watch's measure)
        self._blocked_hosts: set[str] = set()  # hosts whose refusal named the flag
        self._rejects_logged = 0
        s = plan.settings
        counts.selector = (f"--links-css {s.links_css}" if s.links_css is not None
                           else f"--links {s.links or DEFAULT_LINKS_XPATH}")

    # -- listings -----------------------------------------------------------
    def run_listings(self) -> None:
        assert self.fetcher is not None and self.plan.selectors is not None
        walk = listing.Walk(self.fetcher, self.plan.selectors, self.plan.settings.max_pages,
                            self.stop)
        for page in walk.follow(self.plan.starts):
            self._take_page(page)
        for page in walk.template(self.plan.template_urls):
            self._take_page(page)

    def _take_page(self, page: listing.ListingPage) -> None:
        if self.stop.is_set() and page.error in ("cancelled", "connection"):
            return  # cut short by the stop itself: not the site's fault
        if page.skipped:
            self.counts.pages_skipped[page.skipped] += 1
            if page.skipped != "loop":
                log.warning("listing.skipped", url=page.url, reason=page.skipped,
                            status=page.status)
            return
        if page.error:
            self.counts.pages_failed.append((page.url, page.error))
            log.error("listing.failed", url=page.url, error=page.error, status=page.status,
                      **self._blocked_note(page.url, page.error))
            return
        self.counts.pages_read += 1
        self.counts.links_found += len(page.links)
        self._diagnose(page)
        before = (self.counts.offered + self.offerer.pending, self.counts.duplicates)
        self._take_links(page.links, page.final_url)
        # One transaction per page at least, not waited for: consumers start on this page's
        # articles while the walk fetches the next (the walk's end waits for them all).
        self.offerer.push()
        log.info("listing.page", url=page.url, status=page.status, links=len(page.links),
                 new=self.counts.offered + self.offerer.pending - before[0],
                 duplicates=self.counts.duplicates - before[1],
                 elapsed_ms=round(page.elapsed_ms, 1))

    def _blocked_note(self, url: str, error: str | None) -> dict[str, str]:
        """``{"note": ...}`` naming ``--allow-private-addresses`` for the first page of a
        host the address guard refused, as the consumer's ``address.blocked`` does."""
        host = host_of(url)
        if error != BLOCKED_ADDRESS or host in self._blocked_hosts:
            return {}
        self._blocked_hosts.add(host)
        return {"note": BLOCKED_NOTE}

    def _diagnose(self, page: listing.ListingPage) -> None:
        """A selector that selects nothing is a warning naming it, with what the page has."""
        c, url = self.counts, printable(page.url, 500)
        if not page.links:
            c.no_links += 1
            c.no_links_url = c.no_links_url or url
            log.warning("listing.no_links", url=url, selector=c.selector,
                        anchors=listing.describe_anchors(page.anchors, page.anchor_classes),
                        hint=f"check it with `zkcrawl try {url}`")
        nxt = self.plan.settings.next
        if page.first and nxt and page.next_url is None:
            log.warning("listing.no_next", url=url, next=nxt, hint="--next found no link "
                        f"on the first page, so the walk ends there: check it with "
                        f"`zkcrawl try {url} --next {shlex.quote(nxt)}`")

    def _take_links(self, links: list[str], source: str) -> None:
        link_filter = self.plan.link_filter
        for link in links:
            norm, reason = classify_link(link_filter, link, source)
            if norm is None:
                self.counts.dropped[reason] += 1
                continue
            if self.offerer.add(norm, source):
                self.new += 1

    # -- sitemaps (producer/sitemaps.py) -------------------------------------
    def run_sitemaps(self, source: SitemapSource) -> tuple[int, int]:
        """Offer the URLs of every sitemap of ``source``; (files read, files failed)."""
        read = failed = 0
        for sm in source.walk(self.stop):
            if self.stop.is_set() and sm.error in ("cancelled", "connection"):
                break  # cut short by the stop itself
            read += 1
            failed += not self._take_sitemap(sm)
        self.offerer.flush()
        walked = source.last
        log.info("sitemap.pass", files=read, failed=failed,
                 unchanged=walked.unchanged if walked else 0)
        return read, failed

    def _take_sitemap(self, sm: SitemapFile) -> bool:
        if sm.failed:
            self.counts.pages_failed.append((sm.url, sm.error or "failed"))
            log.error("sitemap.failed", url=sm.url, error=sm.error, status=sm.status,
                      **self._blocked_note(sm.url, sm.error))
            return False
        if sm.error or sm.problems:
            log.warning("sitemap.problems", url=sm.url, error=sm.error,
                        problems=dict(sm.problems))
        self.counts.links_found += len(sm.urls)
        if sm.older:
            self.counts.dropped["older"] += sm.older
        before = (self.new, self.counts.duplicates)
        self._take_links([e.loc for e in sm.urls], sm.url)
        self.offerer.flush()
        log.info("sitemap.read", url=sm.url, kind=sm.kind, depth=sm.depth,
                 urls=len(sm.urls), sitemaps=sm.children, older=sm.older,
                 new=self.new - before[0], duplicates=self.counts.duplicates - before[1],
                 elapsed_ms=round(sm.elapsed_ms, 1))
        return True

    # -- --watch (producer/watch.py) ------------------------------------------
    def watch_pass(self, p: watch.Pass, first: bool, source: SitemapSource | None) -> None:
        """One pass: the whole walk the first time, then at most --watch-depth pages per
        walk, each walk stopping at the first page that brings nothing new."""
        self.counts.pages_failed.clear()  # a long watch keeps the last pass's failures only
        pages, new = self.counts.pages_read, self.new
        if self.plan.starts or self.plan.template_urls:
            if first:
                self.run_listings()
            else:
                self._shallow_listings(self.plan.settings.watch_depth)
        if source is not None and not self.stop.is_set():
            p.sitemaps, _failed = self.run_sitemaps(source)
        self.offerer.flush()
        p.pages = self.counts.pages_read - pages
        p.failed = len(self.counts.pages_failed)
        p.new = self.new - new

    def _shallow_listings(self, depth: int) -> None:
        assert self.fetcher is not None and self.plan.selectors is not None
        walk = listing.Walk(self.fetcher, self.plan.selectors, 0, self.stop)
        walks = [walk.follow([start]) for start in self.plan.starts]
        if self.plan.template_urls:
            walks.append(walk.template(self.plan.template_urls))
        for pages in walks:
            for n, page in enumerate(pages, 1):
                before = self.new
                self._take_page(page)
                if n >= depth or self.new == before:
                    break

    # -- --from-file ----------------------------------------------------------
    def run_file(self, chunks: Iterator[listing.Lines], source: str, size_hint: int = 0
                 ) -> None:
        add = self.offerer.add
        counts = self.counts
        for checked in listing.checked_chunks(chunks, self.plan.link_filter, self.stop,
                                              size_hint):
            counts.lines_read += len(checked)
            for lineno, norm, reason, text in checked:
                if norm is not None:
                    add(norm, source)
                elif reason in ("invalid", "scheme", "not-utf8"):
                    why = "not UTF-8" if reason == "not-utf8" else "not an http(s) URL"
                    self._reject(source, lineno, text, why)
                else:
                    counts.dropped[reason or "invalid"] += 1
            if len(checked) < listing.LINES_PER_CHUNK:
                # A short chunk means the input is slow (a stream): offer now, not at EOF.
                self.offerer.flush()
        self.offerer.flush()

    def _reject(self, source: str, lineno: int, text: str, why: str) -> None:
        self.counts.rejected += 1
        if self._rejects_logged < _LOGGED_REJECTS:
            self._rejects_logged += 1
            log.warning("producer.rejected", source=source, line=lineno, text=text[:200],
                        reason=why)
        elif self._rejects_logged == _LOGGED_REJECTS:
            self._rejects_logged += 1
            log.warning("producer.rejected_more", hint="further rejected lines are only "
                        "counted (see producer.summary)")


def _open_input(path: str) -> tuple[BinaryIO, str, bool]:
    """(binary stream, meta.source, whether we must close it)."""
    if path == "-":
        return sys.stdin.buffer, STDIN_SOURCE, False
    try:
        return open(path, "rb"), path, True
    except OSError as exc:
        raise UsageError(f"--from-file: cannot read {path}: {exc.strerror or exc}") from None


def _fetch_settings(s: ProducerSettings) -> FetchSettings:
    return FetchSettings(user_agent=s.user_agent, connect_timeout=min(5.0, s.timeout),
                         timeout=s.timeout, max_bytes=s.max_bytes, retries=s.retries,
                         retry_after_cap=60.0, robots=s.robots,
                         guard=s.address_guard())


def _fetcher(s: ProducerSettings, politeness: LocalPoliteness | None = None) -> Fetcher:
    return Fetcher(_fetch_settings(s), politeness=politeness or LocalPoliteness(s.delay),
                   http=s.http)


def _fetchers(plan: Plan) -> tuple[Fetcher | None, SitemapSource | None]:
    """The listing fetcher and the sitemap source (None when not needed), sharing one
    politeness: a host serving both gets --delay between any two of our requests."""
    s = plan.settings
    if s.from_file is not None:
        return None, None
    politeness = LocalPoliteness(s.delay)
    source = None
    if s.sitemap_input:
        source = SitemapSource(s.sitemap, s.sitemaps_from_robots, _fetch_settings(s),
                               politeness, s.http, since=plan.since,
                               since_age=watch.age_of(s.since))
    return _fetcher(s, politeness), source


def _run_thread(target: Callable[[], object], signals: StopSignals,
                on_stop: Callable[[int], object]) -> BaseException | None:
    """Run ``target`` in the producer thread; return what it raised, if anything. The first
    SIGINT/SIGTERM calls ``on_stop(signum)`` in this (main) thread, not in the handler."""
    failure: list[BaseException] = []

    def body() -> None:
        try:
            target()
        except BaseException as exc:  # handed to the main thread, which reports it
            failure.append(exc)

    # daemon: after a second, forcing signal the process must be able to exit.
    worker = threading.Thread(target=body, name="producer", daemon=True)
    worker.start()
    signals.join(worker, on_stop)  # signal handlers run in this (main) thread meanwhile
    return failure[0] if failure else None


class _ProducerRun:
    """The parts of one run that need starting and, whatever happens, stopping."""

    def __init__(self, plan: Plan, seen: SeenSet, zk: ZkClient, stop: threading.Event,
                 progress_to: IO[str] | None) -> None:
        s = self.settings = plan.settings
        self.plan, self.seen, self.zk, self.stop = plan, seen, zk, stop
        self.counts = Counts()
        self.fetcher, self.sitemaps = _fetchers(plan)
        self.watcher: watch.Watcher | None = None
        self.reg = Registration(zk, Layout.of(s.root).producer(plan.producer_id),
                                self.counts.status)
        self.progress = Progress(self.counts, progress_to) if progress_to else None
        self.registered = False
        self.offerer: Offerer | None = None
        self.recrawl: RecrawlStore | None = None  # --recrawl: set by execute()

    def set_state(self, state: str) -> None:
        self.counts.state = state
        self.reg.refresh()

    def on_stop(self, signum: int) -> None:
        """SIGINT/SIGTERM: stop reading; what was extracted is still offered."""
        log.info("producer.stopping", signal=signal.Signals(signum).name)
        self.counts.interrupted = signal.Signals(signum).name
        self.stop.set()
        if self.fetcher is not None:
            self.fetcher.close()  # cuts a listing fetch or a Retry-After wait short
        if self.sitemaps is not None:
            self.sitemaps.close()

    def start(self) -> None:
        s, plan = self.settings, self.plan
        partitions = use_partitions(self.zk, s.root, s.partitions)
        bound = partition_bound(s.max_depth, partitions, s.max_partition_depth)
        self.offerer = Offerer(
            PartitionOffers(self.zk, s.root, partitions), self.seen, self.counts,
            producer_id=plan.producer_id, batch=s.batch, max_depth=s.max_depth,
            max_partition_depth=bound,
            max_held=held_bound(s.max_depth, s.batch, s.max_held), stop=self.stop,
            on_state=self.set_state, **_recrawl_offers(self.recrawl))
        log.info("producer.partitions", partitions=partitions, max_depth=s.max_depth,
                 max_partition_depth=bound, max_held=self.offerer.max_held)
        # An --id reused right after a crash: its old session may still hold the node.
        self.reg.start(wait_free=s.session_timeout + 1)
        self.registered = True
        self.set_state("reading" if s.from_file is None else "offering")
        if self.progress:
            self.progress.start()

    def work(self) -> None:
        assert self.offerer is not None
        producer = Producer(self.plan, self.offerer, self.counts, self.fetcher, self.stop)
        if self.plan.watch_interval is not None:
            self._watch(producer, self.plan.watch_interval)
        elif self.settings.from_file is not None:
            _run_file(producer, self.settings.from_file)
        else:
            if self.plan.starts or self.plan.template_urls:
                producer.run_listings()
            if self.sitemaps is not None:
                producer.run_sitemaps(self.sitemaps)
        self.counts.state = "flushing"
        self.offerer.drain()  # items held for full partitions too (state waiting meanwhile)
        if self.settings.follow:
            self.set_state("following")
            self._follower().run()
            self.offerer.drain()
        if self.recrawl is not None:
            self.set_state("recrawling")
            self._recrawl_pass()

    def _recrawl_pass(self) -> None:
        """--recrawl: learn <root>/fetched/, offer what is due (zkcrawl.producer.recrawl)."""
        assert self.offerer is not None and self.recrawl is not None
        done = Recrawler(self.recrawl, FetchedReader(self.zk, self.settings.root),
                         self.offerer, batch=self.settings.batch, stop=self.stop).run_pass()
        self.counts.offered += done.reoffered

    def _watch(self, producer: Producer, interval: float) -> None:
        """--watch: passes until SIGTERM; the status node carries the last one."""
        def one(p: watch.Pass, first: bool) -> None:
            self.set_state("reading")
            producer.watch_pass(p, first, self.sitemaps)
            if self.recrawl is not None:  # --recrawl: learn and re-offer every pass too
                producer.offerer.flush()  # self.offerer, as work() built the Producer
                self._recrawl_pass()

        watcher = self.watcher = watch.Watcher(one, interval, self.stop,
                                               on_pass=lambda: self.set_state("watching"))
        self.reg.status = lambda: {**self.counts.status(), "watch": watcher.status()}
        watcher.run()

    def _follower(self) -> Follower:
        assert self.offerer is not None
        s = self.settings
        return Follower(DiscoveredReader(self.zk, s.root), self.offerer,
                        self.plan.follow_filter, self.counts, max_link_depth=s.max_link_depth,
                        queue_depth=self.offerer.feed.pq.depth, stop=self.stop)

    def finish(self) -> None:
        if self.progress:
            self.progress.stop()
        if self.fetcher is not None:
            self.fetcher.close()
        if self.sitemaps is not None:
            self.sitemaps.close()
        if self.offerer is not None:
            self.offerer.close()  # counts and logs what a stop or a failure left un-offered
        self.seen.close()  # holds only offered URLs: saving is right even after a failure
        if self.recrawl is not None:
            self.recrawl.close()
        self.counts.state = "done"
        if self.registered:  # never delete a node that another live producer holds
            self.reg.stop()
        self.zk.close()


def execute(plan: Plan, stop: threading.Event | None = None,
            progress_to: IO[str] | None = None, table_to: IO[str] | None = None) -> ExitStatus:
    """Connect, register, run, report; progress line and final table go to TTYs only."""
    s = plan.settings
    seen = SeenSet.open(s.seen, s.expected, s.fp_rate)
    store = _open_recrawl(s)  # a bad store: exit 2 before any connection
    run = _ProducerRun(plan, seen, runner.connect(s, writes=True), stop or threading.Event(),
                       progress_to)
    run.recrawl = store
    # The handlers stay ours through the wind-down: a SIGTERM that comes just after the work
    # ended by itself (ZooKeeper killed under it, say) must not get the default action while
    # the seen state is saved -- it did, now and then, and the process died unsaved (-15).
    with StopSignals(hard_second=True) as signals, thread_dump_on_sigusr1():
        try:
            run.start()
            failure = _run_thread(run.work, signals, run.on_stop)
        finally:
            run.finish()
            report(run.counts, s.from_file is not None, table_to, s.seen)
    if failure is not None:
        raise _as_error(failure)
    if run.watcher is not None:  # stopped by a signal; each pass logged its failures
        return ExitStatus.OK
    return _outcome(run.counts)


def _outcome(counts: Counts) -> ExitStatus:
    """0, or 1: a listing page could not be read (listed in the summary), or pages were
    read and nothing offered (one line naming the selector, SPEC §4)."""
    why = problem(counts)
    if why is not None and not counts.pages_failed:
        raise ZkCrawlError(why)
    return ExitStatus.FAILURE if counts.pages_failed or why else ExitStatus.OK


def execute_dry_run(plan: Plan, out: IO[str]) -> ExitStatus:
    """``--dry-run``: the same walk, filters and de-duplication, the URLs printed to ``out``
    instead of offered; no ZooKeeper, the ``--seen`` state read and never saved."""
    s = plan.settings
    seen = SeenSet.open(s.seen, s.expected, s.fp_rate)  # never closed: closing saves it
    counts = Counts()
    fetcher, sitemaps = _fetchers(plan)
    producer = Producer(plan, DryOfferer(seen, counts, out), counts, fetcher,
                        threading.Event())
    try:
        if s.from_file is None:
            producer.run_listings()
            if sitemaps is not None:
                producer.run_sitemaps(sitemaps)
        else:
            _run_file(producer, s.from_file)
    finally:
        if fetcher is not None:
            fetcher.close()
        if sitemaps is not None:
            sitemaps.close()
        dryrun.finish(counts, s.from_file is not None)
    return _outcome(counts)


def _open_recrawl(s: ProducerSettings) -> RecrawlStore | None:
    """The --recrawl store (UsageError, exit 2, for a foreign, damaged or newer file)."""
    path = store_path(s.seen, s.recrawl_store)
    if not s.recrawl or path is None:
        return None
    return RecrawlStore(path, Schedule(parse_duration(s.recrawl_min, "--recrawl-min"),
                                       parse_duration(s.recrawl_max, "--recrawl-max")))


def _recrawl_offers(store: RecrawlStore | None) -> dict[str, Any]:
    """The Offerer's --recrawl hooks: first offers ask for a report, and enter the store."""
    if store is None:
        return {}
    return {"meta": {"recrawl": {}}, "on_offered": store.add_new}


def _run_file(producer: Producer, path: str) -> None:
    stream, source, owned = _open_input(path)
    try:
        producer.run_file(listing.LineReader(stream, producer.stop).chunks(), source,
                          _size_of(stream))
    finally:
        if owned:
            with contextlib.suppress(OSError):
                stream.close()


def _size_of(stream: BinaryIO) -> int:
    """Size of a regular file (0 for a pipe or a terminal): a long list gets workers at once."""
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def _as_error(exc: BaseException) -> BaseException:
    if isinstance(exc, ZkCrawlError | KeyboardInterrupt):
        return exc
    if isinstance(exc, ConnectionLoss | SessionExpiredError):
        # ZooKeeper went away mid-run (not a bug): one line, exit 75 so a supervisor retries;
        # what was not committed is counted as un-offered and the next run offers it.
        return ZkUnavailable(f"ZooKeeper unreachable while offering ({exc}); the seen state "
                             "holds what was offered, the next run offers the rest")
    log.error("producer.crashed", exc_info=exc)
    return ZkCrawlError(f"internal error: {exc!r} (details in the log)")


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ExitStatus:
    """Parse, validate, then run; every error is one line on stderr and an exit status."""
    env = os.environ if env is None else env

    def work() -> ExitStatus:
        settings, _ns = parse(ProducerSettings, build_parser(), argv, env)
        plan = make_plan(settings)
        runner.setup_logging(settings)
        if settings.same_host and settings.from_file is not None and not settings.follow:
            log.warning("producer.same_host_ignored", hint="--same-host compares with the "
                        "listing page's host; --from-file has none (with --follow it "
                        "applies to the links followed)")
        if settings.dry_run:
            return execute_dry_run(plan, sys.stdout)
        return execute(plan, progress_to=sys.stderr if sys.stderr.isatty() else None,
                       table_to=sys.stdout if sys.stdout.isatty() else None)

    return runner.guarded(PROG, work)


run = runner.entry(main)

if __name__ == "__main__":
    run()
