"""``zkcrawl bench sitemap|watch``: the producer's sources that keep a crawl current, as ratios
against a baseline measured in the same run.

* ``bench sitemap``: a gzipped sitemap of N URLs on 127.0.0.1 read by ``zkcrawl-producer
  --sitemap`` (``sitemap``), against ``--from-file`` of the same URLs (``from_file``, the
  baseline) and :func:`zkcrawl.producer.sitemaps.decode` alone (``decode``): ``urls_per_s`` and
  ``peak_rss_mb``, and their ``ratio``.
* ``bench watch``: ``zkcrawl-producer --watch INTERVAL`` on a growing sample blog
  (:mod:`zkcrawl.admin.samplesite`): listing pages read per quiet pass (target 1), and the
  time from publishing an article to its offer against INTERVAL + one listing fetch.

Without ``--zk`` a throwaway ZooKeeper is used. Compare the ratios, not the absolutes.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from zkcrawl.admin import samplesite
from zkcrawl.bench.crawl import _zookeeper  # the benches' throwaway ZooKeeper, one copy
from zkcrawl.queue import partition_batch as pb
from zkcrawl.queue.layout import Layout
from zkcrawl.zk import ZkClient

_ROOT = Path(__file__).resolve().parents[2]
_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"


def sitemap_urls(n: int, host: str, seed: int = 7) -> list[str]:
    """N distinct article URLs on ``host``, some with tracking parameters."""
    rnd = random.Random(seed)
    urls = []
    for i in range(n):
        url = f"http://{host}/articles/{i // 100}/{rnd.randrange(10**6)}-{i}.html"
        if i % 5 == 1:
            url += "?utm_source=feed"
        urls.append(url)
    return urls


def sitemap_body(urls: list[str]) -> bytes:
    rows = "".join(f"<url><loc>{u.replace('&', '&amp;')}</loc>"
                   f"<lastmod>2026-0{1 + i % 9}-1{i % 10}T08:00:00Z</lastmod></url>"
                   for i, u in enumerate(urls))
    return gzip.compress(f'<?xml version="1.0" encoding="UTF-8"?>'
                         f'<urlset xmlns="{_NS}">{rows}</urlset>'.encode())


class _Files(ThreadingHTTPServer):
    daemon_threads = True
    files: dict[str, tuple[str, bytes]]


class _SitemapSiteHandler(BaseHTTPRequestHandler):
    server: _Files
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        ctype, body = self.server.files.get(self.path, ("text/plain", b""))
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def _serve(files: dict[str, tuple[str, bytes]]) -> Iterator[str]:
    httpd = _Files(("127.0.0.1", 0), _SitemapSiteHandler)
    httpd.files = files
    thread = threading.Thread(target=httpd.serve_forever, name="bench-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _producer_argv(hosts: str, root: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "zkcrawl.producer.main", "--zk", hosts, "--root", root,
            "--log-format", "json", "--log-level", "info", "--delay", "0",
            "--allow-private-addresses", *extra]


def _events(text: str, name: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if doc.get("event") == name:
                    out.append(doc)
    return out


def _hwm_kb(pid: int) -> int | None:
    """The process's peak resident set (``VmHWM``) so far, in KiB; None once it is gone.
    Not ``ru_maxrss``: after fork + exec that starts at the forking process's size."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _run_producer(argv: list[str], log: Path, timeout: float = 600) -> dict[str, Any]:
    """Run one producer process to its end; its summary and its peak RSS (VmHWM, sampled
    every 20 ms: the high-water mark only grows, so the last sample is the peak)."""
    peak = 0
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                peak = max(peak, _hwm_kb(proc.pid) or 0)
                time.sleep(0.02)  # the sampling period; bounded by ``timeout``
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
    summary = (_events(log.read_text(errors="replace"), "producer.summary") or [{}])[-1]
    return {"exit_status": proc.returncode, "offered": summary.get("offered"),
            "elapsed_s": summary.get("elapsed_s"),
            "urls_per_s": summary.get("offered_per_s"),
            "peak_rss_mb": round(peak / 1024, 1)}


def bench_decode(body: bytes) -> dict[str, Any]:
    """The decoder alone (inflate + parse + dates), in this process, untraced."""
    from zkcrawl.producer.sitemaps import Decoded, decode

    t0 = time.perf_counter()
    out = Decoded()
    n = sum(1 for _ in decode(body, time.time(), out))
    elapsed = time.perf_counter() - t0
    return {"urls": n, "urls_per_s": round(n / elapsed, 1), "elapsed_s": round(elapsed, 3),
            "decoded_bytes": out.decoded_bytes, "error": out.error}


def run_sitemap(hosts: str | None, n: int = 50_000, rounds: int = 2) -> dict[str, Any]:
    """The sitemap cases (module docstring), alternated ``rounds`` times (the best round
    of each is kept: on a shared machine the noise only ever slows a case down); fresh
    roots, removed at the end."""
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-sitemap-") as tmp_name:
        tmp = Path(tmp_name)
        urls = sitemap_urls(n, "news.example.com")
        body = sitemap_body(urls)
        (tmp / "urls.txt").write_text("\n".join(urls) + "\n", encoding="utf-8")
        cases: dict[str, Any] = {"decode": bench_decode(body)}
        with _zookeeper(hosts, tmp) as zk_hosts, \
                _serve({"/sitemap.xml.gz": ("application/gzip", body)}) as base:
            roots = []
            for _ in range(rounds):
                for case, extra in (
                        ("from_file", ("--from-file", str(tmp / "urls.txt"))),
                        ("sitemap", ("--sitemap", f"{base}/sitemap.xml.gz", "--no-robots"))):
                    root = f"/bench-sitemap-{uuid.uuid4().hex[:8]}"
                    roots.append(root)
                    argv = _producer_argv(zk_hosts, root, "--max-depth", str(n + 1),
                                          "--max-partition-depth", str(n + 1), *extra)
                    got = _run_producer(argv, tmp / f"{case}.log")
                    best = cases.get(case)
                    if best is None or (got["urls_per_s"] or 0) > (best["urls_per_s"] or 0):
                        cases[case] = got
            if hosts:
                _drop(zk_hosts, roots)
    s, f = cases["sitemap"], cases["from_file"]
    return {"n": n, "gzip_bytes": len(body), "cases": cases,
            "urls_per_s_ratio": _ratio(s["urls_per_s"], f["urls_per_s"]),
            "peak_rss_ratio": _ratio(s["peak_rss_mb"], f["peak_rss_mb"]),
            "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}


def _ratio(a: object, b: object) -> float | None:
    return round(a / b, 2) if isinstance(a, int | float) and isinstance(b, int | float) and b \
        else None


def _drop(hosts: str, roots: list[str]) -> None:
    zk = ZkClient(hosts).connect()
    try:
        for root in roots:
            with contextlib.suppress(Exception):
                zk.delete(root, recursive=True)
    finally:
        zk.close()


# -- bench watch --------------------------------------------------------------------------

class GrowingSite(samplesite.SampleSite):
    """The sample blog, with articles published on top of page 1 while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.published: list[int] = []

    def publish(self) -> str:
        n = samplesite.ARTICLES + 100 + len(self.published)
        self.published.insert(0, n)
        return f"{self.base_url}{samplesite.article_path(n)}"

    def route(self, path: str) -> tuple[int, str, bytes]:
        status, ctype, body = super().route(path)
        if path == "/blog/page/1" and self.published:
            links = "".join(f'<a class="titlelink" href="{samplesite.article_path(n)}">new</a>'
                            for n in self.published)
            body = body.replace(b"<body>", b"<body>" + links.encode(), 1)
        return status, ctype, body

    def listing_reads(self) -> int:
        return sum(1 for h in list(self.hits) if h.path.startswith("/blog/page/"))


def _enqueued_at(zk: ZkClient, root: str, url: str) -> float | None:
    """The ``enqueued_at`` (the producer's clock, Unix s) of the item of ``url``, if any:
    the producer offers into ``<root>/partitions/<p>/`` batches (SPEC §2)."""
    layout = Layout.of(root)
    for p in _children(zk, layout.partitions):
        path = f"{layout.partitions}/{p}"
        for name in _children(zk, path):
            with contextlib.suppress(Exception):  # gone, or not a batch: not this item
                batch, _ = pb.decode(zk.get(f"{path}/{name}")[0])
                for item in batch.items if batch is not None else ():
                    if item is not None and item.url == url and item.enqueued_at is not None:
                        return float(item.enqueued_at)
    return None


def _children(zk: ZkClient, path: str) -> list[str]:
    try:
        return list(zk.get_children(path))
    except Exception:  # not created yet
        return []


def _passes(zk: ZkClient, root: str, pid: str) -> dict[str, Any]:
    try:
        doc = json.loads(zk.get(f"{Layout.of(root).producers}/{pid}")[0])
    except Exception:  # not registered yet
        return {}
    return doc.get("watch") or {}


def _await(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)  # polling ZooKeeper for the bench's own observation; bounded
    return False


def run_watch(hosts: str | None, interval: float = 2.0, quiet_passes: int = 3
              ) -> dict[str, Any]:
    """The watch case (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="zkcrawl-bench-watch-") as tmp_name:
        tmp = Path(tmp_name)
        with _zookeeper(hosts, tmp) as zk_hosts, GrowingSite() as site:
            root = f"/bench-watch-{uuid.uuid4().hex[:8]}"
            argv = _producer_argv(zk_hosts, root, "--id", "bench-watch", "--same-host",
                                  "--start", site.base_url + "/blog/page/1",
                                  "--next", samplesite.NEXT_XPATH,
                                  "--links", samplesite.LINKS_XPATH,
                                  "--watch", f"{interval:g}s", "--watch-depth", "5")
            log = tmp / "watch.log"
            zk = ZkClient(zk_hosts).connect()
            with open(log, "wb") as err:
                proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.DEVNULL,
                                        stderr=err)
                try:
                    out = _watch_case(zk, root, site, interval, quiet_passes)
                finally:
                    proc.terminate()
                    proc.wait(60)
                    if hosts:
                        _drop(zk_hosts, [root])
                    zk.close()
            text = log.read_text(errors="replace")
            listing_ms = [e["elapsed_ms"] for e in _events(text, "listing.page")]
            _pages_from_log(out, _events(text, "watch.pass"))
    fetch_s = sorted(listing_ms)[len(listing_ms) // 2] / 1000 if listing_ms else 0.0
    # One listing fetch as a pass does it (fetch, parse, offer): a quiet pass's duration;
    # the HTTP fetch alone (median listing.page elapsed_ms) is reported beside it.
    bound = interval + max(out["quiet_pass_s"], fetch_s)
    out.update({"interval_s": interval, "listing_fetch_s": round(fetch_s, 4),
                "bound_s": round(bound, 3),
                "within_bound": out["offered_after_s"] is not None
                and out["offered_after_s"] <= bound,
                "exit_status": proc.returncode,
                "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)})
    return out


def _pages_from_log(out: dict[str, Any], passes: list[dict[str, Any]]) -> None:
    """Listing pages per pass from the producer's own ``watch.pass`` events (exact, unlike
    the site's request count sampled at pass boundaries): the first pass, and the quiet
    ones (no new URL) after it."""
    if not passes:
        return
    quiet = [p["pages"] for p in passes[1:] if p.get("new") == 0]
    out["first_pass_pages"] = passes[0]["pages"]
    out["quiet_passes"] = len(quiet)
    out["pages_per_quiet_pass"] = round(sum(quiet) / len(quiet), 2) if quiet else None


def _watch_case(zk: ZkClient, root: str, site: GrowingSite, interval: float,
                quiet_passes: int) -> dict[str, Any]:
    pid = "bench-watch"
    if not _await(lambda: _passes(zk, root, pid).get("passes", 0) >= 1, 120):
        raise RuntimeError("the watching producer never finished its first pass")
    first = site.listing_reads()  # (replaced by the log's exact counts at the end)
    done = _passes(zk, root, pid)["passes"]
    _await(lambda: _passes(zk, root, pid).get("passes", 0) >= done + quiet_passes,
           (quiet_passes + 2) * interval + 60)
    watch = _passes(zk, root, pid)
    quiet = watch["passes"] - done
    quiet_pass_s = float((watch.get("last_pass") or {}).get("duration_s") or 0.0)
    per_quiet = (site.listing_reads() - first) / max(quiet, 1)
    published = time.time()  # the producer's clock is this machine's: same host
    url = site.publish()
    found: list[float] = []

    def offered() -> bool:
        at = _enqueued_at(zk, root, url)
        if at is not None:
            found.append(at)
        return at is not None

    _await(offered, interval * 3 + 60)
    after = round(found[0] - published, 3) if found else None
    return {"first_pass_pages": first, "quiet_passes": quiet,
            "pages_per_quiet_pass": round(per_quiet, 2), "offered_after_s": after,
            "quiet_pass_s": round(quiet_pass_s, 4)}


def render(out: dict[str, Any]) -> str:
    c = out["cases"]
    lines = [f"bench sitemap: {out['n']:,} URLs, {out['gzip_bytes']:,} bytes gzipped, "
             f"{out['cpus']} CPUs, load {out['load_avg_1m']}"]
    for name in ("sitemap", "from_file"):
        r = c[name]
        lines.append(f"  {name:<10} {r['urls_per_s'] or 0:>10,.0f} URLs/s  peak RSS "
                     f"{r['peak_rss_mb']:>6.1f} MB  ({r['offered']} offered, exit "
                     f"{r['exit_status']})")
    d = c["decode"]
    lines.append(f"  {'decode':<10} {d['urls_per_s']:>10,.0f} URLs/s  (the decoder alone, "
                 f"{d['decoded_bytes']:,} bytes inflated)")
    lines.append(f"  ratio sitemap / from_file: URLs/s {out['urls_per_s_ratio']}, "
                 f"peak RSS {out['peak_rss_ratio']}")
    return "\n".join(lines)


def render_watch(out: dict[str, Any]) -> str:
    return "\n".join([
        f"bench watch: --watch {out['interval_s']:g}s, {out['cpus']} CPUs, "
        f"load {out['load_avg_1m']}",
        f"  first pass            {out['first_pass_pages']} listing pages",
        f"  quiet passes          {out['pages_per_quiet_pass']} listing pages per pass "
        f"({out['quiet_passes']} passes; target 1)",
        f"  new article offered   {out['offered_after_s']} s after publishing "
        f"(bound: INTERVAL + one quiet pass = {out['bound_s']} s; "
        f"{'within' if out['within_bound'] else 'NOT within'}; the HTTP fetch alone "
        f"{out['listing_fetch_s']} s)"])


def main(argv: list[str] | None = None) -> int:
    """``python -m zkcrawl.bench.sitemap [sitemap|watch] [--zk HOSTS] [--items N]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m zkcrawl.bench.sitemap", allow_abbrev=False)
    ap.add_argument("what", choices=("sitemap", "watch"), nargs="?", default="sitemap")
    ap.add_argument("--zk", default=None)
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.what == "watch":
        out = run_watch(args.zk)
        print(json.dumps(out) if args.json else render_watch(out))
    else:
        out = run_sitemap(args.zk, args.items)
        print(json.dumps(out) if args.json else render(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
