"""The admin CLI (`zkcrawl status/pause/resume/dead/queue/report`) in-process, against a real
ZooKeeper, with real registration nodes, leases and dead letters made by the real recipes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import old_layout
from tests.conftest import wait_for
from tests.owned import claim, owned_queue
from zkcrawl.admin.localzk import free_port
from zkcrawl.cli import main
from zkcrawl.errors import ExitStatus
from zkcrawl.queue.control import ControlWatch, read_state
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.queue.registry import Registration


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv), {})
    out, err = capsys.readouterr()
    return int(rc), out, err


def common(hosts: str, root: str) -> list[str]:
    return ["--zk", hosts, "--root", root, "--zk-timeout", "5", "--log-format", "json"]


_REGS: list[Registration] = []


@pytest.fixture(autouse=True)
def stop_registrations(zk_factory):
    """Stop every status node's refresh thread before its client closes (zk_factory)."""
    yield
    while _REGS:
        _REGS.pop().stop(delete=False)


def start(reg: Registration) -> Registration:
    _REGS.append(reg.start())
    return reg


def register(zk, root: str, cid: str, status: dict) -> Registration:
    return start(Registration(zk, f"{root}/consumers/{cid}", lambda: dict(status), interval=5))


class ControlledStatus:
    """What a consumer does for the control node: a ControlWatch whose changes republish
    the status node at once (the real registry and control recipes, no consumer loop)."""

    def __init__(self, zk, root: str, cid: str) -> None:
        self.cid = cid
        self.reg: Registration | None = None
        self.watch = ControlWatch(zk, root, on_change=lambda _s: self.reg and self.reg.refresh())
        self.reg = start(Registration(zk, f"{root}/consumers/{cid}", self.status, interval=5))

    def status(self) -> dict:
        paused = self.watch.paused
        return {"id": self.cid, "state": "paused" if paused else "running",
                "control": self.watch.state, "processed": 0, "failed": 0, "in_flight": 0,
                "items_per_s": 0.0}


def test_status_json_has_every_documented_field(zk_factory, zk_hosts, zk_root, capsys):
    worker, other = zk_factory(), zk_factory()
    IngressQueue(worker, zk_root).offer_many(
        [Item(url=f"http://127.0.0.1/a/{i}", producer="p1") for i in range(6)])
    first, *held = old_layout.oldest(worker, zk_root, 3)
    old_layout.hold(worker, zk_root, held, "c1")  # a root of the previous layout
    old_layout.dead_letter(worker, zk_root, first, "http-503")
    register(worker, zk_root, "c1", {"id": "c1", "pid": 42, "state": "running", "processed": 7,
                                     "failed": 1, "in_flight": 2, "backlog": 0,
                                     "items_per_s": 3.5, "control": "running"})
    start(Registration(other, f"{zk_root}/producers/p1",
                       lambda: {"id": "p1", "state": "listing", "pages": 3, "offered": 6},
                       interval=5))
    time.sleep(0.3)  # let the oldest item age measurably (oldest_age_s is a real age)

    rc, out, err = run(capsys, "status", "--json", *common(zk_hosts, zk_root))
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["control"] == "running"
    assert doc["queue"]["depth"] == 5  # 6 offered, 1 dead-lettered
    assert doc["queue"]["claimable"] == 3
    assert doc["queue"]["oldest_age_s"] >= 0.3
    assert doc["leases"] == {"count": 2, "fetching": 2, "waiting": 0, "by_consumer": {"c1": 2}}
    assert doc["dead"] == {"count": 1}
    [c] = doc["consumers"]
    assert {k: c[k] for k in ("id", "pid", "state", "processed", "ok", "failed", "in_flight",
                              "waiting", "items_per_s", "leases", "acknowledged", "stale",
                              "heartbeat_interval_s")} == {
        "id": "c1", "pid": 42, "state": "running", "processed": 7, "ok": 6, "failed": 1,
        "in_flight": 2, "waiting": 0, "items_per_s": 3.5, "leases": 2, "acknowledged": True,
        "stale": False, "heartbeat_interval_s": 5}
    assert c["host"] and 0 <= c["heartbeat_age_s"] < 5
    [p] = doc["producers"]
    assert p["id"] == "p1" and p["offered"] == 6 and p["state"] == "listing"
    assert doc["control_pending"] == []

    rc, out, _ = run(capsys, "status", *common(zk_hosts, zk_root))
    assert rc == 0
    assert "5 items, 3 claimable" in out and "CONSUMER" in out and "p1" in out
    assert "1 dead letters" in out
    assert "leases    2 held: 2 fetching now, 0 waiting in consumer backlogs" in out
    head = next(line for line in out.splitlines() if line.startswith("CONSUMER"))
    assert head.split() == ["CONSUMER", "HOST", "STATE", "OK", "FAILED", "LEASES", "FETCHING",
                            "WAITING", "ITEMS/S", "HEARTBEAT", "ACK"]
    row = next(line for line in out.splitlines() if line.startswith("c1 ")).split()
    assert row[3:8] == ["6", "1", "2", "2", "0"]  # ok and failed apart


def test_stale_host_nodes_of_the_previous_layout_are_counted_not_read(zk, zk_hosts, zk_root,
                                                                       capsys):
    """``<root>/hosts`` nodes left by cluster politeness (before hosts had owners) are
    ignored: counted once on the status (one line), their data -- garbage here -- never
    read; no such line on a root without them."""
    rc, out, _ = run(capsys, "status", *common(zk_hosts, zk_root))
    assert rc == 0 and "/hosts from before" not in out
    for name, data in (("busy.example%3A80", b"1e300"), ("x", b"\xff\xfe not a time")):
        zk.create(f"{zk_root}/hosts/{name}", data, makepath=True)
    rc, out, err = run(capsys, "status", "--json", *common(zk_hosts, zk_root))
    assert rc == 0 and json.loads(out)["stale_hosts"] == 2 and "hosts" not in json.loads(out)
    assert "malformed" not in err
    rc, out, _ = run(capsys, "status", *common(zk_hosts, zk_root))
    lines = [ln for ln in out.splitlines() if "/hosts from before" in ln]
    assert rc == 0 and lines == [f"stale     2 nodes under {zk_root}/hosts from before hosts "
                                 "had owners: ignored (safe to delete)"]


def test_status_of_an_empty_root_and_orphan_leases(zk_factory, zk_hosts, zk_root, capsys):
    rc, out, _ = run(capsys, "status", "--json", *common(zk_hosts, zk_root))
    doc = json.loads(out)
    assert rc == 0 and doc["exists"] is False and doc["queue"]["depth"] == 0
    assert doc["queue"]["oldest_age_s"] is None and doc["consumers"] == []
    ghost = zk_factory()
    IngressQueue(ghost, zk_root).offer("http://127.0.0.1/x")
    old_layout.hold(ghost, zk_root, old_layout.oldest(ghost, zk_root, 1), "ghost")  # unregistered
    rc, out, _ = run(capsys, "status", *common(zk_hosts, zk_root))
    assert "leases held by unregistered clients: ghost=1" in out


def test_status_watch_refreshes_until_ctrl_c(zk_hosts, zk_root):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "zkcrawl.cli", "status", "--json",
                             "--watch", "0.2", *common(zk_hosts, zk_root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]  # three refreshes
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert all(json.loads(x)["root"] == zk_root for x in lines)
    assert rc == 0, proc.stderr.read()


def test_pause_and_resume_are_acknowledged(zk_factory, zk_hosts, zk_root, capsys):
    consumers = [ControlledStatus(zk_factory(), zk_root, f"c{i}") for i in (1, 2)]
    rc, out, err = run(capsys, "pause", "--wait", "10", *common(zk_hosts, zk_root))
    assert rc == 0, err
    assert "every live consumer acknowledged paused" in out
    assert read_state(zk_factory(), zk_root) == "paused"
    assert all(c.watch.paused for c in consumers)
    rc, out, _ = run(capsys, "status", "--json", *common(zk_hosts, zk_root))
    doc = json.loads(out)
    assert doc["control"] == "paused"
    assert [(c["id"], c["state"], c["acknowledged"]) for c in doc["consumers"]] == [
        ("c1", "paused", True), ("c2", "paused", True)]

    rc, out, _ = run(capsys, "resume", *common(zk_hosts, zk_root))  # returns once written
    assert rc == 0 and f"{zk_root}/control: running" in out
    wait_for(lambda: not any(c.watch.paused for c in consumers), 10, "consumers resumed")
    rc, out, _ = run(capsys, "resume", "--wait", "10", *common(zk_hosts, zk_root))
    assert rc == 0 and "acknowledged running" in out


def test_pause_wait_names_the_consumer_that_did_not_acknowledge(zk_factory, zk_hosts, zk_root,
                                                                capsys):
    ControlledStatus(zk_factory(), zk_root, "good")
    register(zk_factory(), zk_root, "stuck", {"id": "stuck", "state": "running",
                                              "control": "running"})
    rc, out, err = run(capsys, "pause", "--wait", "1", *common(zk_hosts, zk_root))
    assert rc == ExitStatus.FAILURE
    assert err == "zkcrawl pause: error: paused not acknowledged within 1s by: stuck\n", err
    assert "not acknowledged" not in out
    rc, out, _ = run(capsys, "status", *common(zk_hosts, zk_root))
    assert "waiting for 1: stuck" in out


@pytest.fixture
def dead_letters(zk, zk_root) -> dict[str, str]:
    """Three dead letters: url -> id, plus the malformed item under key 'malformed'."""
    IngressQueue(zk, zk_root).offer_many(
        [Item(url="http://127.0.0.1/a", attempt=2, producer="p9", meta={"k": "v"}),
         Item(url="http://127.0.0.1/b", attempt=2)])
    zk.create(f"{zk_root}/queue/qn-", b"\xff not an item", sequence=True)
    for name in old_layout.oldest(zk, zk_root, 3):
        old_layout.dead_letter(zk, zk_root, name, "http-503")
    names = sorted(zk.get_children(f"{zk_root}/dead"))
    by = {}
    for n in names:
        doc = json.loads(zk.get(f"{zk_root}/dead/{n}")[0])
        by[doc["url"] or "malformed"] = n
    return by


def test_dead_list_requeue_and_purge(zk, zk_hosts, zk_root, dead_letters, capsys):
    args = common(zk_hosts, zk_root)
    rc, out, _ = run(capsys, "dead", "list", "--json", *args)
    listed = {d["id"]: d for d in json.loads(out)}
    assert rc == 0 and set(listed) == set(dead_letters.values())
    a = listed[dead_letters["http://127.0.0.1/a"]]
    assert a["attempts"] == 3 and a["error"] == "http-503"
    rc, out, _ = run(capsys, "dead", "list", *args)
    assert "3 dead letter(s)" in out and "(none: malformed item)" in out

    number = str(int(dead_letters["http://127.0.0.1/a"].removeprefix("dl-")))
    rc, out, err = run(capsys, "dead", "requeue", number, *args)  # "7" means dl-0000000007
    assert rc == 0, err
    [name] = zk.get_children(f"{zk_root}/queue")
    item = json.loads(zk.get(f"{zk_root}/queue/{name}")[0])
    assert item["url"] == "http://127.0.0.1/a" and item["attempt"] == 0
    assert item["producer"] == "p9" and item["meta"]["k"] == "v"
    assert item["meta"]["requeued_from"] == dead_letters["http://127.0.0.1/a"]
    assert item["meta"]["last_error"] == "http-503"
    assert len(zk.get_children(f"{zk_root}/dead")) == 2
    with owned_queue(zk, zk_root, "c2") as q:  # a consumer takes it again
        claimed = claim(q, 1)
    assert [c.url for c in claimed] == ["http://127.0.0.1/a"] and claimed[0].attempt == 0

    rc, out, err = run(capsys, "dead", "requeue", "--all", *args)
    assert rc == ExitStatus.FAILURE  # the malformed one cannot be requeued: said, not dropped
    assert "no URL" in err and "1 requeued, 1 skipped" in out
    assert zk.get_children(f"{zk_root}/dead") == [dead_letters["malformed"]]


def test_dead_purge_refuses_without_yes(zk, zk_hosts, zk_root, dead_letters, capsys):
    args = common(zk_hosts, zk_root)
    rc, out, err = run(capsys, "dead", "purge", "--all", *args)
    assert rc == ExitStatus.USAGE and out == ""
    assert len(err.strip().splitlines()) == 1 and "--yes" in err
    assert len(zk.get_children(f"{zk_root}/dead")) == 3
    one = dead_letters["http://127.0.0.1/b"]
    rc, out, _ = run(capsys, "dead", "purge", one, "--yes", *args)
    assert rc == 0 and f"{one} purged" in out
    assert one not in zk.get_children(f"{zk_root}/dead")
    rc, _, _ = run(capsys, "dead", "purge", "--all", "--yes", *args)
    assert rc == 0 and zk.get_children(f"{zk_root}/dead") == []


@pytest.mark.parametrize("argv, needle", [
    (["dead", "requeue"], "--all"),
    (["dead", "requeue", "dl-0000009999"], "no such dead letter"),
    (["dead", "requeue", "bogus"], "not a dead-letter id"),
    (["dead", "requeue", "1", "--all"], "--all"),
    (["dead", "list", "--yes"], "takes no"),
])
def test_dead_bad_usage_is_one_line_exit_2(zk_hosts, zk_root, dead_letters, capsys, argv,
                                           needle):
    rc, _, err = run(capsys, *argv, *common(zk_hosts, zk_root))
    assert rc == ExitStatus.USAGE
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_queue_list_and_purge(zk_factory, zk_hosts, zk_root, capsys):
    zk = zk_factory()
    IngressQueue(zk, zk_root).offer_many([Item(url=f"http://127.0.0.1/q/{i}") for i in range(10)])
    old_layout.hold(zk, zk_root, old_layout.oldest(zk, zk_root, 1), "holder")
    args = common(zk_hosts, zk_root)
    rc, out, _ = run(capsys, "queue", "list", "--limit", "3", "--json", *args)
    rows = json.loads(out)
    assert [r["url"] for r in rows] == [f"http://127.0.0.1/q/{i}" for i in range(3)]
    assert rows[0]["leased_by"] == "holder" and rows[1]["leased_by"] is None

    rc, out, err = run(capsys, "queue", "purge", *args)
    assert rc == ExitStatus.USAGE and len(err.strip().splitlines()) == 1 and "--yes" in err
    assert len(zk.get_children(f"{zk_root}/queue")) == 10
    rc, out, _ = run(capsys, "queue", "purge", "--yes", *args)
    assert rc == 0 and "purged 10 item(s)" in out and "1 were leased" in out
    assert zk.get_children(f"{zk_root}/queue") == []


@pytest.mark.parametrize("argv", [["status"], ["pause"], ["resume"], ["dead", "list"],
                                  ["queue", "list"]])
def test_unreachable_zookeeper_is_one_line_exit_75(capsys, argv):
    port = free_port()  # bound then closed: nothing listens there
    rc, out, err = run(capsys, *argv, "--zk", f"127.0.0.1:{port}", "--zk-timeout", "1")
    assert rc == ExitStatus.TEMPFAIL == 75  # EX_TEMPFAIL: a supervisor may restart it
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "cannot reach ZooKeeper" in lines[0], err
    assert out == ""


RECORDS = [
    {"url": "http://a.test/1", "final_url": "http://a.test/1", "status": 200, "title": "One",
     "fields": {}, "bytes": 100, "item": "qn-0000000001", "attempt": 0, "consumer": "c1",
     "fetched_at": "2024-03-01T10:00:00.000Z", "queue_ms": 50.0, "dispatch_ms": 1.0,
     "wait_ms": 2.0, "process_ms": 40.0, "error": None},
    {"url": "http://a.test/2", "final_url": "http://a.test/2", "status": 404, "title": None,
     "fields": {}, "bytes": 10, "item": "qn-0000000002", "attempt": 0, "consumer": "c2",
     "fetched_at": "2024-03-01T10:00:01.000Z", "queue_ms": 60.0, "dispatch_ms": 1.5,
     "wait_ms": 1.0, "process_ms": 30.0, "error": "http-404"},
    {"url": "http://b.test/3", "final_url": "http://b.test/3", "status": 200, "title": "Three",
     "fields": {}, "bytes": 300, "item": "qn-0000000003", "attempt": 1, "consumer": "c1",
     "fetched_at": "2024-03-01T10:00:03.000Z", "queue_ms": 70.0, "dispatch_ms": 0.5,
     "wait_ms": 0.0, "process_ms": 90.0, "error": None},
]


def test_report_text_json_and_html(tmp_path: Path, capsys):
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + "{truncated\n")
    html = tmp_path / "report.html"
    rc, out, _ = run(capsys, "report", str(results), "--html", str(html))
    assert rc == 0
    assert "3 records, 1 bad lines skipped" in out and "http-404" in out
    assert "dispatch_ms" in out and f"HTML report: {html}" in out
    page = html.read_text()
    assert page.startswith("<!doctype html>") and 'data-chart="hist-process_ms"' in page
    assert 'data-chart="throughput-c1"' in page and "<script" not in page
    rc, out, _ = run(capsys, "report", str(results), "--json")
    doc = json.loads(out)
    assert doc["records"] == 3 and doc["outcomes"] == {"ok": 2, "http-404": 1}
    assert {c["id"]: c["count"] for c in doc["consumers"]} == {"c1": 2, "c2": 1}


def test_report_bad_inputs(tmp_path: Path, capsys):
    rc, _, err = run(capsys, "report", str(tmp_path / "missing.jsonl"))
    assert rc == ExitStatus.USAGE and len(err.strip().splitlines()) == 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    rc, _, err = run(capsys, "report", str(empty))
    assert rc == ExitStatus.FAILURE and "no records" in err
    rc, _, err = run(capsys, "report", str(empty), "--html", str(tmp_path / "no/such/dir.html"))
    assert rc == ExitStatus.USAGE and "cannot write" in err
