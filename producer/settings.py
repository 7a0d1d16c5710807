"""``zkcrawl-producer`` settings: one frozen dataclass, flags per SPEC §4.

Every field is a flag (``--max-depth``), an environment variable (``ZKCRAWL_MAX_DEPTH``)
and a TOML key (``max-depth`` / ``max_depth``); precedence flag > env > file > default.
:meth:`ProducerSettings.validate` checks what can be checked without the network, so a
bad value is one line and exit 2 before anything is fetched or offered: among others a Bloom
filter (``--expected`` at ``--fp-rate``) larger than :data:`MAX_BLOOM_BITS` (its allocation
failing aborts the process, no exception) and an ``--id`` ZooKeeper would refuse.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import ClassVar

from zkcrawl.errors import UsageError
from zkcrawl.queue.discovered import MAX_DEPTH as MAX_LINK_DEPTH
from zkcrawl.queue.partitions import MAX_PARTITIONS
from zkcrawl.settings.common import CommonSettings
from zkcrawl.settings.options import DEDUP, FETCHING, FILTERING, INPUT, POLITENESS, QUEUE, opt
from zkcrawl.settings.validate import header_value_problem, znode_path_problem
from zkcrawl.web.options import WebOptions

RECRAWL = "re-crawl"

#: Tracking parameters stripped when no ``--strip-param`` is given (fnmatch globs).
DEFAULT_STRIP = ("utm_*", "fbclid", "gclid", "dclid", "msclkid", "mc_cid", "mc_eid", "_ga")
DEFAULT_USER_AGENT = "zkcrawl-producer/0.1 (+https://github.com/zkcrawl/zkcrawl)"
#: Items per transaction: ~150 bytes each, so 500 stay far below the 1 MB request limit,
#: and the measured offer rate stops improving beyond a few hundred.
DEFAULT_BATCH = 500
#: Largest --seen Bloom filter (16 GiB): rbloom aborts the process when allocation fails.
MAX_BLOOM_BITS = 2**37


@dataclasses.dataclass(frozen=True)
class ProducerSettings(CommonSettings, WebOptions):
    """Flags of ``zkcrawl-producer`` (SPEC §4 plus the de-duplication and HTTP knobs)."""

    legacy_env_names: ClassVar[bool] = True  # ZKCRAWL_TIMEOUT... still read, deprecated
    examples: ClassVar[str] = """
        # follow a listing's next-page links, offer the article links on the same host
        zkcrawl-producer --start https://blog.example.com/ --next '//a[@rel="next"]/@href' \\
            --links-css 'article h2 a' --same-host
        # numbered listing pages 1..50, remember what was offered across runs
        zkcrawl-producer --pages 'https://shop.example.com/list?page={page}' --page-range 1-50 \\
            --seen /var/lib/zkcrawl/seen.bloom
        # offer the URLs of a file (one per line; - = stdin), nothing fetched
        zkcrawl-producer --from-file urls.txt --deny '\\.pdf$'
        # a deep crawl: seed URLs, then the links consumers' --processor code finds
        zkcrawl-producer --from-file seeds.txt --follow --same-host --max-link-depth 5
    """

    start: tuple[str, ...] = opt((), "listing page to start from; repeatable", repeat=True,
                                 metavar="URL", group=INPUT)
    pages: str | None = opt(None, "listing URL template with {page} (or {page:03d}); "
                            "needs --page-range", metavar="TEMPLATE", group=INPUT)
    page_range: str | None = opt(None, "pages of --pages to read, inclusive", metavar="A-B",
                                 group=INPUT)
    links: str | None = opt(None, "XPath selecting item links (default //a/@href)",
                            metavar="XPATH", group=INPUT)
    links_css: str | None = opt(None, "CSS selector of item link elements (instead of --links)",
                                metavar="SELECTOR", group=INPUT)
    next: str | None = opt(None, "XPath of the next-page link (with --start)", metavar="XPATH",
                           group=INPUT)
    max_pages: int = opt(1000, "read at most N listing pages in this run (0: no limit)",
                         metavar="N", group=INPUT)
    allow: tuple[str, ...] = opt((), "offer only URLs matching one of these regexes; repeatable",
                                 repeat=True, metavar="REGEX", group=FILTERING)
    deny: tuple[str, ...] = opt((), "never offer URLs matching this regex; repeatable",
                                repeat=True, metavar="REGEX", group=FILTERING)
    same_host: bool = opt(False, "offer only links on the listing page's host[:port]",
                          group=FILTERING)
    strip_param: tuple[str, ...] = opt(DEFAULT_STRIP, "query parameter to remove (glob, e.g. "
                                       "'utm_*'); repeatable; replaces the default list",
                                       repeat=True, metavar="NAME", group=FILTERING)
    from_file: str | None = opt(None, "offer the URLs in this file, one per line (- = stdin); "
                                "nothing is fetched", metavar="PATH", group=INPUT)
    seen: str | None = opt(None, "de-duplication state file that survives restarts "
                           "(default: this run only)", metavar="PATH", group=DEDUP)
    expected: int = opt(1_000_000, "URLs the --seen state is sized for (when it is created)",
                        metavar="N", group=DEDUP)
    fp_rate: float = opt(0.001, "false-positive rate of the --seen Bloom filter: that share "
                         "of new URLs is wrongly skipped", metavar="F", group=DEDUP)
    max_depth: int = opt(10_000, "back-pressure: offer nothing more while the queue (the "
                         "ingress and every partition) holds N items",
                         metavar="N", group=QUEUE)
    batch: int = opt(DEFAULT_BATCH, "items per ZooKeeper transaction", metavar="N", group=QUEUE)
    partitions: int = opt(0, "how many partitions the hosts are spread over, recorded in "
                          "a new root (0: the root's, or 256 on a new root; a P other than "
                          "the root's is ignored with a warning)", metavar="P", group=QUEUE)
    max_partition_depth: int = opt(0, "back-pressure per partition: offer nothing more into "
                                   "a partition holding N items, hold its items in memory "
                                   "while the others go on (0: a quarter of --max-depth, at "
                                   "least 2 x --max-depth / P)", metavar="N", group=QUEUE)
    max_held: int = opt(0, "items held in memory for full partitions at most; beyond, the "
                        "producer waits (0: half of --max-depth, at least --batch)",
                        metavar="N", group=QUEUE)
    delay: float = opt(1.0, "seconds between two listing fetches from one host", metavar="S",
                       group=POLITENESS)
    robots: bool = opt(True, "obey robots.txt for listing pages", group=POLITENESS)
    user_agent: str = opt(DEFAULT_USER_AGENT, "User-Agent of listing fetches", group=FETCHING)
    timeout: float = opt(15.0, "connect/read timeout of one listing fetch", metavar="S",
                         group=FETCHING)
    retries: int = opt(3, "retries of a listing fetch that may pass (connection, 429, 5xx)",
                       metavar="N", group=FETCHING)
    max_bytes: int = opt(10_000_000, "read at most N bytes of a listing page", metavar="N",
                         group=FETCHING)
    id: str | None = opt(None, "producer id in <root>/producers (default host-pid)",
                         metavar="NAME", group=QUEUE)
    dry_run: bool = opt(False, "walk the listings (or read --from-file) and print the URLs "
                        "that would be offered, one per line, instead of offering them: no "
                        "ZooKeeper, the --seen state read but never written", group=INPUT)
    follow: bool = opt(False, "also drain <root>/discovered/ (links found by consumers' page "
                       "processors) through --allow/--deny/--same-host and the seen state, "
                       "until the queue and discovered/ are empty", group=INPUT)
    sitemap: tuple[str, ...] = opt((), "sitemap to offer the URLs of (a sitemap index, .xml.gz "
                                   "and a text sitemap too); repeatable", repeat=True,
                                   metavar="URL", group=INPUT)
    sitemaps_from_robots: tuple[str, ...] = opt((), "read the sitemaps the Sitemap: lines of "
                                                "this URL's host's robots.txt name; "
                                                "repeatable", repeat=True, metavar="URL",
                                                group=INPUT)
    since: str | None = opt(None, "only sitemap entries whose <lastmod> is at or after DATE "
                            "(2026-01-31, 2026-01-31T08:00:00Z, or an age such as 7d); "
                            "entries without a <lastmod> are kept", metavar="DATE",
                            group=FILTERING)
    watch: str | None = opt(None, "keep running: every INTERVAL (30s, 10m, 1h) re-read the "
                            "start listings and sitemaps and offer only what is new; SIGTERM "
                            "ends it", metavar="INTERVAL", group=INPUT)
    watch_depth: int = opt(5, "with --watch: after the first pass, read at most N pages of "
                           "each listing walk per pass, stopping at the first page that "
                           "brings nothing new", metavar="N", group=INPUT)
    max_link_depth: int = opt(10, "with --follow: drop links found more than N pages away "
                              "from an offered URL", metavar="N", group=FILTERING)
    recrawl: bool = opt(False, "keep the crawl current: learn from <root>/fetched/ what each "
                        "fetch returned, then offer again the URLs that are due, with their "
                        "ETag/Last-Modified (conditional GET), on adaptive intervals kept "
                        "in a store next to --seen", group=RECRAWL)
    recrawl_min: str = opt("1h", "shortest re-crawl interval (and a new URL's first); "
                           "90s, 15m, 1h, 30d...", metavar="DURATION", group=RECRAWL)
    recrawl_max: str = opt("30d", "longest re-crawl interval", metavar="DURATION",
                           group=RECRAWL)
    recrawl_store: str | None = opt(None, "the --recrawl state file (SQLite; default: "
                                    "<--seen>.recrawl)", metavar="PATH", group=RECRAWL)

    def validate(self) -> None:
        super().validate()
        self._validate_mode()
        self._validate_numbers()

    def _validate_mode(self) -> None:
        listing = bool(self.start or self.pages)
        if (not listing and not self.from_file and not self.follow and not self.sitemap_input
                and not self.recrawl):
            raise UsageError("nothing to read: give --start URL, --pages TEMPLATE with "
                             "--page-range, --sitemap URL, --sitemaps-from-robots URL, "
                             "--from-file PATH, --follow, or --recrawl")
        self._validate_sitemaps(listing)
        self._validate_recrawl()
        if self.follow and self.dry_run:
            raise UsageError("--follow drains <root>/discovered/ in ZooKeeper; --dry-run "
                             "uses no ZooKeeper: give one of them")
        if listing and self.from_file:
            raise UsageError("--from-file cannot be combined with --start/--pages")
        if self.pages and not self.page_range:
            raise UsageError("--pages needs --page-range A-B")
        if self.page_range and not self.pages:
            raise UsageError("--page-range needs --pages TEMPLATE")
        if self.next and not self.start:
            raise UsageError("--next follows next-page links from --start pages; "
                             "give --start (with --pages, use --page-range)")
        if self.links and self.links_css:
            raise UsageError("give either --links or --links-css, not both")

    def _validate_recrawl(self) -> None:
        from zkcrawl.producer.recrawl import parse_duration, store_path

        low = parse_duration(self.recrawl_min, "--recrawl-min")
        high = parse_duration(self.recrawl_max, "--recrawl-max")
        if low > high:
            raise UsageError(f"--recrawl-min {self.recrawl_min} is longer than --recrawl-max "
                             f"{self.recrawl_max}")
        if not self.recrawl:
            return
        if self.dry_run:
            raise UsageError("--recrawl keeps a store and reads <root>/fetched/; --dry-run "
                             "writes nothing: give one of them")
        if store_path(self.seen, self.recrawl_store) is None:
            raise UsageError("--recrawl needs a state that outlives the run: give --seen "
                             "PATH (the store goes next to it) or --recrawl-store PATH")

    def _validate_numbers(self) -> None:
        positive = {"--batch": self.batch, "--max-depth": self.max_depth,
                    "--expected": self.expected, "--max-bytes": self.max_bytes}
        for flag, value in positive.items():
            if value <= 0:
                raise UsageError(f"{flag} must be a positive integer, got {value}")
        if not 0 <= self.partitions <= MAX_PARTITIONS:
            raise UsageError(f"--partitions must be 1..{MAX_PARTITIONS} (0: the root's), "
                             f"got {self.partitions}")
        if self.max_partition_depth < 0 or self.max_held < 0:
            raise UsageError("--max-partition-depth and --max-held must be >= 0 (0: derived)")
        if not 0 <= self.max_link_depth <= MAX_LINK_DEPTH:
            raise UsageError(f"--max-link-depth must be 0..{MAX_LINK_DEPTH}, got "
                             f"{self.max_link_depth}")
        if self.max_pages < 0 or self.retries < 0:
            raise UsageError("--max-pages and --retries must be >= 0")
        if not 0.0 < self.fp_rate < 1.0:
            raise UsageError(f"--fp-rate must be between 0 and 1, got {self.fp_rate}")
        self._validate_bloom()
        for flag, secs in (("--delay", self.delay), ("--timeout", self.timeout)):
            if not math.isfinite(secs) or secs < 0 or (flag == "--timeout" and secs == 0):
                raise UsageError(f"{flag} must be a finite number of seconds, got {secs}")
        if problem := header_value_problem(self.user_agent):
            raise UsageError(f"--user-agent: {problem}")
        if self.from_file not in (None, "-") and os.path.isdir(self.from_file):
            raise UsageError(f"--from-file {self.from_file}: is a directory")
        if self.id is not None and (not self.id or "/" in self.id
                                    or znode_path_problem("/" + self.id)):
            raise UsageError(f"--id must be a non-empty znode name without '/', got {self.id!r}")

    @property
    def sitemap_input(self) -> bool:
        return bool(self.sitemap or self.sitemaps_from_robots)

    def _validate_sitemaps(self, listing: bool) -> None:
        from zkcrawl.producer import watch

        if self.sitemap_input and self.from_file:
            raise UsageError("--from-file cannot be combined with --sitemap/"
                             "--sitemaps-from-robots (it fetches nothing)")
        if self.since is not None:
            if not self.sitemap_input:
                raise UsageError("--since filters sitemap entries: give --sitemap or "
                                 "--sitemaps-from-robots")
            watch.parse_since(self.since, "--since")
        if self.watch is None:
            return
        watch.parse_duration(self.watch, "--watch")
        if not (listing or self.sitemap_input):
            raise UsageError("--watch re-reads listings and sitemaps: give --start, --pages "
                             "or --sitemap")
        if self.dry_run or self.follow:
            raise UsageError("--watch runs until SIGTERM: not with --dry-run or --follow")
        if not 1 <= self.watch_depth <= 1000:
            raise UsageError(f"--watch-depth must be 1..1000, got {self.watch_depth}")

    def _validate_bloom(self) -> None:
        bits = -self.expected * math.log(self.fp_rate) / math.log(2) ** 2
        if bits > MAX_BLOOM_BITS:
            raise UsageError(f"--expected {self.expected} at --fp-rate {self.fp_rate:g} needs a "
                             f"{bits / 2**33:.3g} GiB Bloom filter; at most "
                             f"{MAX_BLOOM_BITS // 2**33} GiB")
