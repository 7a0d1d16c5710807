"""Result pipelines and page processors in a running consumer (issue #17): a real ZooKeeper,
a real HTTP server on 127.0.0.1, the consumer on a thread of this process; processors and
pipelines loaded by name from tests/plugins. The books are checked at the end: every item
has its record, a dead letter, or was dropped by a pipeline on purpose; no lease is left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.httpd import TestServer, html
from tests.plugins import pipes, procs
from tests.queue_view import held, queued_urls
from tests.test_consumer_support import Running, offer, records, settings_for
from zkcrawl import logs
from zkcrawl.consumer.main import main
from zkcrawl.consumer.results import ResultChain
from zkcrawl.errors import UsageError
from zkcrawl.zk.client import ZkClient

P = "tests.plugins"


def page(h):  # type: ignore[no-untyped-def]
    return html(f"<title>T{h.path}</title><h1>{h.path}</h1>")


def test_pipelines_drop_change_and_fail_items_and_processors_fail_alone(
        zk: ZkClient, zk_hosts: str, zk_root: str, tmp_path: Path):
    pipes.EVENTS.clear()
    with TestServer({"/*": page}) as srv:
        urls = {name: srv.url(f"/{name}") for name in
                ("ok1", "ok2", "drop1", "bad1", "boom1", "slow1", "links1")}
        offer(zk, zk_root, list(urls.values()))
        out = tmp_path / "o.jsonl"
        run = Running(settings_for(
            zk_hosts, zk_root, out, "--threads", "4", "--max-attempts", "2",
            "--processor", f"re:/boom {P}.procs:boom", "--processor", f"re:/slow {P}.procs:slow",
            "--processor", f"re:/links {P}.procs:links",
            "--pipeline", f"{P}.pipes:Tag", "--pipeline", f"{P}.pipes:DropMarked",
            "--pipeline", f"{P}.pipes:FailOnBad"))
        try:
            wait_for(lambda: not queued_urls(zk, zk_root), 60, "queue drained")
            snapshot = run.worker.timings.snapshot(0, 0, 0)
        finally:
            run.stop()
    assert pipes.EVENTS == ["Tag.open", "DropMarked.open", "DropMarked.close", "Tag.close"]
    by_url = {r["url"]: r for r in records(out)}
    # Tagged by the first stage; the processors' fields kept.
    assert by_url[urls["ok1"]]["fields"] == {"tagged": True}
    assert by_url[urls["slow1"]]["fields"] == {"slow": True, "tagged": True}
    assert by_url[urls["links1"]]["fields"] == {"n": 0, "tagged": True}
    # Dropped by the second: completed, no record, no dead letter.
    assert urls["drop1"] not in by_url
    # A raising pipeline: retried, then a dead letter with its record (never half-changed).
    bad = by_url[urls["bad1"]]
    assert bad["error"] == (f"pipeline {P}.pipes:FailOnBad: RuntimeError: database said no "
                            "(pipes.py:46)")
    assert bad["attempt"] == 1 and "half" not in bad["fields"]
    (dead,) = [json.loads(zk.get(f"{zk_root}/dead/{n}")[0])
               for n in zk.get_children(f"{zk_root}/dead")]
    assert dead["url"] == urls["bad1"] and dead["error"].startswith("pipeline ")
    # A raising processor: a permanent failure with type and message, recorded at once.
    boom = by_url[urls["boom1"]]
    assert boom["error"] == f"processor: ValueError: no date on {urls['boom1']} (procs.py:20)"
    assert boom["attempt"] == 0 and boom["status"] == 200
    # One metrics/stats label for processor failures, whatever their messages.
    assert run.worker.timings.outcomes["processor"] == 1
    assert not [k for k in run.worker.timings.outcomes if k.startswith("processor:")]
    # The slow processor's time is in the stats apart.
    assert snapshot["extract_p95_ms"] >= procs.SLOW_S * 1000
    # The books: every item accounted for, nothing held.
    assert set(by_url) == set(urls.values()) - {urls["drop1"]}
    assert len(records(out)) == len(by_url)  # no duplicate
    assert held(zk, zk_root) == []


def test_the_chain_copies_the_record_and_reports_a_non_record():
    chain = ResultChain.load([f"{P}.pipes:Tag", f"{P}.pipes:FailOnBad"])
    record = {"url": "http://h/bad", "fields": {}}
    out = chain.process(record)
    assert out.record is None and out.error is not None and record == {"url": "http://h/bad",
                                                                        "fields": {}}
    weird = ResultChain([("x:Y", _Returns(["not", "a", "dict"]))])
    assert weird.process({"url": "u", "fields": {}}).error == (
        "pipeline x:Y: returned list, not a record (dict) or None")


class _Returns:
    def __init__(self, value: object) -> None:
        self.value = value

    def open(self) -> None: ...

    def close(self) -> None: ...

    def process(self, record: object) -> object:
        return self.value


@pytest.mark.parametrize(("spec", "message"), [
    (f"{P}.pipes", "expected package.module:callable"),
    (f"{P}.procs:boom", "is not a class"),
    (f"{P}.pipes:NoProcess", "has no process(record) method"),
    (f"{P}.pipes:Missing", "has no 'Missing'"),
])
def test_a_bad_pipeline_is_a_usage_error(spec: str, message: str):
    with pytest.raises(UsageError, match="--pipeline") as err:
        ResultChain.load([spec])
    assert message in str(err.value)


def test_a_pipeline_whose_open_fails_is_one_line_and_exit_2(capsys, tmp_path: Path):
    pipes.EVENTS.clear()
    logs.flush()  # an earlier test's pipeline.traceback line is not this test's stderr
    capsys.readouterr()
    code = main(["--pipeline", f"{P}.pipes:Tag", "--pipeline", f"{P}.pipes:FailOpen",
                 "--zk", "127.0.0.1:1", "--out", str(tmp_path / "o.jsonl")], {})
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"zkcrawl-consumer: error: --pipeline: {P}.pipes:FailOpen.open() failed: "
                   "ConnectionError: no database"]
    assert pipes.EVENTS == ["Tag.open", "Tag.close"]  # the ones opened are closed
