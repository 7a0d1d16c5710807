"""The PostgreSQL sink (consumer/sinks/postgres.py) against a real PostgreSQL server that the
tests start themselves (zkcrawl/admin/localpg.py, the ``pg_server`` fixture), real
ZooKeeper, real HTTP servers and real consumer processes:

* the URL is decoded as hostile input (hypothesis): only UsageError, never a password;
* any record (hypothesis: dates, sets, bytes, NaN, NUL, nesting) is stored or refused with a
  reason, by the database sink and by the JSON Lines sink alike; rows of a hostile table
  summarize without failing;
* one transaction per group, one row per item: a redelivered item hits the unique key;
* a record the database refuses becomes that item's dead letter with the database's reason,
  the rest of its group is stored;
* the database stopped mid-crawl, or the table locked past the statement timeout: the
  consumer stops claiming, releases what it holds, reconnects with backoff (bounded log
  lines) and finishes by itself;
* SIGKILL mid-crawl, right after a commit and from outside: every offered URL has exactly
  one row (slow);
* start-up: a password in the URL, a table that does not fit, a missing database: exit 2;
  no server: exit 75;
* ``zkcrawl report postgresql://...`` reads the table; ``zkcrawl demo --out`` writes to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import string
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import wait_for
from tests.httpd import TestServer, delayed
from tests.queue_view import held, queued_urls
from tests.test_consumer_support import ROOT, Running, offer, settings_for, spawn
from zkcrawl.admin import report
from zkcrawl.admin.localpg import PgServer
from zkcrawl.admin.localzk import free_port
from zkcrawl.cli import main as admin_main
from zkcrawl.consumer.sinks import Entry, Sink, SinkUnavailable, open_sink
from zkcrawl.consumer.sinks.postgres import PostgresSink
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.postgres import COLUMNS, parse_url, row_record


def page(h):  # type: ignore[no-untyped-def]
    return 200, {"Content-Type": "text/html"}, f"<title>T{h.path}</title>".encode()


def table_of(url: str) -> str:
    return url.rsplit("table=", 1)[1]


def rows_per_url(pg: PgServer, url: str) -> Counter[str]:
    """URL -> rows; empty before the consumer made the table."""
    import psycopg

    try:
        return Counter(u for (u,) in pg.query(f"SELECT url FROM {table_of(url)}"))
    except psycopg.errors.UndefinedTable:
        return Counter()


def events(path: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            ev = json.loads(line)
            if isinstance(ev, dict) and ev.get("event") == name:
                out.append(ev)
    return out


def record(url: str, **extra: Any) -> dict[str, Any]:
    return {"url": url, "final_url": url, "status": 200, "title": "t", "fields": {},
            "bytes": 10, "item": "x", "attempt": 0, "consumer": "c",
            "fetched_at": "2026-01-01T00:00:00.000Z", "queue_ms": 1.0, "dispatch_ms": 0.5,
            "wait_ms": 0.1, "process_ms": 20.0, "error": None, **extra}



def spawn_module(module: str, args: list[str], err: Path) -> subprocess.Popen[bytes]:
    with open(err, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fh)


def consumer_args(zk_hosts: str, zk_root: str, out: str, *extra: str) -> list[str]:
    return ["--zk", zk_hosts, "--root", zk_root, "--out", out, "--domain-delay", "0",
            "--no-robots", "--log-format", "json", "--allow-private-addresses",
            "--session-timeout", "4", *extra]


def books(zk: Any, zk_root: str) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """(URLs queued -- ingress or partitions --, URLs held, dead letters) of a root."""
    dead = []
    for name in zk.get_children(f"{zk_root}/dead") if zk.exists(f"{zk_root}/dead") else []:
        data, _ = zk.get(f"{zk_root}/dead/{name}")
        dead.append(json.loads(data))
    return (queued_urls(zk, zk_root), held(zk, zk_root), dead)


# -- the URL: untrusted input -----------------------------------------------------------------

def test_url_decoding():
    t = parse_url("postgresql://crawl@db.example:5433/results?table=crawl.pages&sslmode=require")
    assert t.table == ("crawl", "pages") and "table=" not in t.conninfo
    assert t.conninfo == "postgresql://crawl@db.example:5433/results?sslmode=require"
    assert parse_url("postgres://h/db").table == ("pages",)
    for bad, why in [("postgresql://u:secret@h/db", "no password"),
                     ("postgresql://u@h/db?password=secret", "no password"),
                     ("postgresql://u@h/db?sslpassword=secret", "no password"),
                     ("postgresql://h/db?table=a;drop", "table must be"),
                     ("postgresql://h/db?table=a&table=b", "twice"),
                     ("postgresql://h/db?table=a.b.c", "table must be"),
                     ("postgresql://h/db#x", "fragment"),
                     ("postgresql://[::1/db", "not a valid"),
                     ("postgresql://h/db\x00", "not a valid")]:
        with pytest.raises(UsageError, match=why) as info:
            parse_url(bad)
        assert "secret" not in str(info.value)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.builds(lambda s: "postgresql://" + s, st.text()),
                 st.builds(lambda a, b: f"postgresql://{a}@h/db?{b}",
                           st.text(string.printable), st.text(string.printable))))
def test_url_decoder_never_fails_otherwise_and_never_keeps_a_password(url):
    try:
        t = parse_url(url)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    parts = urlsplit(t.conninfo)
    assert parts.password is None and t.conninfo.startswith(("postgresql://", "postgres://"))
    assert not {"password", "sslpassword", "table"} & {k for k, _ in parse_qsl(parts.query)}
    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", p) for p in t.table)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.integers(), st.floats(), st.text(),
                                   st.datetimes(), st.decimals(), st.binary(),
                                   st.dictionaries(st.text(), st.integers())),
                         min_size=0, max_size=len(COLUMNS)), max_size=8))
def test_rows_of_a_hostile_table_summarize_without_failing(rows):
    records = [row_record([n for n, _ in COLUMNS], row) for row in rows]
    summary = report.summarize(records)
    json.dumps(summary, allow_nan=False)  # strict JSON, whatever the table held


# -- the sink on a real server ----------------------------------------------------------------

def test_one_row_per_item_however_often_delivered(pg_server):
    url = pg_server.url()
    sink = PostgresSink(url, "/crawl")
    try:
        first = [Entry(f"qn-{i:010d}", 1_000 + i, record(f"http://a.test/{i}")) for i in range(5)]
        assert sink.write_batch(first) == [None] * 5
        # Redelivered (a consumer killed after the commit: attempt + 1), plus a new item.
        again = [Entry(e.item, e.created_ms, record(e.record["url"], attempt=1))
                 for e in first[:2]] + [Entry("qn-0000000009", 2_000,
                                              record("http://b.test/9", pipeline="x",
                                                     error="timeout"), "dead")]
        assert sink.write_batch(again) == [None] * 3
        # The same name in a queue recreated from scratch (a new creation time): a new row.
        assert sink.write_batch([Entry(first[0].item, 99_000, record("http://c.test/0"))]) \
            == [None]
        assert (sink.records, sink.duplicates) == (7, 2)
    finally:
        sink.close()
    rows = pg_server.query(f"SELECT item, attempt, host, extra, root, outcome "
                           f"FROM {table_of(url)} ORDER BY item, item_created")
    assert len(rows) == 7
    assert [r[1] for r in rows if r[0] == "qn-0000000001"] == [0]  # the first write stays
    assert ("qn-0000000009", 0, "b.test", {"pipeline": "x"}, "/crawl", "dead") in rows
    assert {r[5] for r in rows if r[0] != "qn-0000000009"} == {"complete"}


_ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text()
                    | st.datetimes() | st.binary() | st.sets(st.integers(), max_size=2),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


@pytest.fixture(scope="module")
def hostile_sink(pg_server):
    url = pg_server.url()
    sink = PostgresSink(url, "/hostile")
    yield sink, url
    sink.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from([n for n, _ in COLUMNS] + ["x", "y"]), _ANY),
                min_size=1, max_size=4))
def test_any_record_is_stored_or_refused_with_a_reason(hostile_sink, pg_server, records):
    """Records are the page's and the result pipelines': whatever they hold, each one is
    stored or refused with its reason, and the batch never fails for it."""
    sink, url = hostile_sink
    names = [f"qn-{uuid.uuid4().hex}" for _ in records]
    result = sink.write_batch([Entry(n, 1, r) for n, r in zip(names, records, strict=True)])
    assert len(result) == len(records) and sink.available
    assert all(r is None or (isinstance(r, str) and r) for r in result)
    stored = {i for (i,) in pg_server.query(f"SELECT item FROM {table_of(url)} "
                                            "WHERE item = ANY(%s)", names)}
    assert stored == {n for n, r in zip(names, result, strict=True) if r is None}


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=5), _ANY, max_size=5))
def test_jsonl_sink_stores_or_refuses_any_record(tmp_path_factory, record):
    path = tmp_path_factory.mktemp("jsonl") / "o.jsonl"
    sink = Sink(str(path))
    try:
        (why,) = sink.write_batch([Entry("qn-1", 1, record)])
    finally:
        sink.close()
    lines = path.read_bytes().splitlines()
    assert (why is None and len(lines) == 1 and isinstance(json.loads(lines[0]), dict)) \
        or (why is not None and why.startswith("not JSON") and lines == [])


def test_text_postgresql_cannot_hold_is_made_valid(pg_server):
    url = pg_server.url()
    sink = PostgresSink(url, "/r")
    try:
        rec = record("http://a.test/\ud800", title="a\x00b", fields={"k\x00": [float("nan")]})
        assert sink.write_batch([Entry("qn-1", 1, rec)]) == [None]
    finally:
        sink.close()
    assert pg_server.query(f"SELECT url, title, fields FROM {table_of(url)}") == [
        ("http://a.test/\ufffd", "a\ufffdb", {"k\ufffd": [None]})]


def test_a_refused_record_is_a_dead_letter_with_the_databases_reason(pg_server, zk, zk_hosts,
                                                                     zk_root, tmp_path):
    url = pg_server.url()
    open_sink(url, zk_root).close()  # creates the table
    pg_server.query(f"ALTER TABLE {table_of(url)} ADD CONSTRAINT no_evil "
                    "CHECK (url NOT LIKE '%/evil%')")
    with TestServer({"/*": page}) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(20)] + [srv.url("/evil/1"),
                                                          srv.url("/evil/2")]
        offer(zk, zk_root, urls)
        settings = settings_for(zk_hosts, zk_root, Path(url), "--threads", "4",
                                "--exit-when-idle", "1")
        run = Running(settings, sink=open_sink(url, zk_root))
        try:
            run.join(60)
        finally:
            run.close()
    assert run.error is None
    stored = rows_per_url(pg_server, url)
    assert stored == Counter(urls[:20])  # the rest of each group was committed
    queue, leases, dead = books(zk, zk_root)
    assert queue == [] and leases == []
    assert sorted(d["url"] for d in dead) == urls[20:]
    assert all('violates check constraint "no_evil"' in d["error"] for d in dead)


def test_database_down_stops_claiming_releases_and_resumes(zk, zk_hosts, zk_root, tmp_path,
                                                           procs):
    pg = PgServer().start()  # its own server: this test stops it
    err = tmp_path / "err.log"
    try:
        url = pg.url()
        with TestServer({"/*": delayed(0.05, page)}) as srv:
            urls = [srv.url(f"/d/{i}") for i in range(80)]
            offer(zk, zk_root, urls)
            proc = spawn(consumer_args(zk_hosts, zk_root, url, "--threads", "4"), err)
            procs.append(proc)
            wait_for(lambda: sum(rows_per_url(pg, url).values()) >= 10, 60, "rows under way")
            pg.stop()
            wait_for(lambda: events(err, "sink.down"), 30, "sink.down")
            # Nothing held while the database is away, and nothing completed either.
            wait_for(lambda: held(zk, zk_root) == [], 30, "items released")
            left = len(queued_urls(zk, zk_root))
            assert left > 0
            pg.start()
            wait_for(lambda: events(err, "sink.up"), 60, "sink.up")
            wait_for(lambda: queued_urls(zk, zk_root) == [], 60, "the crawl done")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        stored = rows_per_url(pg, url)
    finally:
        pg.destroy()
    assert stored == Counter(urls)  # each URL exactly once
    queue, leases, dead = books(zk, zk_root)
    assert queue == [] and leases == [] and dead == []
    assert len(events(err, "sink.down")) == 1  # bounded: one line for the outage
    assert len(events(err, "sink.still_down")) <= 1
    text = err.read_text()
    assert "Traceback" not in text


@pytest.mark.slow
def test_sigkill_mid_crawl_every_url_has_exactly_one_row(pg_server, zk, zk_hosts, zk_root,
                                                         tmp_path, procs):
    """Four kills: two right after a database commit, before the ZooKeeper completion
    (tests/pg_kill_after_commit.py: the redelivered group must hit the unique key), two
    by an outside SIGKILL whenever it lands; then a consumer finishes the crawl."""
    url = pg_server.url()
    runs = ["after-commit", "outside", "after-commit", "outside", "finish"]
    with TestServer({"/*": delayed(0.2, page)}) as srv:  # ~40 pages/s: killed mid-crawl
        urls = [srv.url(f"/k/{i}") for i in range(150)]
        offer(zk, zk_root, urls)
        for n, how in enumerate(runs):
            args = consumer_args(zk_hosts, zk_root, url, "--threads", "8", "--max-attempts",
                                 "10", "--exit-when-idle", "2")
            err = tmp_path / f"err-{n}.log"
            if how == "after-commit":
                proc = spawn_module("tests.pg_kill_after_commit", ["3", *args], err)
            else:
                proc = spawn(args, err)
            procs.append(proc)
            before = sum(rows_per_url(pg_server, url).values())
            if how == "after-commit":
                assert proc.wait(60) == -signal.SIGKILL
            elif how == "outside":
                wait_for(lambda b=before: sum(rows_per_url(pg_server, url).values()) >= b + 20,
                         60, "rows under way")
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
            else:
                assert proc.wait(120) == 0  # the last one finishes the crawl
            assert how == "finish" or sum(rows_per_url(pg_server, url).values()) < len(urls)
    stored = rows_per_url(pg_server, url)
    assert stored == Counter(urls)  # every offered URL exactly once: no loss, no duplicate
    queue, leases, dead = books(zk, zk_root)
    assert queue == [] and leases == [] and dead == []
    # The duplicates, explained: the groups committed just before a kill came back and
    # were kept once by the key (logged as sink.duplicate), at least one item per kill.
    duplicates = [e for n in range(len(runs))
                  for e in events(tmp_path / f"err-{n}.log", "sink.duplicate")]
    assert sum(e["count"] for e in duplicates) >= 2, duplicates


def test_a_locked_table_is_a_failing_database_until_the_lock_goes(pg_server):
    """An insert that waits for a lock past statement_timeout (the sink's default is 60 s;
    this URL sets 0.5 s) is cancelled: unavailable, released; back once the lock goes."""
    import psycopg

    url = pg_server.url() + "&options=-c%20statement_timeout%3D500"
    sink = PostgresSink(url, "/r")
    holder = psycopg.connect(pg_server.conninfo(), autocommit=False)
    try:
        holder.execute(f"LOCK TABLE {table_of(url.split('&')[0])} IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(SinkUnavailable, match="statement timeout"):
            sink.write_batch([Entry("qn-1", 1, record("http://a.test/"))])
        assert not sink.available
        holder.rollback()  # the lock goes
        wait_for(lambda: sink.between_groups() or sink.available, 20, "reconnected")
        assert sink.write_batch([Entry("qn-1", 1, record("http://a.test/"))]) == [None]
    finally:
        holder.close()
        sink.close()


# -- start-up --------------------------------------------------------------------------------

def run_consumer(argv: list[str]) -> tuple[int, str]:
    """The consumer as a process of its own: its stderr is what a user sees (in this
    process, log lines of earlier tests' threads could land in a redirected stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZKCRAWL_", "PG"))}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "zkcrawl.consumer.main", *argv], env=env,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


def test_a_password_in_the_url_is_refused_and_never_shown(zk_hosts, zk_root):
    status, err = run_consumer(consumer_args(zk_hosts, zk_root,
                                             "postgresql://u:hunter2@127.0.0.1/db"))
    assert status == ExitStatus.USAGE and "PGPASSWORD" in err and "hunter2" not in err
    assert len(err.strip().splitlines()) == 1


def test_no_server_is_exit_75_a_missing_db_and_a_misfit_table_exit_2(pg_server, zk_hosts,
                                                                       zk_root):
    nobody_listens = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    status, err = run_consumer(consumer_args(zk_hosts, zk_root, nobody_listens))
    assert status == ExitStatus.TEMPFAIL and len(err.strip().splitlines()) == 1, err
    status, err = run_consumer(consumer_args(zk_hosts, zk_root, pg_server.url(db="nosuchdb")))
    assert status == ExitStatus.USAGE and 'database "nosuchdb" does not exist' in err, err
    url = pg_server.url()
    pg_server.query(f"CREATE TABLE {table_of(url)} (url text)")
    status, err = run_consumer(consumer_args(zk_hosts, zk_root, url))
    assert status == ExitStatus.USAGE and "does not fit" in err, err


def test_write_while_down_raises_unavailable_and_nothing_is_stored(pg_server):
    url = pg_server.url()
    sink = PostgresSink(url, "/r")
    sink.close()
    with pytest.raises(SinkUnavailable):
        sink.write_batch([Entry("qn-1", 1, record("http://a.test/"))])
    assert pg_server.query(f"SELECT count(*) FROM {table_of(url)}") == [(0,)]


# -- report --------------------------------------------------------------------------------

def test_report_reads_the_table(pg_server, capsys):
    url = pg_server.url()
    sink = PostgresSink(url, "/r")
    try:
        sink.write_batch([Entry(f"qn-{i}", i, record(f"http://h{i % 2}.test/{i}",
                                                      error=None if i % 3 else "http-404"))
                          for i in range(9)])
    finally:
        sink.close()
    assert admin_main(["report", url, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] == 9 and summary["outcomes"] == {"ok": 6, "http-404": 3}
    assert admin_main(["report", pg_server.url(), "--json"]) == 2  # no such table: one line
    assert "does not exist" in capsys.readouterr().err


# -- demo ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_demo_writes_to_a_table(pg_server, tmp_path):
    from tests.test_demo import finish, start_demo
    from zkcrawl.admin.demo import ROOT as DEMO_ROOT
    from zkcrawl.admin.demo import owner_runs
    from zkcrawl.admin.samplesite import expected_articles

    url = pg_server.url()
    sink = PostgresSink(url, DEMO_ROOT)  # an earlier demo's row: deleted before the crawl
    try:
        sink.write_batch([Entry("qn-0000000000", 1, record("http://old.test/"))])
    finally:
        sink.close()
    out_dir = tmp_path / "demo"
    proc = start_demo(out_dir, "--out", url)
    out, err = finish(proc, 120)
    assert proc.returncode == 0, f"{out}\n{err}"
    rows = pg_server.query(f"SELECT url, error, consumer, fetched_at FROM {table_of(url)} "
                           "WHERE root = %s", DEMO_ROOT)
    base = rows[0][0].split("/blog/")[0]
    assert {u: e or "ok" for u, e, _, _ in rows} == expected_articles(base)  # each once
    assert len(rows) == len(expected_articles(base))
    # One host: one owner at a time, changed at most once (when the second one joined).
    runs = owner_runs([{"consumer": c, "fetched_at": t.isoformat()} for _, _, c, t in rows])
    assert {c for c, _ in runs} <= {"consumer-1", "consumer-2"} and 1 <= len(runs) <= 2, runs
    assert f"Table      {url}" in out and "Traceback" not in err
    assert len((out_dir / "results.jsonl").read_text().splitlines()) == len(rows)
