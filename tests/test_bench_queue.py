"""``zkcrawl bench queue`` end to end at a small N: the report's shape, not timings; any
``--items`` works, ``--root`` is honoured and the run's node is gone afterwards -- also after
a real Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import wait_for
from zkcrawl.cli import main

CASES = ("seed_take", "kazoo_locking", "zkcrawl_alo", "zkcrawl_amo", "zkcrawl_alo_4proc",
         "offer_single", "offer_batched")


def test_bench_queue_json_has_every_case(zk_hosts, zk, zk_root, capsys, monkeypatch):
    monkeypatch.setattr("zkcrawl.bench.drain.SAMPLE", 20)
    status = main(["bench", "queue", "--zk", zk_hosts, "--root", zk_root, "--items", "400",
                   "--json"], {})
    assert status == 0
    out = json.loads(capsys.readouterr().out)
    for case in CASES:
        assert out[case]["items_per_s"] > 0, case
    for case in ("seed_take", "kazoo_locking", "zkcrawl_alo", "zkcrawl_amo"):
        assert {"ms_per_take_at_n", "ms_per_take_at_n_10",
                "wasted_requests_per_item"} <= set(out[case])
    assert out["zkcrawl_alo_4proc"]["items"] == 400
    assert out["zkcrawl_alo_4proc"]["left_in_queue"] == 0
    assert out["ratios"]["alo_vs_kazoo"] > 0 and out["ratios"]["amo_vs_alo"] > 0
    assert out["zkcrawl_alo"]["items"] == out["zkcrawl_amo"]["items"] == 400
    assert out["root"] == zk_root and zk.exists(zk_root) is None  # made by the run, removed


def test_bench_queue_with_fewer_items_than_the_sample(zk_hosts, zk, capsys):
    """--items 30 with the real SAMPLE (300): kazoo's get() on an emptied queue used to wait
    5 s per missing item (tens of minutes). The sample is never larger than the queue."""
    zk.ensure_path("/keep/other")  # a root that exists stays, and so does what it held
    status = main(["bench", "queue", "--zk", zk_hosts, "--root", "/keep", "--items", "30",
                   "--json"], {})
    out = json.loads(capsys.readouterr().out)
    assert status == 0
    assert out["seed_take"]["sampled_takes"] == 30 + 3
    assert out["kazoo_locking"]["sampled_takes"] == 30 + 3
    assert out["zkcrawl_alo_4proc"]["items"] == 30
    assert zk.get_children("/keep") == ["other"]
    zk.delete("/keep", recursive=True)


def test_bench_queue_removes_its_node_on_ctrl_c(zk_hosts, zk, zk_root):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "zkcrawl.cli", "bench", "queue", "--zk",
                             zk_hosts, "--root", zk_root, "--items", "20000", "--log-format",
                             "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        def items_queued() -> bool:  # a case is under way: nodes exist below the run node
            runs = zk.get_children(zk_root) if zk.exists(zk_root) else []
            return any(zk.get_children(f"{zk_root}/{r}") for r in runs)

        wait_for(items_queued, 60, "the bench to create its nodes")
        proc.send_signal(signal.SIGINT)
        try:
            _out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
            raise AssertionError(f"no exit 60 s after SIGINT; its last lines: {err[-3000:]}"
                                 ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1 and err.strip().endswith("zkcrawl: interrupted"), err
    assert "Traceback" not in err, err
    assert zk.exists(zk_root) is None


def test_bench_rejects_unknown_case(capsys):
    assert main(["bench", "nope"], {}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "invalid choice" in err[0]
