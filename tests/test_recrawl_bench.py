"""``zkcrawl bench recrawl`` / ``recrawl-store`` on a small scale (issue #23): the figures are
there and say what the full runs say -- a re-crawl of an unchanged site is all 304s,
``changed: false``, a few percent of the first crawl's bytes. CPU is not asserted (a
shared machine's load)."""

from __future__ import annotations

import pytest

from zkcrawl.bench import recrawl


def test_store_bench_small() -> None:
    out = recrawl.run_store(3000)
    assert out["urls"] == 3000 and out["due_count"] == 3000 and out["reoffered"] == 3000
    assert 40 < out["bytes_per_url"] < 400
    assert "bytes per URL" in recrawl.render_store(out)


@pytest.mark.slow
def test_recrawl_bench_small(zk_hosts: str) -> None:
    out = recrawl.run_bench(zk_hosts, n=120, threads=8, latency_ms=5, page_kb=20)
    first, again = out["first"], out["recrawl"]
    assert out["page_kb"] == 20 and first["bytes"] > 120 * 10 * 1024  # 10-30 KB articles
    assert first["pages"] == again["pages"] == 120 and first["errors"] == again["errors"] == 0
    assert first["changed_absent"] == 120  # SPEC §4: absent on a first fetch
    assert again["status_304"] == again["changed_false"] == 120
    assert out["ratios"]["bytes_recrawl_vs_first"] < 0.05
    assert out["producer_pass"]["reports"] == 120 and out["producer_pass"]["reoffered"] == 120
    assert "re-crawl / first" in recrawl.render(out) and "20 KB" in recrawl.render(out)


@pytest.mark.slow
def test_recrawl_bench_article(zk_hosts: str) -> None:
    """``--extract article``: every pass with the consumer's extraction processes; a 304
    extracts nothing, so the re-crawl's records are ``changed: false`` with no text."""
    out = recrawl.run_bench(zk_hosts, n=60, threads=8, latency_ms=5, extract="article")
    first, again = out["first"], out["recrawl"]
    assert out["extract"] == "article" and first["errors"] == again["errors"] == 0
    assert first["pages"] == again["pages"] == 60 and again["changed_false"] == 60
    assert first["cpu_ms_per_page"] > 0 and again["cpu_ms_per_page"] > 0
    assert "--extract article" in recrawl.render(out)
