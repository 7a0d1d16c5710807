"""Hostile data end to end (SPEC §2, §3), with real consumer processes, a real ZooKeeper
and real HTTP servers: poison znodes neither crash nor stall the cluster, and a page that
kills its consumers ends in the dead letters as ``abandoned``."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.httpd import TestServer, delayed, html
from tests.queue_view import held, queued_urls
from tests.test_consumer_support import offer, records, spawn
from zkcrawl.cli import main as admin_main
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.items import Item
from zkcrawl.queue.untrusted import ITEM_LIMIT, load_json

NESTED = b"[" * 6000 + b"]" * 6000


def page(h):  # type: ignore[no-untyped-def]
    return html(f"<title>T{h.path}</title>")


def consumer_args(zk_hosts: str, zk_root: str, out: Path, *extra: str) -> list[str]:
    return ["--zk", zk_hosts, "--root", zk_root, "--out", str(out), "--no-robots",
            "--domain-delay", "0", "--log-format", "json", "--session-timeout", "2",
            "--max-attempts", "3", "--allow-private-addresses", *extra]


def at_the_limit(url: str) -> bytes:
    """An item of exactly ``ITEM_LIMIT`` bytes."""
    probe = Item(url=url, meta={"pad": ""}, enqueued_at=1.0).encode()
    data = Item(url=url, meta={"pad": "x" * (ITEM_LIMIT - len(probe))}, enqueued_at=1.0).encode()
    assert len(data) == ITEM_LIMIT
    return data


def hostile_items(ok: TestServer, failing: TestServer) -> dict[str, bytes]:
    return {
        "nested url": b'{"url":' + NESTED + b"}",
        "nested meta": b'{"url":"' + ok.url("/n/meta").encode() + b'","meta":' + NESTED + b"}",
        "url not a string": b'{"url": 42}',
        "invalid utf-8": b'{"url":"' + ok.url("/n/\xff").encode("latin-1") + b'"}',
        "empty": b"",
        "javascript": b'{"url":"javascript:alert(1)"}',
        "lone surrogate": b'{"url":"' + ok.url("/n/").encode() + b'\\ud800"}',
        "huge attempt": (b'{"url":"' + ok.url("/n/attempt").encode() + b'","attempt":'
                         + str(10**25).encode() + b"}"),
        "at the limit, 503 for ever": at_the_limit(failing.url("/503")),
    }


def hostile_urls(ok: TestServer) -> dict[str, str]:
    """The URL of each hostile item that decodes (moved into a partition, then recorded)."""
    return {"javascript": "javascript:alert(1)", "nested meta": ok.url("/n/meta"),
            "huge attempt": ok.url("/n/attempt")}


def admin(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = admin_main(list(argv), {})
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return int(rc), cap.out


def admin_views_survive(capsys: pytest.CaptureFixture[str], hosts: str, root: str) -> None:
    common = ("--zk", hosts, "--root", root, "--log-format", "json")
    rc, out = admin(capsys, "status", "--json", *common)
    assert rc == 0 and json.loads(out)["control"] in ("running", "paused")
    assert admin(capsys, "dead", "list", *common)[0] == 0
    assert admin(capsys, "queue", "list", *common)[0] == 0
    assert admin(capsys, "status", *common)[0] == 0


def plant_poison(zk, root: str) -> None:  # type: ignore[no-untyped-def]
    """Nested JSON in every other node a consumer or an admin command reads."""
    poison = b'{"state":' + NESTED + b"}"
    zk.create(f"{root}/control", poison, makepath=True)
    zk.create(f"{root}/consumers/evil", poison, ephemeral=True, makepath=True)
    zk.create(f"{root}/producers/evil", poison, ephemeral=True, makepath=True)
    zk.create(f"{root}/dead/{item_codec.DEAD_PREFIX}", poison, sequence=True, makepath=True)
    zk.create(f"{root}/hosts/127.0.0.1", b"1e300", makepath=True)


def test_poison_items_and_nodes_do_not_take_the_cluster_down(zk, zk_hosts, zk_root, tmp_path,
                                                            capsys):
    with TestServer({"/ok/*": page, "/n/*": page}) as ok, \
            TestServer({"/503": html("busy", status=503)}) as failing:
        urls = [ok.url(f"/ok/{i}") for i in range(40)]
        offer(zk, zk_root, urls[:20])
        hostile = {zk.create(f"{zk_root}/queue/{item_codec.PREFIX}", data, sequence=True
                             ).rsplit("/", 1)[1]: what
                   for what, data in hostile_items(ok, failing).items()}
        offer(zk, zk_root, urls[20:])
        plant_poison(zk, zk_root)
        forged = zk.create(f"{zk_root}/partitions/0/owner", b'{"consumer":' + NESTED + b"}",
                           ephemeral=True, makepath=True)  # an owner node is untrusted too
        admin_views_survive(capsys, zk_hosts, zk_root)
        zk.delete(forged)

        outs = [tmp_path / f"o{i}.jsonl" for i in range(2)]
        errs = [tmp_path / f"e{i}.log" for i in range(2)]
        procs = [spawn(consumer_args(zk_hosts, zk_root, o, "--exit-when-idle", "3",
                                     "--threads", "4"), e)
                 for o, e in zip(outs, errs, strict=True)]
        rcs = [p.wait(timeout=120) for p in procs]
        failing_url = failing.url("/503")
    logs = "".join(e.read_text() for e in errs)
    assert rcs == [0, 0], logs[-3000:]
    assert "Traceback" not in logs
    assert '"znode.malformed"' in logs  # the control node was reported, not obeyed

    raw = b"".join(o.read_bytes() for o in outs)
    raw.decode("utf-8")  # valid UTF-8 whatever the input
    recs = records(*outs)
    ok_recs = [r for r in recs if r["url"] in urls]
    assert sorted(r["url"] for r in ok_recs if r["error"] is None) == sorted(urls)

    dead = {}
    for name in zk.get_children(f"{zk_root}/dead"):
        doc, _ = load_json(zk.get(f"{zk_root}/dead/{name}")[0])  # one is the planted poison
        if isinstance(doc, dict) and "item" in doc:
            dead[doc["item"]] = doc
    # An ingress item that decodes is moved into its partition under a batch entry's name
    # ("<p>/<batch>/<i>"): its record is found by its URL; one that does not decode is a
    # dead letter under its ingress name at the move (SPEC §2). None vanishes.
    recorded = {r["url"] for r in recs}
    limit_item = next(n for n, w in hostile.items() if w.startswith("at the limit"))
    for name, what in hostile.items():
        url = hostile_urls(ok).get(what)
        assert name in dead or (url is not None and url in recorded) or name == limit_item, what
    [script] = [r for r in recs if r["url"] == "javascript:alert(1)"]
    assert script["error"] == "bad-url"  # SPEC §3: a permanent failure
    # Retried twice (a new znode each time, never larger than the limit), then dead.
    [limited] = [d for d in dead.values() if d["url"] == failing_url]
    assert limited["error"] == "http-503" and limited["attempts"] == 3
    for what in ("nested url", "url not a string", "invalid utf-8", "empty", "lone surrogate"):
        name = next(n for n, w in hostile.items() if w == what)
        assert dead[name]["error"].startswith("malformed"), what
    assert queued_urls(zk, zk_root) == [] and held(zk, zk_root) == []
    admin_views_survive(capsys, zk_hosts, zk_root)


def test_a_page_that_kills_its_consumers_is_abandoned_after_max_attempts(zk, zk_hosts,
                                                                         zk_root, tmp_path):
    """Each consumer that fetches the page is SIGKILLed (a crash, an OOM kill); with
    ``--max-attempts 3`` the page is fetched 3 times, then dead-lettered ``abandoned``."""
    with TestServer({"/hang": delayed(30, page)}) as srv:
        offer(zk, zk_root, [srv.url("/hang")])
        out = tmp_path / "o.jsonl"
        rcs = []
        for run in range(5):  # bounded: 3 kills, then one that dead-letters it, + 1 spare
            err = tmp_path / f"e{run}.log"
            proc = spawn(consumer_args(zk_hosts, zk_root, out, "--exit-when-idle", "2",
                                       "--timeout", "60"), err)
            outcome = _killed_or_exited(proc, srv, run + 1)
            rcs.append(outcome)
            if outcome != "killed":
                break
            assert "Traceback" not in err.read_text()
        hits = len(srv.requests_for("/hang"))
    assert rcs == ["killed", "killed", "killed", 0], rcs
    assert hits == 3
    [name] = zk.get_children(f"{zk_root}/dead")
    doc = json.loads(zk.get(f"{zk_root}/dead/{name}")[0])
    assert doc["error"] == "abandoned" and doc["attempts"] == 3
    assert [r["error"] for r in records(out, strict=False)] == ["abandoned"]
    assert queued_urls(zk, zk_root) == [] and held(zk, zk_root) == []


def _killed_or_exited(proc: subprocess.Popen[bytes], srv: TestServer, nth: int) -> object:
    """SIGKILL ``proc`` once the server sees the ``nth`` request for /hang; or its exit code
    if it exits first."""
    def seen_or_exited() -> bool:
        return len(srv.requests_for("/hang")) >= nth or proc.poll() is not None

    wait_for(seen_or_exited, timeout=60, what=f"request {nth} or exit")
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    return "killed"
