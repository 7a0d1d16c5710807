"""``zkcrawl-producer``: listing pages (or a URL list) to normalized, de-duplicated, batched
offers with back-pressure (SPEC §4).

``main(argv, env) -> ExitStatus`` runs in-process (tests call it); :func:`run` is the console
entry. Exit status: 0 done (or stopped by SIGINT/SIGTERM), 1 a listing page could not be read
(reported in the summary) or the queue failed mid-run, 2 bad usage (bad XPath/CSS/regex/
template/range, nothing to read, unreachable ZooKeeper) -- always one line on stderr.

The work runs in one producer thread; the main thread only waits and turns SIGINT/SIGTERM
into "stop reading": the producer then offers what it already extracted, the seen state is
saved, and the process exits 0. A second signal has its default action (SIGINT: interrupted,
exit 1; SIGTERM: the process ends). Signal handling is :mod:`zkcrawl.signals`'s, set up here
and nowhere else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, BinaryIO

import structlog

from producer import dryrun, listing
from producer.dryrun import DryOfferer
from producer.follow import Follower
from producer.offerer import Offerer
from producer.settings import ProducerSettings
from producer.summary import Counts, Progress, report
from zkcrawl import runner
from zkcrawl.errors import ExitStatus, UsageError, ZkCrawlError, ZkUnavailable
from zkcrawl.politeness.local import LocalPoliteness
from zkcrawl.queue.discovered import DiscoveredReader
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.leases import LeaseQueue
from zkcrawl.queue.registry import Registration, default_id
from zkcrawl.seen import SeenSet
from zkcrawl.settings import ArgumentParser, add_options, parse
from zkcrawl.signals import StopSignals
from zkcrawl.web.fetch import Fetcher, FetchSettings
from zkcrawl.web.urls import LinkFilter, compile_patterns, drop_reason
from zkcrawl.zk import ConnectionLoss, SessionExpiredError, ZkClient

PROG = "zkcrawl-producer"
STDIN_SOURCE = "stdin"
_LOGGED_REJECTS = 20  # rejected --from-file lines logged one by one; the rest are counted

log = structlog.get_logger("producer")  # lazy: bound after logs.configure()


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
    return Plan(s, s.id or default_id(), link_filter, selectors, starts, template,
                follow_filter)


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


class Producer:
    """One run: read listings or lines, filter, de-duplicate, offer. Runs in one thread."""

    def __init__(self, plan: Plan, offerer: Offerer | DryOfferer, counts: Counts,
                 fetcher: Fetcher | None, stop: threading.Event) -> None:
        self.plan = plan
        self.offerer = offerer
        self.counts = counts
        self.fetcher = fetcher
        self.stop = stop
        self._rejects_logged = 0

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
            log.error("listing.failed", url=page.url, error=page.error, status=page.status)
            return
        self.counts.pages_read += 1
        self.counts.links_found += len(page.links)
        before = (self.counts.offered + self.offerer.pending, self.counts.duplicates)
        self._take_links(page.links, page.final_url)
        # One transaction per page at least: consumers start while the walk goes on.
        self.offerer.flush()
        log.info("listing.page", url=page.url, status=page.status, links=len(page.links),
                 new=self.counts.offered + self.offerer.pending - before[0],
                 duplicates=self.counts.duplicates - before[1],
                 elapsed_ms=round(page.elapsed_ms, 1))

    def _take_links(self, links: list[str], source: str) -> None:
        link_filter = self.plan.link_filter
        for link in links:
            norm, reason = classify_link(link_filter, link, source)
            if norm is None:
                self.counts.dropped[reason] += 1
                continue
            self.offerer.add(norm, source)

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


def _fetcher(s: ProducerSettings) -> Fetcher:
    fs = FetchSettings(user_agent=s.user_agent, connect_timeout=min(5.0, s.timeout),
                       timeout=s.timeout, max_bytes=s.max_bytes, retries=s.retries,
                       retry_after_cap=60.0, robots=s.robots,
                       guard=s.address_guard())
    return Fetcher(fs, politeness=LocalPoliteness(s.delay), http=s.http)


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


class _Run:
    """The parts of one run that need starting and, whatever happens, stopping."""

    def __init__(self, plan: Plan, seen: SeenSet, zk: ZkClient, stop: threading.Event,
                 progress_to: IO[str] | None) -> None:
        s = self.settings = plan.settings
        self.plan, self.seen, self.zk, self.stop = plan, seen, zk, stop
        self.counts = Counts()
        self.fetcher = None if s.from_file else _fetcher(s)
        self.reg = Registration(zk, Layout.of(s.root).producer(plan.producer_id),
                                self.counts.status)
        self.progress = Progress(self.counts, progress_to) if progress_to else None
        self.registered = False
        self.offerer: Offerer | None = None

    def set_state(self, state: str) -> None:
        self.counts.state = state
        self.reg.refresh()

    def on_stop(self, signum: int) -> None:
        """SIGINT/SIGTERM: stop reading; what was extracted is still offered."""
        log.info("producer.stopping", signal=signal.Signals(signum).name)
        self.stop.set()
        if self.fetcher is not None:
            self.fetcher.close()  # cuts a listing fetch or a Retry-After wait short

    def start(self) -> None:
        s, plan = self.settings, self.plan
        q = LeaseQueue(self.zk, s.root, plan.producer_id, offer_batch=s.batch)
        self.offerer = Offerer(q, self.seen, self.counts, producer_id=plan.producer_id,
                               batch=s.batch, max_depth=s.max_depth, stop=self.stop,
                               on_state=self.set_state)
        # An --id reused right after a crash: its old session may still hold the node.
        self.reg.start(wait_free=s.session_timeout + 1)
        self.registered = True
        self.set_state("reading" if s.from_file is None else "offering")
        if self.progress:
            self.progress.start()

    def work(self) -> None:
        assert self.offerer is not None
        producer = Producer(self.plan, self.offerer, self.counts, self.fetcher, self.stop)
        if self.settings.from_file is not None:
            _run_file(producer, self.settings.from_file)
        elif self.plan.starts or self.plan.template_urls:
            producer.run_listings()
        self.counts.state = "flushing"
        self.offerer.flush()
        if self.settings.follow:
            self.set_state("following")
            self._follower().run()
            self.offerer.flush()

    def _follower(self) -> Follower:
        assert self.offerer is not None
        s = self.settings
        queue = self.offerer.queue
        return Follower(DiscoveredReader(self.zk, s.root), self.offerer,
                        self.plan.follow_filter, self.counts,
                        max_link_depth=s.max_link_depth, queue_depth=queue.depth,
                        stop=self.stop)

    def finish(self) -> None:
        if self.progress:
            self.progress.stop()
        if self.fetcher is not None:
            self.fetcher.close()
        if self.offerer is not None:
            self.offerer.close()  # counts and logs what a stop or a failure left un-offered
        self.seen.close()  # holds only offered URLs: saving is right even after a failure
        self.counts.state = "done"
        if self.registered:  # never delete a node that another live producer holds
            self.reg.stop()
        self.zk.close()


def execute(plan: Plan, stop: threading.Event | None = None,
            progress_to: IO[str] | None = None, table_to: IO[str] | None = None) -> ExitStatus:
    """Connect, register, run, report; progress line and final table go to TTYs only."""
    s = plan.settings
    seen = SeenSet.open(s.seen, s.expected, s.fp_rate)
    run = _Run(plan, seen, runner.connect(s), stop or threading.Event(), progress_to)
    try:
        run.start()
        with StopSignals(hard_second=True) as signals:
            failure = _run_thread(run.work, signals, run.on_stop)
        if failure is not None:
            raise _as_error(failure)
    finally:
        run.finish()
        report(run.counts, s.from_file is not None, table_to)
    return ExitStatus.FAILURE if run.counts.pages_failed else ExitStatus.OK


def execute_dry_run(plan: Plan, out: IO[str]) -> ExitStatus:
    """``--dry-run``: the same walk, filters and de-duplication, the URLs printed to ``out``
    instead of offered; no ZooKeeper, the ``--seen`` state read and never saved."""
    s = plan.settings
    seen = SeenSet.open(s.seen, s.expected, s.fp_rate)  # never closed: closing saves it
    counts = Counts()
    fetcher = None if s.from_file else _fetcher(s)
    producer = Producer(plan, DryOfferer(seen, counts, out), counts, fetcher,
                        threading.Event())
    try:
        if s.from_file is None:
            producer.run_listings()
        else:
            _run_file(producer, s.from_file)
    finally:
        if fetcher is not None:
            fetcher.close()
        dryrun.finish(counts, s.from_file is not None)
    return ExitStatus.FAILURE if counts.pages_failed else ExitStatus.OK


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
