"""``--metrics-port``: Prometheus ``/metrics`` and a ``/healthz`` that really says 503, against
a ZooKeeper of its own that this test stops and restarts (SUSPENDED, then reconnected)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import wait_for
from tests.httpd import TestServer, delayed
from tests.test_consumer_support import Running, left, offer, records, settings_for
from zkcrawl.admin.localzk import ZkServer, free_port
from zkcrawl.consumer.metrics import MAX_REASONS, Metrics, outcome_label, reason_label
from zkcrawl.zk.client import ZkClient


def page(h):  # type: ignore[no-untyped-def]
    return 200, {"Content-Type": "text/html"}, f"<title>T{h.path}</title>".encode()


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def own_zk(tmp_path) -> Iterator[list[ZkServer]]:  # type: ignore[no-untyped-def]
    servers = [ZkServer(tmp_path / "zk").start(wait=60)]
    yield servers  # a list: the test replaces the server it restarts
    servers[-1].stop()


def test_metrics_and_healthz_follow_zookeeper_and_the_run_state(own_zk, tmp_path):
    zk_server = own_zk[0]
    port, out = free_port(), tmp_path / "o.jsonl"
    with TestServer({"/m/*": page, "/slow": delayed(2.0, page)}) as srv:
        zk = ZkClient(zk_server.hosts, zk_timeout=15).connect()
        offer(zk, "/m", [srv.url(f"/m/{i}") for i in range(10)])
        run = Running(settings_for(zk_server.hosts, "/m", out, "--metrics-port", str(port),
                                   "--metrics-host", "127.0.0.1", "--session-timeout", "20",
                                   "--threads", "2"))
        try:
            wait_for(lambda: len(records(out)) == 10, what="10 records")
            # Counted once durable, which may be a moment after the line is in the file.
            wait_for(lambda: 'zkcrawl_consumer_items_total{outcome="ok",reason=""} 10.0'
                     in get(port, "/metrics")[1], what="10 items counted")
            status, body = get(port, "/healthz")
            assert status == 200 and json.loads(body)["state"] == "running"
            status, text = get(port, "/metrics")
            assert status == 200
            for line in ('zkcrawl_consumer_items_total{outcome="ok",reason=""} 10.0',
                         "zkcrawl_consumer_dispatch_seconds_count 10.0",
                         "zkcrawl_consumer_queue_seconds_count 10.0",
                         "zkcrawl_consumer_process_seconds_count 10.0",
                         'zkcrawl_consumer_zookeeper_state{state="CONNECTED"} 1.0',
                         "zkcrawl_consumer_in_flight ", "zkcrawl_consumer_backlog ",
                         "zkcrawl_consumer_process_seconds_bucket{le=",
                         'zkcrawl_build_info{component="consumer",', "process_cpu_seconds_total",
                         "python_gc_collections_total", "python_info{",
                         "zkcrawl_consumer_ready 1.0"):
                assert line in text, line
            assert get(port, "/")[0] == 404  # not prometheus-client's "200 everywhere"
            assert "zkcrawl_consumer_politeness" not in text  # --domain-delay 0: none shared

            # ZooKeeper goes away with an item in flight: unhealthy, completion held.
            offer(zk, "/m", [srv.url("/slow")])
            srv.wait_for_requests(1, path="/slow", timeout=10)
            zk.close()
            zk_server.stop()
            wait_for(lambda: get(port, "/healthz")[0] == 503, what="503 while suspended")
            assert json.loads(get(port, "/healthz")[1])["zookeeper"] != "CONNECTED"
            text = get(port, "/metrics")[1]
            assert 'zookeeper_state{state="SUSPENDED"} 1.0' in text
            assert "zkcrawl_consumer_ready 0.0" in text  # what /readyz says, for alerts
            assert 'zookeeper_transitions_total{state="SUSPENDED"} 1.0' in text
            wait_for(lambda: len(records(out)) == 11, what="the slow record, written anyway")

            # Back within the session timeout: the held completion goes through.
            own_zk.append(ZkServer(tmp_path / "zk", port=zk_server.port).start(wait=60))
            wait_for(lambda: get(port, "/healthz")[0] == 200, timeout=30, what="healthy again")
            zk = ZkClient(zk_server.hosts, zk_timeout=15).connect()
            wait_for(lambda: zk.get_children("/m/queue") == [], timeout=20,
                     what="the held completion")
            wait_for(lambda: left(zk, "/m") == [], timeout=20, what="its batch settled")
        finally:
            run.stop()
            zk.close()
    assert run.worker.health()[0] is False and run.worker.state == "stopped"
    assert sorted(r["url"] for r in records(out)).count(srv.url("/slow")) == 1


# ------------------------------------------------------------ outcome and reason --
def samples(m: Metrics, name: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            if s.name == name:
                out[(s.labels["outcome"], s.labels["reason"])] = s.value
    return out


def test_items_are_counted_by_outcome_kind_apart_from_reason():
    m = Metrics()
    m.observe("complete", None, 5.0, 1.0, 2.0, 30.0)
    m.observe("complete", "http-404", 5.0, 1.0, 2.0, 30.0)
    m.observe("complete", "http-404", 5.0, 1.0, 2.0, 30.0)
    m.observe("retry", "timeout", 5.0, 1.0, 2.0, 30.0)
    m.observe("dead", "abandoned", -3.0, 1.0, 2.0, 30.0)  # a clock step: queue time 0
    m.observe("complete", "Some Exception: free text", 5.0, 1.0, 2.0, 30.0)
    m.observe("complete", None, 5.0, 1.0, 2.0, 30.0, skipped=True)
    assert samples(m, "zkcrawl_consumer_items_total") == {
        ("ok", ""): 1, ("failed", "http-404"): 2, ("retry", "timeout"): 1,
        ("dead", "abandoned"): 1, ("failed", "other"): 1, ("skipped", ""): 1}
    text = m.exposition().decode()
    assert "zkcrawl_consumer_process_seconds_count 7.0" in text
    assert "zkcrawl_consumer_queue_seconds_sum 0.03" in text  # 6 x 5 ms, the -3 as 0
    assert "fetch_seconds" not in text


@given(st.lists(st.one_of(st.none(), st.text(max_size=60),
                          st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True)),
                max_size=300))
def test_reason_labels_stay_bounded_whatever_the_errors(errors):
    known: set[str] = set()
    labels = {reason_label(e, known) for e in errors}
    assert len(labels) <= MAX_REASONS + 2  # the known ones, "" and "other"
    for error, lab in zip(errors, [reason_label(e, set(known)) for e in errors], strict=True):
        assert lab in ("", "other", error)
        assert lab == "" or (len(lab) <= 40 and lab.isascii() and lab.isprintable())
    assert outcome_label("complete", None) == "ok"
    assert outcome_label("complete", "x") == "failed"
    assert outcome_label("retry", "x") == "retry" and outcome_label("dead", None) == "dead"


def _histograms(m: Metrics) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, s.labels.get("le", "")): s.value
            for fam in text_string_to_metric_families(m.exposition().decode())
            if fam.name.startswith("zkcrawl_consumer_") and fam.name.endswith("_seconds")
            for s in fam.samples
            if not s.name.endswith("_created")}


@given(st.lists(st.tuples(*[st.one_of(st.floats(-1e3, 1e9, allow_nan=False),
                                      st.sampled_from([0.0, 0.1, 10.0, 25.0, 50.0, 100.0,
                                                       1000.0, 1e5, 1e8]))] * 4),
                max_size=40))
def test_the_timing_histograms_count_as_prometheus_observe_does(values):
    """Metrics.observe fills the buckets by bisection: exactly what Histogram.observe
    would (a value on a bucket's bound counts in that bucket, le="+Inf" takes the rest)."""
    fast, plain = Metrics(), Metrics()
    for q, d, w, p in values:
        fast.observe("complete", None, q, d, w, p)
        plain.queue.observe(max(0.0, q) / 1000.0)
        plain.dispatch.observe(d / 1000.0)
        plain.wait.observe(w / 1000.0)
        plain.process.observe(p / 1000.0)
    assert _histograms(fast) == _histograms(plain)
