"""A refused loopback ZooKeeper port, with stderr piped as in CI, a script or ``2>log``
(issue #26 review, gap 1): every one-shot ``zkcrawl`` command fails at once with the one
"connection refused" line and exit 75; the daemons (consumer, producer) keep trying for
``--zk-timeout`` -- a supervised daemon may start before its local ZooKeeper -- and say
"within Ns (timed out)"."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zkcrawl.admin.localzk import free_port
from zkcrawl.errors import ExitStatus

ROOT = Path(__file__).resolve().parent.parent
#: Far longer than a process start: a command that waited it out would be caught.
LONG_TIMEOUT = 60


def piped(module: str, *argv: str, timeout: float = 120) -> tuple[int, str, float]:
    """``python -m module ARGV`` with stderr a pipe (no terminal anywhere, stdin closed):
    (exit status, stderr, seconds it took)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZKCRAWL_")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stderr, time.monotonic() - started


@pytest.fixture
def results(tmp_path: Path) -> Path:
    path = tmp_path / "results.jsonl"
    path.write_text('{"url": "http://a.example/", "outcome": "ok"}\n')
    return path


@pytest.mark.parametrize("command", [
    ["status"], ["status", "--json"], ["dead", "list"], ["queue", "list"], ["pause"],
    ["resume"], ["acl", "check"], ["report", "{results}", "--dead"],
])
def test_a_one_shot_command_fails_at_once_without_a_terminal(command, results):
    argv = [a.format(results=results) for a in command]
    rc, err, elapsed = piped("zkcrawl.cli", *argv, "--zk", f"127.0.0.1:{free_port()}",
                             "--zk-timeout", str(LONG_TIMEOUT))
    assert rc == ExitStatus.TEMPFAIL, err
    [line] = err.splitlines()
    assert line.startswith(f"zkcrawl {argv[0]}: error: cannot reach ZooKeeper at 127.0.0.1:")
    assert "(connection refused: nothing listens there)" in line, line
    assert "within" not in line and "connecting to" not in err, err
    assert elapsed < LONG_TIMEOUT / 2, elapsed  # did not wait it out


def test_the_consumer_without_a_terminal_keeps_trying_for_the_timeout(tmp_path):
    rc, err, elapsed = piped("zkcrawl.consumer.main", "--zk", f"127.0.0.1:{free_port()}",
                             "--zk-timeout", "3", "--out", str(tmp_path / "out.jsonl"))
    assert rc == ExitStatus.TEMPFAIL, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("zkcrawl-consumer: error: cannot reach ZooKeeper at 127.0.0.1:")
    assert "within 3s (timed out)" in last and "refused" not in last, last
    assert elapsed >= 3, elapsed


def test_the_producer_without_a_terminal_keeps_trying_for_the_timeout(tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text("http://a.example/1\n")
    rc, err, elapsed = piped("zkcrawl.producer.main", "--zk", f"127.0.0.1:{free_port()}",
                             "--zk-timeout", "3", "--from-file", str(urls))
    assert rc == ExitStatus.TEMPFAIL, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("zkcrawl-producer: error: cannot reach ZooKeeper at 127.0.0.1:")
    assert "within 3s (timed out)" in last and "refused" not in last, last
    assert elapsed >= 3, elapsed
