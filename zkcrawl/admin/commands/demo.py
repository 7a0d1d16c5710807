"""``zkcrawl demo``: crawl the bundled sample blog with a throwaway ZooKeeper, a producer and
two consumers on this machine, then say what happened and where the results are.

Needs only Java and ZooKeeper's jars (``apt-get install zookeeper``); ``--zk`` and ``--root``
are ignored: the demo never touches a real cluster.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from zkcrawl import postgres
from zkcrawl.admin.demo import LINKS_CSS, ROOT, START_PATH, DemoConfig, DemoResult, run_demo
from zkcrawl.admin.samplesite import NEXT_XPATH
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.runner import setup_logging
from zkcrawl.settings import CommonSettings, opt

NAME = "demo"
HELP = "run the whole system on this machine against a bundled sample site (no setup)"
EXAMPLES = """
    zkcrawl demo                           # about 20 s; results in ./zkcrawl-demo/
    zkcrawl demo --consumers 3 --threads 8 --out-dir /tmp/demo
"""

#: What each failure reason of the sample site means, for the summary.
REASONS = {
    "http-404": "a listing links to an article that does not exist",
    "robots": "robots.txt disallows /blog/private/: not fetched",
    "content-type": "a link to a JSON file: not HTML, not parsed",
    "timeout": "the page did not answer within --timeout",
}


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    out_dir: str = opt("zkcrawl-demo", "where results.jsonl, report.html and logs/ go",
                       metavar="DIR")
    consumers: int = opt(2, "consumer processes to run", metavar="N")
    threads: int = opt(4, "worker threads per consumer", metavar="N")
    domain_delay: float = opt(0.05, "gap between requests to the sample site's one host "
                              "(the consumer's default of 1.0 s is for real sites)", metavar="S")
    timeout: float = opt(90.0, "give up if the crawl is not done after S seconds", metavar="S")
    out: str = opt("", "consumers write to this PostgreSQL table instead of part files: "
                   "postgresql://USER@HOST/DB?table=NAME (needs zkcrawl[postgres]; rows of "
                   "an earlier demo, root /zkcrawl-demo, are deleted first; password from "
                   "PGPASSWORD/PGPASSFILE)", metavar="URL")
    progress: str = opt("auto", "live progress bar (auto: on a TTY), else plain lines",
                        choices=("auto", "bar", "lines"))

    def validate(self) -> None:
        super().validate()
        if not 1 <= self.consumers <= 16 or not 1 <= self.threads <= 256:
            raise UsageError("--consumers must be 1..16 and --threads 1..256")
        if self.domain_delay < 0 or self.timeout <= 0:
            raise UsageError("--domain-delay must be >= 0 and --timeout > 0")
        if not self.out_dir.strip():
            raise UsageError("--out-dir must not be empty (the demo writes results.jsonl, "
                             "report.html, logs/ and parts/ there)")
        if self.out:
            postgres.parse_url(self.out)  # a password, a bad table, not postgresql://: exit 2


def configure(parser: argparse.ArgumentParser) -> None:
    """No positionals."""


class DemoProgress:
    """A live bar on a TTY (redrawn in place), a plain line every few seconds otherwise."""

    def __init__(self, stream: IO[str], live: bool) -> None:
        self.stream = stream
        self.live = live
        self.t0 = time.monotonic()
        self._last_line = 0.0
        self._last: tuple[int, int] = (-1, -1)

    def say(self, text: str) -> None:
        print(f"demo: {text}", file=self.stream, flush=True)

    def show(self, counts: dict[str, int], offered: int, depth: int) -> None:
        done = sum(counts.values())
        rate = done / max(time.monotonic() - self.t0, 1e-6)
        shares = " ".join(f"{n} {100.0 * c / done:.0f}%" if done else f"{n} -"
                          for n, c in counts.items())
        total = max(offered, done)
        if self.live:
            filled = int(24 * done / total) if total else 0
            bar = "█" * filled + "░" * (24 - filled)
            self.stream.write(f"\r[{bar}] {done}/{total} items  {rate:5.1f}/s  {shares}  "
                              f"queue {depth}   ")
            self.stream.flush()
        elif (done, total) != self._last and time.monotonic() - self._last_line >= 2.0:
            self._last_line = time.monotonic()
            self._last = (done, total)
            self.say(f"{done}/{total} items done, {rate:.1f} items/s, {shares}, queue {depth}")

    def close(self) -> None:
        if self.live:
            self.stream.write("\n")
            self.stream.flush()


def _ms(v: float | None) -> str:
    return "-" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.3g}")


def render_summary(res: DemoResult, cfg: DemoConfig) -> str:
    """What the operator reads at the end: outcomes, shares, timing, paths, next steps."""
    s: dict[str, Any] = res.summary
    n = s["records"]
    lines = [f"zkcrawl demo: {n} items crawled in {res.elapsed_s:.1f}s by {cfg.consumers} "
             f"consumers x {cfg.threads} threads (--domain-delay {cfg.domain_delay:g}s: "
             "one local host)", "", "Outcomes"]
    for outcome, count in s["outcomes"].items():
        why = REASONS.get(outcome, "fetched and extracted" if outcome == "ok" else "")
        lines.append(f"  {outcome:<14} {count:>4}  {why}")
    shares = ", ".join(f"{c['id']} {c['count']} ({c['pct']:.0f}%)" for c in s["consumers"])
    lines += ["", f"Consumers  {shares}", "", "Timing (ms)        p50      p95      max"]
    for key, label in (("queue_ms", "queued"), ("dispatch_ms", "dispatch"),
                       ("wait_ms", "wait (backlog)"), ("polite_ms", "  of it polite"),
                       ("process_ms", "process")):
        t = s["timing"][key]
        lines.append(f"  {label:<14} {_ms(t['p50']):>8} {_ms(t['p95']):>8} {_ms(t['max']):>8}")
    lines += [f"  Pace: {s['pace']['text']}",
              "  dispatch = from the take in ZooKeeper until handed to the pool; wait = in the",
              "  capped backlog, polite = the part of it waiting for the host's turn; process =",
              "  fetch + parse + write. Here one local host and --domain-delay "
              f"{cfg.domain_delay:g}s: a real", "  crawl spreads over many hosts.", ""]
    if res.producer_summary:
        lines += [f"Producer   {res.producer_summary[:300]}", ""]
    lines += res.notes
    if cfg.out:
        lines += [f"Table      {postgres.parse_url(cfg.out).shown}  ({n} rows of root "
                  f"{ROOT}; zkcrawl report {postgres.parse_url(cfg.out).shown})"]
    lines += [f"Results    {_rel(res.results)}  ({n} records, one JSON object per line)",
              f"Report     {_rel(res.html)}  (open in a browser; text: zkcrawl report "
              f"{_rel(res.results)})",
              f"Logs       {_rel(res.logs)}/", "", *_real_cluster()]
    return "\n".join(lines) + "\n"


def _rel(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return rel if not rel.startswith("..") else str(path)


def _real_cluster() -> list[str]:
    zk = "zk1:2181,zk2:2181,zk3:2181"
    start = f"https://blog.example.com{START_PATH}"
    return [
        "The same crawl against a real ZooKeeper ensemble:",
        f"  export ZKCRAWL_ZK={zk}",
        "  zkcrawl-consumer --out results-$(hostname).jsonl --threads 16   # on each machine",
        f"  zkcrawl-producer --start {start} --next '{NEXT_XPATH}' \\",
        f"      --links-css '{LINKS_CSS}' --same-host",
        "  zkcrawl status --watch 2",
        "  zkcrawl report results-*.jsonl --html report.html",
    ]


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    setup_logging(settings)
    live = settings.progress == "bar" or (settings.progress == "auto" and sys.stderr.isatty())
    cfg = DemoConfig(out_dir=Path(settings.out_dir), consumers=settings.consumers,
                     threads=settings.threads, domain_delay=settings.domain_delay,
                     timeout=settings.timeout, out=settings.out or None)
    try:
        res = run_demo(cfg, DemoProgress(sys.stderr, live))
    except KeyboardInterrupt:
        print(f"zkcrawl demo: interrupted; every process it started is stopped; partial "
              f"results in {_rel(Path(settings.out_dir) / 'parts')}/", file=sys.stderr)
        return ExitStatus.FAILURE
    sys.stdout.write(render_summary(res, cfg))
    failed = {n: rc for n, rc in res.consumer_exits.items() if rc not in (0, None)}
    if failed or res.left_in_queue:
        print(f"zkcrawl demo: incomplete: consumer exits {failed}, {res.left_in_queue} left "
              f"in the queue; see {_rel(res.logs)}/", file=sys.stderr)
        return ExitStatus.FAILURE
    return ExitStatus.OK
