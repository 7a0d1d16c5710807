"""Per-host caps (zkcrawl.consumer.parking): no host holds back another inside a consumer.

Units on the decision, then a real consumer on a real ZooKeeper and a real HTTP server: a big
host's items queued ahead of a small host's must not keep the small host waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.httpd import TestServer
from tests.test_consumer_support import Running, left, offer, records, settings_for
from zkcrawl.consumer.parking import HORIZON_S, Parking


@dataclass
class T:
    name: str
    host: str


def test_the_cap_is_a_horizon_of_turns_bounded_by_a_quarter_of_the_table():
    assert Parking(lambda h: 0, 1.0, 48).cap == HORIZON_S  # two turns at a 1 s gap
    assert Parking(lambda h: 0, 0.1, 48).cap == 12  # a quarter of the table at most
    assert Parking(lambda h: 0, 0.1, 3).cap == 1  # never below one
    assert Parking(lambda h: 0, 0.0, 48).cap == 0  # no gap: no cap
    assert Parking(lambda h: 0, 1.0, 48, enabled=False).cap == 0  # at-most-once


def test_a_host_at_its_cap_or_another_consumers_is_parked():
    load = {"big": 1}
    p = Parking(lambda h: load.get(h, 0), 1.0, 48, foreign=lambda h: h == "theirs")  # cap 2
    keep, park = p.split([T("qn-1", "big"), T("qn-2", "big"), T("qn-3", "small"),
                          T("qn-4", ""), T("qn-5", "big"), T("qn-6", "theirs")])
    assert [t.name for t in keep] == ["qn-1", "qn-3", "qn-4"]  # the batch counts itself
    assert [t.name for t in park] == ["qn-2", "qn-5", "qn-6"]
    assert p.parked_total == 3
    keep, park = p.split([T("qn-2", "big")])  # given back before: its host has room now
    assert keep and not park and p.parked_total == 3


def test_a_big_host_queued_first_does_not_hold_back_a_small_one(zk, zk_hosts, zk_root,
                                                               tmp_path):
    delay = 0.2
    with TestServer({"/p/*": (200, {"Content-Type": "text/html"}, b"<title>t</title>")}) as srv:
        big = [srv.url(f"/p/big{i}") for i in range(20)]
        small = [srv.url(f"/p/small{i}", host="localhost") for i in range(4)]
        offer(zk, zk_root, big + small)  # every big-host item ahead of the small host's
        run = Running(settings_for(zk_hosts, zk_root, tmp_path / "o.jsonl", "--threads", "2",
                                   "--backlog", "2", "--domain-delay", str(delay),
                                   "--exit-when-idle", "1"))
        run.join(60)
        run.close()
        big_times, small_times = srv.times(host="127.0.0.1"), srv.times(host="localhost")
        gaps = srv.gaps(host="127.0.0.1") + srv.gaps(host="localhost")
    assert len(big_times) == 20 and len(small_times) == 4
    # Without the cap the table (4 places) fills with big-host items and the small host
    # starts after about 17 of them; with a cap of one per host they take turns.
    assert max(small_times) < big_times[8]
    assert min(gaps) >= delay  # the server saw no gap below the delay
    recs = records(tmp_path / "o.jsonl")
    assert sorted(r["url"] for r in recs) == sorted(big + small)  # each once
    assert left(zk, zk_root) == []
    assert run.error is None
