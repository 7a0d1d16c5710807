"""Issue #26, item 1: forgetting ``--allow-private-addresses`` is loud and undoable -- real
consumer processes, a real ZooKeeper, a real HTTP server on 127.0.0.1, the real
``zkcrawl dead requeue``: one warning per host naming the flag, the items in the dead letters
(not completed), a verdict that leads with the failure, and a requeue that undoes it all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.httpd import TestServer, html
from tests.test_consumer_support import ROOT, offer, records, spawn
from zkcrawl.admin.cluster import list_dead
from zkcrawl.verdict import Stages, judge

pytestmark = pytest.mark.slow


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]


def consumer(zk_hosts: str, zk_root: str, out: Path, err: Path, *extra: str) -> int:
    proc = spawn(["--zk", zk_hosts, "--root", zk_root, "--out", str(out), "--log-format",
                  "json", "--exit-when-idle", "1", "--session-timeout", "4",
                  "--domain-delay", "0", "--stats-interval", "0.5", *extra], err)
    return proc.wait(60)


def test_blocked_address_is_a_dead_letter_a_warning_and_requeue_undoes_it(
        zk, zk_hosts, zk_root, tmp_path):
    with TestServer({"/p/*": html("<title>mine</title>")}) as srv:
        urls = [srv.url(f"/p/{i}") for i in range(4)]
        offer(zk, zk_root, urls)
        out, err = tmp_path / "first.jsonl", tmp_path / "first.log"
        assert consumer(zk_hosts, zk_root, out, err) == 0  # robots on: its fetch is refused too
        evs = events(err)
        warnings = [e for e in evs if e["event"] == "address.blocked"]
        assert len(warnings) == 1, warnings  # one per host, not one per item
        assert warnings[0]["level"] == "warning"
        assert "--allow-private-addresses" in warnings[0]["note"]
        assert "zkcrawl dead requeue --error blocked-address" in warnings[0]["note"]
        assert {r["error"] for r in records(out)} == {"blocked-address"}
        dead = list_dead(zk, zk_root)
        assert sorted(d.url or "" for d in dead) == sorted(urls)
        assert {d.error for d in dead} == {"blocked-address"}
        [summary] = [e for e in evs if e["event"] == "consumer.summary"]
        assert summary["verdict"].startswith("100 % of items failed: blocked-address")
        assert summary["failing"] == "blocked-address"
        assert summary["errors"] == {"blocked-address": 4}
        stats = [e for e in evs if e["event"] == "consumer.stats" and e["failures"]]
        assert stats and all(e["verdict"].startswith("100 % of items failed: blocked-address")
                             for e in stats)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        rep = subprocess.run([sys.executable, "-m", "zkcrawl.cli", "report", str(out)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                             check=False)
        assert rep.returncode == 0, rep.stderr
        assert "Pace: 100 % of items failed: blocked-address -- " in rep.stdout, rep.stdout
        # The undo: requeue those dead letters, run the consumer as it should have been.
        done = subprocess.run(
            [sys.executable, "-m", "zkcrawl.cli", "dead", "requeue", "--error",
             "blocked-address", "--zk", zk_hosts, "--root", zk_root],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert list_dead(zk, zk_root) == []
        out2, err2 = tmp_path / "second.jsonl", tmp_path / "second.log"
        assert consumer(zk_hosts, zk_root, out2, err2, "--allow-private-addresses") == 0
    again = records(out2)
    assert sorted(r["url"] for r in again) == sorted(urls)
    assert {r["error"] for r in again} == {None} and {r["title"] for r in again} == {"mine"}
    assert not [e for e in events(err2) if e["event"] == "address.blocked"]


def test_the_verdict_leads_with_a_reason_most_items_failed_with():
    st = Stages(items=10, fetch=5.0, write=100.0)
    assert judge(st).text.startswith("the sink sets the pace")  # the "faster disk"
    failing = judge(Stages(items=10, fetch=5.0, write=100.0,
                           failures=(("blocked-address", 10),)))
    assert failing.failure == "blocked-address"
    assert failing.text.startswith("100 % of items failed: blocked-address -- ")
    assert "--allow-private-addresses" in failing.text
    assert failing.text.index("blocked-address") < failing.text.index("sink sets the pace")
    # Half or fewer: no lead; the largest reason among several leads when it is a majority.
    assert judge(Stages(items=10, fetch=5.0, failures=(("http-404", 5),))).failure is None
    mixed = judge(Stages(items=4, fetch=5.0, failures=(("timeout", 1), ("http-404", 3)),
                         finals=4))
    assert mixed.text.startswith("75 % of items failed: http-404")


def test_zkcrawl_try_says_a_blocked_address_is_dead_lettered(tmp_path):
    with TestServer({"/a": html("<title>mine</title>")}) as srv:
        done = subprocess.run([sys.executable, "-m", "zkcrawl.cli", "try", srv.url("/a")],
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True, timeout=60, check=False)
    assert "--allow-private-addresses to fetch it" in done.stdout, done.stdout
    assert ("would record the failure at once: error blocked-address; and dead-letter it "
            "(`zkcrawl dead requeue --error blocked-address` undoes it)") in done.stdout
