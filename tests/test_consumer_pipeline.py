"""The consumer's per-item pipeline, politeness gate, sink and timings against real HTTP
servers on 127.0.0.1 (no ZooKeeper: items are built the way the queue builds them)."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.httpd import TestServer, delayed, gzip_bomb, gzipped, html, redirect, static, trickle
from zkcrawl.consumer.pipeline import COMPLETE, DEAD, RETRY, ItemHandler
from zkcrawl.consumer.settings import CRAWL_DELAY_CAP, ConsumerSettings
from zkcrawl.consumer.sinks import Sink
from zkcrawl.consumer.timing import ItemTiming, Timings, percentile
from zkcrawl.errors import SinkError, UsageError
from zkcrawl.politeness.gate import HostGate
from zkcrawl.politeness.local import LocalPoliteness
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.claims import Claimed
from zkcrawl.web.extract import parse_field_specs
from zkcrawl.web.fetch import Fetcher
from zkcrawl.web.urls import host_of

RECORD_KEYS = {"url", "final_url", "status", "title", "fields", "bytes", "item", "attempt",
               "fetches", "holder_deaths",  # issue #26: tries apart from redeliveries
               "consumer", "fetched_at", "queue_ms", "dispatch_ms", "wait_ms", "polite_ms",
               "process_ms", "error"}


def make(**kw: object) -> ItemHandler:
    kw.setdefault("domain_delay", 0.0)
    kw.setdefault("robots", False)
    kw.setdefault("allow_private_addresses", True)
    s = ConsumerSettings(**kw)  # type: ignore[arg-type]
    gate = HostGate(LocalPoliteness(s.domain_delay), s.domain_delay, CRAWL_DELAY_CAP)
    return ItemHandler(Fetcher(s.fetch_settings(), politeness=gate), gate,
                    parse_field_specs(s.field), "c-test", s.max_attempts)


def claimed(url: str | None = None, *, data: bytes | None = None, attempt: int = 0,
            name: str = "qn-0000000007") -> Claimed:
    if data is None:
        data = item_codec.Item(url=url or "", attempt=attempt).encode()
    dec = item_codec.decode(data)
    return Claimed(name=name, seq=7, data=data, item=dec.item, error=dec.error,
                   ctime=time.time() - 0.25, bare=dec.bare)


def run(p: ItemHandler, c: Claimed):  # type: ignore[no-untyped-def]
    t = ItemTiming(time.monotonic(), c.queue_ms)
    t.submitted = t.started = time.monotonic()
    return p.process(c, t)


ARTICLE = ('<html><head><title>  Hello\n  world </title></head><body>'
           '<span class="author">Ada</span><p>x</p></body></html>')


def test_a_page_gives_a_record_with_exactly_the_spec_fields():
    with TestServer({"/a": html(ARTICLE)}) as srv:
        out = run(make(field=("author=//span[@class='author']/text()",)),
                  claimed(srv.url("/a")))
    assert out.kind == COMPLETE and out.error is None
    rec = out.record
    assert set(rec) == RECORD_KEYS
    assert rec["title"] == "Hello world" and rec["fields"] == {"author": "Ada"}
    assert rec["status"] == 200 and rec["bytes"] == len(ARTICLE)
    assert rec["item"] == "qn-0000000007" and rec["consumer"] == "c-test"
    assert rec["final_url"] == rec["url"] == srv.url("/a")
    assert rec["fetched_at"].endswith("Z") and rec["queue_ms"] >= 250
    assert json.loads(Sink.encode(rec)) == rec


def test_404_is_recorded_at_once_and_completed():
    with TestServer() as srv:
        out = run(make(), claimed(srv.url("/missing")))
    assert out.kind == COMPLETE and out.record["error"] == "http-404"
    assert out.record["status"] == 404 and out.record["title"] is None


def test_500_is_retried_then_dead_lettered_with_a_record():
    with TestServer({"/e": static(500, "boom")}) as srv:
        p = make(max_attempts=3)
        first = run(p, claimed(srv.url("/e"), attempt=0))
        last = run(p, claimed(srv.url("/e"), attempt=2))
    assert first.kind == RETRY and first.record is None and first.error == "http-500"
    assert last.kind == DEAD and last.record["error"] == "http-500"
    assert last.record["attempt"] == 2


def test_retry_after_cools_the_host_down_for_every_item():
    with TestServer({"/busy": static(503, "", {"Retry-After": "2"})}) as srv:
        p = make()
        out = run(p, claimed(srv.url("/busy")))
        _, due = p.gate.admit(host_of(srv.url("/")), None)
    assert out.kind == RETRY and out.error == "http-503"
    assert due is not None and due - time.monotonic() > 1.5  # the host waits ~2 s


def test_timeout_is_retryable_and_does_not_hold_the_thread():
    with TestServer({"/slow": delayed(5, html("late"))}) as srv:
        t0 = time.monotonic()
        out = run(make(timeout=0.4), claimed(srv.url("/slow")))
    assert out.kind == RETRY and out.error == "timeout"
    assert time.monotonic() - t0 < 2.0


def test_a_trickling_server_is_cut_at_the_total_budget():
    body = b"<title>drip</title>" + b"x" * 200
    with TestServer({"/drip": trickle(body, interval=0.1)}) as srv:
        t0 = time.monotonic()
        out = run(make(timeout=0.5), claimed(srv.url("/drip")))  # budget: 2 x 0.5 s
    assert out.error == "timeout" and out.kind == RETRY
    assert time.monotonic() - t0 < 2.0  # each byte comes well within the read timeout


def test_max_bytes_stops_reading_and_keeps_the_title():
    body = "<html><head><title>Big</title></head><body>" + "y" * 50_000 + "</body></html>"
    with TestServer({"/big": html(body)}) as srv:
        out = run(make(max_bytes=1000), claimed(srv.url("/big")))
    assert out.kind == COMPLETE and out.record["error"] == "too-large"
    assert out.record["bytes"] == 1000 and out.record["title"] == "Big"


def test_redirect_chain_is_followed_and_a_loop_is_a_permanent_failure():
    routes = {"/r1": redirect("/r2"), "/r2": redirect("/r3", 301), "/r3": redirect("/end"),
              "/end": html("<title>End</title>"), "/l1": redirect("/l2"), "/l2": redirect("/l1")}
    with TestServer(routes) as srv:
        p = make()
        chain = run(p, claimed(srv.url("/r1")))
        loop = run(p, claimed(srv.url("/l1")))
    assert chain.record["final_url"] == srv.url("/end") and chain.record["title"] == "End"
    assert chain.record["url"] == srv.url("/r1") and chain.record["error"] is None
    assert loop.kind == COMPLETE and loop.record["error"] == "redirects"


def test_gzip_is_decoded_and_a_gzip_bomb_is_cut_at_max_bytes():
    with TestServer({"/gz": gzipped("<title>Zipped</title>" + "z" * 5000),
                     "/bomb": gzip_bomb(50_000_000)}) as srv:
        p = make(max_bytes=100_000)
        zipped = run(p, claimed(srv.url("/gz")))
        bomb = run(p, claimed(srv.url("/bomb")))
    assert zipped.record["title"] == "Zipped" and zipped.record["error"] is None
    assert bomb.record["error"] == "too-large" and bomb.record["bytes"] == 100_000


def test_non_html_is_a_permanent_content_type_failure():
    with TestServer({"/f.pdf": static(200, b"%PDF-1.4", {"Content-Type": "application/pdf"})}
                    ) as srv:
        out = run(make(), claimed(srv.url("/f.pdf")))
    assert out.kind == COMPLETE and out.record["error"] == "content-type"


@pytest.mark.parametrize(("enc", "how"), [("gbk", "header"), ("big5", "meta"),
                                          ("gbk", "detect")])
def test_chinese_titles_decode_right(enc: str, how: str):
    title = "中文标题测试页面" if enc == "gbk" else "中文標題測試頁面"
    meta = f'<meta charset="{enc}">' if how == "meta" else ""
    page = (f"<html><head>{meta}<title>{title}</title></head><body><p>"
            f"{title * 20}</p></body></html>").encode(enc)
    ctype = f"text/html; charset={enc}" if how == "header" else "text/html"
    with TestServer({"/zh": static(200, page, {"Content-Type": ctype})}) as srv:
        out = run(make(), claimed(srv.url("/zh")))
    assert out.record["title"] == title


def test_malformed_html_is_tolerated():
    page = "<html><title>Broken &amp; fine</title><body><div><p>unclosed<span></div></b>"
    with TestServer({"/m": html(page)}) as srv:
        out = run(make(field=("p=//p",)), claimed(srv.url("/m")))
    assert out.record["title"] == "Broken & fine" and out.record["fields"]["p"] == "unclosed"


def test_robots_disallow_is_a_permanent_failure_without_fetching_the_page():
    routes = {"/robots.txt": static(200, "User-agent: *\nDisallow: /private\n",
                                    {"Content-Type": "text/plain"}),
              "/private/x": html("<title>secret</title>")}
    with TestServer(routes) as srv:
        out = run(make(robots=True), claimed(srv.url("/private/x")))
        paths = [r.path for r in srv.requests]
    assert out.kind == COMPLETE and out.record["error"] == "robots"
    assert "/private/x" not in paths


def test_robots_crawl_delay_larger_than_domain_delay_wins_capped():
    routes = {"/robots.txt": static(200, "User-agent: *\nCrawl-delay: 2\n",
                                    {"Content-Type": "text/plain"}), "/p": html("<title>p</title>")}
    with TestServer(routes) as srv:
        p = make(robots=True, domain_delay=0.1)
        host = host_of(srv.url("/p"))
        p.prepare(srv.url("/p"), host)  # fetches robots.txt: a request to the host too
        _, due = p.gate.admit(host, None)
        assert srv.requests_for("/robots.txt")
    assert due is not None and 1.5 < due - time.monotonic() <= 2.0


def test_crawl_delay_is_capped():
    gate = HostGate(LocalPoliteness(0.0), 0.0, CRAWL_DELAY_CAP)
    gate.set_min_delay("h:1", 3600)
    assert gate.admit("h:1", None)[1] is None
    gate.finished("h:1")
    _, due = gate.admit("h:1", None)
    assert due is not None and 29 < due - time.monotonic() <= CRAWL_DELAY_CAP == 30


def test_malformed_item_is_dead_lettered_with_its_reason():
    out = run(make(), claimed(data=b"\xff\xfe not a url"))
    assert out.kind == DEAD and out.error == "malformed: not UTF-8"
    assert out.record["error"] == out.error and out.record["url"] is None


def test_bare_url_item_is_fetched():
    with TestServer({"/bare": html("<title>Bare</title>")}) as srv:
        c = claimed(data=f"  {srv.url('/bare')}\n".encode())
        out = run(make(), c)
    assert c.bare and out.kind == COMPLETE and out.record["title"] == "Bare"


def test_gate_queues_a_cooling_host_and_never_delays_another():
    gate = HostGate(LocalPoliteness(0.5), 0.5, CRAWL_DELAY_CAP)
    _, due = gate.admit("a:1", None)
    assert due is None  # first request to a: now
    slot, due = gate.admit("a:1", None)
    assert due is not None and due - time.monotonic() > 0.4  # a is busy: queued, not slept
    assert gate.admit("b:1", None)[1] is None  # another host is not held up
    gate.finished("a:1")
    _, due2 = gate.admit("a:1", slot)
    assert due2 is not None and due2 - time.monotonic() > 0.45  # the gap counts from the end


def test_sink_writes_a_group_at_sync_and_drops_what_was_never_synced(tmp_path):
    path = tmp_path / "out.jsonl"
    sink = Sink(str(path))
    sink.write({"url": "u1", "title": "é"})
    sink.write({"url": "u2", "title": None})
    assert path.read_text() == ""  # queued, not yet written: nothing completed either
    sink.sync()
    sink.write({"url": "u3"})
    sink.close()  # u3 was never synced: its item was not completed, it will come again
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["url"] for x in lines] == ["u1", "u2"] and sink.syncs == 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_sink_on_a_full_disk_raises_and_stays_broken():
    sink = Sink("/dev/full")
    sink.write({"url": "u"})
    with pytest.raises(SinkError, match="No space left"):
        sink.sync()
    with pytest.raises(SinkError):
        sink.write({"url": "v"})


def test_timings_and_the_verdict():
    assert percentile([5, 1, 3, 2, 4], 50) == 3 and percentile([1.0] * 19 + [100.0], 95) == 1.0
    t = Timings()
    for i in range(20):
        it = ItemTiming(claimed=0.0, queue_ms=1.0, submitted=0.001, started=0.002 + i * 0.001,
                        finished=0.05 + i * 0.001)
        t.record(it.durations(), "ok", final=True, failed=False, timing=it)
    t.sample_fill(8, 8, now=10.0)
    t.sample_fill(2, 8, now=13.0)  # from full to a quarter in 3 s
    t.sample_fill(2, 8, now=14.0)  # then a quarter full for 1 s
    snap = t.snapshot(in_flight=2, backlog=3, held=5)
    assert snap["processed"] == 20 and snap["dispatch_p95_ms"] == 1.0
    assert snap["dispatch_process_ratio"] < 0.05 and snap["fill"] == 0.531
    # No response stamp: the whole of process is the fetch, which dominates.
    assert snap["pace"] == "site" and snap["verdict"].startswith("the site sets the pace")
    # Politeness: the cool-down is part of wait_ms, and is not the pool's.
    polite = ItemTiming(claimed=0.0, queue_ms=0.0, submitted=0.0, started=2.0, fetched=2.05,
                        finished=2.06, polite_ms=1900.0)
    assert polite.fields()["polite_ms"] == 1900.0 and polite.pool_ms == 100.0
    assert polite.stages()["fetch"] == 50.0 and polite.stages()["parse"] == 10.0
    for _ in range(100):
        t.record(polite.durations(), "ok", final=True, failed=False, timing=polite)
    assert t.run_verdict()["pace"] == "politeness"


def test_credentials_in_a_url_are_used_but_never_recorded():
    with TestServer({"/x": html("<title>t</title>")}) as srv:
        url = srv.url("/x").replace("://", "://bob:hunter2@")
        out = run(make(), claimed(url))
    assert out.kind == COMPLETE and out.record["title"] == "t"
    assert out.record["url"] == srv.url("/x").replace("://", "://***@")
    assert "hunter2" not in json.dumps(out.record)


def test_out_is_never_written_through_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    planted = tmp_path / "out.jsonl"
    planted.symlink_to(victim)
    with pytest.raises(UsageError, match="symbolic link"):
        Sink(str(planted))
    assert victim.read_text() == "keep"
    fresh = tmp_path / "new.jsonl"
    old = os.umask(0o022)
    try:
        Sink(str(fresh)).close()
    finally:
        os.umask(old)
    assert fresh.stat().st_mode & 0o777 == 0o640


def test_iso_now_is_datetimes_isoformat_to_the_millisecond():
    """iso_now formats the second once and adds the milliseconds (issue #23: per record):
    the text is datetime's, truncated to milliseconds."""
    from datetime import UTC, datetime

    from zkcrawl.consumer import pipeline
    for _ in range(3):
        before = datetime.now(UTC).replace(microsecond=0)
        text = pipeline.iso_now()
        after = datetime.now(UTC)
        assert len(text) == 24 and text.endswith("Z") and text[19] == "."
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        assert before <= parsed <= after
        assert text == parsed.isoformat(timespec="milliseconds").replace("+00:00", "Z")
