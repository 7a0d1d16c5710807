"""The pace verdict (zkcrawl.verdict): the rules on hand-made stages, any numbers at all,
and three real runs -- a real consumer against a real ZooKeeper and a real HTTP server --
bound by politeness, by the pool and by a slow site, each named right by the consumer's
stats, its whole-run verdict and ``zkcrawl report`` on its records."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.httpd import TestServer, delayed
from tests.test_consumer_support import Running, left, offer, records, settings_for
from zkcrawl.admin.report import render_html, render_text, summarize
from zkcrawl.verdict import PaceSetter, Stages, judge


@pytest.mark.parametrize(("stages", "pace", "figure"), [
    (Stages(items=10, dispatch=1, polite=1800, pool=20, fetch=50, parse=2, write=12),
     PaceSetter.POLITENESS, 1800),
    (Stages(items=10, dispatch=1, polite=0, pool=400, fetch=50, parse=2, write=12),
     PaceSetter.POOL, 400),
    (Stages(items=10, dispatch=1, polite=5, pool=5, fetch=900, parse=2, write=12),
     PaceSetter.SITE, 900),
    (Stages(items=10, dispatch=80, polite=0, pool=1, fetch=20, parse=2, write=12),
     PaceSetter.ZOOKEEPER, 80),
    (Stages(items=10, dispatch=1, polite=0, pool=1, fetch=2, parse=30, write=12),
     PaceSetter.PARSE, 30),
    (Stages(items=10, dispatch=1, polite=0, pool=1, fetch=20, parse=2, write=300),
     PaceSetter.SINK, 300),
    (Stages(items=10, dispatch=1, polite=None, pool=900, fetch=20),
     PaceSetter.BACKLOG, 900),
])
def test_the_largest_stage_sets_the_pace(stages: Stages, pace: PaceSetter,
                                        figure: float) -> None:
    v = judge(stages)
    assert v.pace is pace and v.figure_ms == figure and 0.5 < v.share <= 1.0
    assert "\n" not in v.text and f"{v.share:.0%}" in v.text


def test_a_consumer_not_full_is_waiting_for_supply() -> None:
    busy = Stages(items=10, polite=1800, fetch=50, fill=0.95)
    assert judge(busy).pace is PaceSetter.POLITENESS
    # Not full, but its items wait for their host: more items would only wait longer.
    few = Stages(items=10, polite=1800, fetch=50, fill=0.2)
    assert judge(few).pace is PaceSetter.POLITENESS
    starved = Stages(items=10, polite=0, fetch=50, fill=0.2)
    assert judge(starved).pace is PaceSetter.SUPPLY and "20%" in judge(starved).text
    assert judge(Stages(items=0)).pace is PaceSetter.IDLE


_numbers = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True))


@given(items=st.integers(-5, 10**9), dispatch=st.floats(), polite=_numbers,
       pool=st.floats(), fetch=st.floats(), parse=st.floats(), write=_numbers,
       fill=_numbers)
def test_any_numbers_give_one_line(items: int, dispatch: float, polite: float | None,
                                   pool: float, fetch: float, parse: float,
                                   write: float | None, fill: float | None) -> None:
    v = judge(Stages(items=items, dispatch=dispatch, polite=polite, pool=pool, fetch=fetch,
                     parse=parse, write=write, fill=fill))
    assert isinstance(v.pace, PaceSetter) and "\n" not in v.text and v.text
    assert math.isfinite(v.figure_ms) and 0.0 <= v.share <= 1.0
    v.as_dict()


# -- real runs ---------------------------------------------------------------------------

def _run(zk, zk_hosts, zk_root, tmp_path, urls, *flags: str) -> tuple[Running, list]:
    offer(zk, zk_root, urls)
    out = tmp_path / "o.jsonl"
    run = Running(settings_for(zk_hosts, zk_root, out, "--exit-when-idle", "0.5",
                               "--stats-interval", "3600", *flags))
    run.join(60)
    run.close()
    recs = records(out)
    assert sorted(r["url"] for r in recs) == sorted(urls)  # the books: every item, once
    assert left(zk, zk_root) == []
    return run, recs


def _check(run: Running, recs: list, pace: str) -> dict:
    whole = run.worker.timings.run_verdict()
    snap = run.worker.timings.snapshot(0, 0, 0)  # the consumer.stats payload of the run
    summary = summarize(recs)
    assert whole["pace"] == pace, whole
    assert snap["pace"] in (pace, "supply"), snap  # the run's tail drains the consumer
    assert summary["pace"]["pace"] == pace, summary["pace"]
    assert summary["pace"]["text"] in render_text(summary)
    assert f'data-pace="{pace}"' in render_html(summary)
    assert all(0 <= r["polite_ms"] <= r["wait_ms"] for r in recs)
    return summary


def test_politeness_bound_run(zk, zk_hosts, zk_root, tmp_path) -> None:
    # One host, 0.15 s between requests to it, four threads with little to do.
    with TestServer({"/p/*": delayed(0.005, lambda h: (200, {}, b"<title>p</title>"))}) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(14)]
        run, recs = _run(zk, zk_hosts, zk_root, tmp_path, urls, "--threads", "4",
                         "--backlog", "4", "--domain-delay", "0.15")
    summary = _check(run, recs, "politeness")
    timing = summary["timing"]
    assert timing["polite_ms"]["mean"] > 3 * timing["process_ms"]["mean"]
    assert "more threads will not help" in summary["pace"]["text"]


def test_pool_bound_run(zk, zk_hosts, zk_root, tmp_path) -> None:
    # No politeness gap, one thread, a deep backlog: items queue for the thread.
    with TestServer({"/p/*": delayed(0.02, lambda h: (200, {}, b"<title>p</title>"))}) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(40)]
        run, recs = _run(zk, zk_hosts, zk_root, tmp_path, urls, "--threads", "1",
                         "--backlog", "12", "--politeness", "local")
    summary = _check(run, recs, "pool")
    assert summary["timing"]["polite_ms"]["max"] < 50  # nothing waited for the host
    assert "add --threads" in summary["pace"]["text"]


def test_slow_site_run(zk, zk_hosts, zk_root, tmp_path) -> None:
    # Answers take 0.4 s; every item finds a free thread at once (no backlog).
    with TestServer({"/p/*": delayed(0.4, lambda h: (200, {}, b"<title>p</title>"))}) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(12)]
        run, recs = _run(zk, zk_hosts, zk_root, tmp_path, urls, "--threads", "4",
                         "--backlog", "0", "--politeness", "local")
    summary = _check(run, recs, "site")
    assert summary["pace"]["figure_ms"] >= 400


def test_records_without_polite_ms_do_not_blame_the_pool() -> None:
    """Records of consumers older than polite_ms: a long wait is 'backlog' (a host's turn or
    a thread, the records cannot tell), never 'add threads'."""
    old = [{"url": f"http://a.test/{i}", "dispatch_ms": 0.1, "wait_ms": 1800.0,
            "process_ms": 50.0, "error": None} for i in range(10)]
    pace = summarize(old)["pace"]
    assert pace["pace"] == "backlog" and "add --threads" not in pace["text"]
    new = [{**r, "polite_ms": 1750.0} for r in old]
    assert summarize(new)["pace"]["pace"] == "politeness"
