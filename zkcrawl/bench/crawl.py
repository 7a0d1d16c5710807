"""``zkcrawl bench crawl``: a whole crawl, zkcrawl against the seed's naive crawler, one run.

N article URLs of the synthetic site (:mod:`zkcrawl.bench.site`, its own process, every
response delayed by ``latency_ms``) are crawled by: ``seed_naive`` (seed 002's
``threaded_crawler`` as written), ``zkcrawl_1`` (one consumer, the queue filled beforehand,
the fsynced sink included), ``zkcrawl_2`` (two consumers), ``zkcrawl_requests``
(``--http requests``) and ``zkcrawl_pg`` (a PostgreSQL sink, alternating ``rounds`` times
with JSON Lines; skipped with the reason when there is no server or driver). With
``--extract article`` (:func:`run_article_bench`): ``title``, ``article_threads`` and
``article_pool`` instead. A throwaway ZooKeeper is started unless ``hosts`` is given.

Cases run in child processes sampled with psutil: CPU per page between the first and the
last page, RSS at the first and the last thousand; ``pct_ideal`` compares pages/s with
``threads x processes / latency``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from zkcrawl import postgres
from zkcrawl.admin.localzk import ZkServer
from zkcrawl.bench.naive import seed_supervisor
from zkcrawl.bench.site import start_benchsite, stop_benchsite
from zkcrawl.queue import control
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.zk.client import ZkClient

SAMPLE_S = 0.05
_ROOT = Path(__file__).resolve().parents[2]


# -- the seed's crawler, as a child process ------------------------------------------------
def naive_crawl(urls: list[str], max_threads: int, out: str) -> None:
    """seed 002 ``threaded_crawler`` with a pre-filled ``crawl_queue`` (no politeness delay,
    as for every case here); the scrape callback takes the title, like the consumer."""
    import lxml.html
    import requests

    crawl_queue = list(reversed(urls))  # pop() takes from the end: crawl in order
    sink = open(out, "w", buffering=1)  # noqa: SIM115 - one line per page, progress for the parent
    lock = threading.Lock()

    def process_queue() -> None:
        while True:
            try:
                url = crawl_queue.pop()
            except IndexError:
                break  # crawl queue is empty
            started = time.time()
            html = requests.get(url, headers={"User-agent": "wswp"}, timeout=60).content
            title = lxml.html.fromstring(html).findtext(".//title")
            with lock:
                sink.write(json.dumps({"url": url, "title": title, "start": started,
                                       "end": time.time()}) + "\n")

    seed_supervisor(process_queue, crawl_queue, max_threads)
    sink.close()



# -- child process sampling ---------------------------------------------------------------
class Probe:
    """Samples child processes: CPU seconds, RSS, and pages done (lines in their outputs)."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], outputs: list[Path],
                 marker: bytes = b"\n", children: bool = False,
                 count: Callable[[], int] | None = None) -> None:
        self.procs = procs
        # count: pages done, asked instead of reading outputs (the PostgreSQL case: rows)
        self.count = count
        # children: the CPU and RSS of their child processes too (--extract-workers); a
        # child killed between two samples takes its last CPU seconds with it.
        self.children = children
        self.child_rss_peak = 0.0  # MB, all children of all procs at once
        self.outputs = outputs
        self.marker = marker  # one per page in an output: a line, or an item.done event
        self.ps = [psutil.Process(p.pid) for p in procs]
        self.cpu_first: float | None = None
        self.pages_first = 0
        self._idle: tuple[float, int] | None = None  # the last sample before any page
        self.cpu_last = 0.0
        self.pages_last = 0
        self.rss_peak: list[float] = [0.0] * len(procs)
        self.rss_at: dict[int, float] = {}  # pages done -> max RSS (MB) of a child then
        self._read = [0] * len(outputs)  # bytes of each output counted so far
        self._lines = [0] * len(outputs)

    def _pages(self) -> int:
        if self.count is not None:
            return self.count()
        # Only what was appended since the last sample is read: the parent's own CPU must
        # not grow with the output while it shares the cores with what it measures.
        for i, path in enumerate(self.outputs):
            with contextlib.suppress(OSError), open(path, "rb") as fh:
                fh.seek(self._read[i])
                new = fh.read()
                new = new[:new.rfind(b"\n") + 1]  # whole lines only: a marker is never cut
                self._read[i] += len(new)
                self._lines[i] += new.count(self.marker)
        return sum(self._lines)

    def sample(self) -> int:
        cpu, rss = 0.0, []
        child_mb = 0.0
        for i, p in enumerate(self.ps):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                cpu += t.user + t.system
                mb = p.memory_info().rss / 2**20
                rss.append(mb)
                self.rss_peak[i] = max(self.rss_peak[i], mb)
            if self.children:
                c_cpu, c_mb = _children_usage(p)
                cpu += c_cpu
                child_mb += c_mb
        self.child_rss_peak = max(self.child_rss_peak, child_mb)
        pages = self._pages()
        if pages and self.cpu_first is None:
            # From the last sample without a page: a small run whose pages all land between
            # two samples (owners settle in groups) still has an interval to measure.
            self.cpu_first, self.pages_first = self._idle if self._idle else (cpu, pages)
        elif not pages:
            self._idle = (cpu, 0)
        if pages > self.pages_last:
            self.cpu_last, self.pages_last = cpu, pages
        if rss:
            self.rss_at[pages // 1000] = max(self.rss_at.get(pages // 1000, 0.0), max(rss))
        return pages

    def run(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # Sampled until the children exit (the consumers' idle timer): CPU is only
            # counted up to the last page, so the idle seconds cost nothing.
            self.sample()
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(SAMPLE_S)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    def cpu_ms_per_page(self) -> float:
        pages = self.pages_last - self.pages_first
        if self.cpu_first is None or pages <= 0:
            return 0.0
        return round((self.cpu_last - self.cpu_first) * 1000 / pages, 3)


def _children_usage(p: psutil.Process) -> tuple[float, float]:
    """CPU seconds and RSS (MB) of ``p``'s live child processes."""
    cpu = mb = 0.0
    with contextlib.suppress(psutil.Error):
        for child in p.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                t = child.cpu_times()
                cpu += t.user + t.system
                mb += child.memory_info().rss / 2**20
    return cpu, mb


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _summary(probe: Probe, spans: list[tuple[float, float]], n: int, ideal: float,
             procs: int = 1) -> dict[str, Any]:
    start = min(s for s, _ in spans)
    end = max(e for _, e in spans)
    rate = len(spans) / max(1e-9, end - start)
    buckets = sorted(probe.rss_at)
    return {"pages": len(spans), "expected": n, "seconds": round(end - start, 3),
            "pages_per_s": round(rate, 1), "pct_ideal": round(100 * rate / ideal, 1),
            "cpu_ms_per_page": probe.cpu_ms_per_page(),
            "probe_pages": probe.pages_last,  # the pages its CPU was sampled over (up to)
            # The rate at which that CPU per page fills one core per process (the GIL):
            # near pages_per_s, the case is CPU-bound, not bound by threads / latency.
            "cpu_bound_pages_per_s": round(procs * 1000 / probe.cpu_ms_per_page(), 1)
            if probe.cpu_ms_per_page() else None,
            "rss_mb": round(max(probe.rss_peak), 1),
            "rss_mb_first_1000": round(probe.rss_at[buckets[0]], 1) if buckets else None,
            "rss_mb_last_1000": round(probe.rss_at[buckets[-1]], 1) if buckets else None}


def _read_lines(paths: list[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        with open(path, "rb") as fh:
            for line in fh:
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


def _pct(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(len(ordered) * pct / 100 + 0.999) - 1))]


# -- cases --------------------------------------------------------------------------------
def case_naive(urls: list[str], threads: int, latency_ms: float, tmp: Path) -> dict[str, Any]:
    url_file, out = tmp / "naive-urls.txt", tmp / "naive.jsonl"
    url_file.write_text("\n".join(urls) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "zkcrawl.bench.crawl", "naive",
                             str(threads), str(url_file), str(out)], env=_env(),
                            stdin=subprocess.DEVNULL)
    probe = Probe([proc], [out])
    probe.run(timeout=60 + len(urls) * latency_ms / 1000)
    recs = _read_lines([out])
    spans = [(r["start"], r["end"]) for r in recs]
    return _summary(probe, spans, len(urls), threads / (latency_ms / 1000))


class RowCount:
    """Pages done by a PostgreSQL case: the rows of its table, asked once per sample on one
    autocommit connection (the server's CPU, not the consumer's; 0 until the consumer has
    made the table). The consumer's own log cannot tell: its per-item ``item.done`` events
    are debug, off in the bench (they made the case's CPU per page 0.0)."""

    def __init__(self, url: str) -> None:
        self.target = postgres.parse_url(url, "bench")
        self._conn: Any = None

    def __call__(self) -> int:
        import psycopg
        from psycopg import sql

        try:
            if self._conn is None:
                self._conn = postgres.connect(self.target, "zkcrawl-bench")
            query = sql.SQL("SELECT count(*) FROM {}").format(postgres.qualified(self.target))
            row = self._conn.execute(query).fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
        return int(row[0]) if row else 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def case_zkcrawl(hosts: str, urls: list[str], threads: int, latency_ms: float, procs: int,
                 tmp: Path, http: str = "curl", pg: str | None = None,
                 extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One crawl by ``procs`` consumers; ``extra``: more consumer flags (``--extract``)."""
    root = f"/bench-crawl-{uuid.uuid4().hex[:8]}"
    zk = ZkClient(hosts, session_timeout=30).connect()
    IngressQueue(zk, root).offer_many(Item(url=u, producer="bench") for u in urls)
    # Paused until every consumer is up (the operator's pause, SPEC §5): the processes
    # start one after the other, and the first must not run alone while the others
    # import -- the measured span would then hold a one-process stretch.
    control.set_state(zk, root, control.PAUSED, by="bench")
    tag = f"zk{procs}-{http}-{'pg' if pg else 'jsonl'}-{root[-8:]}"
    outs = [tmp / f"{tag}-{i}.jsonl" for i in range(procs)]
    logs = [tmp / f"{tag}-{i}.log" for i in range(procs)]
    table = f"bench_{root[-8:]}"  # a fresh table per case
    children = []
    for i in range(procs):
        with open(logs[i], "wb") as err:
            children.append(subprocess.Popen(
                [sys.executable, "-m", "zkcrawl.consumer.main", "--zk", hosts, "--root", root,
                 "--id", f"bench-{i}", "--threads", str(threads), "--backlog", str(threads * 2),
                 "--out", f"{pg}?table={table}" if pg else str(outs[i]),
                 "--exit-when-idle", "2", "--domain-delay", "0",
                 "--no-robots", "--log-format", "json", "--stats-interval", "5",
                 "--http", http, "--allow-private-addresses", *extra],
                env=_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err))
    try:
        _wait_registered(zk, root, procs, children, timeout=60)
        control.set_state(zk, root, control.RUNNING, by="bench")
    finally:
        zk.close()
    rows = RowCount(f"{pg}?table={table}") if pg else None
    probe = Probe(children, outs, children=bool(extra), count=rows)
    try:
        probe.run(timeout=60 + len(urls) * latency_ms / 1000)
    finally:
        if rows is not None:
            rows.close()
    recs = (postgres.load_rows(postgres.parse_url(f"{pg}?table={table}", "bench"))
            if pg else _read_lines(outs))
    spans = []
    for r in recs:
        end = datetime.fromisoformat(r["fetched_at"].replace("Z", "+00:00")).timestamp()
        spans.append((end - r["process_ms"] / 1000, end))
    out = _summary(probe, spans, len(urls), procs * threads / (latency_ms / 1000), procs)
    out["unique_urls"] = len({r["url"] for r in recs})
    out["errors"] = sum(1 for r in recs if r.get("error"))
    out["exit_codes"] = [c.returncode for c in children]
    out["dispatch_p95_ms"] = round(_pct([r["dispatch_ms"] for r in recs], 95), 3)
    out["process_p50_ms"] = round(_pct([r["process_ms"] for r in recs], 50), 3)
    out["wait_p50_ms"] = round(_pct([r["wait_ms"] for r in recs], 50), 3)
    if extra:
        out["children_rss_mb"] = round(probe.child_rss_peak, 1)
        out["with_text"] = sum(1 for r in recs if (r.get("fields") or {}).get("text"))
    return out


def _wait_registered(zk: ZkClient, root: str, n: int, children: list[subprocess.Popen[bytes]],
                     timeout: float) -> None:
    deadline = time.monotonic() + timeout
    path = Layout.of(root).consumers
    while len(zk.get_children(path) if zk.exists(path)
              else []) < n:
        if time.monotonic() > deadline or any(c.poll() is not None for c in children):
            raise RuntimeError("bench consumers did not start")
        time.sleep(SAMPLE_S)


@contextlib.contextmanager
def _zookeeper(hosts: str | None, tmp: Path) -> Iterator[str]:
    if hosts:
        yield hosts
        return
    server = ZkServer(tmp / "zk", heap_mb=512).start(wait=60)
    try:
        yield server.hosts
    finally:
        server.stop()


@contextlib.contextmanager
def _postgres(pg: str | None) -> Iterator[tuple[str | None, str]]:
    """(URL without a table, or None; why not). The given server, else a throwaway local
    one with the durable defaults; None when neither the driver nor a server is there."""
    try:
        import psycopg  # noqa: F401 - the optional extra
    except ImportError:
        yield None, "the PostgreSQL driver is not installed: pip install 'zkcrawl[postgres]'"
        return
    if pg:
        postgres.parse_url(pg, "--pg")
        yield pg.split("?", 1)[0], ""
        return
    from zkcrawl.admin.localpg import LocalPgError, PgServer

    try:
        server = PgServer(durable=True).start()
    except LocalPgError as exc:
        yield None, str(exc).splitlines()[0]
        return
    try:
        yield server.conninfo(), ""
    finally:
        server.destroy()


def run_bench(hosts: str | None, n: int = 2000, threads: int = 32, latency_ms: int = 50,
              json_out: bool = False, pg: str | None = None, rounds: int = 2,
              extract: str = "title") -> dict[str, Any]:
    """Run the cases in one run; returns the figures (``json_out`` only changes what the
    caller prints). JSON Lines and PostgreSQL alternate ``rounds`` times. ``extract``
    ``article``: the article cases instead (:func:`run_article_bench`)."""
    del json_out
    if extract == "article":
        return run_article_bench(hosts, n, threads, latency_ms)
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-crawl-") as name:
        tmp = Path(name)
        site, base = start_benchsite(latency_ms, n)
        try:
            with _zookeeper(hosts, tmp) as zk_hosts, _postgres(pg) as (pg_url, why_not):
                urls = [f"{base}/a/{i}.html" for i in range(1, n + 1)]
                out: dict[str, Any] = {"n": n, "threads": threads, "latency_ms": latency_ms,
                                       "cpus": os.cpu_count()}
                out["seed_naive"] = case_naive(urls, threads, latency_ms, tmp)
                jsonl, pgs = [], []
                for _ in range(rounds if pg_url else 1):
                    jsonl.append(case_zkcrawl(zk_hosts, urls, threads, latency_ms, 1, tmp))
                    if pg_url:
                        pgs.append(case_zkcrawl(zk_hosts, urls, threads, latency_ms, 1, tmp,
                                                pg=pg_url))
                out["zkcrawl_1"] = _best(jsonl)
                out["zkcrawl_requests"] = case_zkcrawl(zk_hosts, urls, threads, latency_ms, 1,
                                                       tmp, http="requests")
                out["zkcrawl_2"] = case_zkcrawl(zk_hosts, urls, threads, latency_ms, 2, tmp)
                if pgs:
                    out["zkcrawl_pg"] = _best(pgs)
                    out["rounds_jsonl_pages_per_s"] = [c["pages_per_s"] for c in jsonl]
                    out["rounds_pg_pages_per_s"] = [c["pages_per_s"] for c in pgs]
                else:
                    out["zkcrawl_pg"] = {"skipped": why_not}
        finally:
            stop_benchsite(site)
    out["ratios"] = _ratios(out)
    return out


ARTICLE_CASES = {"title": (), "article_threads": ("--extract", "article",
                                                 "--extract-workers", "0"),
                 "article_pool": ("--extract", "article")}


def run_article_bench(hosts: str | None, n: int, threads: int, latency_ms: int
                      ) -> dict[str, Any]:
    """``--extract article`` against the default, one consumer each, in one run:
    ``title`` (the default's fast path), ``article_threads`` (extraction in the fetch
    threads, ``--extract-workers 0``) and ``article_pool`` (the default: one extraction
    process per core). CPU per page counts the extraction processes too."""
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-article-") as name:
        tmp = Path(name)
        site, base = start_benchsite(latency_ms, n)
        try:
            with _zookeeper(hosts, tmp) as zk_hosts:
                urls = [f"{base}/a/{i}.html" for i in range(1, n + 1)]
                out: dict[str, Any] = {"n": n, "threads": threads, "latency_ms": latency_ms,
                                       "cpus": os.cpu_count(), "extract": "article"}
                for case, extra in ARTICLE_CASES.items():
                    out[case] = case_zkcrawl(zk_hosts, urls, threads, latency_ms, 1, tmp,
                                             extra=extra or ("--extract", "title"))
        finally:
            stop_benchsite(site)
    a, t, p = out["article_threads"], out["title"], out["article_pool"]

    def r(x: float, y: float) -> float:
        return round(x / y, 2) if y else 0.0

    out["ratios"] = {"pool_vs_threads_pages_per_s": r(p["pages_per_s"], a["pages_per_s"]),
                     "threads_vs_title_pages_per_s": r(a["pages_per_s"], t["pages_per_s"]),
                     "pool_vs_title_pages_per_s": r(p["pages_per_s"], t["pages_per_s"]),
                     "article_vs_title_cpu_per_page": r(a["cpu_ms_per_page"],
                                                        t["cpu_ms_per_page"])}
    return out


def render_article(out: dict[str, Any]) -> str:
    lines = [f"crawl of {out['n']} articles, {out['threads']} threads, {out['latency_ms']} ms "
             f"per response, {out['cpus']} CPUs, one consumer per case",
             f"{'case':<17}{'pages/s':>9}{'CPU ms/pg':>11}{'RSS MB':>8}{'pool MB':>9}"
             f"{'proc p50':>10}{'errors':>8}"]
    for key in ARTICLE_CASES:
        c = out[key]
        lines.append(f"{key:<17}{c['pages_per_s']:>9}{c['cpu_ms_per_page']:>11}"
                     f"{c['rss_mb']:>8}{c.get('children_rss_mb', 0.0):>9}"
                     f"{c['process_p50_ms']:>10}{c['errors']:>8}")
    rt = out["ratios"]
    lines.append(f"pages/s: pool / threads = {rt['pool_vs_threads_pages_per_s']}x, threads / "
                 f"title = {rt['threads_vs_title_pages_per_s']}x, pool / title = "
                 f"{rt['pool_vs_title_pages_per_s']}x; CPU per page article / title = "
                 f"{rt['article_vs_title_cpu_per_page']}x")
    return "\n".join(lines)


def _best(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the most pages/s (the least disturbed by the machine's other load)."""
    return max(cases, key=lambda c: c["pages_per_s"])


def _ratios(out: dict[str, Any]) -> dict[str, float]:
    def r(a: float, b: float) -> float:
        return round(a / b, 2) if b else 0.0

    one, two, seed = out["zkcrawl_1"], out["zkcrawl_2"], out["seed_naive"]
    req, pg = out["zkcrawl_requests"], out["zkcrawl_pg"]
    pg_ratios = {} if "skipped" in pg else {
        # the sinks, same run, alternated: < 1 means PostgreSQL is slower than the file
        "pg_vs_jsonl_pages_per_s": r(pg["pages_per_s"], one["pages_per_s"]),
        "pg_vs_jsonl_cpu_per_page": r(pg["cpu_ms_per_page"], one["cpu_ms_per_page"])}
    return {**pg_ratios, "zkcrawl_1_vs_seed": r(one["pages_per_s"], seed["pages_per_s"]),
            "zkcrawl_2_vs_1": r(two["pages_per_s"], one["pages_per_s"]),
            "dispatch_p95_over_process_p50": r(one["dispatch_p95_ms"], one["process_p50_ms"]),
            # the transports, same run: > 1 means requests costs more CPU per page than libcurl
            "requests_vs_curl_cpu_per_page": r(req["cpu_ms_per_page"], one["cpu_ms_per_page"]),
            "requests_vs_curl_pages_per_s": r(req["pages_per_s"], one["pages_per_s"])}


def render(out: dict[str, Any]) -> str:
    """A table for humans (``--json`` prints the dict instead)."""
    if out.get("extract") == "article":
        return render_article(out)
    lines = [f"crawl of {out['n']} articles, {out['threads']} threads per process, "
             f"{out['latency_ms']} ms per response, {out['cpus']} CPUs",
             f"{'case':<17}{'pages/s':>9}{'% ideal':>9}{'CPU ms/pg':>11}{'RSS MB':>8}"
             f"{'disp p95':>10}{'proc p50':>10}"]
    for key in ("seed_naive", "zkcrawl_1", "zkcrawl_2", "zkcrawl_requests", "zkcrawl_pg"):
        c = out[key]
        if "skipped" in c:
            lines.append(f"{key:<17}skipped: {c['skipped']}")
            continue
        lines.append(f"{key:<17}{c['pages_per_s']:>9}{c['pct_ideal']:>9}"
                     f"{c['cpu_ms_per_page']:>11}{c['rss_mb']:>8}"
                     f"{c.get('dispatch_p95_ms', '-'):>10}{c.get('process_p50_ms', '-'):>10}")
    rt = out["ratios"]
    lines.append(f"zkcrawl_1 / seed = {rt['zkcrawl_1_vs_seed']}x, zkcrawl_2 / zkcrawl_1 = "
                 f"{rt['zkcrawl_2_vs_1']}x, dispatch p95 / process p50 = "
                 f"{rt['dispatch_p95_over_process_p50']}")
    lines.append(f"CPU per page, --http requests / curl = {rt['requests_vs_curl_cpu_per_page']}x, "
                 f"pages/s = {rt['requests_vs_curl_pages_per_s']}x")
    if "pg_vs_jsonl_pages_per_s" in rt:
        lines.append(f"--out postgresql:// / JSON Lines: pages/s = {rt['pg_vs_jsonl_pages_per_s']}x"
                     f" (rounds, alternated: JSONL {out['rounds_jsonl_pages_per_s']}, "
                     f"PostgreSQL {out['rounds_pg_pages_per_s']}), CPU per page = "
                     f"{rt['pg_vs_jsonl_cpu_per_page']}x")
    return "\n".join(lines)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "naive":
    naive_crawl(Path(sys.argv[3]).read_text().split(), int(sys.argv[2]), sys.argv[4])
