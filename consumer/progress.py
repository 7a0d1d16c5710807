"""What a person watching a consumer sees: a refreshing progress line on a terminal, and a
summary when it stops.

* :func:`progress_line` -- one line (state, items/s, ok/failed, in flight, backlog, the
  pace-setter): on a terminal the claim loop redraws it every :data:`REDRAW` seconds below
  the log lines (:func:`zkcrawl.logs.status`), while per-item events are at ``debug``;
* :func:`summary_text` -- the closing table a terminal gets (like ``zkcrawl demo``'s);
  :func:`summary_event` -- the same as the ``consumer.summary`` event for JSON logs.

Everything shown here is counts and times of this process, plus error reasons (short
strings the fetcher makes, printed through :func:`zkcrawl.textsafe.printable` anyway).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from zkcrawl.textsafe import printable

__all__ = ["REDRAW", "progress_line", "summary_event", "summary_text"]

REDRAW = 1.0  # seconds between two draws of the progress line
_WIDTH = 160  # a progress line longer than this is cut (a narrow terminal wraps it)
_NOT_ERRORS = frozenset({"ok", "retry", "dead"})  # outcome labels that are no error reason


def _duration(seconds: float) -> str:
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{seconds:.1f}s")


def progress_line(state: str, items_per_s: float, processed: int, failed: int,
                  in_flight: int, backlog: int, pace: dict[str, Any], elapsed: float) -> str:
    """``[running] 12.3 items/s · ok 340 · failed 5 · in flight 16 · backlog 32 ·
    pace: politeness 92% · 1m20s``."""
    setter = pace.get("pace", "idle")
    share = f" {pace['share']:.0%}" if setter not in ("idle", "supply") and pace.get(
        "share") else ""
    line = (f"[{state}] {items_per_s:.1f} items/s · ok {processed - failed} · failed "
            f"{failed} · in flight {in_flight} · backlog {backlog} · pace: {setter}{share} · "
            f"{_duration(elapsed)}")
    return printable(line, _WIDTH)


def _reasons(outcomes: Counter[str]) -> str:
    errors = Counter({k: v for k, v in outcomes.items() if k not in _NOT_ERRORS})
    return ", ".join(f"{printable(k, 40)} {v}" for k, v in errors.most_common(6))


def summary_event(consumer: str, elapsed: float, processed: int, failed: int,
                  outcomes: Counter[str], pace: dict[str, Any],
                  timing: dict[str, float]) -> dict[str, Any]:
    """The key/values of ``consumer.summary`` (JSON logs)."""
    return {"consumer": consumer, "elapsed_s": round(elapsed, 3), "processed": processed,
            "ok": processed - failed, "failed": failed,
            "items_per_s": round(processed / elapsed, 3) if elapsed > 0 else 0.0,
            "retried": outcomes.get("retry", 0), "dead": outcomes.get("dead", 0),
            "errors": {k: v for k, v in outcomes.items() if k not in _NOT_ERRORS},
            "pace": pace.get("pace"), "verdict": pace.get("text"), **timing}


def summary_text(event: dict[str, Any], outcomes: Counter[str]) -> str:
    """The closing table for a terminal (from :func:`summary_event`'s values)."""
    e = event
    reasons = _reasons(outcomes)
    rows = [
        ("processed", f"{e['processed']}  (ok {e['ok']}, failed {e['failed']}"
                      + (f": {reasons})" if reasons else ")")),
        ("retried", f"{e['retried']} tries put back, {e['dead']} dead letters"),
        ("rate", f"{e['items_per_s']:.2f} items/s over {_duration(e['elapsed_s'])}"),
        ("timing p50", " · ".join(f"{name} {e[key]:.0f} ms" for name, key in (
            ("dispatch", "dispatch_p50_ms"), ("polite", "polite_p50_ms"),
            ("pool", "pool_p50_ms"), ("fetch", "fetch_p50_ms"), ("parse", "parse_p50_ms"),
            ("write", "write_p50_ms")) if key in e)),
        ("pace", printable(str(e.get("verdict") or "idle: nothing processed"))),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"zkcrawl-consumer {printable(e['consumer'], 80)} stopped"]
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    return "\n".join(lines) + "\n"
