"""The example project of the README (examples/blog_articles): its processor and pipeline
crawl the bundled sample site through the Python API -- a real ZooKeeper, the sample site on
127.0.0.1, the example run as a user runs it (its own process) -- and ``zkcrawl try`` shows
what its processor makes of one page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.queue_view import held, queued_urls
from tests.test_consumer_support import ROOT, records
from zkcrawl.admin import samplesite as ss
from zkcrawl.admin.localzk import free_port
from zkcrawl.cli import main
from zkcrawl.zk.client import ZkClient

EXAMPLE = ROOT / "examples" / "blog_articles"


@pytest.mark.slow
def test_the_example_crawls_the_sample_site_keeping_articles_with_an_author(
        zk: ZkClient, zk_hosts: str, zk_root: str, tmp_path: Path):
    out = tmp_path / "articles.jsonl"
    with ss.SampleSite(slow_s=0.1) as site:
        base = site.base_url.rstrip("/")
        proc = subprocess.run(
            [sys.executable, str(EXAMPLE / "crawl.py"), "--zk", zk_hosts, "--root", zk_root,
             "--start", f"{base}/blog/page/1", "--out", str(out)],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
            text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = records(out)
    want = {f"{base}{ss.article_path(n)}": n for n in range(1, ss.ARTICLES + 1)}
    assert sorted(r["url"] for r in recs) == sorted(want)  # each once; listings dropped
    for r in recs:
        n = want[r["url"]]
        assert r["fields"]["author"] == ss.article_author(n)
        assert r["fields"]["published"] == f"2024-03-{n % 28 + 1:02d}"
        assert r["title"] == ss.article_title(n)
    assert "RequireAuthor: kept 40 records, dropped" in proc.stderr
    # The books: nothing queued (ingress or partitions), nothing held, discovered/ drained.
    assert queued_urls(zk, zk_root) == [] == held(zk, zk_root)
    assert zk.get_children(f"{zk_root}/discovered") == []


def test_try_shows_the_example_processor_and_pipeline(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    with ss.SampleSite() as site:
        base = site.base_url.rstrip("/")
        argv = ["try", "--json", "--allow-private-addresses", "--zk", f"127.0.0.1:{free_port()}",
                "--processor", "blog_articles.processors:article",
                "--pipeline", "blog_articles.pipelines:RequireAuthor"]
        assert main([*argv, f"{base}{ss.article_path(3)}"], {}) == 0
        article = json.loads(capsys.readouterr().out)["consumer"]
        assert main([*argv, f"{base}/blog/page/1"], {}) == 0
        listing = json.loads(capsys.readouterr().out)["consumer"]
        assert main([*argv[:2], *argv[3:], f"{base}/blog/page/2"], {}) == 1  # blocked
        capsys.readouterr()
    assert article["outcome"] == "record" and article["links"] == []
    assert article["record"]["fields"] == {"author": ss.article_author(3),
                                           "published": "2024-03-04",
                                           "headline": ss.article_title(3)}
    assert listing["outcome"] == "dropped"  # no author: the pipeline drops it
    assert f"{base}/blog/page/2" in listing["links"]
    assert f"{base}{ss.article_path(1)}" in listing["links"]
