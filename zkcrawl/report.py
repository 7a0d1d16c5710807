"""``zkcrawl report``: summarize consumer result files (JSON Lines, SPEC §4).

:func:`load_records` reads files tolerantly, :func:`summarize` turns records into one
JSON-serializable dict, :func:`render_text` and :func:`render_html` present it.  The HTML page
is self-contained (inline CSS and SVG, no script, no external resource), so it can be mailed or
attached to a ticket and opened anywhere.
"""

from __future__ import annotations

import contextlib
import gzip
import html
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO, Any
from urllib.parse import urlsplit

import structlog

from zkcrawl.errors import UsageError

__all__ = ["TIMINGS", "load_records", "render_html", "render_text", "summarize"]

log = structlog.get_logger(__name__)

#: The four per-item durations a record carries, in pipeline order.
TIMINGS = ("queue_ms", "dispatch_ms", "wait_ms", "process_ms")
_NICE_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200,
                 86400)
_MAX_BUCKETS = 60
_HIST_BINS = 24


def load_records(paths: Sequence[str]) -> tuple[list[dict[str, Any]], int]:
    """Read JSON Lines files (``-`` = stdin, ``*.gz`` decompressed); return (records, bad lines).

    A line that is not a JSON object (truncated by a killed consumer, binary junk...) is
    counted as bad and skipped; blank lines are ignored.  Only a file that cannot be opened
    raises, as :class:`UsageError` with one line naming it.
    """
    records: list[dict[str, Any]] = []
    bad = 0
    for path in paths:
        try:
            ctx: contextlib.AbstractContextManager[IO[bytes]]
            if path == "-":
                ctx = contextlib.nullcontext(sys.stdin.buffer)  # not ours to close
            elif path.endswith(".gz"):
                ctx = gzip.open(path, "rb")  # noqa: SIM115 - entered just below
            else:
                ctx = open(path, "rb")  # noqa: SIM115 - entered just below
        except OSError as exc:
            raise UsageError(f"{path}: cannot read results file: {exc.strerror or exc}") from None
        with ctx as stream:
            try:
                for line in stream:
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except ValueError:  # includes UnicodeDecodeError
                        bad += 1
                        continue
                    if isinstance(obj, dict):
                        records.append(obj)
                    else:
                        bad += 1
            except (OSError, EOFError) as exc:
                # A damaged gzip stream or a read error: keep what was read, count one bad.
                log.warning("report.read_error", path=path, error=str(exc))
                bad += 1
    return records, bad


def _percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile (a value that actually occurred)."""
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    # A naive timestamp is taken as UTC, which is what consumers write.
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _host(url: Any) -> str:
    if not isinstance(url, str):
        return "(none)"
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return "(invalid)"
    return netloc.rpartition("@")[2].lower() or "(none)"


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None, "mean": None}
    values.sort()
    return {"n": len(values), "p50": _percentile(values, 50), "p95": _percentile(values, 95),
            "p99": _percentile(values, 99), "max": values[-1],
            "mean": round(sum(values) / len(values), 3)}


def _histogram(values: list[float], st: dict[str, Any]) -> dict[str, Any]:
    """Equal-width bins; a long tail (max > 2 x p99) goes to one overflow bin."""
    if not values:
        return {"edges": [], "counts": [], "overflow": 0}
    lo = min(0.0, min(values))
    hi = st["p99"] if st["max"] > 2 * st["p99"] > 0 else st["max"]
    if hi <= lo:
        hi = lo + 1.0
    width = (hi - lo) / _HIST_BINS
    counts = [0] * _HIST_BINS
    overflow = 0
    for v in values:
        if v > hi:
            overflow += 1
        else:
            counts[min(_HIST_BINS - 1, int((v - lo) / width))] += 1
    edges = [round(lo + i * width, 3) for i in range(_HIST_BINS + 1)]
    return {"edges": edges, "counts": counts, "overflow": overflow}


def _throughput(dated: list[tuple[datetime, str]], consumers: list[str]) -> dict[str, Any]:
    """Items per consumer per time bucket; at most ~60 buckets of a 'nice' width."""
    if not dated:
        return {"bucket_s": None, "times": [], "series": {}}
    first = min(t for t, _ in dated).timestamp()
    last = max(t for t, _ in dated).timestamp()
    span = last - first
    bucket = next((b for b in _NICE_BUCKETS if span / b < _MAX_BUCKETS),
                  math.ceil(span / _MAX_BUCKETS))
    start = math.floor(first / bucket) * bucket  # aligned, so buckets read as wall-clock times
    n = int((last - start) // bucket) + 1
    series = {c: [0] * n for c in consumers}
    for t, consumer in dated:
        series[consumer][int((t.timestamp() - start) // bucket)] += 1
    times = [_iso(datetime.fromtimestamp(start + i * bucket, UTC)) for i in range(n)]
    return {"bucket_s": bucket, "times": times, "series": series}


def _ratio(timing: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Compare dispatch p95 with process p50 and say, in one line, what it means."""
    d = timing["dispatch_ms"]["p95"]
    p = timing["process_ms"]["p50"]
    w = timing["wait_ms"]["p50"]
    if d is None or p is None or p <= 0:
        return {"value": None, "verdict": "unknown",
                "interpretation": "not enough timing data to compare dispatch with processing"}
    ratio = d / p
    facts = f"dispatch p95 {_fmt(d)} ms = {ratio:.1%} of process p50 {_fmt(p)} ms"
    saturated = w is not None and w >= p
    if ratio < 0.05:
        verdict = "queue-not-bottleneck"
        text = f"queue is not the bottleneck ({facts}); " + (
            f"workers are saturated (wait p50 {_fmt(w)} ms): add threads or consumers"
            if saturated else "processing dominates")
    elif ratio < 0.5:
        verdict = "queue-noticeable"
        text = f"queue overhead is noticeable ({facts}) but processing dominates"
    elif saturated:
        verdict = "workers-saturated"
        text = (f"workers are the bottleneck: the backlog is full so dispatch waits for a slot "
                f"({facts}, wait p50 {_fmt(w)} ms); add threads or consumers")
    else:
        verdict = "queue-bottleneck"
        text = (f"queue is the bottleneck ({facts}); check ZooKeeper latency and the number "
                f"of consumers per ensemble")
    return {"value": round(ratio, 4), "verdict": verdict, "interpretation": text}


def summarize(records: list[dict[str, Any]], bad_lines: int = 0) -> dict[str, Any]:
    """Aggregate records into one JSON-serializable dict (see the module docs of the keys).

    Outcome is ``"ok"`` when ``error`` is null/absent, else ``str(error)``.  Percentiles are
    nearest-rank over the records that carry a number for that field.  Throughput is bucketed
    by ``fetched_at``; records without a parseable one are counted in ``undated``.
    """
    n = len(records)
    outcomes: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    hosts: Counter[str] = Counter()
    per_consumer: dict[str, Counter[str]] = defaultdict(Counter)
    timing_values: dict[str, list[float]] = {k: [] for k in TIMINGS}
    dated: list[tuple[datetime, str]] = []
    total_bytes = retried = 0
    for rec in records:
        err = rec.get("error")
        outcome = "ok" if err is None else str(err)
        outcomes[outcome] += 1
        consumer = str(rec.get("consumer") or "(unknown)")
        per_consumer[consumer]["ok" if outcome == "ok" else "failed"] += 1
        statuses[str(rec.get("status"))] += 1
        hosts[_host(rec.get("url"))] += 1
        for key in TIMINGS:
            v = _number(rec.get(key))
            if v is not None:
                timing_values[key].append(v)
        b = _number(rec.get("bytes"))
        total_bytes += int(b) if b else 0
        a = _number(rec.get("attempt"))
        retried += 1 if a and a > 0 else 0
        t = _parse_time(rec.get("fetched_at"))
        if t is not None:
            dated.append((t, consumer))

    first = min((t for t, _ in dated), default=None)
    last = max((t for t, _ in dated), default=None)
    duration = (last - first).total_seconds() if first and last else 0.0
    consumers = sorted(per_consumer, key=lambda c: (-sum(per_consumer[c].values()), c))
    timing = {k: _stats(timing_values[k]) for k in TIMINGS}
    return {
        "records": n,
        "bad_lines": bad_lines,
        "ok": outcomes.get("ok", 0),
        "failed": n - outcomes.get("ok", 0),
        "outcomes": dict(outcomes.most_common()),
        "statuses": dict(statuses.most_common()),
        "consumers": [
            {"id": c, "count": (cnt := sum(per_consumer[c].values())),
             "pct": round(100.0 * cnt / n, 2), "ok": per_consumer[c]["ok"],
             "failed": per_consumer[c]["failed"],
             "items_per_s": round(cnt / duration, 3) if duration > 0 else None}
            for c in consumers
        ],
        "hosts": [{"host": h, "count": c} for h, c in hosts.most_common()],
        "timing": timing,
        "histograms": {k: _histogram(timing_values[k], timing[k]) for k in TIMINGS},
        "first_fetched_at": _iso(first) if first else None,
        "last_fetched_at": _iso(last) if last else None,
        "duration_s": round(duration, 3),
        "items_per_s": round(len(dated) / duration, 3) if duration > 0 else None,
        "undated": n - len(dated),
        "bytes": total_bytes,
        "retried": retried,
        "throughput": _throughput(dated, consumers),
        "ratio": _ratio(timing),
    }


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _duration(seconds: float) -> str:
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{seconds:.1f}s")


def _sparkline(values: list[int]) -> str:
    bars = " ▁▂▃▄▅▆▇█"
    top = max(values, default=0)
    if top <= 0:
        return " " * len(values)
    return "".join(bars[0 if v == 0 else max(1, round(v / top * 8))] for v in values)


def render_text(summary: dict[str, Any]) -> str:
    """A plain-text report for a terminal (fixed-width tables, one sparkline per consumer)."""
    s = summary
    n = s["records"]
    out = [f"zkcrawl report: {n} records"
           + (f", {s['bad_lines']} bad lines skipped" if s["bad_lines"] else "")]
    if s["first_fetched_at"]:
        rate = f", {s['items_per_s']:g} items/s" if s["items_per_s"] else ""
        out.append(f"fetched {s['first_fetched_at']} .. {s['last_fetched_at']} "
                   f"({_duration(s['duration_s'])}){rate}")
    out.append(f"ok {s['ok']}, failed {s['failed']}, retried {s['retried']}, "
               f"{s['bytes']:,} bytes")
    out += ["", "Outcomes"]
    out += [f"  {k:<22} {v:>8}  {100.0 * v / n:5.1f}%" for k, v in s["outcomes"].items()]
    out += ["", f"  {'Consumer':<22} {'items':>8} {'share':>6} {'ok':>8} {'failed':>7} "
                f"{'items/s':>8}"]
    for c in s["consumers"]:
        out.append(f"  {c['id'][:22]:<22} {c['count']:>8} {c['pct']:5.1f}% {c['ok']:>8} "
                   f"{c['failed']:>7} {_fmt(c['items_per_s']):>8}")
    out += ["", f"  {'Timing (ms)':<22} {'n':>8} {'p50':>8} {'p95':>8} {'max':>8} {'mean':>8}"]
    for key in TIMINGS:
        t = s["timing"][key]
        out.append(f"  {key:<22} {t['n']:>8} {_fmt(t['p50']):>8} {_fmt(t['p95']):>8} "
                   f"{_fmt(t['max']):>8} {_fmt(t['mean']):>8}")
    out += ["", f"Dispatch/process: {s['ratio']['interpretation']}"]
    hosts = s["hosts"]
    out += ["", f"Hosts ({len(hosts)}" + (", top 10)" if len(hosts) > 10 else ")")]
    out += [f"  {h['host'][:40]:<40} {h['count']:>8}" for h in hosts[:10]]
    tp = s["throughput"]
    if tp["bucket_s"]:
        out += ["", f"Throughput (items per {tp['bucket_s']} s, from {tp['times'][0]})"]
        for cid, counts in tp["series"].items():
            out.append(f"  {cid[:22]:<22} |{_sparkline(counts)}| max {max(counts)}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------- HTML --
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")
_W, _H, _PAD = 480, 200, 36  # chart size and the margin that holds axis labels
_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:8px 0 20px}td,th{padding:3px 10px;text-align:right;
border-bottom:1px solid #ddd}td:first-child,th:first-child{text-align:left}
.charts{display:flex;flex-wrap:wrap;gap:16px}figure{margin:0}figcaption{font-weight:600}
svg.chart{background:#fafafa;border:1px solid #ddd}svg text{font:11px sans-serif;fill:#444}
.verdict{padding:8px 12px;background:#eef5ff;border-left:4px solid #1f77b4}"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _frame(chart: str, title: str, body: list[str], x_labels: tuple[str, str],
           y_top: str) -> str:
    x0, y0 = _PAD, _H - _PAD + 12
    return "\n".join([
        f'<figure><figcaption>{_e(title)}</figcaption>',
        f'<svg class="chart" data-chart="{_e(chart)}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{_e(title)}">',
        f'<line x1="{x0}" y1="{_H - _PAD}" x2="{_W - 8}" y2="{_H - _PAD}" stroke="#888"/>',
        f'<line x1="{x0}" y1="8" x2="{x0}" y2="{_H - _PAD}" stroke="#888"/>',
        f'<text x="{x0 - 4}" y="16" text-anchor="end">{_e(y_top)}</text>',
        f'<text x="{x0}" y="{y0 + 6}">{_e(x_labels[0])}</text>',
        f'<text x="{_W - 8}" y="{y0 + 6}" text-anchor="end">{_e(x_labels[1])}</text>',
        *body, "</svg></figure>"])


def _hist_svg(key: str, hist: dict[str, Any]) -> str:
    counts = hist["counts"] + ([hist["overflow"]] if hist["overflow"] else [])
    chart = f"hist-{key}"
    if not counts:
        return _frame(chart, f"{key}: no data", [f'<text x="{_W / 2}" y="{_H / 2}" '
                      'text-anchor="middle">no data</text>'], ("", ""), "")
    top = max(counts) or 1
    plot_w, plot_h = _W - _PAD - 8, _H - _PAD - 12
    bw = plot_w / len(counts)
    edges = hist["edges"]
    bars = []
    for i, c in enumerate(counts):
        h = plot_h * c / top
        over = i >= len(hist["counts"])
        label = f"> {edges[-1]:g} ms" if over else f"{edges[i]:g}-{edges[i + 1]:g} ms"
        bars.append(f'<rect class="bar" x="{_PAD + i * bw + 1:.1f}" y="{_H - _PAD - h:.1f}" '
                    f'width="{max(bw - 2, 1):.1f}" height="{h:.1f}" '
                    f'fill="{"#d62728" if over else "#1f77b4"}"><title>{_e(label)}: {c}'
                    f"</title></rect>")
    hi = f"{'> ' if hist['overflow'] else ''}{_fmt(edges[-1])} ms"
    return _frame(chart, f"{key} (ms)", bars, (_fmt(edges[0]), hi), str(top))


def _line_svg(chart: str, title: str, times: list[str], bucket: int,
              series: dict[str, list[int]]) -> str:
    top = max((v / bucket for vals in series.values() for v in vals), default=0) or 1
    plot_w, plot_h = _W - _PAD - 8, _H - _PAD - 12
    step = plot_w / max(len(times) - 1, 1)
    body = []
    for idx, (cid, vals) in enumerate(series.items()):
        color = _PALETTE[idx % len(_PALETTE)]
        pts = [(_PAD + i * step, _H - _PAD - plot_h * (v / bucket) / top)
               for i, v in enumerate(vals)]
        body.append(f'<polyline class="line" fill="none" stroke="{color}" stroke-width="2" '
                    f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}">'
                    f"<title>{_e(cid)}</title></polyline>")
        body += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{color}"><title>{_e(cid)} '
                 f"{_e(times[i])}: {vals[i] / bucket:.3g}/s</title></circle>"
                 for i, (x, y) in enumerate(pts)]
    if len(series) > 1:  # legend in the bottom margin, between the two time labels
        spans = " ".join(f'<tspan fill="{_PALETTE[i % len(_PALETTE)]}">\u25a0 {_e(cid)}</tspan>'
                         for i, cid in enumerate(series))
        body.append(f'<text x="{_W / 2}" y="{_H - 8}" text-anchor="middle">{spans}</text>')
    return _frame(chart, title, body, (times[0][11:19], times[-1][11:19]), f"{top:.3g}/s")


def _table(head: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{trs}</table>"


def render_html(summary: dict[str, Any]) -> str:
    """One self-contained HTML page: tables, an SVG histogram per timing, throughput lines.

    Every chart is ``<svg class="chart" data-chart="...">`` (``hist-<timing>``,
    ``throughput-all``, ``throughput-<consumer>``) drawn with real ``<rect>``/``<polyline>``
    elements; no script, stylesheet link, font or image is fetched.
    """
    s = summary
    n = s["records"] or 1
    parts = [
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>zkcrawl report</title>", f"<style>{_CSS}</style></head><body>",
        "<h1>zkcrawl report</h1>",
        f"<p>{s['records']} records ({s['ok']} ok, {s['failed']} failed, {s['retried']} "
        f"retried), {s['bad_lines']} bad lines; fetched {_e(s['first_fetched_at'] or '-')} .. "
        f"{_e(s['last_fetched_at'] or '-')} ({_duration(s['duration_s'])}), "
        f"{_e(s['items_per_s'] or '-')} items/s.</p>",
        f'<p class="verdict">{_e(s["ratio"]["interpretation"])}</p>',
        "<h2>Outcomes</h2>",
        _table(["outcome", "items", "%"],
               [[k, v, f"{100.0 * v / n:.1f}"] for k, v in s["outcomes"].items()]),
        "<h2>Consumers</h2>",
        _table(["consumer", "items", "share %", "ok", "failed", "items/s"],
               [[c["id"], c["count"], c["pct"], c["ok"], c["failed"],
                 _fmt(c["items_per_s"])] for c in s["consumers"]]),
        "<h2>Timing (ms)</h2>",
        _table(["timing", "n", "p50", "p95", "max", "mean"],
               [[k, t["n"], _fmt(t["p50"]), _fmt(t["p95"]), _fmt(t["max"]), _fmt(t["mean"])]
                for k, t in s["timing"].items()]),
        '<div class="charts">',
        *(_hist_svg(k, s["histograms"][k]) for k in TIMINGS),
        "</div>",
    ]
    tp = s["throughput"]
    if tp["bucket_s"]:
        parts += [f"<h2>Throughput (items/s, {tp['bucket_s']} s buckets, UTC)</h2>",
                  '<div class="charts">',
                  _line_svg("throughput-all", "all consumers", tp["times"], tp["bucket_s"],
                            tp["series"])]
        parts += [_line_svg(f"throughput-{cid}", cid, tp["times"], tp["bucket_s"],
                            {cid: vals}) for cid, vals in tp["series"].items()]
        parts.append("</div>")
    parts += ["<h2>Hosts</h2>",
              _table(["host", "items"], [[h["host"], h["count"]] for h in s["hosts"][:50]]),
              "</body></html>"]
    return "\n".join(parts) + "\n"
