"""zkcrawl-producer as operators meet it: bad usage (exit 2, one line), ``--from-file -``
from stdin and SIGTERM/SIGINT in a real process, and the end-of-run table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.queue_view import queued_count, queued_counter, queued_items
from tests.test_producer import _fresh_loggers  # noqa: F401 - autouse fixture
from zkcrawl.producer.main import main
from zkcrawl.producer.offerer import partition_bound
from zkcrawl.producer.summary import Counts, render_table
from zkcrawl.queue.items import Item
from zkcrawl.queue.partitions import DEFAULT_PARTITIONS
from zkcrawl.zk.client import ZkClient

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("argv, words", [
    ([], "nothing to read"),
    (["--start", "http://x.test/", "--links", "//a["], "--links: invalid XPath"),
    (["--start", "http://x.test/", "--next", "//a[@rel=next"], "--next: invalid XPath"),
    (["--start", "http://x.test/", "--links-css", "a[["], "--links-css: invalid CSS"),
    (["--start", "http://x.test/", "--allow", "("], "--allow: invalid regex"),
    (["--start", "http://x.test/", "--deny", "[a-"], "--deny: invalid regex"),
    (["--pages", "http://x.test/p", "--page-range", "1-3"], "no {page} placeholder"),
    (["--pages", "http://x.test/{page}", "--page-range", "3-1"], "3 is after 1"),
    (["--pages", "http://x.test/{page}", "--page-range", "one-two"], "expected A-B"),
    (["--pages", "http://x.test/{page}"], "--pages needs --page-range"),
    (["--pages", "ftp://x.test/{page}", "--page-range", "1-2"], "http(s) URL"),
    (["--start", "x.test/list"], "--start: not an absolute http(s) URL"),
    (["--from-file", "/nonexistent/urls.txt"], "--from-file: cannot read"),
    (["--from-file", "-", "--start", "http://x.test/"], "cannot be combined"),
    (["--start", "http://x.test/", "--batch", "0"], "--batch must be a positive"),
    (["--start", "http://x.test/", "--fp-rate", "2"], "--fp-rate"),
    (["--start", "http://x.test/", "--max-depth", "ten"], "--max-depth"),
])
def test_bad_usage_is_one_line_and_exit_2(argv, words, capsys):
    assert main([*argv, "--log-format", "json"], {}) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("zkcrawl-producer: error: "), err
    assert words in err


def test_unreachable_zookeeper_is_one_line_and_exit_75(capsys):
    # EX_TEMPFAIL (SPEC §4): temporary, so a supervisor restarts it, unlike a 2.
    argv = ["--start", "http://x.test/", "--zk", "127.0.0.1:1", "--zk-timeout", "1"]
    assert main([*argv, "--log-format", "json"], {}) == 75
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("zkcrawl-producer: error: "), err
    assert "cannot reach ZooKeeper" in err


def test_bad_xpath_from_the_config_file_is_a_usage_error_too(tmp_path, capsys):
    cfg = tmp_path / "producer.toml"
    cfg.write_text('start = ["http://x.test/"]\nlinks = "//a["\n')
    assert main(["--config", str(cfg)], {}) == 2
    assert "--links: invalid XPath" in capsys.readouterr().err


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO),
                                                         os.environ.get("PYTHONPATH", "")])}


def _producer(zk_hosts: str, zk_root: str, *extra: str, **kw: Any) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "zkcrawl.producer.main", "--zk", zk_hosts, "--root", zk_root,
           "--log-format", "json", "--session-timeout", "4", "--allow-private-addresses",
           *extra]  # test sites are on 127.0.0.1: the SSRF guard off
    return subprocess.Popen(cmd, cwd=REPO, env=_env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _events(stderr: bytes) -> list[dict[str, Any]]:
    lines = stderr.decode().splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def _summary(stderr: bytes) -> dict[str, Any]:
    [s] = [e for e in _events(stderr) if e["event"] == "producer.summary"]
    return s


def _queued(zk: ZkClient, root: str) -> list[Item]:
    """What the producer offered, wherever it is queued (ingress or partitions)."""
    return queued_items(zk, root)


def test_from_stdin(zk, zk_hosts, zk_root):
    lines = [
        "# a comment", "http://Example.com/a?utm_source=x#frag", "http://example.com/a",
        "   http://example.com/b   ", "", "not a url", "/relative/path", "mailto:x@y.test",
        "https://example.com:443/c", "http://bücher.example/d",
    ]
    proc = _producer(zk_hosts, zk_root, "--from-file", "-", "--deny", "/b$")
    _out, err = proc.communicate(("\n".join(lines) + "\n").encode(), timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    items = _queued(zk, zk_root)
    assert Counter(i.url for i in items) == Counter([  # each once; hosts' partitions differ
        "http://example.com/a", "https://example.com/c", "http://xn--bcher-kva.example/d"])
    assert {i.meta["source"] for i in items} == {"stdin"}
    s = _summary(err)
    assert (s["lines_read"], s["rejected"], s["duplicates"], s["offered"]) == (8, 3, 1, 3)
    assert s["dropped"] == {"deny": 1}
    rejected = [e for e in _events(err) if e["event"] == "producer.rejected"]
    assert [e["line"] for e in rejected] == [6, 7, 8]  # logged with their line numbers


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_offers_what_was_read_saves_seen_and_exits_0(sig, zk, zk_hosts, zk_root,
                                                            tmp_path):
    seen = tmp_path / "seen"
    urls = [f"http://example.com/s/{i}" for i in range(30)]
    proc = _producer(zk_hosts, zk_root, "--from-file", "-", "--seen", str(seen), "--id", "sig")
    try:
        assert proc.stdin is not None
        proc.stdin.write(("\n".join(urls) + "\n").encode())
        proc.stdin.flush()  # stdin stays open: a stream that has not ended
        wait_for(lambda: queued_count(zk, zk_root) == 30, what="the streamed lines offered")
        assert zk.exists(f"{zk_root}/producers/sig") is not None
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()[-2000:]
    stopping = [e for e in _events(err) if e["event"] == "producer.stopping"]
    assert [e["signal"] for e in stopping] == [sig.name]
    assert _summary(err)["offered"] == 30
    assert "Traceback" not in err.decode()
    assert zk.exists(f"{zk_root}/producers/sig") is None

    # The seen state was saved on the way out: a restart offers only the new URLs.
    more = [f"http://example.com/s/{i}" for i in range(25, 35)]
    again = _producer(zk_hosts, zk_root, "--from-file", "-", "--seen", str(seen))
    _out, err2 = again.communicate(("\n".join(more) + "\n").encode(), timeout=60)
    assert again.returncode == 0, err2.decode()[-2000:]
    s = _summary(err2)
    assert (s["offered"], s["duplicates"]) == (5, 5)
    assert Counter(i.url for i in _queued(zk, zk_root)) == Counter(
        [f"http://example.com/s/{i}" for i in range(35)])


def test_summary_table_names_every_count():
    c = Counts(pages_read=3, links_found=17, duplicates=2, offered=11)
    c.pages_failed.append(("http://x.test/l/2", "http-503"))
    c.pages_skipped.update({"robots": 1})
    c.dropped.update({"javascript": 1, "other-host": 2})
    table = render_table(c, from_file=False)
    for label, value in (("pages read", "3"), ("links found", "17"),
                         ("duplicates skipped", "2"), ("items offered", "11"),
                         ("pages failed", "1"), ("dropped", "3")):
        line = next(x for x in table.splitlines() if x.strip().startswith(label))
        assert line.split()[-1] == value or f" {value} " in line + " ", line
    assert "other-host 2, javascript 1" in table
    assert "failed: http://x.test/l/2 (http-503)" in table


def test_sigterm_while_held_by_backpressure_leaves_the_rest_for_the_next_run(
        zk, zk_hosts, zk_root, tmp_path):
    seen = tmp_path / "seen"
    src = tmp_path / "urls.txt"
    urls = [f"http://example.com/h/{i}" for i in range(300)]
    src.write_text("\n".join(urls) + "\n")
    proc = _producer(zk_hosts, zk_root, "--from-file", str(src), "--seen", str(seen),
                     "--max-depth", "100", "--batch", "50", "--id", "held")

    def held() -> bool:
        node = f"{zk_root}/producers/held"
        return bool(zk.exists(node)) and json.loads(zk.get(node)[0])["state"] == "waiting"

    try:
        wait_for(held, what="the producer held by back-pressure")
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()[-2000:]
    s = _summary(err)
    # One host, one partition: its bound (a quarter of --max-depth by default) holds it.
    bound = partition_bound(100, DEFAULT_PARTITIONS)
    assert bound == 25
    assert (s["offered"], s["unoffered"]) == (bound, 300 - bound)  # counted, logged, not dropped
    assert any(e["event"] == "producer.unoffered" for e in _events(err))
    assert queued_count(zk, zk_root) == bound

    # Only offered URLs entered the seen state: the next run offers the others.
    again = _producer(zk_hosts, zk_root, "--from-file", str(src), "--seen", str(seen),
                      "--max-depth", "1000", "--max-partition-depth", "1000")
    _out, err2 = again.communicate(timeout=60)
    assert again.returncode == 0, err2.decode()[-2000:]
    assert (_summary(err2)["offered"], _summary(err2)["duplicates"]) == (300 - bound, bound)
    assert queued_counter(zk, zk_root) == Counter(urls)
