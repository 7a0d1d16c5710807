"""Issue #26, the consumer's messages as functions: the progress line's width, the verdict's
failure lead and the kazoo fold, for any input (hypothesis); the end-to-end tests that read
them on a terminal are in tests/test_diag_consumer_*.py."""

from __future__ import annotations

import logging
import math

from hypothesis import given
from hypothesis import strategies as st

from zkcrawl import logs
from zkcrawl.consumer.progress import Console, progress_line
from zkcrawl.consumer.timing import Timings
from zkcrawl.verdict import Stages, failures_of, judge

counts = st.integers(0, 10**9)
seconds = st.floats(0, 10**7, allow_nan=False)


@given(st.integers(0, 400), st.text(max_size=20), st.floats(allow_nan=True), counts, counts,
       counts, counts, seconds, st.one_of(st.none(), seconds),
       st.one_of(st.none(), st.tuples(st.text(max_size=80), st.floats(0, 1))))
def test_property_the_progress_line_fits_any_width(width, state, rate, processed, failed,
                                                   in_flight, backlog, elapsed, away,
                                                   failing):
    rate = rate if math.isfinite(rate) else 0.0
    line = progress_line(state, rate, processed, failed, in_flight, backlog,
                         {"pace": "site", "share": 0.5}, elapsed, away_s=away,
                         failing=failing, width=width)
    assert len(line) <= max(20, width - 1)
    assert "\n" not in line and "\r" not in line
    if away is not None:
        assert line.startswith("[suspended ")


def test_the_progress_line_drops_the_least_useful_first():
    args = ("running", 12.3, 340, 5, 16, 32, {"pace": "politeness", "share": 0.92}, 80.0)
    wide = progress_line(*args, width=200)
    assert wide == ("[running] 12.3 items/s · ok 335 · failed 5 · in flight 16 · backlog 32 · "
                    "pace: politeness 92% · 1m20s")
    assert progress_line(*args, width=90) == (
        "[running] 12.3 items/s · ok 335 · failed 5 · in flight 16 · pace: politeness 92%")
    assert progress_line(*args, width=80) == (
        "[running] 12.3 items/s · ok 335 · failed 5 · pace: politeness 92%")
    assert progress_line(*args, away_s=12.4, width=200).startswith("[suspended 12s] 12.3")


@given(st.dictionaries(st.text(max_size=30), st.one_of(st.integers(-5, 10**6), st.booleans(),
                                                       st.floats(), st.text(max_size=3)),
                       max_size=6),
       st.integers(-3, 10**6), st.one_of(st.none(), st.integers(-3, 10**6)))
def test_property_the_failure_lead_never_breaks_a_verdict(raw, items, finals):
    failures = failures_of(raw)  # type: ignore[arg-type]
    assert all(isinstance(r, str) and c > 0 for r, c in failures)
    v = judge(Stages(items=items, fetch=3.0, failures=failures, finals=finals))
    assert isinstance(v.text, str) and v.text
    if v.failure is not None:
        assert "% of items failed: " in v.text and "\n" not in v.text


def record(message: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("kazoo.client", level, __file__, 1, message, None, None)


def test_kazoo_chatter_is_folded_into_the_next_zk_line_only_when_asked():
    fold = logs._Chatter()
    assert not fold.fold(record("Connection dropped: socket connection broken"))  # off
    fold.enabled = True
    assert fold.fold(record("Connection dropped: socket connection broken"))
    assert fold.fold(record("Transition to CONNECTING"))
    assert not fold.fold(record("Some other kazoo warning"))  # written as it comes
    assert not fold.fold(record("Connection dropped: x", logging.ERROR))  # errors too
    assert fold.take() == {"kazoo": "Connection dropped: socket connection broken",
                           "kazoo_lines": 2}
    assert fold.take() == {}


class Reports:
    """What the Console hands its reporter (a list of (event, keys))."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, object]]] = []

    def info(self, event: str, **kw: object) -> None:
        self.lines.append((event, kw))


def test_under_a_progress_line_stats_are_one_short_line_a_minute():
    t, reports = Timings(), Reports()
    console = Console("c1", t, 10.0, True, reports, started=0.0)
    console._next_draw = math.inf  # the line itself is drawn by the pty tests
    for now in range(0, 200, 1):
        t.record((1.0, 1.0, 1.0), "ok", final=True, failed=False)  # working all along
        console.tick(float(now), "running", None, 1, 0, 1)
    stats = [kw for event, kw in reports.lines if event == "consumer.stats"]
    assert len(stats) == 3  # at 60, 120, 180 s -- not one per 10 s interval (19)
    assert set(stats[0]) == {"consumer", "state", "items_per_s", "processed", "failed",
                             "pace", "failing"}
    plain = Reports()
    json_like = Console("c1", Timings(), 10.0, False, plain, started=0.0)
    for now in range(0, 200, 1):
        json_like.tick(float(now), "running", None, 0, 0, 0)
    lines = plain.lines  # JSON logs: every interval; an idle consumer says so once
    assert sum(e == "consumer.stats" for e, _ in lines) == 19
    assert sum(e == "consumer.idle" for e, _ in lines) == 1


def test_stage_values_given_once_account_like_timings_computed_inside():
    """issue #23: the worker hands Timings the stage values it computed for the item; the
    windows, run sums and counters are those of the values computed inside."""
    from zkcrawl.consumer.timing import ItemTiming
    t = ItemTiming(claimed=1.0, queue_ms=5.0, submitted=1.002, started=1.010, finished=1.050,
                   polite_ms=3.0, extract_ms=0.5, fetched=1.040, written=1.070)
    a, b = Timings(), Timings()
    values = t.stage_values()
    assert (values[0], values[7], values[6]) == t.durations()
    a.record(t.durations(), "ok", final=True, failed=False, timing=t)
    b.record((values[0], values[7], values[6]), "ok", final=True, failed=False, timing=t,
             values=values)
    assert a.p50s() == b.p50s() and a.run_verdict() == b.run_verdict()
    assert t.fields() == {"queue_ms": 5.0, "dispatch_ms": 2.0, "wait_ms": 8.0,
                          "polite_ms": 3.0, "process_ms": 40.0}


def test_stage_values_unrounded_where_only_the_windows_see_them():
    """The windows take the stages unrounded (round() was most of the per-item cost); what
    is shown -- stages(), the percentiles -- is to the microsecond as before, and the three
    durations the record, the event and the metrics take are rounded as fields() has them."""
    from zkcrawl.consumer.timing import ItemTiming
    t = ItemTiming(claimed=0.1, queue_ms=1.0, submitted=0.3, started=0.7, fetched=0.9000004,
                   finished=1.1, written=1.3, polite_ms=0.1234567, extract_ms=0.0004444)
    values = t.stage_values()
    assert (values[0], values[7], values[6]) == t.durations() == (200.0, 400.0, 400.0)
    assert t.stages() == {"dispatch": 200.0, "polite": 0.123, "pool": 399.877,
                          "fetch": 200.0, "parse": 200.0, "write": 200.0, "process": 400.0,
                          "wait": 400.0, "extract": 0.0}
    timings = Timings()
    timings.record(t.durations(), "ok", final=True, failed=False, timing=t, values=values)
    assert timings.p50s() == {f"{k}_p50_ms": v for k, v in t.stages().items()}


def test_enabled_asks_the_logger_and_says_yes_when_it_cannot_tell():
    import structlog
    filtering = structlog.make_filtering_bound_logger(logging.INFO)(None, [], {})
    assert not logs.enabled(filtering, logging.DEBUG)
    assert logs.enabled(filtering, logging.WARNING)
    assert logs.enabled(object(), logging.DEBUG)  # no is_enabled_for: cannot tell
