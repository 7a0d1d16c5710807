"""``zkcrawl bench queue|offer|crawl|hosts|e2e|ensemble``: benchmarks as ratios against
baselines in one run."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.settings import CommonSettings, opt

NAME = "bench"
HELP = ("measure the queue, the producer's offers, a whole crawl, politeness on many hosts, "
        "an ensemble or the pipeline end to end against baselines")
EXAMPLES = """
    zkcrawl bench queue                    # a throwaway local ZooKeeper
    zkcrawl bench queue --zk 127.0.0.1:2181 --root /bench --items 5000
    zkcrawl bench crawl --json > crawl.json
    zkcrawl bench crawl --pg postgresql://crawl@db/bench   # the PostgreSQL cases there
    zkcrawl bench hosts --site-hosts 500 --domain-delay 1   # politeness on many hosts
    zkcrawl bench ensemble                 # the queue on a 3-node ensemble on loopback
    zkcrawl bench e2e                      # producer + consumer vs seed 002's crawler
"""


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    zk: str = opt("", "ZooKeeper to measure against (default: a throwaway local server)",
                  metavar="HOSTS")
    root: str = opt("/zkcrawl-bench", "queue: znode under which each run makes (and on exit, "
                    "Ctrl-C included, removes) its own node")
    items: int = opt(0, "items per case (0: queue 20000, offer 100000, crawl 2000)",
                     metavar="N")
    threads: int = opt(32, "crawl: worker threads per consumer", metavar="N")
    latency_ms: int = opt(50, "crawl: delay of every response of the synthetic site",
                          metavar="MS")
    pg: str = opt("", "crawl: PostgreSQL for the --out postgresql:// cases, "
                  "postgresql://USER@HOST/DB (default: a throwaway local server when "
                  "PostgreSQL is installed; password from PGPASSWORD/PGPASSFILE)",
                  metavar="URL")
    site_hosts: int = opt(500, "hosts: loopback hosts (127.77.x.y) the synthetic site answers as",
                          metavar="N")
    per_host: int = opt(10, "hosts: pages offered per host", metavar="N")
    domain_delay: float = opt(1.0, "hosts: --domain-delay of the consumers", metavar="S")
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
        if not (math.isfinite(self.domain_delay) and 0 < self.domain_delay <= 60):
            raise UsageError("--domain-delay must be within (0, 60] seconds")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=("queue", "offer", "crawl", "hosts", "e2e", "ensemble"))


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    hosts = settings.zk or None
    out: dict[str, Any]
    if ns.what == "queue":
        from zkcrawl.bench import drain as bq

        out = bq.run_bench(hosts, settings.items or 20_000, settings.root)
        text = bq.render(out)
    elif ns.what == "offer":
        from zkcrawl.bench import offer as bo

        out = bo.run_bench(hosts, settings.items or 100_000, json_out=settings.json)
        text = bo.render(out) if hasattr(bo, "render") else json.dumps(out, indent=2)
    elif ns.what in ("hosts", "e2e", "ensemble"):
        out, text = _cluster_scale(ns.what, settings, hosts)
    else:
        try:
            from zkcrawl.bench import crawl as bc
        except ImportError as exc:  # psutil: the `bench` extra
            raise UsageError(f"zkcrawl bench crawl needs {exc.name}: "
                             "pip install 'zkcrawl[bench]'") from None

        out = bc.run_bench(hosts, settings.items or 2000, threads=settings.threads,
                           latency_ms=settings.latency_ms, json_out=settings.json,
                           pg=settings.pg or None)
        text = bc.render(out) if hasattr(bc, "render") else json.dumps(out, indent=2)
    print(json.dumps(out) if settings.json else text)
    return ExitStatus.OK


def _cluster_scale(what: str, settings: Settings, hosts: str | None) -> tuple[dict[str, Any], str]:
    try:
        from zkcrawl.bench import hosts as bh
    except ImportError as exc:  # psutil: the `bench` extra
        raise UsageError(f"zkcrawl bench {what} needs {exc.name}: "
                         "pip install 'zkcrawl[bench]'") from None
    if what == "hosts":
        out = bh.run_bench(hosts, hosts=settings.site_hosts, per_host=settings.per_host,
                           threads=settings.threads, latency_ms=settings.latency_ms,
                           delay=settings.domain_delay)
        return out, bh.render(out)
    if what == "ensemble":
        if hosts is not None:
            raise UsageError("bench ensemble starts its own 3-node ensemble: no --zk")
        out = bh.run_ensemble(settings.items or 20_000)
        return out, bh.render_ensemble(out)
    from zkcrawl.bench import e2e

    out = e2e.run_bench(hosts, articles=settings.items or 2000, threads=settings.threads,
                        latency_ms=settings.latency_ms)
    return out, e2e.render(out)
