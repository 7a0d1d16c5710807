"""``zkcrawl bench queue|offer|crawl|...``: the benchmarks' subcommand (registered by
:mod:`zkcrawl.cli`), each case a ratio against its baseline in one run. The cases are
imported when run: most need the ``bench`` extra (psutil), and ``zkcrawl --help`` loads none."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.runner import setup_logging
from zkcrawl.settings import CommonSettings, opt

NAME = "bench"
HELP = ("measure the queue, the producer's offers, a whole crawl, politeness on many hosts, "
        "one big host among small ones, a rebalance, an ensemble, the partitioned queue or the "
        "pipeline end to end against baselines")
EXAMPLES = """
    zkcrawl bench queue                    # a throwaway local ZooKeeper
    zkcrawl bench queue --zk 127.0.0.1:2181 --root /bench --items 5000
    zkcrawl bench crawl --json > crawl.json
    zkcrawl bench crawl --pg postgresql://crawl@db/bench   # the PostgreSQL cases there
    zkcrawl bench hosts --site-hosts 500 --domain-delay 1   # politeness on many hosts
    zkcrawl bench skew                     # one big host among 50 small ones
    zkcrawl bench ensemble                 # the queue on a 3-node ensemble on loopback
    zkcrawl bench e2e                      # producer + consumer vs seed 002's crawler
    zkcrawl bench sitemap                  # a 50,000-URL .xml.gz sitemap vs --from-file
    zkcrawl bench watch                    # --watch: pages per quiet pass, time to offer
    zkcrawl bench recrawl                  # a conditional re-crawl vs the first crawl
    zkcrawl bench recrawl-store --items 10000000   # the --recrawl store at 10 M URLs
    zkcrawl bench frontier --site-hosts 2500       # ZooKeeper writes a page: partitions
    zkcrawl bench rebalance --site-hosts 300 --session-timeout 4   # a consumer joins, one leaves
"""


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    zk: str = opt("", "ZooKeeper to measure against (default: a throwaway local server)",
                  metavar="HOSTS")
    root: str = opt("/zkcrawl-bench", "queue: znode under which each run makes (and on exit, "
                    "Ctrl-C included, removes) its own node")
    items: int = opt(0, "items per case (0: queue 20000, offer 100000, crawl 2000, "
                     "recrawl 2000, recrawl-store 1000000)",
                     metavar="N")
    threads: int = opt(32, "crawl: worker threads per consumer", metavar="N")
    latency_ms: int = opt(50, "crawl: delay of every response of the synthetic site",
                          metavar="MS")
    pg: str = opt("", "crawl: PostgreSQL for the --out postgresql:// cases, "
                  "postgresql://USER@HOST/DB (default: a throwaway local server when "
                  "PostgreSQL is installed; password from PGPASSWORD/PGPASSFILE)",
                  metavar="URL")
    extract: str = opt("title", "crawl: 'article' measures --extract article (in the fetch "
                       "threads, and with the process pool) against the default title; "
                       "recrawl: both passes with --extract article",
                       choices=("title", "article"))
    site_hosts: int = opt(500, "hosts, rebalance: loopback hosts (127.77.x.y) the synthetic "
                          "site answers as; frontier: hosts the URLs are spread over",
                          metavar="N")
    per_host: int = opt(10, "hosts, rebalance: pages offered per host (rebalance: at least "
                        "45 s of them at --domain-delay)", metavar="N")
    domain_delay: float = opt(1.0, "hosts, skew, rebalance: --domain-delay of the consumers",
                              metavar="S")
    consumers: int = opt(4, "hosts: consumer processes of its many-consumer case "
                         "(owner_N)", metavar="N")
    backlog: int = opt(0, "hosts, rebalance: --backlog of each consumer (0: twice --threads); a "
                       "consumer keeps at most --threads + --backlog items in memory, of hosts "
                       "whose turn is near", metavar="N")
    small_hosts: int = opt(50, "skew: small hosts, --per-host pages each", metavar="N")
    big_pages: int = opt(600, "skew: pages of the one big host", metavar="N")
    page_kb: int = opt(0, "recrawl: articles of 0.5-1.5 times this many KB (0: the site's "
                       "5-15 KB; real articles' HTML is commonly 30-100 KB)", metavar="KB")
    json: bool = opt(False, "print one JSON object instead of a table")

    zk_optional = True  # no --zk: each bench starts a throwaway local ZooKeeper

    def validate(self) -> None:
        super().validate()
        if self.items < 0:
            raise UsageError(f"--items must be >= 0 (0: the case's default), got {self.items}")
        if not 1 <= self.threads <= 1024:
            raise UsageError(f"--threads must be 1..1024, got {self.threads}")
        if not 0 <= self.latency_ms <= 60_000:
            raise UsageError(f"--latency-ms must be 0..60000, got {self.latency_ms}")
        if self.site_hosts < 1 or self.per_host < 1:
            raise UsageError("--site-hosts and --per-host must be at least 1")
        if not 1 <= self.consumers <= 16 or not 0 <= self.backlog <= 1_000_000:
            raise UsageError("--consumers must be 1..16 and --backlog 0..1000000")
        if not 1 <= self.small_hosts <= 5000 or not 1 <= self.big_pages <= 100_000:
            raise UsageError("--small-hosts must be 1..5000 and --big-pages 1..100000")
        if not 0 <= self.page_kb <= 4096:
            raise UsageError(f"--page-kb must be 0..4096, got {self.page_kb}")
        if not (math.isfinite(self.domain_delay) and 0 < self.domain_delay <= 60):
            raise UsageError("--domain-delay must be within (0, 60] seconds")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=tuple(CASES))


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    setup_logging(settings)  # queues run in this process too: their lines go to stderr
    out, text = CASES[ns.what](settings, settings.zk or None)
    print(json.dumps(out) if settings.json else text)
    return ExitStatus.OK


Result = tuple[dict[str, Any], str]


def _case(what: str, module: str) -> ModuleType:
    """``zkcrawl.bench.<module>``, or one line naming the ``bench`` extra (psutil) when a
    module it needs is not installed."""
    try:
        return importlib.import_module(f"zkcrawl.bench.{module}")
    except ImportError as exc:
        raise UsageError(f"zkcrawl bench {what} needs {exc.name}: "
                         "pip install 'zkcrawl[bench]'") from None


def _queue(s: Settings, hosts: str | None) -> Result:
    bq = _case("queue", "drain")
    out = bq.run_bench(hosts, s.items or 20_000, s.root)
    return out, bq.render(out)


def _offer(s: Settings, hosts: str | None) -> Result:
    bo = _case("offer", "offer")
    out = bo.run_bench(hosts, s.items or 100_000, json_out=s.json)
    return out, bo.render(out)


def _crawl(s: Settings, hosts: str | None) -> Result:
    bc = _case("crawl", "crawl")
    out = bc.run_bench(hosts, s.items or 2000, threads=s.threads, latency_ms=s.latency_ms,
                       json_out=s.json, pg=s.pg or None, extract=s.extract)
    return out, bc.render(out)


def _hosts(s: Settings, hosts: str | None) -> Result:
    bh = _case("hosts", "hosts")
    out = bh.run_bench(hosts, hosts=s.site_hosts, per_host=s.per_host, threads=s.threads,
                       latency_ms=s.latency_ms, delay=s.domain_delay, consumers=s.consumers,
                       backlog=s.backlog or None)
    return out, bh.render(out)


def _skew(s: Settings, hosts: str | None) -> Result:
    skew = _case("skew", "skew")
    # the mix as the issue met it: 2 consumers x 16 threads, everything else default
    out = skew.run_bench(hosts, small_hosts=s.small_hosts, per_small=s.per_host,
                         big=s.big_pages, procs=2, threads=16, latency_ms=s.latency_ms,
                         delay=s.domain_delay)
    return out, skew.render(out)


def _e2e(s: Settings, hosts: str | None) -> Result:
    e2e = _case("e2e", "e2e")
    out = e2e.run_bench(hosts, articles=s.items or 2000, threads=s.threads,
                        latency_ms=s.latency_ms)
    return out, e2e.render(out)


def _ensemble(s: Settings, hosts: str | None) -> Result:
    if hosts is not None:
        raise UsageError("bench ensemble starts its own 3-node ensemble: no --zk")
    bh = _case("ensemble", "hosts")
    out = bh.run_ensemble(s.items or 20_000)
    return out, bh.render_ensemble(out)


def _sitemap(s: Settings, hosts: str | None) -> Result:
    bs = _case("sitemap", "sitemap")
    out = bs.run_sitemap(hosts, s.items or 50_000)
    return out, bs.render(out)


def _watch(s: Settings, hosts: str | None) -> Result:
    bs = _case("watch", "sitemap")
    out = bs.run_watch(hosts)
    return out, bs.render_watch(out)


def _recrawl(s: Settings, hosts: str | None) -> Result:
    br = _case("recrawl", "recrawl")
    out = br.run_bench(hosts, s.items or 2000, threads=s.threads, latency_ms=s.latency_ms,
                       page_kb=s.page_kb, extract=s.extract)
    return out, br.render(out)


def _recrawl_store(s: Settings, hosts: str | None) -> Result:
    br = _case("recrawl-store", "recrawl")
    out = br.run_store(s.items or 1_000_000)
    return out, br.render_store(out)


def _frontier(s: Settings, hosts: str | None) -> Result:
    frontier = _case("frontier", "frontier")
    out = frontier.run_bench(hosts, items=s.items or 20_000, site_hosts=s.site_hosts)
    return out, frontier.render(out)


def _rebalance(s: Settings, hosts: str | None) -> Result:
    rebalance = _case("rebalance", "rebalance")
    out = rebalance.run_bench(hosts, hosts=s.site_hosts,
                              per_host=max(s.per_host, math.ceil(45 / s.domain_delay)),
                              threads=s.threads, latency_ms=s.latency_ms,
                              delay=s.domain_delay, session_timeout=s.session_timeout,
                              backlog=s.backlog)
    return out, rebalance.render(out)


# The cases, in the order `zkcrawl bench --help` lists them: each imports its module when
# run (most need the `bench` extra, and `zkcrawl --help` loads none).
CASES: dict[str, Callable[[Settings, str | None], Result]] = {
    "queue": _queue, "offer": _offer, "crawl": _crawl, "hosts": _hosts, "skew": _skew,
    "e2e": _e2e, "ensemble": _ensemble, "sitemap": _sitemap, "watch": _watch,
    "recrawl": _recrawl, "recrawl-store": _recrawl_store, "frontier": _frontier,
    "rebalance": _rebalance,
}
