"""``zkcrawl report``: summarize consumer result files (JSON Lines, SPEC §4) --
:func:`load_records`, :func:`summarize`, then :func:`render_text` or :func:`render_html`
(self-contained: inline CSS and SVG, no script, no external resource).

Result files are untrusted input. Guarantees, whatever the bytes:

* nothing but an unreadable file raises: bad lines are counted in ``bad_lines``, unusable
  values in ``bad_values``;
* the summary holds only finite numbers and bounded UTF-8 labels, so ``--json`` is strict
  JSON;
* a failure of the user's code counts by kind, exception type and place
  (:func:`failure_reason`), whatever its message: one bug on one line is one reason;
* text output goes through :func:`zkcrawl.textsafe.printable`, HTML is escaped.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import html
import json
import math
import re
import sys
import zlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog

from zkcrawl.errors import UsageError
from zkcrawl.textsafe import ELLIPSIS, scrub, shown_url
from zkcrawl.verdict import Stages, failures_of, judge

if TYPE_CHECKING:  # the type only: reading results files needs no ZooKeeper code
    from zkcrawl.admin.cluster import DeadLetter

__all__ = ["LABEL_LIMIT", "TIMINGS", "dead_records", "failure_reason", "latest_records",
           "load_records", "parse_line", "render_html", "render_text", "skipped_note",
           "summarize"]

log = structlog.get_logger(__name__)

#: The per-item durations a record carries, in the order an item meets them (``polite_ms``
#: is the part of ``wait_ms`` spent waiting for the host's turn).
TIMINGS = ("queue_ms", "dispatch_ms", "wait_ms", "polite_ms", "process_ms")
_NICE_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200,
                 86400)
_MAX_BUCKETS = 60
_HIST_BINS = 24
LABEL_LIMIT = 200  # characters kept of an outcome, consumer, status or host label
_TINY_MS = 1e-6  # durations below this are no basis for a ratio or a bin width
_MAX_NUMBER = 1e15  # larger magnitudes are junk (31,000 years in ms), and sums stay finite
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def load_records(paths: Sequence[str]) -> tuple[list[dict[str, Any]], int]:
    """Read JSON Lines files (``-`` = stdin, ``*.gz`` decompressed); return (records, bad lines).

    A line that is not a JSON object (truncated by a killed consumer, binary junk, invalid
    UTF-8, nested too deep: see :func:`parse_line`) is counted as bad and skipped; blank lines
    are ignored; a damaged gzip stream keeps what was read and counts one bad.  Only a file
    that cannot be opened raises, as :class:`UsageError` with one line naming it.
    """
    records: list[dict[str, Any]] = []
    bad = 0
    for path in paths:
        try:
            ctx: contextlib.AbstractContextManager[IO[bytes] | gzip.GzipFile]
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
                    obj = parse_line(line)
                    if obj is None:
                        bad += 1
                    else:
                        records.append(obj)
            except (OSError, EOFError, zlib.error) as exc:
                # A damaged gzip stream or a read error: keep what was read, count one bad.
                log.warning("report.read_error", path=path, error=str(exc))
                bad += 1
    return records, bad


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One result line as a JSON object, or None (not UTF-8, not JSON, not an object, nested
    too deep); never raises. ``NaN``/``Infinity`` and overflowing floats such as ``1e999``
    decode as non-finite floats, which :func:`summarize` counts as bad values."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # ValueError includes UnicodeDecodeError
        return None
    return obj if isinstance(obj, dict) else None


def _percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile (a value that actually occurred)."""
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def _number(value: Any) -> float | None:
    """A finite number of magnitude <= 1e15, else None (``bool`` is not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        f = float(value)
    except OverflowError:  # an int of hundreds of digits
        return None
    return f if math.isfinite(f) and abs(f) <= _MAX_NUMBER else None


def _parse_time(value: Any) -> datetime | None:
    """An ISO 8601 time in 1970..9000 (naive = UTC), else None."""
    if not isinstance(value, str):
        return None
    try:
        dt = datetime.fromisoformat(value)
        # A naive timestamp is taken as UTC, which is what consumers write.
        dt = dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    except (ValueError, OverflowError):  # not ISO 8601; year 1 at +14:00
        return None
    return dt if _EARLIEST <= dt < _LATEST else None


@functools.lru_cache(maxsize=4096)
def _clean_label(text: str) -> str:
    """At most :data:`LABEL_LIMIT` characters, UTF-8-safe; a cut keeps the place that ends
    an error (`` (myproc.py:5)``)."""
    if len(text) <= LABEL_LIMIT:
        return scrub(text)
    place = _PLACE.search(text)
    tail = place.group() if place is not None and len(place.group()) < LABEL_LIMIT // 2 else ""
    return scrub(text[:LABEL_LIMIT - 1 - len(tail)] + ELLIPSIS + tail)


def _label(value: Any) -> str | None:
    """A label for a scalar JSON value (``str()`` as before, made UTF-8-safe and bounded);
    None for an object or array."""
    if isinstance(value, dict | list):
        return None
    return _clean_label(value if isinstance(value, str) else str(value))


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _host(url: str) -> str:
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return "(invalid)"
    return _clean_label(netloc.rpartition("@")[2].lower() or "(none)")


class _Fields:
    """Reads a record's fields for :func:`summarize`, counting the values it cannot use
    (present and not null, yet of the wrong type or out of range) in ``bad``."""

    def __init__(self) -> None:
        self.bad = 0

    def number(self, rec: dict[str, Any], key: str) -> float | None:
        raw = rec.get(key)
        value = _number(raw)
        if value is None and raw is not None:
            self.bad += 1
        return value

    def label(self, rec: dict[str, Any], key: str, default: str) -> str:
        raw = rec.get(key)
        value = _label(raw)
        if value is None:
            self.bad += 1
            return "(invalid)"
        return default if raw is None else value

    def time(self, rec: dict[str, Any]) -> datetime | None:
        raw = rec.get("fetched_at")
        value = _parse_time(raw)
        if value is None and raw is not None:
            self.bad += 1
        return value

    def host(self, rec: dict[str, Any]) -> str:
        url = rec.get("url")
        if isinstance(url, str):
            return _host(url)
        if url is not None:
            self.bad += 1
        return "(none)"


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
    if hi - lo < _TINY_MS:  # a span of 1e-320 ms would make bins of width 0
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
    if d is None or p is None or p < _TINY_MS:  # d / 1e-313 is infinite: no verdict
        return {"value": None, "verdict": "unknown",
                "interpretation": "not enough timing data to compare dispatch with processing"}
    ratio = d / p
    facts = f"dispatch p95 {_fmt(d)} ms = {ratio:.1%} of process p50 {_fmt(p)} ms"
    saturated = w is not None and w >= p
    if ratio < 0.05:
        verdict = "queue-not-bottleneck"
        text = f"queue is not the bottleneck ({facts})"
    elif ratio < 0.5:
        verdict = "queue-noticeable"
        text = f"queue overhead is noticeable ({facts}) but processing dominates"
    elif saturated:
        verdict = "workers-saturated"
        text = (f"dispatch is slow while items also wait to start ({facts}, wait p50 "
                f"{_fmt(w)} ms): the pace line says whether for a host's turn or a thread")
    else:
        verdict = "queue-bottleneck"
        text = (f"queue is the bottleneck ({facts}); check ZooKeeper latency and the number "
                f"of consumers per ensemble")
    return {"value": round(ratio, 4), "verdict": verdict, "interpretation": text}


def _pace(timing: dict[str, dict[str, Any]], outcomes: Counter[str] | None = None,
          records: int = 0) -> dict[str, Any]:
    """The pace-setter (:func:`zkcrawl.verdict.judge`) from the records' mean stages: the
    politeness wait (``polite_ms``) apart from the pool wait (the rest of ``wait_ms``), the
    fetch with its parse (``process_ms``); the sink's time is not in a record. A reason most
    records failed with (``outcomes``) leads it."""
    def mean(key: str) -> float | None:
        value = timing[key]["mean"]
        return float(value) if value is not None else None

    wait, polite = mean("wait_ms") or 0.0, mean("polite_ms")
    stages = Stages(items=timing["process_ms"]["n"], dispatch=mean("dispatch_ms") or 0.0,
                    polite=polite, pool=max(0.0, wait - (polite or 0.0)),
                    fetch=mean("process_ms") or 0.0, queue=mean("queue_ms"),
                    failures=failures_of({k: v for k, v in (outcomes or {}).items()
                                          if k != "ok"}), finals=records or None)
    return judge(stages).as_dict()


#: URLs listed per failure reason (the counts are always exact).
TOP_FAILED_URLS = 5
DEAD_CONSUMER = "(dead letter)"  # the consumer column of a dead letter without a record
_DEAD = "_dead_at"  # the key marking a record made from a dead letter (its time)


def dead_records(letters: Sequence[DeadLetter], records: Sequence[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """Records for the dead letters (:class:`~zkcrawl.admin.cluster.DeadLetter`) whose item
    has no failed record among ``records`` (the sink refused the record, the discovered
    links were not writable, a malformed item): so every dead letter is in the failure
    totals once. Their ``consumer`` is :data:`DEAD_CONSUMER`; they carry no timing."""
    failed_items = {item for r in records if r.get("error") is not None
                    and isinstance(item := r.get("item"), str)}
    out = []
    for d in letters:
        if d.item is not None and d.item in failed_items:
            continue
        t = _number(d.dead_at)
        at = datetime.fromtimestamp(t, UTC).isoformat() if t is not None and 0 <= t < 2e11 else None
        out.append({"url": d.url, "item": d.item, "error": d.error or "dead",
                    "attempt": max(0, d.attempts - 1), "consumer": DEAD_CONSUMER, _DEAD: at})
    return out


def latest_records(records: Sequence[dict[str, Any]], dead: Sequence[dict[str, Any]] = ()
                   ) -> tuple[list[dict[str, Any]], int]:
    """Each URL's final outcome: the record with the latest ``fetched_at`` (a dead letter:
    its time; the later line on a tie or without a time), so a requeued item that failed
    and then succeeded counts once, as ok. Records without a URL stay. Returns (records,
    how many were superseded); never raises. ``dead``: those of ``records`` that
    :func:`dead_records` made (the others' ``_dead_at`` key, if any, is data, not a time)."""
    made = {id(r) for r in dead}
    best: dict[str, tuple[datetime, int]] = {}
    keep: list[dict[str, Any] | None] = []
    for index, rec in enumerate(records):
        url = rec.get("url")
        keep.append(rec)
        if not isinstance(url, str):
            continue
        when = _parse_time(rec.get(_DEAD) if id(rec) in made else rec.get("fetched_at")
                           ) or _EARLIEST
        seen = best.get(url)
        if seen is not None and seen[0] > when:
            keep[index] = None
            continue
        if seen is not None:
            keep[seen[1]] = None
        best[url] = (when, index)
    final = [r for r in keep if r is not None]
    return final, len(records) - len(final)


#: A failure of the user's code (``zkcrawl.consumer.processors.failure_text``): ``processor: Type:
#: message (file.py:12)`` or ``pipeline NAME: Type: message (file.py:12)``, the place optional.
_CODE_FAILURE = re.compile(r"(processor|pipeline .+?): ([A-Za-z_][\w.]*): (.*?)"
                           r"(?: (\([^()]*:\d+\)))?", re.DOTALL)
#: The place that ends a reason: `` (myproc.py:5)``.
_PLACE = re.compile(r" \([^()]*:\d+\)\Z")


def failure_reason(error: str) -> str:
    """The reason an error counts under: a processor's or a pipeline stage's failure by its
    kind, exception type and place, whatever its message (``processor: ValueError: bad
    value 17 (myproc.py:5)`` -> ``processor: ValueError (myproc.py:5)``): one bug on one
    line is one reason. Any other error is its own reason."""
    match = _CODE_FAILURE.fullmatch(error)
    if match is None:
        return error
    kind, exc_type, _message, place = match.groups()
    return f"{kind}: {exc_type}" + (f" {place}" if place else "")


def _failures(failed: list[tuple[str, str, float | None, str]]) -> list[dict[str, Any]]:
    """Per reason (:func:`failure_reason`), most frequent first: its count, its most
    frequent error as ``example`` and how many distinct errors it holds (``messages``), and
    its :data:`TOP_FAILED_URLS` URLs (most failures first) with the most attempts seen and
    the last consumer."""
    by_reason: dict[str, dict[str, list[Any]]] = defaultdict(dict)
    errors: dict[str, Counter[str]] = defaultdict(Counter)
    for error, url, attempt, consumer in failed:
        reason = failure_reason(error)
        errors[reason][error] += 1
        entry = by_reason[reason].setdefault(url, [0, 0, consumer])
        entry[0] += 1
        entry[1] = max(entry[1], int(attempt or 0) + 1)
        entry[2] = consumer
    out = []
    for reason, urls in by_reason.items():
        top = sorted(urls.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_FAILED_URLS]
        out.append({"reason": reason, "count": sum(v[0] for v in urls.values()),
                    "urls": len(urls), "example": errors[reason].most_common(1)[0][0],
                    "messages": len(errors[reason]),
                    "top": [{"url": u, "failures": v[0], "attempts": v[1], "consumer": v[2]}
                            for u, v in top]})
    return sorted(out, key=lambda f: (-f["count"], f["reason"]))


def _redelivered(s: dict[str, Any]) -> str:
    return f", {s['redelivered']} redelivered after a holder died" if s.get("redelivered") else ""


def summarize(records: list[dict[str, Any]], bad_lines: int = 0, *, latest: bool = False,
              dead: Sequence[DeadLetter] = ()) -> dict[str, Any]:
    """Aggregate records into one JSON-serializable dict (see the module docs of the keys).

    ``dead``: the crawl's dead letters (:func:`dead_records` adds those without a failed
    record, so they are in the failure totals); ``latest``: each URL counted once, by its
    final outcome (:func:`latest_records`).

    Outcome is ``"ok"`` when ``error`` is null/absent, else ``str(error)``.  Percentiles are
    nearest-rank over the records that carry a number for that field.  Throughput is bucketed
    by ``fetched_at``; records without a parseable one are counted in ``undated``.  Values
    that cannot be used are ignored and counted in ``bad_values``; never raises.
    """
    extra = dead_records(dead, records) if dead else []
    records = [*records, *extra]
    superseded = 0
    if latest:
        records, superseded = latest_records(records, extra)
    made = {id(r) for r in extra}
    n = len(records)
    outcomes: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    hosts: Counter[str] = Counter()
    host_failed: Counter[str] = Counter()
    failed_urls: list[tuple[str, str, float | None, str]] = []
    per_consumer: dict[str, Counter[str]] = defaultdict(Counter)
    timing_values: dict[str, list[float]] = {k: [] for k in TIMINGS}
    dated: list[tuple[datetime, str]] = []
    total_bytes = retried = redelivered = 0
    fields = _Fields()
    for rec in records:
        failed = rec.get("error") is not None
        outcome = fields.label(rec, "error", "ok")
        outcomes[failure_reason(outcome) if failed else outcome] += 1
        consumer = fields.label(rec, "consumer", "") or "(unknown)"
        if id(rec) not in made:  # a dead letter's record is no consumer's work
            per_consumer[consumer]["failed" if failed else "ok"] += 1
        statuses[fields.label(rec, "status", "None")] += 1
        host = fields.host(rec)
        hosts[host] += 1
        if failed:
            host_failed[host] += 1
            url = rec.get("url")
            failed_urls.append((outcome, _clean_label(url) if isinstance(url, str)
                                else "(none)", _number(rec.get("attempt")), consumer))
        for key in TIMINGS:
            v = fields.number(rec, key)
            if v is not None:
                timing_values[key].append(v)
        b = fields.number(rec, "bytes")
        total_bytes += int(b) if b else 0
        # tries apart from redeliveries: a holder's death is an attempt, not a fetch
        a = fields.number(rec, "attempt") or 0
        deaths = max(0.0, min(a, fields.number(rec, "holder_deaths") or 0))
        retried += 1 if a - deaths > 0 else 0
        redelivered += 1 if deaths > 0 else 0
        t = fields.time(rec)
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
        "bad_values": fields.bad,
        "ok": n - len(failed_urls),
        "failed": len(failed_urls),
        "failures": _failures(failed_urls),
        "dead_letters": {"count": len(dead), "without_record": len(extra)},
        "latest": latest,
        "superseded": superseded,
        "outcomes": dict(outcomes.most_common()),
        "statuses": dict(statuses.most_common()),
        "consumers": [
            {"id": c, "count": (cnt := sum(per_consumer[c].values())),
             "pct": round(100.0 * cnt / max(n, 1), 2), "ok": per_consumer[c]["ok"],
             "failed": per_consumer[c]["failed"],
             "items_per_s": round(cnt / duration, 3) if duration > 0 else None}
            for c in consumers
        ],
        "hosts": [{"host": h, "count": c, "ok": c - host_failed[h], "failed": host_failed[h]}
                  for h, c in hosts.most_common()],
        "timing": timing,
        "histograms": {k: _histogram(timing_values[k], timing[k]) for k in TIMINGS},
        "first_fetched_at": _iso(first) if first else None,
        "last_fetched_at": _iso(last) if last else None,
        "duration_s": round(duration, 3),
        "items_per_s": round(len(dated) / duration, 3) if duration > 0 else None,
        "undated": n - len(dated),
        "bytes": total_bytes,
        "retried": retried, "redelivered": redelivered,
        "throughput": _throughput(dated, consumers),
        "ratio": _ratio(timing),
        "pace": _pace(timing, outcomes, n),
        "recrawl": recrawl_passes(records),
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


def skipped_note(summary: dict[str, Any]) -> str:
    """``, 2 bad lines skipped, 1 bad values ignored`` (the parts that are not zero)."""
    lines, values = summary.get("bad_lines", 0), summary.get("bad_values", 0)
    return ((f", {lines} bad lines skipped" if lines else "")
            + (f", {values} bad values ignored" if values else ""))


def _t(value: Any, width: int | None = None) -> str:
    """Data shown on a terminal: escaped (:func:`printable`), at most ``width`` characters
    of it; a URL's credentials masked, its non-ASCII host as punycode (:func:`shown_url`)."""
    return shown_url(str(value), width)


def _shown_host(hostport: str, width: int | None = None) -> str:
    """A host label (``host[:port]``) for display as :func:`shown_url` shows a URL's: a
    non-ASCII host (a homograph) as its punycode A-label, unsafe characters escaped."""
    return _t(shown_url("http://" + hostport)[len("http://"):], width)


def _dead_note(s: dict[str, Any]) -> str:
    dead = s.get("dead_letters") or {}
    if not dead.get("count"):
        return ""
    return (f", {_n(dead['count'], 'dead letter')} ({dead['without_record']} without a "
            "failed record, counted here too)")


def _n(count: int, noun: str) -> str:
    """``1 item``, ``2 items``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _reason(reason: Any, width: int) -> str:
    """A reason on a terminal, at most about ``width`` characters of it: a long one loses
    the middle of its message, never the place that ends it (`` (myproc.py:5)``)."""
    text = str(reason)
    place = _PLACE.search(text)
    if place is None or len(text) <= width:
        return _t(text, width)
    return _t(text[:place.start()], max(20, width - len(place.group()))) + _t(place.group())


def _example(f: dict[str, Any]) -> list[str]:
    """``e.g. processor: ValueError: bad value 17 (myproc.py:5)`` when the reason groups
    errors (its messages differ from it)."""
    example = f.get("example")
    if not isinstance(example, str) or example == f["reason"]:
        return []
    more = f.get("messages", 1)
    others = f" ({_n(more - 1, 'other message')})" if more > 1 else ""
    return [f"    e.g. {_reason(example, 100)}{others}"]


def _failures_text(s: dict[str, Any]) -> list[str]:
    """The "what broke?" section: per reason its count, an example and top URLs."""
    failures = s.get("failures") or []
    if not failures:
        return []
    out = ["", f"Failures ({_n(s['failed'], 'item')}, {_n(len(failures), 'reason')}"
                f"{_dead_note(s)})"]
    for f in failures:
        out.append(f"  {_reason(f['reason'], 80)}: {_n(f['count'], 'item')}, "
                   f"{_n(f['urls'], 'URL')}")
        out += _example(f)
        out += [f"    {_t(u['url'], 90)}  attempts {u['attempts']}  {_t(u['consumer'], 30)}"
                for u in f["top"]]
        if f["urls"] > len(f["top"]):
            out.append(f"    ... {f['urls'] - len(f['top'])} more URLs")
    return out


def render_text(summary: dict[str, Any]) -> str:
    """A plain-text report for a terminal (fixed-width tables, one sparkline per consumer).
    Every label from the data goes through :func:`printable`."""
    s = summary
    n = s["records"]
    out = [f"zkcrawl report: {n} records{skipped_note(s)}"]
    if s["first_fetched_at"]:
        rate = f", {s['items_per_s']:g} items/s" if s["items_per_s"] else ""
        out.append(f"fetched {s['first_fetched_at']} .. {s['last_fetched_at']} "
                   f"({_duration(s['duration_s'])}){rate}")
    again = (f", redelivered {s['redelivered']} (a holder died)"
             if s.get("redelivered") else "")
    out.append(f"ok {s['ok']}, failed {s['failed']}, retried {s['retried']}{again}, "
               f"{s['bytes']:,} bytes")
    if s.get("latest"):
        out.append(f"final outcome per URL (--latest): {s['superseded']} earlier records of "
                   "the same URLs not counted")
    out += ["", "Outcomes"]
    out += [f"  {_reason(k, 60):<22} {v:>8}  {100.0 * v / max(n, 1):5.1f}%"
            for k, v in s["outcomes"].items()]
    out += _failures_text(s)
    out += ["", f"  {'Consumer':<22} {'items':>8} {'share':>6} {'ok':>8} {'failed':>7} "
                f"{'items/s':>8}"]
    for c in s["consumers"]:
        out.append(f"  {_t(c['id'], 22):<22} {c['count']:>8} {c['pct']:5.1f}% {c['ok']:>8} "
                   f"{c['failed']:>7} {_fmt(c['items_per_s']):>8}")
    out += ["", f"  {'Timing (ms)':<22} {'n':>8} {'p50':>8} {'p95':>8} {'max':>8} {'mean':>8}"]
    for key in TIMINGS:
        t = s["timing"][key]
        out.append(f"  {key:<22} {t['n']:>8} {_fmt(t['p50']):>8} {_fmt(t['p95']):>8} "
                   f"{_fmt(t['max']):>8} {_fmt(t['mean']):>8}")
    out += ["", f"Pace: {s['pace']['text']}",
            f"Dispatch/process: {s['ratio']['interpretation']}"]
    hosts = s["hosts"]
    out += ["", f"Hosts ({len(hosts)}" + (", top 10)" if len(hosts) > 10 else ")")]
    out.append(f"  {'host':<40} {'items':>8} {'ok':>8} {'failed':>8}")
    out += [f"  {_shown_host(h['host'], 40):<40} {h['count']:>8} {h['ok']:>8} {h['failed']:>8}"
            for h in hosts[:10]]
    tp = s["throughput"]
    if tp["bucket_s"]:
        out += ["", f"Throughput (items per {tp['bucket_s']} s, from {tp['times'][0]})"]
        for cid, counts in tp["series"].items():
            out.append(f"  {_t(cid, 22):<22} |{_sparkline(counts)}| max {max(counts)}")
    out += _recrawl_text(s.get("recrawl"))
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
.verdict{padding:8px 12px;background:#eef5ff;border-left:4px solid #1f77b4}
table.failures td,table.failures th{text-align:left;max-width:640px;overflow-wrap:anywhere}
table.failures td:first-child{color:#b00020;font-weight:600}"""


def _e(value: Any) -> str:
    """HTML-escaped, after :func:`shown_url` (no control, bidi or invisible character in the
    page, no URL credentials, punycode hosts)."""
    return html.escape(shown_url(str(value)), quote=True)


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


def _failures_html(s: dict[str, Any]) -> list[str]:
    """``<section id="failures">``: one row per listed URL, grouped by reason."""
    failures = s.get("failures") or []
    if not failures:
        return []
    rows = []
    for f in failures:
        for i, u in enumerate(f["top"]):
            example = f.get("example")
            eg = f"; e.g. {example}" if isinstance(example, str) and example != f["reason"] else ""
            rows.append([f"{f['reason']} ({_n(f['count'], 'item')}, {_n(f['urls'], 'URL')}{eg})"
                         if i == 0 else "", u["url"], u["attempts"], u["consumer"]])
        if f["urls"] > len(f["top"]):
            rows.append(["", f"... {f['urls'] - len(f['top'])} more URLs", "", ""])
    return ['<section id="failures">',
            f"<h2>Failures ({_n(s['failed'], 'item')}, {_n(len(failures), 'reason')}"
            f"{_e(_dead_note(s))})</h2>",
            _table(["reason", "url", "attempts", "consumer"], rows).replace(
                "<table>", '<table class="failures">', 1), "</section>"]


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
        f"retried{_redelivered(s)}), {s['bad_lines']} bad lines, "
        f"{s.get('bad_values', 0)} bad values; "
        f"fetched {_e(s['first_fetched_at'] or '-')} .. "
        f"{_e(s['last_fetched_at'] or '-')} ({_duration(s['duration_s'])}), "
        f"{_e(s['items_per_s'] or '-')} items/s.</p>",
        f'<p class="verdict" data-pace="{_e(s["pace"]["pace"])}">{_e(s["pace"]["text"])}</p>',
        f'<p>{_e(s["ratio"]["interpretation"])}</p>',
        *([f"<p>Final outcome per URL (--latest): {s['superseded']} earlier records of the "
            "same URLs not counted.</p>"] if s.get("latest") else []),
        "<h2>Outcomes</h2>",
        _table(["outcome", "items", "%"],
               [[k, v, f"{100.0 * v / n:.1f}"] for k, v in s["outcomes"].items()]),
        *_failures_html(s),
        "<h2>Hosts</h2>",
        _table(["host", "items", "ok", "failed"],
               [[_shown_host(h["host"]), h["count"], h["ok"], h["failed"]]
                for h in s["hosts"][:50]]),
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
    parts += _recrawl_html(s.get("recrawl"))
    parts += ["</body></html>"]
    return "\n".join(parts) + "\n"


# -------------------------------------------------------------- re-crawls --
#: Records further apart than this (by ``fetched_at``) are in different passes.
PASS_GAP_S = 600.0
PASS_KINDS = ("new", "changed", "unchanged", "gone", "failed")
_MAX_PASSES = 20  # the latest ones shown


def _pass_kind(rec: dict[str, Any]) -> str:
    """new (no ``changed``: a first fetch), changed, unchanged, gone (404/410), failed."""
    error = rec.get("error")
    if error in ("http-404", "http-410"):
        return "gone"
    if error is not None:
        return "failed"
    changed = rec.get("changed")
    if changed is True:
        return "changed"
    return "unchanged" if changed is False else "new"


def recrawl_passes(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Issue #23: per pass -- records closer than :data:`PASS_GAP_S` to the previous one by
    ``fetched_at`` -- how many pages were new, changed, unchanged, gone or failed. None when
    no record is a re-crawl (none has a ``changed`` field). The latest
    :data:`_MAX_PASSES` passes are kept; undated records are left out."""
    if not any(isinstance(r.get("changed"), bool) for r in records):
        return None
    dated = sorted((t, _pass_kind(r)) for r in records
                   if (t := _parse_time(r.get("fetched_at"))) is not None)
    passes: list[dict[str, Any]] = []
    last: datetime | None = None
    for t, kind in dated:
        if last is None or (t - last).total_seconds() > PASS_GAP_S:
            passes.append({"start": _iso(t), "end": _iso(t), **dict.fromkeys(PASS_KINDS, 0)})
        passes[-1][kind] += 1
        passes[-1]["end"] = _iso(t)
        last = t
    return {"gap_s": PASS_GAP_S, "passes": passes[-_MAX_PASSES:],
            "total": {k: sum(p[k] for p in passes) for k in PASS_KINDS}}


def _recrawl_text(section: dict[str, Any] | None) -> list[str]:
    if not section:
        return []
    head = "".join(f" {k:>9}" for k in PASS_KINDS)
    out = ["", f"Re-crawl passes (a gap of {section['gap_s']:g} s starts a new one)",
           f"  {'pass start (UTC)':<26}{head}"]
    for p in section["passes"]:
        out.append(f"  {_t(p['start'], 26):<26}" + "".join(f" {p[k]:>9}" for k in PASS_KINDS))
    return out


def _recrawl_html(section: dict[str, Any] | None) -> list[str]:
    if not section:
        return []
    return ["<h2>Re-crawl passes</h2>",
            _table(["pass start (UTC)", "end", *PASS_KINDS],
                   [[p["start"], p["end"], *(p[k] for k in PASS_KINDS)]
                    for p in section["passes"]])]
