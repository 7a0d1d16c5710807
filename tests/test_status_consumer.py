"""``zkcrawl status --consumer ID`` against a real consumer process, and the stale marker.

The consumer (one thread, a backlog of 3) fetches from a page that does not answer, so it
holds four leases -- one fetching, three waiting -- while the view is read; then SIGTERM, and
the books: every offered item still queued (released, nothing lost), no lease left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.httpd import TestServer, delayed, html
from tests.queue_view import held, queued_urls
from zkcrawl.cli import main
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.queue.partition_offers import recorded_partitions
from zkcrawl.queue.partition_queue import PartitionQueue

REPO = Path(__file__).resolve().parent.parent


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv), {})
    out, err = capsys.readouterr()
    return int(rc), out, err


def test_status_of_one_real_consumer(zk, zk_hosts, zk_root, tmp_path, capsys):
    common = ["--zk", zk_hosts, "--root", zk_root, "--log-format", "json"]
    with TestServer({"/slow/*": delayed(60, html("<title>late</title>"))}) as site:
        urls = [site.url(f"/slow/{i}") for i in range(4)]
        PartitionQueue(zk, zk_root, recorded_partitions(zk, zk_root)).offer(
            [Item(url=u) for u in urls])
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env = {k: v for k, v in env.items() if not k.startswith("ZKCRAWL_")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "zkcrawl.consumer.main", *common, "--id", "watched", "--threads",
             "1", "--backlog", "3", "--allow-private-addresses", "--no-robots",
             "--domain-delay", "0", "--grace", "0.5", "--out", str(tmp_path / "out.jsonl")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            def holding() -> dict | None:
                rc, out, _ = run(capsys, "status", "--consumer", "watched", "--json", *common)
                doc = json.loads(out) if rc == 0 else None
                c = doc and doc["consumer"]
                ready = c and 1 <= len(doc["leases"]) <= 3 and c["in_flight"] == 1 \
                    and c["waiting"] == 3
                return doc if ready else None

            doc = wait_for(holding, 30, "the consumer to hold 4 leases")
            c = doc["consumer"]
            assert doc["registered"] and c["id"] == "watched" and c["stale"] is False
            assert c["heartbeat_interval_s"] == 2.0 and c["heartbeat_age_s"] < 6
            # Started = marked in ZooKeeper: the one fetching, and at most two marked ahead
            # per pool thread; the other items wait in its backlog, unmarked.
            started = sorted(x["url"] for x in doc["leases"])
            assert set(started) <= set(urls)
            ages = [x["age_s"] for x in doc["leases"]]
            assert ages == sorted(ages, reverse=True) and all(a >= 0 for a in ages)
            # Held = marked started in its partition's batch (no lease nodes): one host,
            # one owner, so one partition holds the four.
            assert len({x["item"].split("/")[0] for x in doc["leases"]}) == 1
            assert sorted(held(zk, zk_root)) == started
            host = urls[0].split("/")[2]
            assert [(h["host"], h["leased_items"]) for h in doc["hosts"]] == [(host,
                                                                               len(started))]

            rc, out, _ = run(capsys, "status", "--consumer", "watched", *common)
            assert rc == 0
            assert (f"leases    {len(started)} started (marked in ZooKeeper); it holds 1 "
                    "fetching now, 3 waiting in its backlog") in out
            assert "heartbeat" in out and "STALE" not in out
            assert sum(1 for line in out.splitlines()
                       if line.split("/", 1)[0].isdigit() and "/qn-" in line) == len(started)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                _, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert proc.returncode == 0, err
    assert sorted(queued_urls(zk, zk_root)) == sorted(urls)  # released, not lost
    assert held(zk, zk_root) == []  # and unmarked: the next owner charges no death


def test_unknown_consumer_is_one_line_exit_1(zk, zk_hosts, zk_root, capsys):
    zk.ensure_path(Layout.of(zk_root).consumers)
    rc, out, err = run(capsys, "status", "--consumer", "nobody", "--zk", zk_hosts, "--root",
                       zk_root)
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert "no consumer 'nobody'" in err and "(live: none)" in err


def test_a_consumer_without_heartbeat_for_three_intervals_is_stale(zk, zk_hosts, zk_root,
                                                                   capsys):
    layout = Layout.of(zk_root)
    zk.ensure_path(layout.consumers)
    frozen = {"id": "frozen", "state": "running", "heartbeat_at": time.time() - 7,
              "heartbeat_interval_s": 2.0, "processed": 3, "failed": 0}
    fresh = {**frozen, "id": "fresh", "heartbeat_at": time.time()}
    for doc in (frozen, fresh):
        zk.create(layout.consumer(doc["id"]), json.dumps(doc).encode(), ephemeral=True)
    rc, out, _ = run(capsys, "status", "--json", "--zk", zk_hosts, "--root", zk_root)
    stale = {c["id"]: c["stale"] for c in json.loads(out)["consumers"]}
    assert rc == 0 and stale == {"fresh": False, "frozen": True}
    rc, out, _ = run(capsys, "status", "--zk", zk_hosts, "--root", zk_root)
    row = next(line for line in out.splitlines() if line.startswith("frozen"))
    assert "STALE" in row and "STALE: no heartbeat for 3 intervals" in out
    assert "STALE" not in next(line for line in out.splitlines() if line.startswith("fresh"))
    rc, out, _ = run(capsys, "status", "--consumer", "frozen", "--zk", zk_hosts, "--root",
                     zk_root)
    assert rc == 0 and "STALE: older than 3 x 2 s" in out
