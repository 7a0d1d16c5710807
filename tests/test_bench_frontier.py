"""``zkcrawl bench frontier`` at a tiny size: every case drains every item and the report has
its shape. The writes per page come from the server's counters: the one structural claim
checked is issue #22's bound, at most 0.1 ZooKeeper writes per page with partitions worked in
checkpoints (a count of transactions, fixed by the sizes here, not a timing). The consumer's
queue (``owned``) writes on its own clock, so its ratio to that is reported, not asserted."""

from __future__ import annotations

from zkcrawl.bench import frontier


def test_a_tiny_frontier_run_drains_every_case(zk_hosts) -> None:
    out = frontier.run_bench(zk_hosts, items=600, site_hosts=60, partitions=16, wave=10)
    for key in ("owned", "partitioned"):
        assert out[key]["pages"] == 600, key
    assert "shared" not in out  # the per-item leases it measured are gone
    zk = {k: out[k]["zk"] for k in ("owned", "partitioned")}
    if all(zk.values()):  # mntr answered (the test server allows it)
        assert 0 < zk["partitioned"]["writes_per_page"] <= 0.1
        assert out["writes_per_page_owned_vs_partitioned"] > 0
    text = frontier.render(out)
    assert "partitioned" in text and "owned" in text
