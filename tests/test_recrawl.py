"""``--recrawl`` (issue #23 item 4): the adaptive schedule (property-based), the SQLite store
(durable, refuses foreign / damaged / newer files with one line and exit 2, ignores reports
for URLs nobody offered, retires a page gone twice), and a whole loop -- producer, consumer,
``<root>/fetched/``, producer again -- with a real ZooKeeper and a real HTTP server."""

from __future__ import annotations

import random
import sqlite3
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.httpd import TestServer
from tests.test_consumer_support import Running, records, settings_for
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.producer.main import main as producer_main
from zkcrawl.producer.recrawl import (
    GROW,
    SHRINK,
    VERSION,
    RecrawlStore,
    Schedule,
    next_interval,
    parse_duration,
)
from zkcrawl.queue.fetched import Fetched
from zkcrawl.zk.client import ZkClient

HOUR, DAY = 3600.0, 86400.0
SCHED = Schedule(HOUR, 30 * DAY, random.Random(7))


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([None, True, False]))
def test_next_interval_stays_within_bounds(interval: float, changed: bool | None) -> None:
    new = next_interval(interval, changed, SCHED)
    assert HOUR <= new <= 30 * DAY
    if changed is False and HOUR <= interval * GROW <= 30 * DAY:
        assert new == int(interval * GROW)
    if changed is True and HOUR <= interval * SHRINK <= 30 * DAY:
        assert new == int(interval * SHRINK)


@given(st.text(max_size=12))
def test_parse_duration_is_a_duration_or_one_usage_error(text: str) -> None:
    try:
        seconds = parse_duration(text, "--recrawl-min")
    except UsageError as exc:
        assert "--recrawl-min" in str(exc)
    else:
        assert 1 <= seconds <= 3650 * DAY


def test_parse_duration_units() -> None:
    assert [parse_duration(t, "-") for t in ("90", "15m", "1h", "30d", "2w")] == [
        90, 900, 3600, 30 * DAY, 14 * DAY]


class NoOffers:
    """The offerer of a Recrawler that only drains (``drain_once`` offers nothing)."""

    def offer_item(self, *_args: object) -> bool:
        raise AssertionError("a drain offers nothing")

    def drain(self) -> None:
        raise AssertionError("a drain offers nothing")


def _fetched(url: str, status: int | None, changed: bool | None, at: float) -> Fetched:
    return Fetched(url, status, changed, '"e"', None, "a" * 32, at)


def test_store_learns_grows_shrinks_retires_and_ignores_strangers(tmp_path: Path) -> None:
    path = str(tmp_path / "s.recrawl")
    store = RecrawlStore(path, SCHED)
    now = 1_000_000_000.0
    store.add_new(["https://h/a", "https://h/b", "https://h/g"], now)
    assert store.due(now) == []  # a new URL is due after --recrawl-min
    due = store.due(now + 1.2 * HOUR)
    assert sorted(d.url for d in due) == ["https://h/a", "https://h/b", "https://h/g"]
    learnt = store.learn([_fetched("https://h/a", 200, None, now),
                          _fetched("https://h/b", 200, None, now),
                          _fetched("https://h/g", 404, None, now),
                          _fetched("https://evil/x", 200, True, now)])
    assert learnt.unknown == 1 and learnt.kinds == {"new": 2, "gone": 1}
    at = now + 10
    learnt = store.learn([_fetched("https://h/a", 304, False, at),
                          _fetched("https://h/b", 200, True, at),
                          _fetched("https://h/g", 410, None, at)])
    assert learnt.kinds == {"unchanged": 1, "changed": 1, "gone": 1} and learnt.retired == 1
    store.close()
    store = RecrawlStore(path, SCHED)  # durable: reopened, the same state
    rows = dict(sqlite3.connect(path).execute("SELECT url, interval FROM urls").fetchall())
    assert rows["https://h/a"] == int(HOUR * GROW)
    assert rows["https://h/b"] == int(HOUR)  # x 0.8, clamped to --recrawl-min
    assert store.counts()["retired"] == 1
    later = store.due(at + 2 * DAY)
    assert sorted(d.url for d in later) == ["https://h/a", "https://h/b"]  # g retired
    assert {d.url: d.validators.etag for d in later}["https://h/a"] == '"e"'
    store.offered([d.id for d in later], at + 2 * DAY)
    assert store.due(at + 2 * DAY) == []  # offered: not again before its interval
    store.close()


def test_foreign_damaged_and_newer_stores_are_one_line_exit_2(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"not a database at all" * 100)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    newer = tmp_path / "newer"
    RecrawlStore(str(newer), SCHED).close()
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version = {VERSION + 1}")
    db.commit()
    db.close()
    for path, words in ((garbage, "not a readable re-crawl store"),
                        (other, "not a zkcrawl re-crawl store"),
                        (newer, "newer zkcrawl")):
        with pytest.raises(UsageError, match=words) as info:
            RecrawlStore(str(path), SCHED)
        assert "\n" not in str(info.value) and info.value.exit_status == ExitStatus.USAGE
    assert garbage.read_bytes().startswith(b"not a database")  # never reset


def test_producer_cli_refuses_a_damaged_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    (tmp_path / "seen.recrawl").write_bytes(b"\x00garbage" * 512)
    code = producer_main(["--recrawl", "--seen", str(tmp_path / "seen"), "--zk",
                          "127.0.0.1:1", "--log-format", "json"], {})
    assert code == ExitStatus.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "re-crawl store" in err[0]
    assert producer_main(["--recrawl", "--zk", "127.0.0.1:1"], {}) == ExitStatus.USAGE


PAGE = b"<html><head><title>P</title></head><body>" + b"z" * 3000 + b"</body></html>"


def _site(h: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
    if h.path == "/gone":
        return 404, {}, b""
    if h.path == "/etag" and h.headers.get("If-None-Match") == '"v1"':
        return 304, {"ETag": '"v1"'}, b""
    head = {"Content-Type": "text/html"} | ({"ETag": '"v1"'} if h.path == "/etag" else {})
    return 200, head, PAGE


@pytest.mark.slow
def test_a_new_url_is_never_due_before_its_shortest_interval(tmp_path: Path) -> None:
    """CI: due times were whole seconds, cut down -- a URL added at x.95 s under a 1 s
    interval came due 0.05 s later, so the first pass re-offered what it had just added."""
    store = RecrawlStore(str(tmp_path / "s"), Schedule(1.0, 30 * DAY, random.Random(3)))
    at = 1_000_000.95
    store.add_new([f"https://h/{i}" for i in range(50)], at)
    assert store.due(at + 0.899) == []  # -10 % jitter at most
    assert len(store.due(at + 1.101, 100)) == 50
    store.offered([d.id for d in store.due(at + 1.101, 100)], at + 1.2)
    assert store.due(at + 1.2 + 0.899) == []
    store.close()


def test_a_recrawl_loop_learns_and_asks_conditionally(zk: ZkClient, zk_hosts: str,
                                                      zk_root: str, tmp_path: Path) -> None:
    with TestServer({"*": _site}) as srv:
        urls = [srv.url(p) for p in ("/etag", "/plain", "/gone")]
        src = tmp_path / "urls.txt"
        src.write_text("\n".join(urls) + "\n")
        base = ["--zk", zk_hosts, "--root", zk_root, "--seen", str(tmp_path / "seen"),
                "--recrawl", "--recrawl-min", "1s", "--log-format", "json"]

        def crawl(n: int) -> list[dict[str, object]]:
            out = tmp_path / f"out{n}.jsonl"
            c = Running(settings_for(zk_hosts, zk_root, out, "--exit-when-idle", "1"))
            c.join(60)
            c.close()
            return records(out)

        assert producer_main([*base, "--from-file", str(src)], {}) == ExitStatus.OK
        first = crawl(1)
        assert sorted(r["url"] for r in first) == sorted(urls)
        assert all("changed" not in r for r in first)  # SPEC §4: absent on a first fetch
        assert zk.get_children(f"{zk_root}/fetched")  # the reports wait for the producer
        time.sleep(1.2)  # --recrawl-min 1s (+10 % jitter) must pass: the schedule's clock
        assert producer_main(base, {}) == ExitStatus.OK
        assert zk.get_children(f"{zk_root}/fetched") == []  # drained
        second = {r["url"]: r for r in crawl(2)}
        assert set(second) == set(urls)
        assert second[srv.url("/etag")]["changed"] is False
        assert second[srv.url("/etag")]["status"] == 304
        assert second[srv.url("/plain")]["changed"] is False  # by signature
        conditional = [r for r in srv.requests_for("/etag") if "If-None-Match" in r.headers]
        assert len(conditional) == 1
        time.sleep(1.2)
        assert producer_main(base, {}) == ExitStatus.OK
        store = RecrawlStore(str(tmp_path / "seen.recrawl"), SCHED)
        assert store.counts()["retired"] == 1  # /gone: 404 twice
        store.close()


def test_forged_fetched_nodes_are_drained_and_change_nothing(zk: ZkClient, zk_root: str,
                                                             tmp_path: Path) -> None:
    import threading

    from zkcrawl.producer.recrawl import Recrawler
    from zkcrawl.queue.fetched import FetchedReader, FetchedWriter

    store = RecrawlStore(str(tmp_path / "s"), SCHED)
    store.add_new(["https://h/known"], time.time())
    reader = FetchedReader(zk, zk_root)
    for data in (b"\x00" * 70_000, b'{"fetched": "no"}', b"[1, 2]"):
        zk.create(f"{reader.path}/fn-", data, sequence=True)
    FetchedWriter(zk, zk_root, "evil").report(
        [Fetched("https://h/never-offered", 404, None, None, None, None, time.time()),
         Fetched("https://h/known", 200, False, '"x"', None, None, time.time())])
    rc = Recrawler(store, reader, NoOffers(), batch=10, stop=threading.Event())
    while rc.drain_once():
        pass
    assert reader.names() == []  # every node gone, the forged ones too: never read again
    assert rc.counts.learnt.unknown == 1 and rc.counts.learnt.kinds == {"unchanged": 1}
    store.close()


@pytest.mark.slow
def test_watch_with_recrawl_reoffers_conditionally_every_pass(
        zk: ZkClient, zk_hosts: str, zk_root: str, tmp_path: Path, procs: list) -> None:
    """One long-running producer (--watch --recrawl): a consumer's reports come back
    through fetched/, and a later watch pass offers the articles again, conditionally."""
    import os
    import signal

    from tests.conftest import wait_for
    from tests.test_watch import Blog, start_producer

    def post(h: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        if h.headers.get("If-None-Match") == '"p"':
            return 304, {"ETag": '"p"'}, b""
        return 200, {"ETag": '"p"', "Content-Type": "text/html"}, PAGE

    with TestServer({"/post/*": post}) as srv:
        Blog(srv, articles=3)
        out = tmp_path / "out.jsonl"
        consumer = Running(settings_for(zk_hosts, zk_root, out))
        try:
            proc = start_producer(procs, zk_hosts, zk_root, srv.base_url, "--watch", "1s",
                                  "--recrawl", "--recrawl-min", "1s",
                                  "--seen", str(tmp_path / "seen"))

            def unchanged() -> int:
                return sum(1 for r in records(out, strict=False) if r.get("changed") is False)

            wait_for(lambda: unchanged() >= 3, 60, "every article re-crawled, unchanged")
            os.kill(proc.pid, signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err[-3000:]
        finally:
            consumer.stop()
    recs = records(out, strict=False)
    assert {r["status"] for r in recs if r.get("changed") is False} == {304}
    assert all("changed" not in r for r in recs[:3])  # the first fetches
    assert len([r for r in srv.requests if "If-None-Match" in r.headers]) >= 3
