"""``zkcrawl bench crawl`` at a tiny size: the shape of its JSON, not its timings."""

from __future__ import annotations

from zkcrawl.bench.crawl import render, run_bench


def test_bench_crawl_reports_every_case(zk_hosts):
    out = run_bench(zk_hosts, n=60, threads=4, latency_ms=5, rounds=1)
    for case in ("seed_naive", "zkcrawl_1", "zkcrawl_2", "zkcrawl_requests", "zkcrawl_pg"):
        c = out[case]
        for key in ("pages_per_s", "pct_ideal", "cpu_ms_per_page", "rss_mb"):
            assert isinstance(c[key], int | float) and c[key] >= 0, (case, key)
        assert c["pages"] == 60 and c["pages_per_s"] > 0
    for case in ("zkcrawl_1", "zkcrawl_2", "zkcrawl_requests", "zkcrawl_pg"):
        c = out[case]
        assert c["unique_urls"] == 60 and c["errors"] == 0 and set(c["exit_codes"]) == {0}
        assert c["dispatch_p95_ms"] >= 0 and c["process_p50_ms"] > 0
    assert set(out["ratios"]) >= {"zkcrawl_1_vs_seed", "zkcrawl_2_vs_1",
                                  "requests_vs_curl_cpu_per_page", "requests_vs_curl_pages_per_s"}
    assert out["ratios"]["requests_vs_curl_cpu_per_page"] > 0
    assert "zkcrawl_2" in render(out) and "zkcrawl_requests" in render(out)
    # PostgreSQL (a throwaway local server) alternated with JSON Lines (1 round each here).
    assert len(out["rounds_jsonl_pages_per_s"]) == len(out["rounds_pg_pages_per_s"]) == 1
    assert out["ratios"]["pg_vs_jsonl_pages_per_s"] > 0 and "postgresql" in render(out)
    # Its CPU is sampled against the rows stored (its log has no per-page event at info):
    # every page seen, as the JSON Lines case sees its lines.
    assert out["zkcrawl_pg"]["probe_pages"] == out["zkcrawl_1"]["probe_pages"] == 60
