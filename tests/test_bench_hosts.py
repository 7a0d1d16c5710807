"""``zkcrawl bench hosts`` / ``bench ensemble`` at a tiny size: the many-hosts site, one case's
books and report shape, and the decoders of ZooKeeper's counters. Timings are never asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st

from zkcrawl.bench import hosts as bh
from zkcrawl.bench.site import host_address, start_site, stop_benchsite


def test_the_site_answers_as_many_hosts_and_measures_gaps_per_host() -> None:
    proc, bases = start_site(latency_ms=1, articles=5, hosts=3)
    try:
        assert len({b.split("//")[1].split(":")[0] for b in bases}) == 3
        assert all(b.startswith("http://127.77.0.") for b in bases)
        for base in bases:
            for n in (1, 2):
                assert requests.get(f"{base}/a/{n}.html", timeout=5).status_code == 200
        requests.get(f"{bases[0]}/a/3.html", timeout=5)
        stats = requests.get(f"{bases[1]}/stats", timeout=5).json()
    finally:
        assert stop_benchsite(proc) == 0
    assert stats["hosts"] == 3 and stats["requests"] == 7
    assert stats["host_requests"] == {bases[0]: 3, bases[1]: 2, bases[2]: 2}
    assert all(gap is not None and gap > 0 for gap in stats["host_min_gap_s"].values())
    assert stats["first_request_at"] <= stats["last_request_at"]


def test_host_addresses_are_distinct_loopback_addresses() -> None:
    addresses = [host_address(i) for i in range(600)]
    assert len(set(addresses)) == 600
    assert all(a.startswith("127.77.") and not a.endswith(".0") for a in addresses)
    with pytest.raises(ValueError):
        host_address(-1)


def test_one_case_keeps_the_books(zk_hosts: str, tmp_path: Path) -> None:
    out = bh.case(zk_hosts, hosts=3, per_host=2, procs=2, threads=2, latency_ms=5, delay=0.2,
                  tmp=tmp_path)
    # every offered URL has exactly one record, none failed, both consumers exited cleanly
    assert out["pages"] == out["expected"] == out["unique_urls"] == 6
    assert out["server_requests"] == 6 and out["errors"] == 0 and out["exit_codes"] == [0, 0]
    # the gap as the server saw it: every host has one owner, which keeps its gap
    assert out["min_gap_s"] is not None and out["min_gap_s"] >= 0.2 - 0.002
    assert out["hosts_below_delay"] == 0
    # first to last page; an exited consumer still counts. >= 0: a run this small can fit
    # between two samples (psutil's CPU times move in clock ticks)
    assert out["cpu_ms_per_page"] is not None and out["cpu_ms_per_page"] >= 0
    assert out["pct_attainable"] > 0 and out["attainable_pages_per_s"] > 0
    assert "politeness_stats" not in out  # owners write nothing per request
    zk = out["zk"]  # the standalone test server answers mntr on loopback
    assert zk is not None and zk["writes_per_page"] > 0 and zk["requests_per_page"] > 0


def test_a_host_in_its_gap_takes_no_place_in_the_consumers_table(zk_hosts: str,
                                                                 tmp_path: Path) -> None:
    """A consumer with a table of 4 places (2 threads, --backlog 2) and 6 hosts at a 1 s
    gap: a host's next item stays in ZooKeeper until its turn is near (READY_AHEAD_S), so
    no item waits in the consumer for its host's gap -- before, each host's next item was
    taken as soon as the last one ended and held a place for the whole second (polite_ms
    ~950 for every page but a host's first, and 4 places served ~4 pages a second)."""
    out = bh.case(zk_hosts, hosts=6, per_host=3, procs=1, threads=2, latency_ms=5, delay=1.0,
                  tmp=tmp_path, backlog=2)
    assert out["pages"] == out["expected"] == out["unique_urls"] == 18
    assert out["errors"] == 0 and out["exit_codes"] == [0]
    assert out["hosts_below_delay"] == 0 and out["min_gap_s"] >= 1.0 - 0.002
    # READY_AHEAD_S is 100 ms: a page waits at most that for its turn, plus a claim round
    # (ROOM_S) and a busy machine's delays -- far from the gap it waited before.
    assert out["polite_ms_p90"] < 400, out
    # a fresh root: every partition's first owner ever, so each host's first page waits for
    # no hand-over (it waited a gap, ~1 s, before)
    assert out["polite_ms_first_p90"] < 400, out


@pytest.mark.slow
def test_run_bench_reports_every_case(zk_hosts: str) -> None:
    out = bh.run_bench(zk_hosts, hosts=4, per_host=2, threads=2, latency_ms=5, delay=0.1,
                       contention_pages=10)
    for key in ("owner_1", "owner_4", "contention"):
        assert out[key]["pages"] == out[key]["expected"], key
        assert out[key]["errors"] == 0 and set(out[key]["exit_codes"]) == {0}, key
    assert set(out) >= {"owner_1", "owner_4", "contention"}
    assert not {"local_1", "cluster_1", "cluster_4", "local_4"} & set(out)  # one mode now
    assert set(out["ratios"]) == {"owner_1_vs_attainable", "owner_4_vs_attainable",
                                  "owner_4_vs_owner_1", "contention_vs_hosts_per_delay"}
    assert "contention" in bh.render(out)


@pytest.mark.slow
@pytest.mark.ensemble
def test_ensemble_bench_drains_every_item() -> None:
    out = bh.run_ensemble(n=300, procs=(1, 2))
    for key in ("alo_1proc", "alo_2proc"):
        c = out[key]
        assert c["items"] == 300 and c["left_in_queue"] == 0, key
        assert c["proposals_per_item"] > 0 and c["zk_cpu_s"] > 0, key
    assert "alo_2proc" in bh.render_ensemble(out)


def test_mntr_parsing() -> None:
    text = "zk_version\t3.8.0\nzk_packets_received\t12\nzk_cnt_updatelatency\t3\nzk_x\tnan\n"
    assert bh.parse_mntr(text) == {"zk_packets_received": 12.0, "zk_cnt_updatelatency": 3.0}
    assert bh.zk_ports("127.0.0.1:2181,zk2:2181,localhost:7/chroot") == [2181, 7]
    before = {"requests": 10.0, "reads": 4.0, "writes": 2.0, "proposals": 0.0}
    after = {"requests": 30.0, "reads": 8.0, "writes": 12.0, "proposals": 0.0}
    assert bh.per_page(before, after, 10) == {"requests_per_page": 2.0,
                                              "reads_per_page": 0.4, "writes_per_page": 1.0}
    assert bh.per_page(None, after, 10) is None and bh.per_page(before, after, 0) is None


@given(st.text())
def test_a_hostile_mntr_reply_never_raises(text: str) -> None:
    parsed = bh.parse_mntr(text)
    assert all(k.startswith("zk_") and v == v for k, v in parsed.items())


@given(st.text())
def test_any_connect_string_gives_ports_or_nothing(hosts: str) -> None:
    assert all(isinstance(p, int) for p in bh.zk_ports(hosts))
