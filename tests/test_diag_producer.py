"""Selectors that select nothing, and an interrupted run (issue #26, items 2 and 7), through
the real ``zkcrawl-producer`` process and what a person reads on stderr or the terminal: a
``listing.no_links`` warning per page naming the selector, a summary that says "0 links on
N of N listing pages" and exit 1, a warning when ``--next`` finds nothing on the first page,
the same in ``--dry-run``; ``zkcrawl try`` counts the page's ``<a>`` elements and their
classes; an interrupted run's table says so and how to continue."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import wait_for
from tests.httpd import TestServer, delayed, html
from tests.test_diag_errors import read_all
from zkcrawl.producer import listing
from zkcrawl.web.extract import parse_html

ROOT = Path(__file__).resolve().parent.parent


def listing_page(n: int, last: int) -> str:
    nxt = f'<a class="pager" rel="next" href="/list/{n + 1}">next</a>' if n < last else ""
    posts = "".join(f'<a class="post-link" href="/post/{n}-{i}">post {i}</a>'
                    for i in range(3))
    return f"<html><body><h1>List {n}</h1>{posts}<a href='/about'>about</a>{nxt}</body></html>"


@pytest.fixture
def site() -> Iterator[TestServer]:
    routes = {f"/list/{n}": html(listing_page(n, 3)) for n in range(1, 4)}
    with TestServer(routes) as srv:
        yield srv


def producer(*argv: str, timeout: float = 120) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZKCRAWL_")}
    proc = subprocess.run([sys.executable, "-m", "zkcrawl.producer.main", *argv], cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def events(err: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in err.splitlines() if x.startswith("{")]


def walk_args(site: TestServer, *extra: str, next_xpath: str = '//a[@rel="next"]/@href'
              ) -> list[str]:
    return ["--start", site.url("/list/1"), "--next", next_xpath, "--delay", "0",
            "--no-robots", "--allow-private-addresses", "--log-format", "json", *extra]


def test_a_links_css_that_selects_nothing_warns_per_page_and_exits_1(site, zk_hosts,
                                                                    zk_root):
    rc, out, err = producer(*walk_args(site, "--links-css", "h2.title a", "--zk", zk_hosts,
                                       "--root", zk_root))
    assert rc == 1 and out == "", err
    warned = [e for e in events(err) if e["event"] == "listing.no_links"]
    assert [e["url"] for e in warned] == [site.url(f"/list/{n}") for n in range(1, 4)]
    assert warned[0]["selector"] == "--links-css h2.title a"
    assert warned[0]["anchors"] == ("the page has 5 <a> elements; most common classes: "
                                    "post-link (3), pager (1)")
    summary = next(e for e in events(err) if e["event"] == "producer.summary")
    assert summary["level"] == "warning" and summary["pages_without_links"] == 3
    last = err.strip().splitlines()[-1]
    assert last == ("zkcrawl-producer: error: 0 links on 3 of 3 listing pages: check "
                    f"`--links-css` with `zkcrawl try {site.url('/list/1')}`"), last


def test_the_same_in_dry_run(site):
    rc, out, err = producer("--dry-run", *walk_args(site, "--links-css", "h2.title a"))
    assert rc == 1 and out == "", err
    lines = err.strip().splitlines()
    assert "0 URLs would be offered" in lines[-2]
    assert "0 links on 3 of 3 listing pages (--links-css h2.title a)" in lines[-2]
    assert lines[-1].startswith("zkcrawl-producer: error: 0 links on 3 of 3 listing pages")


def test_a_next_that_finds_nothing_on_the_first_page_warns(site):
    rc, out, err = producer("--dry-run", *walk_args(site, "--links-css", "a.post-link",
                                                    next_xpath="//a[@rel='nope']/@href"))
    assert rc == 0, err
    assert len(out.splitlines()) == 3  # one page read: the walk ended there
    warned = [e for e in events(err) if e["event"] == "listing.no_next"]
    assert len(warned) == 1 and warned[0]["url"] == site.url("/list/1"), err
    assert "--next found no link on the first page" in str(warned[0]["hint"])
    assert not [e for e in events(err) if e["event"] == "listing.no_links"]


def test_every_link_dropped_is_exit_1_too_but_seen_before_is_not(site, zk_hosts, zk_root,
                                                                  tmp_path):
    rc, _out, err = producer("--dry-run", *walk_args(site, "--deny", "."))
    assert rc == 1, err
    assert "links found and every one dropped (deny " in err.strip().splitlines()[-1]
    run = walk_args(site, "--links-css", "a.post-link", "--zk", zk_hosts, "--root", zk_root,
                    "--seen", str(tmp_path / "seen"))
    assert producer(*run)[0] == 0
    rc, _out, err = producer(*run)  # nothing new: every link was offered before
    assert rc == 0, err
    summary = next(e for e in events(err) if e["event"] == "producer.summary")
    assert summary["offered"] == 0 and summary["duplicates"] == 9 and not summary["problem"]


def test_try_shows_the_anchors_and_a_selector_that_would_select(site, capsys):
    from zkcrawl.admin.localzk import free_port
    from zkcrawl.cli import main

    capsys.readouterr()
    assert main(["try", site.url("/list/1"), "--links-css", "h2.title a",
                 "--allow-private-addresses", "--zk", f"127.0.0.1:{free_port()}"], {}) == 0
    out = capsys.readouterr().out
    assert ("  0 links found: 0 would be offered, 0 dropped\n"
            "  the page has 5 <a> elements; most common classes: post-link (3), pager (1)\n"
            "  the selector selects nothing: --links-css 'a.post-link' would select 3\n") in out


@given(st.text(max_size=300))
def test_anchor_stats_of_any_page(body):
    doc = parse_html(body.encode("utf-8", "surrogatepass"), "http://x.test/")
    count, classes = listing.anchor_stats(doc)
    assert count >= 0 and len(classes) <= listing.TOP_CLASSES
    assert all(n >= 1 and len(c) <= 60 for c, n in classes)
    assert listing.describe_anchors(count, classes).startswith("the page has ")


@pytest.mark.slow
def test_an_interrupted_run_says_so_and_how_to_continue(zk_hosts, zk_root, tmp_path):
    """SIGINT half-way through a slow walk, on a terminal: exit 0, the table's title says it
    was interrupted and its last line how to continue."""
    routes = {f"/list/{n}": delayed(0.3, html(listing_page(n, 40))) for n in range(1, 41)}
    with TestServer(routes) as srv:
        master, slave = pty.openpty()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZKCRAWL_")}
        argv = walk_args(srv, "--links-css", "a.post-link", "--zk", zk_hosts, "--root",
                         zk_root, "--seen", str(tmp_path / "seen"))
        proc = subprocess.Popen([sys.executable, "-m", "zkcrawl.producer.main", *argv], cwd=ROOT,
                                env={**env, "PYTHONPATH": str(ROOT)},
                                stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
        os.close(slave)
        try:
            wait_for(lambda: len(srv.requests_for()) >= 3, 60, "three listing pages read")
            proc.send_signal(signal.SIGINT)
            screen = read_all(master, proc, 60)
        finally:
            os.close(master)
    print(screen)  # shown when the test fails
    assert proc.wait(10) == 0
    assert "zkcrawl-producer summary (interrupted by SIGINT)" in screen, screen
    assert ("interrupted by SIGINT: run the same command again: --seen skips what this run "
            "offered") in screen, screen
