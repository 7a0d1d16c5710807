"""``zkcrawl demo``: the whole system on one machine, nothing to configure. :func:`run_demo`
starts a throwaway ZooKeeper, the sample blog, the producer and the consumers -- the very
``zkcrawl-producer`` and ``zkcrawl-consumer`` an operator runs -- shows progress, and
summarizes the results once the queue is drained.

* No process outlives it: every child in its own process group, an ordered shutdown
  (SIGTERM and drain, then SIGKILL, then the site and ZooKeeper) in ``finally`` with
  signals held; only a SIGKILL of the demo itself can orphan children.
* With ``out`` (a PostgreSQL table), the demo root's rows are deleted first, progress is
  counted there, and the rows are exported to ``results.jsonl`` for the report.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import zkcrawl
from zkcrawl import postgres
from zkcrawl.admin import report, samplesite
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.admin.partition_status import partition_status
from zkcrawl.errors import UsageError, ZkCrawlError
from zkcrawl.queue import untrusted
from zkcrawl.queue.layout import Layout
from zkcrawl.zk.client import ZkClient

if TYPE_CHECKING:
    import psycopg

ROOT = "/zkcrawl-demo"
#: Where the producer starts and how it reads the sample blog.
START_PATH = "/blog/page/1"
LINKS_CSS = "a.titlelink"
FIELDS = samplesite.FIELDS


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs; the defaults finish in seconds on a laptop."""

    out_dir: Path
    consumers: int = 2
    threads: int = 4
    backlog: int = 4  # small: with one host a deep backlog lets the first consumer hoard
    domain_delay: float = 0.05  # one local host: the 1.0 s default would make a slow demo
    idle: float = 5.0  # consumers' --exit-when-idle: a safety net, the demo stops them first
    timeout: float = 90.0  # the whole crawl, after ZooKeeper is up
    slow_s: float = 2.0  # the sample site's slow article
    out: str | None = None  # a postgresql:// table for the consumers, instead of part files


@dataclass
class DemoResult:
    """Where everything is, and the :func:`zkcrawl.admin.report.summarize` document."""

    out_dir: Path
    results: Path
    html: Path
    logs: Path
    base_url: str
    elapsed_s: float
    summary: dict[str, Any]
    producer_exit: int | None
    consumer_exits: dict[str, int | None]
    left_in_queue: int
    producer_summary: str = ""
    notes: list[str] = field(default_factory=list)


class Children:
    """The demo's subprocesses, each in its own process group, stopped in order."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self._logs: list[IO[bytes]] = []

    def start(self, name: str, argv: list[str], log: Path, *, pipe: bool = False
              ) -> subprocess.Popen[bytes]:
        """Start ``python argv`` in its own process group, output to ``log``
        (with ``pipe``, stdout stays a pipe for a readiness line)."""
        fh = open(log, "wb")  # noqa: SIM115 - closed in stop_all, after the child is gone
        self._logs.append(fh)
        with _INTERRUPTS.held():
            proc = subprocess.Popen([sys.executable, *argv],
                                    stdout=subprocess.PIPE if pipe else fh,
                                    stderr=fh if pipe else subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.env,
                                    start_new_session=True)
            self.procs[name] = proc
            self.logs[name] = log
        return proc

    def running(self, prefix: str = "") -> list[str]:
        return [n for n, p in self.procs.items() if n.startswith(prefix) and p.poll() is None]

    @staticmethod
    def _signal(procs: list[subprocess.Popen[bytes]], sig: int) -> None:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)

    def _stop(self, procs: list[subprocess.Popen[bytes]], grace: float) -> None:
        """SIGTERM each group, wait up to ``grace`` for them to drain, then SIGKILL."""
        self._signal(procs, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        self._signal(procs, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            # A grandchild could still hold the group: kill it even if the leader is gone.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def stop_all(self, grace: float, last: str = "site") -> None:
        """Stop everything; ``last`` (the site) only once the crawlers are gone, so their
        in-flight fetches can finish during the grace."""
        self._stop([p for n, p in self.procs.items() if n != last], grace)
        self._stop([p for n, p in self.procs.items() if n == last], grace)
        for proc in self.procs.values():
            if proc.stdout is not None:
                proc.stdout.close()
        for fh in self._logs:
            fh.close()


class _Interrupts:
    """SIGINT/SIGTERM as KeyboardInterrupt (see :func:`interruptible`), held back while a
    child is being started and registered (else it could be orphaned) and dropped during
    the clean-up (a second Ctrl-C must not cut it short)."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending = False

    def handler(self, _sig: int, _frame: object) -> None:
        if self.depth:
            self.pending = True
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self, deliver: bool = True) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if not self.depth and self.pending:
                self.pending = False
                if deliver:
                    raise KeyboardInterrupt


_INTERRUPTS = _Interrupts()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """In the main thread, SIGINT and SIGTERM raise KeyboardInterrupt so the clean-up runs
    (SIGINT explicitly: a shell starts background jobs with it ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _INTERRUPTS.handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def start_site(children: Children, slow_s: float, log: Path, timeout: float = 30) -> str:
    """Run the sample site in its own process; returns its base URL once it listens."""
    proc = children.start("site", ["-m", "zkcrawl.admin.samplesite", "--slow-s", str(slow_s)], log,
                          pipe=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
    if not line.startswith("READY "):
        raise ZkCrawlError(f"the sample site did not start within {timeout:g}s: "
                           f"{line or _log_tail(log)} (see {log})")
    return line.split(" ", 1)[1]


def child_env() -> dict[str, str]:
    """The environment of the children: this package importable, no ZKCRAWL_* leaking in."""
    src = str(Path(zkcrawl.__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZKCRAWL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def producer_argv(zk: str, base_url: str) -> list[str]:
    return ["-m", "zkcrawl.producer.main", "--zk", zk, "--root", ROOT, "--id", "demo-producer",
            "--start", base_url + START_PATH, "--next", samplesite.NEXT_XPATH,
            "--links-css", LINKS_CSS, "--same-host", "--delay", "0.05",
            "--allow-private-addresses",  # the sample site is on 127.0.0.1
            "--log-format", "json"]


def consumer_argv(zk: str, cfg: DemoConfig, name: str, out: Path) -> list[str]:
    argv = ["-m", "zkcrawl.consumer.main", "--zk", zk, "--root", ROOT, "--id", name,
            "--out", cfg.out or str(out), "--threads", str(cfg.threads),
            "--backlog", str(cfg.backlog),
            "--domain-delay", str(cfg.domain_delay), "--exit-when-idle", str(cfg.idle),
            "--grace", "5", "--timeout", "10", "--session-timeout", "5",
            "--allow-private-addresses", "--log-format", "json"]
    for fname, xpath in FIELDS.items():
        argv += ["--field", f"{fname}={xpath}"]
    return argv


class Tally:
    """Records written so far per consumer, read incrementally from the part files."""

    def __init__(self, parts: dict[str, Path]) -> None:
        self.parts = parts
        self.counts = dict.fromkeys(parts, 0)
        self._offsets = dict.fromkeys(parts, 0)

    def update(self) -> int:
        for name, path in self.parts.items():
            try:
                with open(path, "rb") as fh:
                    fh.seek(self._offsets[name])
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            complete = chunk[:chunk.rfind(b"\n") + 1]  # a half-written line waits
            self._offsets[name] += len(complete)
            self.counts[name] += complete.count(b"\n")
        return sum(self.counts.values())

    def close(self) -> None:
        """Nothing held between two reads of the part files."""


class TableTally(Tally):
    """Records written so far per consumer, counted in the results table (the demo's root)."""

    def __init__(self, parts: dict[str, Path], url: str) -> None:
        super().__init__(parts)
        self.target = postgres.parse_url(url)
        # one connection for every refresh, made again after a failure
        self._conn: psycopg.Connection[Any] | None = None

    def update(self) -> int:
        from psycopg import sql

        query = sql.SQL("SELECT consumer, count(*) FROM {} WHERE root = %s GROUP BY consumer"
                        ).format(postgres.qualified(self.target))
        try:
            if self._conn is None:
                self._conn = postgres.connect(self.target, "zkcrawl-demo")
            rows = self._conn.execute(query, (ROOT,)).fetchall()
        except Exception:  # a progress count only: the next refresh tries again
            self.close()
            return sum(self.counts.values())
        for consumer, count in rows:
            if consumer in self.counts:
                self.counts[consumer] = int(count)
        return sum(self.counts.values())


    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def prepare_table(url: str) -> None:
    """Create the table if missing and delete the rows of a previous demo (its root only)."""
    from psycopg import Error, sql

    target = postgres.parse_url(url)
    with postgres.connect(target, "zkcrawl-demo") as conn:
        try:
            postgres.create_table(conn, target)
            conn.execute(sql.SQL("DELETE FROM {} WHERE root = %s").format(
                postgres.qualified(target)), (ROOT,))
        except Error as exc:
            raise UsageError(f"--out {target.shown}: {postgres.first_line(exc)}") from None


def export_table(url: str, results: Path) -> None:
    """The demo's rows, as one results file in fetch order."""
    records = postgres.load_rows(postgres.parse_url(url), root=ROOT)
    _write_results(records, results)


class Display(Protocol):
    """Where the demo reports while it runs (the command draws a bar or prints lines)."""

    def say(self, text: str) -> None: ...

    def show(self, counts: dict[str, int], offered: int, depth: int) -> None: ...

    def close(self) -> None: ...


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _summary_event(log: Path) -> dict[str, Any] | None:
    """The producer's ``producer.summary`` log event, once it has written it."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("event") == "producer.summary":
            return ev
    return None


def producer_summary(log: Path) -> str:
    """One sentence from the producer's summary event ('' if absent)."""
    ev = _summary_event(log)
    if ev is None:
        return ""
    dropped = ev.get("dropped") or {}
    why = ", ".join(f"{k} {v}" for k, v in dropped.items())
    return (f"read {ev.get('pages_read')} listing pages, found {ev.get('links_found')} links, "
            f"dropped {sum(dropped.values())}" + (f" ({why})" if why else "")
            + f", skipped {ev.get('duplicates')} duplicates, offered {ev.get('offered')} items")


def _offered(zk: ZkClient) -> int:
    """What the producer says it offered (0 before it publishes, or once it is gone)."""
    try:
        data, _ = zk.get(Layout.of(ROOT).producer("demo-producer"))
    except Exception:  # missing node, no connection: the count is only for the progress bar
        return 0
    doc, _why = untrusted.load_object(data, {"offered": untrusted.NUMBER})
    return int(untrusted.number((doc or {}).get("offered"), 0, lo=0))


def _estimate(before: int, zk: ZkClient, children: Children, seen: int) -> int:
    """Items offered so far: the producer's final count once it is done; meanwhile the
    larger of its published count and records + queued (which may count an item twice
    for the instant between its record and its completion)."""
    if children.procs["producer"].poll() == 0:
        ev = _summary_event(children.logs["producer"])
        if ev is not None and isinstance(ev.get("offered"), int):
            return int(ev["offered"])
    return max(before, _offered(zk), seen)


def _depth(zk: ZkClient) -> int:
    """Items queued: in the ingress and, not done yet, in the partitions (a few batches in
    a demo: their data is read)."""
    stat = zk.exists(Layout.of(ROOT).queue)
    ingress = int(stat.numChildren) if stat else 0
    parts = partition_status(zk, ROOT, time.time(), {})
    if parts is None:
        return ingress
    items = parts.get("items")
    return ingress + int(items if items is not None else parts.get("batches") or 0)


def _await_first_item(zk: ZkClient, children: Children, timeout: float) -> None:
    """Start consumers once there is work, so ``--exit-when-idle`` cannot fire too early."""
    queued = threading.Event()
    zk.ensure_path(Layout.of(ROOT).queue)
    deadline = time.monotonic() + timeout
    while not queued.is_set() and time.monotonic() < deadline:
        if zk.get_children(Layout.of(ROOT).queue, watch=lambda _e: queued.set()):
            return
        if not children.running("producer"):
            return  # it ended (or failed) without offering: the caller reports it
        queued.wait(0.5)  # woken by the watch; the bound re-checks the producer's exit


def _crawl(zk: ZkClient, children: Children, cfg: DemoConfig, tally: Tally,
           display: Display) -> str:
    """Watch the crawl until the producer is done and the queue is empty.

    Returns why it ended: ``done``, ``producer-failed`` or ``consumers-exited``.
    """
    deadline = time.monotonic() + cfg.timeout
    offered = 0
    while time.monotonic() < deadline:
        producer = children.procs["producer"].poll()
        depth = _depth(zk)
        offered = _estimate(offered, zk, children, tally.update() + depth)
        display.show(dict(tally.counts), offered, depth)
        if producer not in (0, None):
            return "producer-failed"
        if producer == 0 and depth == 0:
            return "done"  # every item completed: its record is already on disk
        if not children.running("consumer"):
            return "consumers-exited"
        time.sleep(0.25)  # the display's refresh period
    raise ZkCrawlError(f"the demo crawl did not finish within {cfg.timeout:g}s; "
                       f"see the logs in {cfg.out_dir / 'logs'}")


def _merge(parts: dict[str, Path], results: Path) -> None:
    """One results file, in fetch order, from the consumers' part files."""
    records, _bad = report.load_records([str(p) for p in parts.values() if p.exists()])
    _write_results(records, results)


def _write_results(records: list[dict[str, Any]], results: Path) -> None:
    records.sort(key=lambda r: str(r.get("fetched_at") or ""))
    tmp = results.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, results)


def _prepare(out_dir: Path, consumers: int) -> tuple[Path, dict[str, Path]]:
    logs = out_dir / "logs"
    parts_dir = out_dir / "parts"
    parts = {f"consumer-{i}": parts_dir / f"consumer-{i}.jsonl" for i in range(1, consumers + 1)}
    try:
        for d in (out_dir, logs, parts_dir):
            d.mkdir(parents=True, exist_ok=True)
        for old in [*parts.values(), out_dir / "results.jsonl", out_dir / "report.html"]:
            old.unlink(missing_ok=True)  # a previous demo's files must not be counted again
    except OSError as exc:
        raise UsageError(f"--out-dir {out_dir}: {exc.strerror or exc}") from None
    return logs, parts


def run_demo(cfg: DemoConfig, display: Display) -> DemoResult:
    """Run the whole demo; raises :class:`ZkCrawlError` (one line) if a part fails."""
    out_dir = cfg.out_dir.resolve()
    logs, parts = _prepare(out_dir, cfg.consumers)
    if cfg.out:
        prepare_table(cfg.out)
    t0 = time.monotonic()
    with interruptible(), tempfile.TemporaryDirectory(prefix="zkcrawl-demo-") as tmp:
        server = ZkServer(Path(tmp) / "zk")
        children = Children(child_env())
        zk: ZkClient | None = None
        try:
            display.say(f"starting ZooKeeper on {server.hosts} and the sample site")
            with _INTERRUPTS.held():
                server.start(wait=0, detach=True)
            server.wait_serving(60)
            base_url = start_site(children, cfg.slow_s, logs / "site.log")
            zk = ZkClient(server.hosts, zk_timeout=15).connect()
            children.start("producer", producer_argv(server.hosts, base_url),
                           logs / "producer.log")
            _await_first_item(zk, children, timeout=30)
            for name, part in parts.items():
                children.start(name, consumer_argv(server.hosts, cfg, name, part),
                               logs / f"{name}.log")
            display.say(f"crawling {base_url} with {len(parts)} consumers")
            try:
                tally = TableTally(parts, cfg.out) if cfg.out else Tally(parts)
                try:
                    ended = _crawl(zk, children, cfg, tally, display)
                finally:
                    tally.close()
                producer_exit = children.procs["producer"].returncode
            finally:
                display.close()
            left = _depth(zk)
        finally:
            with _INTERRUPTS.held(deliver=False):
                children.stop_all(grace=8)
                if zk is not None:
                    zk.close()
                server.stop()
                (logs / "zookeeper.log").write_bytes(
                    server.log_path.read_bytes() if server.log_path.exists() else b"")
    exits = {n: p.returncode for n, p in children.procs.items() if n.startswith("consumer")}
    _check(ended, producer_exit, exits, logs)
    return _finish(out_dir, logs, parts, producer_exit, exits, base_url, left, t0, cfg.out)


def _check(ended: str, producer_exit: int | None, exits: dict[str, int | None],
           logs: Path) -> None:
    """Turn a failed part into one line that names its log."""
    if ended == "producer-failed":
        raise ZkCrawlError(f"the producer failed (exit {producer_exit}): "
                           f"{_log_tail(logs / 'producer.log', 1)} (see {logs}/producer.log)")
    failed = {n: rc for n, rc in exits.items() if rc not in (0, None)}
    if ended == "consumers-exited" and len(failed) == len(exits):
        name = next(iter(failed))
        raise ZkCrawlError(f"the consumers failed ({name} exit {failed[name]}): "
                           f"{_log_tail(logs / f'{name}.log', 1)} (see {logs}/{name}.log)")


def owner_runs(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """``(consumer, records)`` of each run of one consumer in fetch order: who owned the
    sample site's one host, and for how long (SPEC §2: a host has one owner at a time)."""
    runs: list[tuple[str, int]] = []
    for r in sorted(records, key=lambda r: str(r.get("fetched_at") or "")):
        who = str(r.get("consumer"))
        if runs and runs[-1][0] == who:
            runs[-1] = (who, runs[-1][1] + 1)
        else:
            runs.append((who, 1))
    return runs


def owners_note(records: list[dict[str, Any]]) -> str:
    """The summary's line on owners: the demo site is one host, so one consumer fetches it
    at a time; the shares between consumers come from many hosts."""
    runs = owner_runs(records)
    who = " then ".join(f"{c} ({n})" for c, n in runs)
    again = " -- a hand-over when the second joined" if len(runs) > 1 else ""
    return (f"Owners     one host here, so one owner at a time: {who}{again}; with more "
            "hosts their partitions spread over the consumers")


def _finish(out_dir: Path, logs: Path, parts: dict[str, Path], producer: int | None,
            exits: dict[str, int | None], base_url: str, left: int, t0: float,
            table: str | None = None) -> DemoResult:
    results, html = out_dir / "results.jsonl", out_dir / "report.html"
    if table:
        export_table(table, results)
    else:
        _merge(parts, results)
    records, bad = report.load_records([str(results)])
    summary = report.summarize(records, bad)
    html.write_text(report.render_html(summary), encoding="utf-8")
    res = DemoResult(out_dir=out_dir, results=results, html=html, logs=logs,
                     base_url=base_url, elapsed_s=round(time.monotonic() - t0, 2),
                     summary=summary, producer_exit=producer, consumer_exits=exits,
                     left_in_queue=left, producer_summary=producer_summary(logs / "producer.log"))
    if left:
        res.notes.append(f"{left} item(s) were still queued when the demo stopped")
    if records:
        res.notes += [owners_note(records), ""]
    if not records:
        raise ZkCrawlError(f"the demo produced no results; see the logs in {logs}")
    return res
