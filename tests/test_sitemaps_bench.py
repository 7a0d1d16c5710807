"""``zkcrawl bench sitemap`` and ``zkcrawl bench watch`` at a small size: the cases run,
offer everything, and report their figures (not their speed: that is the machine's)."""

from __future__ import annotations

import pytest

from zkcrawl.bench import sitemap as bs


@pytest.mark.slow
def test_bench_sitemap_offers_the_same_urls_both_ways(zk_hosts) -> None:
    out = bs.run_sitemap(zk_hosts, n=2000, rounds=1)
    cases = out["cases"]
    assert cases["decode"]["urls"] == 2000 and cases["decode"]["error"] is None
    for name in ("sitemap", "from_file"):
        assert cases[name]["exit_status"] == 0 and cases[name]["offered"] == 2000, cases[name]
        assert cases[name]["peak_rss_mb"] > 0
    assert out["urls_per_s_ratio"] and out["peak_rss_ratio"]
    assert "ratio sitemap / from_file" in bs.render(out)


@pytest.mark.slow
def test_bench_watch_reads_one_listing_page_per_quiet_pass(zk_hosts) -> None:
    out = bs.run_watch(zk_hosts, interval=1.0, quiet_passes=2)
    assert out["first_pass_pages"] == 5  # the sample blog's whole chain
    assert out["pages_per_quiet_pass"] == 1.0
    assert out["offered_after_s"] is not None and out["exit_status"] == 0
    assert "listing pages per pass" in bs.render_watch(out)
