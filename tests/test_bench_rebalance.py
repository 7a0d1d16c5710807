"""``zkcrawl bench rebalance`` at a tiny size: a consumer joins and one leaves (SIGTERM, then
SIGKILL) mid-crawl; the books and the report's shape. Timings are never asserted (benches are
read by people), and neither is how many partitions moved at each event."""

from __future__ import annotations

import pytest

from zkcrawl.bench import rebalance as br


def test_windows_and_recovery_are_read_from_the_page_ends() -> None:
    ends = [0.1, 0.2, 1.5, 3.2, 3.4, 4.1, 4.2, 5.5, 5.6]
    assert br.rate_series(ends, 0.0) == [2, 1, 0, 2, 2, 2]
    assert br.rate_between(ends, 3.0, 5.0) == 2.0
    # a baseline of 2/s: windows from 2.0 are 0, 2, 2, 2 -> back at 1 s after the event
    assert br.recovery(ends, 2.0, 2.0, until=6.0) == (1.0, 0.0)
    assert br.recovery(ends, 2.0, 2.0, until=4.0) == (None, 0.0)
    # windows 2..6 of a 2/s baseline: 0, 2, 2, 2 -> 2 pages short = 1 s of the baseline
    assert br.lost_seconds(ends, 2.0, 2.0, until=6.0) == 1.0
    assert br.below_share(ends, 2.0, 6.0) == 0.25  # the mean is 1.5/s: one window of 4 short
    assert br.attainable(2, 4, 50, 300, 1.0) == 160.0
    assert br.attainable(3, 32, 50, 300, 1.0) == 300.0


@pytest.mark.slow
def test_a_join_and_a_leave_keep_the_books(zk_hosts: str) -> None:
    out = br.run_bench(zk_hosts, hosts=6, per_host=40, threads=4, latency_ms=5, delay=0.25,
                       session_timeout=2.0, partitions=16)
    assert out["session_timeout_s"] == 2.0
    for how in br.CASES:
        c = out[how]
        assert c["partitions"] == 16 and c["expected"] == 240
        # every offered URL recorded, none made up, nothing failed
        assert c["missing"] == 0 and c["extra"] == 0 and c["unique_urls"] == 240
        assert c["errors"] == 0 and c["dead_letters"] == 0
        assert c["records"] == 240 + c["duplicates"]
        assert set(c["events"]) == {"join", "leave"}
        for e in c["events"].values():
            assert {"at_s", "steady_before", "baseline", "dip", "recovery_s", "lost_s", "moved",
                    "p_over_n", "rendezvous"} <= e.keys()
            assert e["moved"] >= 0 and e["rendezvous"] > 0
        assert c["events"]["join"]["at_s"] < c["events"]["leave"]["at_s"]
        assert 0 <= c["steady_windows_below_90pct"] <= 1
        assert c["min_gap_s"] is not None and sum(c["rate_per_s"]) == c["records"]
    # a clean stop hands its partitions over with nothing in flight: no page twice
    assert out["term"]["duplicates"] == 0
    assert out["term"]["exit_codes"] == [0, 0, 0]
    # a kill: only what the killed consumer had in flight may repeat
    assert out["kill"]["dups_not_from_killed"] == 0
    assert out["kill"]["exit_codes"][0] == -9 and out["kill"]["exit_codes"][1:] == [0, 0]
    text = br.render(out)
    assert "term" in text and "kill" in text and "books:" in text
