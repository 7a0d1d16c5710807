"""Issue #26, item 3: your own code's errors, as a person reads them -- the installed console
scripts run from a directory of one's own (not on PYTHONPATH), a real ZooKeeper, a real HTTP
server: the record's error names the line, the log has the traceback once, ``zkcrawl try``
has it every time, a module not found says how to make it found; ``Page.css`` /
``get`` / ``getall`` and ``--field NAME=css:SELECTOR``, and a ``--field`` that is null on
every page is a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lxml.etree
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.httpd import TestServer, html
from tests.test_consumer_support import ROOT, offer, records
from zkcrawl.page import Page
from zkcrawl.web.css import CssError, css_to_xpath

BIN = Path(sys.executable).parent
ARTICLE = '''from zkcrawl import PageResult


def parse(page):
    raise ValueError("no date here")
'''
PAGE = ("<html><head><title>T</title></head><body><h1>Hello <b>you</b></h1>"
        '<a class="n" href="/a">one</a><a href="/b">two</a></body></html>')


def script(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed next to {sys.executable}")
    return str(path)


def run(argv: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH is this checkout only: the user's directory is not on it.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, check=False)


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in text.splitlines() if x.startswith("{")]


@pytest.mark.slow
def test_a_processor_that_raises_names_its_line_and_logs_its_traceback_once(
        zk, zk_hosts, zk_root, tmp_path):
    (tmp_path / "article.py").write_text(ARTICLE)
    with TestServer({"/p/*": html(PAGE)}) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(3)]
        offer(zk, zk_root, urls)
        out = tmp_path / "o.jsonl"
        done = run([script("zkcrawl-consumer"), "--zk", zk_hosts, "--root", zk_root,
                    "--out", str(out), "--log-format", "json", "--exit-when-idle", "1",
                    "--session-timeout", "4", "--domain-delay", "0", "--no-robots",
                    "--allow-private-addresses", "--processor", "article:parse"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert [r["error"] for r in records(out)] == [
        "processor: ValueError: no date here (article.py:5)"] * 3
    failed = [e for e in events(done.stderr) if e["event"] == "processor.failed"]
    assert len(failed) == 1, failed  # once per (callable, type, line), not per page
    assert failed[0]["level"] == "warning" and failed[0]["callable"] == "article:parse"
    assert "Traceback" in failed[0]["exception"]
    assert 'article.py", line 5, in parse' in failed[0]["exception"]
    [summary] = [e for e in events(done.stderr) if e["event"] == "consumer.summary"]
    assert summary["verdict"].startswith("100 % of items failed: processor -- ")


def test_zkcrawl_try_shows_the_traceback_every_time(tmp_path):
    (tmp_path / "article.py").write_text(ARTICLE)
    with TestServer({"/a": html(PAGE)}) as srv:
        done = run([script("zkcrawl"), "try", srv.url("/a"), "--allow-private-addresses",
                    "--no-robots", "--processor", "article:parse", "--log-format", "console"],
                   tmp_path)
    assert "processor: ValueError: no date here (article.py:5)" in done.stdout, done.stdout
    assert "Traceback" in done.stderr and 'article.py", line 5, in parse' in done.stderr


def test_a_module_not_found_says_where_it_looked_and_how(tmp_path):
    done = run([script("zkcrawl-consumer"), "--zk", "127.0.0.1:1", "--processor",
                "articles:parse"], tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert "cannot import 'articles'" in lines[0]
    assert f"working directory {tmp_path}" in lines[0]
    assert "articles.py" in lines[0] and "PYTHONPATH" in lines[0]


@pytest.mark.slow
def test_field_css_and_a_field_null_on_every_page_warns_once(zk, zk_hosts, zk_root, tmp_path):
    with TestServer({"/p/*": html(PAGE)}) as srv:
        offer(zk, zk_root, [srv.url(f"/p/{i}") for i in range(4)])
        out = tmp_path / "o.jsonl"
        done = run([script("zkcrawl-consumer"), "--zk", zk_hosts, "--root", zk_root,
                    "--out", str(out), "--log-format", "json", "--exit-when-idle", "1",
                    "--session-timeout", "4", "--domain-delay", "0", "--no-robots",
                    "--allow-private-addresses", "--stats-interval", "0.3",
                    "--field", "h=css:h1::text", "--field", "links=css:a::attr(href)",
                    "--field", "price=css:.price::text"], tmp_path)
    assert done.returncode == 0, done.stderr
    recs = records(out)
    assert len(recs) == 4
    assert all(r["fields"] == {"h": "Hello", "links": ["/a", "/b"], "price": None}
               for r in recs)
    warned = [e for e in events(done.stderr) if e["event"] == "field.always_null"]
    assert [e["field"] for e in warned] == ["price"], warned  # once, and only that one
    assert warned[0]["level"] == "warning" and "zkcrawl try" in warned[0]["note"]


def test_a_bad_css_field_is_one_line_and_exit_2(tmp_path):
    done = run([script("zkcrawl-consumer"), "--zk", "127.0.0.1:1", "--field",
                "x=css:a::nope"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "zkcrawl-consumer: error: --field x: 'a::nope': unknown pseudo-element ::nope "
        "(::text and ::attr(NAME) are known)"]


def page(body: str = PAGE) -> Page:
    return Page(url="http://example.org/", final_url="http://example.org/", status=200,
                headers={"content-type": "text/html"}, body=body.encode())


def test_page_css_get_getall_as_scrapy_users_write_them():
    p = page()
    assert p.css("h1::text").get() == "Hello "
    assert p.css("a::attr(href)").getall() == ["/a", "/b"]
    assert p.getall("a.n::text") == ["one"]
    assert p.get("h1") == "<h1>Hello <b>you</b></h1>"  # an element: its HTML
    assert p.get("h3") is None and p.get("h3", "none") == "none"
    assert p.css("h3").getall() == [] and len(p.css("a")) == 2
    with pytest.raises(ValueError, match="unknown pseudo-element"):
        p.css("a::nope")


@given(st.one_of(st.text(max_size=60),
                st.text("\\:()[]=\"'.#>+~*, a1x-_|^$@\x00\U0001f600", max_size=40)))
def test_property_css_compiles_or_says_why(selector: str):
    try:
        xpath = css_to_xpath(selector)
    except CssError:
        return
    lxml.etree.XPath(xpath)  # whatever compiled is a valid XPath


@given(st.sampled_from(["a", "h1", "p.x", "div > a", "*"]),
       st.sampled_from(["", "::text", "::attr(href)", "::attr(data-x)"]))
def test_property_pseudo_elements_select_strings(base: str, pseudo: str):
    values = page('<div><a class="x" href="/h" data-x="1">t</a><p class="x">p</p></div>'
                  ).css(base + pseudo).getall()
    assert all(isinstance(v, str) for v in values)
