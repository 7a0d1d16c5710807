"""``zkcrawl bench queue`` end to end at a small N: the report's shape, not timings."""

from __future__ import annotations

import json

from zkcrawl.cli import main

CASES = ("seed_take", "kazoo_locking", "zkcrawl_alo", "zkcrawl_alo_uncounted", "zkcrawl_amo",
         "zkcrawl_alo_4proc", "offer_single", "offer_batched")


def test_bench_queue_json_has_every_case(zk_hosts, capsys, monkeypatch):
    monkeypatch.setattr("zkcrawl.bench.drain.SAMPLE", 20)
    status = main(["bench", "queue", "--zk", zk_hosts, "--items", "400", "--json"], {})
    assert status == 0
    out = json.loads(capsys.readouterr().out)
    for case in CASES:
        assert out[case]["items_per_s"] > 0, case
    for case in ("seed_take", "kazoo_locking", "zkcrawl_alo", "zkcrawl_amo"):
        assert {"ms_per_take_at_n", "ms_per_take_at_n_10",
                "wasted_requests_per_item"} <= set(out[case])
    assert out["zkcrawl_alo_4proc"]["items"] == 400
    assert out["zkcrawl_alo_4proc"]["left_in_queue"] == 0
    assert out["ratios"]["alo_counted_vs_uncounted"] > 0


def test_bench_rejects_unknown_case(capsys):
    assert main(["bench", "nope"], {}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "invalid choice" in err[0]
