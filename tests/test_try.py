"""``zkcrawl try URL`` against the bundled sample site (a real HTTP server on 127.0.0.1):
the producer's view of a listing, the consumer's record of an article, the SSRF guard and
robots.txt as the crawl meets them, and bad expressions refused before anything is fetched.
No ZooKeeper anywhere: ``--zk`` points at a closed port to prove it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from zkcrawl.admin import samplesite as ss
from zkcrawl.admin.localzk import free_port
from zkcrawl.admin.samplesite import SampleSite
from zkcrawl.cli import main


@pytest.fixture(scope="module")
def site() -> Iterator[SampleSite]:
    with SampleSite() as s:
        yield s


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["try", *argv, "--zk", f"127.0.0.1:{free_port()}"], {})
    out, err = capsys.readouterr()
    return int(rc), out, err


def try_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc, out, _ = run(capsys, *argv, "--json", "--allow-private-addresses")
    return rc, json.loads(out)


def test_listing_page_what_the_producer_would_offer(site: SampleSite, capsys) -> None:
    base = site.base_url
    rc, doc = try_json(capsys, f"{base}/blog/page/1", "--links", ss.LINKS_XPATH,
                       "--next", ss.NEXT_XPATH)
    assert rc == 0
    producer = doc["producer"]
    articles = [f"{base}{ss.article_path(n)}" for n in range(1, ss.PER_PAGE + 1)]
    # Normalized as offered (no fragment, no utm_*), in page order, each once.
    assert producer["offer"] == [*articles, ss.EXTERNAL_URL]
    reasons = {d["reason"] for d in producer["drop"]}
    assert reasons == {"duplicate", "mailto"}
    assert producer["links_found"] == len(producer["offer"]) + len(producer["drop"])
    assert producer["next"] == f"{base}/blog/page/2"


def test_filters_drop_with_the_producers_reasons(site: SampleSite, capsys) -> None:
    base = site.base_url
    rc, doc = try_json(capsys, f"{base}/blog/page/2", "--links-css", "a.titlelink",
                       "--same-host", "--deny", r"/posts/1\d\.html")
    assert rc == 0
    drops = {d["link"]: d["reason"] for d in doc["producer"]["drop"]}
    assert drops["javascript:void(0)"] == "javascript"
    assert f"{base}{ss.article_path(10)}" in drops and "deny" in drops.values()
    assert all(not u.endswith(("/10.html", "/11.html")) for u in doc["producer"]["offer"])
    assert doc["producer"]["next"] is None  # no --next given


def test_article_what_the_consumer_would_record(site: SampleSite, capsys) -> None:
    n = ss.GBK_ARTICLE  # declared only by <meta charset="gbk">: the consumer's decoding
    url = f"{site.base_url}{ss.article_path(n)}"
    fields = [f"--field={name}={xpath}" for name, xpath in ss.FIELDS.items()]
    rc, doc = try_json(capsys, url, *fields)
    assert rc == 0
    consumer = doc["consumer"]
    record = consumer["record"]
    assert consumer["outcome"] == "record"
    assert record["title"] == ss.article_title(n)
    assert record["fields"]["author"] == ss.article_author(n)
    assert record["fields"]["headline"] == ss.article_title(n)
    assert record["status"] == 200 and record["error"] is None and record["url"] == url
    # The record has every field of SPEC §4, as the consumer writes them.
    assert set(record) >= {"url", "final_url", "status", "title", "fields", "bytes", "item",
                           "attempt", "consumer", "fetched_at", "queue_ms", "dispatch_ms",
                           "wait_ms", "process_ms", "error"}


def test_text_output_names_both_views(site: SampleSite) -> None:
    # A process of its own: structlog caches each logger's level on first use, so in this
    # process an earlier test's info level would leak into the stderr assertion below.
    proc = subprocess.run([sys.executable, "-m", "zkcrawl.cli", "try",
                           f"{site.base_url}/blog/page/2", "--allow-private-addresses",
                           "--links", ss.LINKS_XPATH, "--next", ss.NEXT_XPATH,
                           "--log-format", "json"], capture_output=True, text=True, timeout=60)
    rc, out, err = proc.returncode, proc.stdout, proc.stderr
    assert rc == 0, err
    assert f"offer  {site.base_url}{ss.article_path(9)}\n" in out
    assert "javascript:void(0)" in out and "drop   javascript" in out
    assert f"next page: {site.base_url}/blog/page/3" in out
    assert "title: Sample blog - page 2" in out
    assert err == ""  # robots.txt fetches are info: not shown unless asked for


def test_private_address_blocked_by_default(site: SampleSite, capsys) -> None:
    before = len(site.hits)
    rc, out, _ = run(capsys, f"{site.base_url}/blog/page/1")
    assert rc == 1
    assert "error: blocked-address" in out and "--allow-private-addresses" in out
    assert len(site.hits) == before  # refused before connecting: robots.txt included


def test_robots_disallow_and_missing_page(site: SampleSite, capsys) -> None:
    rc, doc = try_json(capsys, f"{site.base_url}{ss.PRIVATE_PATH}")
    assert rc == 1 and doc["fetch"]["error"] == "robots"
    assert doc["producer"]["skipped"] == "robots"
    assert doc["consumer"]["outcome"] == "record-failed"
    rc, doc = try_json(capsys, f"{site.base_url}{ss.article_path(ss.MISSING_ARTICLE)}")
    assert rc == 1 and doc["consumer"]["record"]["error"] == "http-404"
    rc, doc = try_json(capsys, f"{site.base_url}{ss.PRIVATE_PATH}", "--no-robots")
    assert rc == 0 and doc["fetch"]["status"] == 200


@pytest.mark.parametrize(("args", "expect"), [
    (["not a url"], "not an absolute http(s) URL"),
    (["http://127.0.0.1:1/", "--links", "//a[@"], "--links"),
    (["http://127.0.0.1:1/", "--links-css", "a[[["], "--links-css"),
    (["http://127.0.0.1:1/", "--field", "nonsense"], "--field"),
    (["http://127.0.0.1:1/", "--deny", "(unclosed"], "--deny"),
    (["http://127.0.0.1:1/", "--links", "//a", "--links-css", "a"], "not both"),
])
def test_bad_input_is_one_line_exit_2(capsys, args: list[str], expect: str) -> None:
    rc, out, err = run(capsys, *args)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and expect in err and "Traceback" not in err


# -- zkcrawl-producer --dry-run -----------------------------------------------------------

def dry_run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    from zkcrawl.producer.main import main as producer_main

    capsys.readouterr()
    rc = producer_main(["--dry-run", "--zk", f"127.0.0.1:{free_port()}",
                        "--log-format", "json", *argv], {})
    out, err = capsys.readouterr()
    return int(rc), out.splitlines(), err


def test_dry_run_walks_the_listings_and_prints_the_offers(site: SampleSite, capsys,
                                                           tmp_path) -> None:
    base = site.base_url
    walk = ["--start", f"{base}/blog/page/1", "--links", ss.LINKS_XPATH, "--next",
            ss.NEXT_XPATH, "--same-host", "--delay", "0", "--allow-private-addresses"]
    seen = tmp_path / "seen.state"
    rc, urls, err = dry_run(capsys, *walk, "--seen", str(seen))
    assert rc == 0
    # Every item a real run offers, once each, normalized, in the form --from-file reads.
    assert sorted(urls) == sorted(ss.expected_articles(base))
    assert f"{len(urls)} URLs would be offered" in err and "other-host 1" in err
    assert not seen.exists()  # the seen state is never written

    # URLs an earlier run offered (in the --seen state) are duplicates, as in a real run;
    # the state file stays as it was.
    from zkcrawl.seen import SeenSet
    state = SeenSet.open(seen)
    state.add(f"{base}{ss.article_path(1)}")
    state.close()
    before = seen.read_bytes()
    rc, again, _ = dry_run(capsys, *walk, "--seen", str(seen))
    assert rc == 0 and sorted(again) == sorted(set(urls) - {f"{base}{ss.article_path(1)}"})
    assert seen.read_bytes() == before


def test_dry_run_of_a_list_and_of_a_failing_listing(site: SampleSite, capsys,
                                                     tmp_path) -> None:
    src = tmp_path / "urls.txt"
    src.write_text("http://a.example/x?utm_source=feed\nhttp://a.example/x\nnot a url\n")
    rc, urls, err = dry_run(capsys, "--from-file", str(src))
    assert rc == 0 and urls == ["http://a.example/x"]
    assert "1 rejected" in err and "1 duplicates" in err
    rc, urls, err = dry_run(capsys, "--start", f"{site.base_url}/blog/page/99",
                            "--allow-private-addresses", "--retries", "0")
    assert rc == 1 and urls == [] and "failed: " in err and "http-404" in err


def test_a_hostile_page_cannot_drive_the_terminal(capsys) -> None:
    from tests.httpd import TestServer, html

    evil = ("<title>\x1b[2J\x1b]0;pwned\x07Buy\u202enow</title>"
            '<a href="/x\x1b[31m">x</a><a href="javascript:\x1b[2Jalert(1)">j</a>')
    with TestServer({"/": html(evil)}) as srv:
        rc, out, _ = run(capsys, srv.url("/"), "--allow-private-addresses", "--field",
                         "t=//title")
    assert rc == 0
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    assert "\\x1b[2J" in out and "\\u202e" in out  # shown, escaped


def test_a_down_host_is_a_connection_error_not_robots(capsys) -> None:
    rc, out, _ = run(capsys, f"http://127.0.0.1:{free_port()}/page", "--allow-private-addresses")
    assert rc == 1 and "error: connection (no answer from the host" in out
    assert "would retry later (connection)" in out
