"""``zkcrawl bench e2e`` at a tiny size: both crawlers fetch the whole chain, the books balance,
the bound is the chain's. Timings are never asserted."""

from __future__ import annotations

import pytest

from zkcrawl.bench import e2e


def test_the_bound_is_the_chain_or_the_threads() -> None:
    # 50 listings at 50 ms, 40 articles each, 32 threads: the threads bound it -- the first
    # listing, then 63 whole rounds of 32 (one thread fetches 63 articles in a row): 3.2 s
    assert e2e.bound_s(2000, 50, 40, 32, 0.05) == pytest.approx(0.05 + 63 * 0.05)
    assert e2e.bound_s(2016, 50, 41, 32, 0.05) == pytest.approx(0.05 + 63 * 0.05)
    # with 1000 threads the chain does: 50 listings + one round of articles
    assert e2e.bound_s(2000, 50, 40, 1000, 0.05) == pytest.approx(51 * 0.05)


def test_e2e_crawls_the_chain_with_both_crawlers(zk_hosts: str) -> None:
    out = e2e.run_bench(zk_hosts, articles=100, threads=4, latency_ms=5)
    z, seed = out["zkcrawl"], out["seed_naive"]
    # zkcrawl: every article offered by the producer has one record; the producer walked
    # all 50 listing pages once; both exited 0
    assert z["articles"] == z["unique_urls"] == 100 and z["errors"] == 0
    assert z["listings"] == 50 and z["server_requests"] == 150
    assert z["exit_codes"] == {"consumer": 0, "producer": 0}
    # the seed's crawler reaches the same pages (each once: its seen set)
    assert seed["articles"] == seed["unique_urls"] == 100 and seed["listings"] == 50
    assert len(seed["runs_pages_per_s"]) == 2
    for c in (z, seed):
        assert c["pages"] == 150 and c["pages_per_s"] > 0 and c["cpu_ms_per_page"] > 0
        assert c["attainable_pages_per_s"] == pytest.approx(150 / e2e.bound_s(100, 50, 2, 4,
                                                                               0.005), rel=0.01)
    # the bound at the latency the site served is never above the nominal one's share
    assert z["site_late_ms"] >= 0 and z["pct_attainable_as_served"] >= z["pct_attainable"]
    assert "bound at the latency served" in e2e.render(out)
    # --zk given: the server is not ours, its CPU is not counted
    assert out["zk_cpu_counted"] is False and z["zk_cpu_ms_per_page"] is None
    assert "seed_naive" in e2e.render(out)
