"""``--extract article`` in the consumer (issue #24): the extraction process pool
(consumer/extract_pool.py) -- real child processes, real signals -- the flags, the missing
extra, ``zkcrawl try --extract article``, and a real consumer against a real ZooKeeper and
HTTP server recording articles and the reasons of pathological pages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.articles import pages
from tests.conftest import wait_for
from tests.httpd import TestServer, html
from tests.test_consumer_support import ROOT, offer, records, spawn
from zkcrawl.cli import main as cli_main
from zkcrawl.consumer.extract_pool import ExtractPool, default_workers, extraction
from zkcrawl.consumer.main import main as consumer_main
from zkcrawl.consumer.settings import ConsumerSettings
from zkcrawl.web import article as art
from zkcrawl.web.article import ArticleError, extract_article

SAMPLES = list(pages())
HEAVY = b"<html><body>" + b"<p>a b c d e f</p>" * 14_000  # seconds of trafilatura


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def pool():  # type: ignore[no-untyped-def]
    p = ExtractPool(1, timeout=0.5, wait=30)
    assert p.ready(60)
    yield p
    p.close()


def test_the_pool_gives_what_extraction_in_the_thread_gives(pool: ExtractPool):
    for s in SAMPLES[:3] + SAMPLES[-3:]:
        assert pool.extract(s.body, s.url, s.content_type) == extract_article(
            s.body, s.url, s.content_type)
    with pytest.raises(ArticleError, match=r"^extract: not-text$"):
        pool.extract(b"\x00" * 10_000, "http://h/x", "text/html")


def test_a_page_past_the_time_cap_is_a_timeout_and_its_process_is_replaced(pool):
    (old,) = pool.pids()
    started = time.monotonic()
    with pytest.raises(ArticleError, match=r"^extract: timeout$"):
        pool.extract(HEAVY, "http://h/heavy", "text/html")
    assert time.monotonic() - started < 0.5 + 6  # the cap, plus the kill
    wait_for(lambda: _gone(old), 10, "the stuck process killed")
    s = SAMPLES[0]
    assert pool.extract(s.body, s.url, s.content_type)["author"] == s.author  # a new one
    assert pool.pids() != [old] and pool.replaced == 1


def test_a_process_that_dies_is_a_crash_for_its_page_and_is_replaced(pool):
    (old,) = pool.pids()
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: _gone(old), 10, "the child dead")
    s = SAMPLES[1]
    with pytest.raises(ArticleError, match=r"^extract: crashed$"):
        pool.extract(s.body, s.url, s.content_type)
    assert pool.extract(s.body, s.url, s.content_type)["text"]
    assert pool.pids() != [old]


def test_no_free_process_within_the_wait_is_busy():
    p = ExtractPool(1, timeout=20, wait=0.2)
    try:
        assert p.ready(60)
        holder = threading.Thread(target=lambda: _swallow(p), daemon=True)
        holder.start()
        wait_for(lambda: p._idle.qsize() == 0, 10, "the only child taken")
        with pytest.raises(ArticleError, match=r"^extract: busy$"):
            p.extract(SAMPLES[0].body, SAMPLES[0].url, None)
        holder.join(30)
    finally:
        p.close()


def _swallow(p: ExtractPool) -> None:
    try:
        p.extract(HEAVY, "http://h/heavy", "text/html")
    except ArticleError:
        pass


def test_close_ends_every_child_and_sigint_sigterm_are_the_parents():
    p = ExtractPool(2, timeout=5)
    assert p.ready(60)
    pids = p.pids()
    for pid in pids:  # a terminal's Ctrl-C, a service manager's stop: to the whole group
        os.kill(pid, signal.SIGINT)
        os.kill(pid, signal.SIGTERM)
    s = SAMPLES[2]
    assert p.extract(s.body, s.url, s.content_type)["text"]
    assert sorted(p.pids()) == sorted(pids) and p.replaced == 0
    p.close()
    wait_for(lambda: all(_gone(pid) for pid in pids), 10, "children gone after close")


@pytest.mark.slow
def test_children_exit_when_the_consumer_is_killed(tmp_path: Path, procs):
    script = textwrap.dedent("""
        import sys, time
        from zkcrawl.consumer.extract_pool import ExtractPool
        p = ExtractPool(2)
        assert p.ready(60)
        print(*p.pids(), flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    procs.append(proc)
    assert proc.stdout is not None
    pids = [int(x) for x in proc.stdout.readline().split()]
    assert len(pids) == 2
    proc.kill()
    proc.wait(10)
    wait_for(lambda: all(_gone(pid) for pid in pids), 15, "orphaned children gone")


def test_the_runner_is_the_pool_only_while_the_consumer_runs():
    assert art._runner is None
    with extraction("article", 1) as p:
        assert p is not None and art._runner == p.extract
    assert art._runner is None
    with extraction("article", 0) as p, extraction("title", None) as q:
        assert p is None and q is None and art._runner is None


# -- flags ---------------------------------------------------------------------------------
def test_the_flags_have_env_names_toml_keys_and_bounds(tmp_path: Path, capsys):
    assert ConsumerSettings().extract == "title" and default_workers() >= 1
    cfg = tmp_path / "c.toml"
    cfg.write_text('extract = "article"\n')
    env = {"ZKCRAWL_CONSUMER_CONFIG": str(cfg), "ZKCRAWL_CONSUMER_EXTRACT_WORKERS": "3"}
    assert consumer_main(["--print-config"], env) == 0
    out = capsys.readouterr().out
    assert 'extract = "article"' in out and "extract-workers = 3" in out
    for argv in (["--extract", "summary"], ["--extract-workers", "-1"],
                 ["--extract-workers", "65"]):
        assert consumer_main(argv, {}) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "extract" in err[0], err


def test_without_the_extra_article_is_one_line_and_exit_2(tmp_path: Path):
    fake = tmp_path / "trafilatura"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ModuleNotFoundError('no', name='trafilatura')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    for cmd in (["-m", "zkcrawl.consumer.main", "--extract", "article", "--zk", "127.0.0.1:1"],
                ["-m", "zkcrawl.cli", "try", "http://127.0.0.1:1/", "--extract", "article"]):
        done = subprocess.run([sys.executable, *cmd], env=env, capture_output=True, timeout=60,
                              stdin=subprocess.DEVNULL, text=True)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, done.stderr
        assert len(lines) == 1 and "pip install 'zkcrawl[article]'" in lines[0], lines


def test_try_shows_the_article_the_consumer_would_record(capsys):
    s = SAMPLES[4]
    with TestServer({"/post": (200, {"Content-Type": s.content_type}, s.body)}) as srv:
        rc = cli_main(["try", srv.url("/post"), "--extract", "article", "--json",
                       "--allow-private-addresses", "--no-robots"], {})
    assert rc == 0
    fields = json.loads(capsys.readouterr().out)["consumer"]["record"]["fields"]
    assert fields["author"] == s.author and s.text.splitlines()[0] in fields["text"]


# -- a real consumer ----------------------------------------------------------------------
@pytest.mark.slow
def test_a_consumer_records_articles_and_the_reasons_of_pathological_pages(
        zk, zk_hosts, zk_root, tmp_path: Path, procs):
    chosen = [s for s in SAMPLES if s.charset != "utf-8"][:4] + SAMPLES[:2]
    routes = {f"/p/{i}": (200, {"Content-Type": s.content_type}, s.body)
              for i, s in enumerate(chosen)}
    routes["/nested"] = html(b"<html><body>" + b"<div>" * 2_100_000)
    routes["/binary"] = html(bytes(range(256)) * 400)
    routes["/heavy"] = html(HEAVY)
    out = tmp_path / "out.jsonl"
    with TestServer(routes) as srv:
        urls = [srv.url(p) for p in routes]
        offer(zk, zk_root, urls)
        proc = spawn(["--zk", zk_hosts, "--root", zk_root, "--out", str(out), "--no-robots",
                      "--allow-private-addresses", "--domain-delay", "0", "--exit-when-idle",
                      "1", "--session-timeout", "4", "--extract", "article",
                      "--extract-workers", "1", "--field", "h1=//h1//text()",
                      "--processor", "re:/p/5$ tests.articles.procs:words",
                      "--log-format", "json"], tmp_path / "err.log")
        procs.append(proc)
        assert proc.wait(120) == 0, (tmp_path / "err.log").read_text()[-2000:]
    recs = {r["url"]: r for r in records(out)}
    assert len(recs) == len(urls)
    assert '"extract_pool.started"' in (tmp_path / "err.log").read_text()
    mine = recs.pop(srv.url("/p/5"))  # a processor of the user's, calling page.article()
    assert mine["error"] is None and mine["fields"]["author"] == chosen[5].author
    assert 0.9 <= mine["fields"]["words"] / len(chosen[5].text.split()) <= 1.1
    chosen = chosen[:5]
    for i, s in enumerate(chosen):
        r = recs[srv.url(f"/p/{i}")]
        assert r["error"] is None and r["title"]
        assert set(r["fields"]) == {*art.ARTICLE_FIELDS, "h1"}
        assert r["fields"]["author"] == s.author and s.text.splitlines()[0] in r["fields"]["text"]
    assert recs[srv.url("/nested")]["error"] == "extract: too-large"
    assert recs[srv.url("/binary")]["error"] == "extract: not-text"
    heavy = recs[srv.url("/heavy")]  # seconds of work, within the 10 s cap even under load
    assert heavy["error"] is None or heavy["error"] == "extract: timeout"
    for url in (srv.url("/nested"), srv.url("/binary")):
        assert set(recs[url]["fields"]) == {*art.ARTICLE_FIELDS, "h1"}
        assert all(v is None for v in recs[url]["fields"].values())


@pytest.mark.slow
def test_bench_crawl_extract_article_reports_its_cases(zk_hosts):
    from zkcrawl.bench.crawl import ARTICLE_CASES, render, run_bench

    out = run_bench(zk_hosts, n=40, threads=4, latency_ms=5, extract="article")
    for case in ARTICLE_CASES:
        c = out[case]
        assert c["pages"] == 40 and c["errors"] == 0 and set(c["exit_codes"]) == {0}, case
        assert c["cpu_ms_per_page"] > 0 and c["pages_per_s"] > 0
    assert out["title"]["with_text"] == 0
    assert out["article_threads"]["with_text"] == out["article_pool"]["with_text"] == 40
    assert out["article_pool"]["children_rss_mb"] > 0 == out["article_threads"][
        "children_rss_mb"]
    assert out["ratios"]["pool_vs_threads_pages_per_s"] > 0
    assert "article_pool" in render(out)
