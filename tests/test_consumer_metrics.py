"""``--metrics-port``: Prometheus ``/metrics`` and a ``/healthz`` that really says 503, against
a ZooKeeper of its own that this test stops and restarts (SUSPENDED, then reconnected)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.conftest import wait_for
from tests.httpd import TestServer, delayed
from tests.test_consumer_support import Running, offer, records, settings_for
from zkcrawl.admin.localzk import ZkServer, free_port
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
            status, body = get(port, "/healthz")
            assert status == 200 and json.loads(body)["state"] == "running"
            status, text = get(port, "/metrics")
            assert status == 200
            for line in ('zkcrawl_consumer_items_total{outcome="ok"} 10.0',
                         "zkcrawl_consumer_dispatch_seconds_count 10.0",
                         'zkcrawl_consumer_zookeeper_state{state="CONNECTED"} 1.0',
                         "zkcrawl_consumer_in_flight ", "zkcrawl_consumer_backlog ",
                         "zkcrawl_consumer_fetch_seconds_bucket{le="):
                assert line in text, line
            assert get(port, "/")[0] == 404  # not prometheus-client's "200 everywhere"

            # ZooKeeper goes away with an item in flight: unhealthy, completion held.
            offer(zk, "/m", [srv.url("/slow")])
            srv.wait_for_requests(1, path="/slow", timeout=10)
            zk.close()
            zk_server.stop()
            wait_for(lambda: get(port, "/healthz")[0] == 503, what="503 while suspended")
            assert json.loads(get(port, "/healthz")[1])["zookeeper"] != "CONNECTED"
            assert 'zookeeper_state{state="SUSPENDED"} 1.0' in get(port, "/metrics")[1]
            wait_for(lambda: len(records(out)) == 11, what="the slow record, written anyway")

            # Back within the session timeout: the held completion goes through.
            own_zk.append(ZkServer(tmp_path / "zk", port=zk_server.port).start(wait=60))
            wait_for(lambda: get(port, "/healthz")[0] == 200, timeout=30, what="healthy again")
            zk = ZkClient(zk_server.hosts, zk_timeout=15).connect()
            wait_for(lambda: zk.get_children("/m/queue") == [], timeout=20,
                     what="the held completion")
            assert zk.get_children("/m/leases") == []
        finally:
            run.stop()
            zk.close()
    assert run.worker.health()[0] is False and run.worker.state == "stopped"
    assert sorted(r["url"] for r in records(out)).count(srv.url("/slow")) == 1
