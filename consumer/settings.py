"""Settings of ``zkcrawl-consumer`` (SPEC §4): every flag, its env variable and TOML key.

:meth:`ConsumerSettings.validate` refuses, as a :class:`UsageError` (exit 2), every value the
daemon could not run with: counts below 1 or above what a process can start (``--threads``
<= :data:`MAX_THREADS`), non-finite or negative seconds, ports outside 0..65535, and an
``--id`` ZooKeeper would refuse as a znode name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import ClassVar

from zkcrawl.errors import UsageError
from zkcrawl.politeness.local import MAX_CRAWL_DELAY
from zkcrawl.postgres import is_database_url, parse_url
from zkcrawl.queue import discovered as links
from zkcrawl.queue import fetched as reports
from zkcrawl.queue.claims import AT_LEAST_ONCE, AT_MOST_ONCE
from zkcrawl.queue.partitions import MAX_PARTITIONS
from zkcrawl.settings.common import CommonSettings
from zkcrawl.settings.options import (
    DELIVERY,
    FETCHING,
    OPERATIONS,
    OUTPUT,
    POLITENESS,
    WORKERS,
    opt,
)
from zkcrawl.settings.validate import header_value_problem, znode_path_problem
from zkcrawl.web.fetch import FetchSettings
from zkcrawl.web.options import WebOptions
from zkcrawl.zk import ZkClient

DEFAULT_USER_AGENT = "zkcrawl/0.1 (+https://github.com/zkcrawl/zkcrawl)"
# robots.txt Crawl-delay above --domain-delay wins, up to this (a typo of "3600" must not
# stall a host for an hour): the one cap of politeness, zkcrawl.politeness.MAX_CRAWL_DELAY.
CRAWL_DELAY_CAP = MAX_CRAWL_DELAY
EXTENSIONS = "page processors and result pipelines"
#: Worker threads start up front: far more than this fails with "can't start new thread".
MAX_THREADS = 1024
#: --backlog by default: max(DEFAULT_BACKLOG_MIN, DEFAULT_BACKLOG_PER_THREAD x --threads)
DEFAULT_BACKLOG_MIN = 256
DEFAULT_BACKLOG_PER_THREAD = 16


@dataclasses.dataclass(frozen=True)
class ConsumerSettings(CommonSettings, WebOptions):
    """``zkcrawl-consumer`` flags; names are the stable surface of SPEC §4."""

    legacy_env_names: ClassVar[bool] = True  # ZKCRAWL_TIMEOUT... still read, deprecated
    examples: ClassVar[str] = """
        # one consumer per machine, results in a file, metrics for Prometheus
        zkcrawl-consumer --zk zk1:2181,zk2:2181,zk3:2181 --out results.jsonl --metrics-port 9100
        # extra fields from each page, a gentler gap per host
        zkcrawl-consumer --field "price=//span[@class='price']/text()" --domain-delay 2
        # crawl what is queued, then exit (batch jobs, tests)
        zkcrawl-consumer --out - --exit-when-idle 10 | gzip > results.jsonl.gz
        # your own code for blog pages, records through your pipeline before the sink
        zkcrawl-consumer --processor 're:^https://blog.example.com/ myproj.blog:parse' \\
            --pipeline myproj.pipelines:RequireAuthor
    """

    id: str | None = opt(None, "consumer id, unique in the cluster (default: host-pid)",
                         metavar="NAME", group=WORKERS)
    threads: int = opt(16, "worker threads fetching in parallel", metavar="N", group=WORKERS)
    backlog: int | None = opt(None, "capacity of the capped queue in front of the pool "
                              "(default: max(256, 16 x --threads)); a consumer never holds "
                              "more than threads + backlog items taken from its partitions "
                              "and not settled", metavar="N",
                              group=WORKERS)
    out: str = opt("-", "where records go: a JSON Lines file, '-' (stdout), or a PostgreSQL "
                   "table, postgresql://USER@HOST[:PORT]/DB?table=NAME (password from "
                   "PGPASSWORD/PGPASSFILE, never in the URL; needs zkcrawl[postgres])",
                   metavar="PATH|-|URL", group=OUTPUT)
    field: tuple[str, ...] = opt((), "extra record field NAME=XPATH or NAME=css:SELECTOR "
                                 "(::text, ::attr(NAME); repeatable; title is always "
                                 "recorded)", repeat=True, metavar="NAME=XPATH",
                                 group=OUTPUT)
    timeout: float = opt(15.0, "read timeout of a fetch in seconds; the whole fetch gets "
                         "twice that", metavar="S", group=FETCHING)
    max_attempts: int = opt(3, "tries before an item goes to the dead letters", metavar="N",
                            group=DELIVERY)
    domain_delay: float = opt(1.0, "minimum gap in seconds between two requests to one host",
                              metavar="S", group=POLITENESS)
    politeness: str = opt("owner", "where --domain-delay holds: 'owner' (each host fetched "
                          "by the one consumer that owns its partition: no ZooKeeper write "
                          "per request); 'cluster' and 'local', the modes before owners, are "
                          "accepted and mean 'owner' (one warning line)",
                          choices=("owner", "cluster", "local"), group=POLITENESS)
    partitions: int = opt(0, "how many partitions the hosts are spread "
                          "over, recorded in the root by the first consumer (0: the root's, "
                          "or 256 on a new root; ignored with a warning after)", metavar="P",
                          group=POLITENESS)
    robots: bool = opt(True, "obey robots.txt (cached per host for an hour)", group=POLITENESS)
    user_agent: str = opt(DEFAULT_USER_AGENT, "User-Agent header, also the robots.txt agent",
                          group=FETCHING)
    max_bytes: int = opt(10_000_000, "stop reading a body there; the record gets error "
                         "too-large", metavar="N", group=FETCHING)
    delivery: str = opt(AT_LEAST_ONCE, "at-least-once (no item lost) or at-most-once "
                        "(delete on take, lossy)", choices=(AT_LEAST_ONCE, AT_MOST_ONCE),
                        group=DELIVERY)
    exit_when_idle: float | None = opt(None, "exit 0 after S seconds with nothing in flight "
                                       "and no item in the queue, held by a consumer or not "
                                       "(default: run forever)",
                                       metavar="S", group=OPERATIONS)
    metrics_port: int = opt(0, "serve Prometheus /metrics, /livez and /readyz (/healthz) on "
                            "this port (0 = off)", metavar="P", group=OPERATIONS)
    metrics_host: str = opt("127.0.0.1", "address the metrics server binds to (0.0.0.0: "
                            "every interface; /metrics has no authentication)",
                            metavar="ADDR", group=OPERATIONS)
    grace: float = opt(30.0, "seconds running fetches get to finish after SIGTERM",
                       metavar="S", group=OPERATIONS)
    stats_interval: float = opt(10.0, "seconds between consumer.stats reports (written "
                                "whatever --log-level says)", metavar="S", group=OPERATIONS)
    processor: tuple[str, ...] = opt((), "page code for URLs matching PATTERN (a regex searched "
                                     "in the item URL; without re: every URL), first match "
                                     "wins; default: title + --field", repeat=True,
                                     metavar="[re:PATTERN ]module:callable", group=EXTENSIONS)
    processors: Mapping[str, str] | None = opt(None, "TOML table [processors] of PATTERN = "
                                            "'module:callable', tried after --processor in "
                                            "file order (a table: only in --config)",
                                            metavar="TABLE", group=EXTENSIONS)
    extract: str = opt("title", "what a page gives without a --processor: 'title' (the title "
                       "and --field values) or 'article' (also main text, author, date, "
                       "language, canonical, tags, description, JSON-LD: needs "
                       "zkcrawl[article])", choices=("title", "article"), group=OUTPUT)
    extract_workers: int | None = opt(None, "processes that run --extract article, fed by "
                                      "the worker threads (default: one per core, at most 8;"
                                      " 0: in the worker threads)", metavar="N",
                                      group=WORKERS)
    # Links found by page processors, bounded in ZooKeeper (issue #27; zkcrawl/queue/
    # discovered.py): per page, and what <root>/discovered/ may hold.
    max_page_links: int = opt(links.MAX_PAGE_LINKS, "links a page processor may hand over "
                              "from one page (the rest dropped)", metavar="N", group=EXTENSIONS)
    max_page_link_bytes: int = opt(links.MAX_PAGE_LINK_BYTES, "bytes of links from one page "
                                   "(UTF-8; the rest dropped)", metavar="N", group=EXTENSIONS)
    discovered_max_nodes: int = opt(links.MAX_NODES, "nodes <root>/discovered/ may hold "
                                    "before consumers wait for the producer", metavar="N",
                                    group=EXTENSIONS)
    discovered_max_bytes: int = opt(links.MAX_BYTES, "bytes <root>/discovered/ may hold "
                                    "(counted as nodes x 64 KiB, the most one holds)",
                                    metavar="N", group=EXTENSIONS)
    discovered_wait: float = opt(links.WAIT, "seconds a page waits for room in a full "
                                 "<root>/discovered/; then its item is retried "
                                 "(discovered-full)", metavar="S", group=EXTENSIONS)
    # Re-crawl reports (items with meta.recrawl), bounded the same way in <root>/fetched/
    # (zkcrawl/queue/fetched.py): the producer's --recrawl drains it.
    fetched_max_nodes: int = opt(reports.MAX_NODES, "nodes <root>/fetched/ (re-crawl "
                                 "reports) may hold before consumers wait for the producer",
                                 metavar="N", group=EXTENSIONS)
    fetched_max_bytes: int = opt(reports.MAX_BYTES, "bytes <root>/fetched/ may hold "
                                 "(counted as nodes x 64 KiB, the most one holds)",
                                 metavar="N", group=EXTENSIONS)
    fetched_wait: float = opt(reports.WAIT, "seconds re-crawl reports wait for room in a "
                              "full <root>/fetched/; then they are dropped (fetched-full: "
                              "the items complete all the same)", metavar="S",
                              group=EXTENSIONS)
    pipeline: tuple[str, ...] = opt((), "result pipeline class, instantiated once: open(), "
                                    "process(record) -> record | None, close(); repeatable, "
                                    "a chain in order before the sink", repeat=True,
                                    metavar="module:Class", group=EXTENSIONS)

    def validate(self) -> None:
        super().validate()
        positive = {"--threads": self.threads, "--max-attempts": self.max_attempts,
                    "--max-bytes": self.max_bytes,
                    "--max-page-link-bytes": self.max_page_link_bytes,
                    "--discovered-max-nodes": self.discovered_max_nodes,
                    "--discovered-max-bytes": self.discovered_max_bytes,
                    "--fetched-max-nodes": self.fetched_max_nodes,
                    "--fetched-max-bytes": self.fetched_max_bytes}
        for flag, count in positive.items():
            if count < 1:
                raise UsageError(f"{flag} must be at least 1, got {count}")
        if self.threads > MAX_THREADS:
            raise UsageError(f"--threads must be at most {MAX_THREADS}, got {self.threads}")
        if self.extract_workers is not None and not 0 <= self.extract_workers <= 64:
            raise UsageError(f"--extract-workers must be 0..64, got {self.extract_workers}")
        if not 0 <= self.partitions <= MAX_PARTITIONS:
            raise UsageError(f"--partitions must be 1..{MAX_PARTITIONS} (0: the root's), "
                             f"got {self.partitions}")
        if self.backlog is not None and self.backlog < 0:
            raise UsageError(f"--backlog must be >= 0, got {self.backlog}")
        if self.max_page_links < 0:
            raise UsageError(f"--max-page-links must be >= 0, got {self.max_page_links}")
        seconds = {"--timeout": (self.timeout, False), "--stats-interval": (self.stats_interval,
                   False), "--domain-delay": (self.domain_delay, True),
                   "--grace": (self.grace, True),
                   "--discovered-wait": (self.discovered_wait, True),
                   "--fetched-wait": (self.fetched_wait, True),
                   "--exit-when-idle": (self.exit_when_idle or 1.0, False)}
        for flag, (value, zero_ok) in seconds.items():
            if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
                raise UsageError(f"{flag} must be a {'non-negative' if zero_ok else 'positive'}"
                                 f" number of seconds, got {value:g}")
        if is_database_url(self.out):
            parse_url(self.out)  # a password or a bad table name: exit 2 before connecting
        if not 0 <= self.metrics_port <= 65535:
            raise UsageError(f"--metrics-port must be 0..65535, got {self.metrics_port}")
        if problem := header_value_problem(self.user_agent):
            raise UsageError(f"--user-agent: {problem}")
        if self.processors is not None and (
                not isinstance(self.processors, dict)
                or not all(isinstance(v, str) for v in self.processors.values())):
            raise UsageError("--processors is a TOML table in --config ([processors] with "
                             "PATTERN = \"module:callable\"); on the command line use "
                             "--processor 're:PATTERN module:callable'")
        if self.id is not None and (not self.id or "/" in self.id
                                    or znode_path_problem("/" + self.id)):
            raise UsageError(f"--id must be a non-empty znode name without '/', got {self.id!r}")

    @property
    def backlog_size(self) -> int:
        """``--backlog``, or its default: enough items waiting for their hosts' turns that a
        consumer of many hosts keeps its threads busy (one item per host at a 1 s gap: the
        2,500-host bench needed 2,048 a consumer for 128 threads: docs/benchmarks.md). An item
        waiting costs memory only (a few KB; bounded by threads + backlog) and nothing at
        a death: it is marked started only when it starts (SPEC §3)."""
        if self.backlog is not None:
            return self.backlog
        return max(DEFAULT_BACKLOG_MIN, DEFAULT_BACKLOG_PER_THREAD * self.threads)

    @property
    def capacity(self) -> int:
        """Most items this consumer holds at once (taken from its partitions, not settled)."""
        return self.threads + self.backlog_size

    def link_bounds(self, zk: ZkClient) -> links.LinkBounds:
        """The per page and per directory bounds of the links pages hand over."""
        return links.LinkBounds(zk, self.root, self.max_page_links, self.max_page_link_bytes,
                                self.discovered_max_nodes, self.discovered_max_bytes,
                                self.discovered_wait)

    def fetch_settings(self) -> FetchSettings:
        """The shared HTTP layer's settings. Retries are the queue's job (the item goes to the
        tail with attempt + 1), so the fetcher itself never sleeps on a worker thread."""
        return FetchSettings(user_agent=self.user_agent,
                             connect_timeout=min(5.0, self.timeout), timeout=self.timeout,
                             total_timeout=2 * self.timeout, max_bytes=self.max_bytes,
                             max_redirects=10, retries=0, robots=self.robots,
                             guard=self.address_guard())
