"""Fixtures of the fault suite: the module's 3-node ensemble healed before each test, a fast
local site in its own process, consumer processes that are killed if a test fails."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.test_consumer_support import ROOT, records, spawn
from zkcrawl.admin.localzk import Ensemble, ZkServer
from zkcrawl.bench.site import start_benchsite, stop_benchsite
from zkcrawl.zk.client import ZkClient

SESSION = 4.0  # --session-timeout of the consumers in this suite (seconds)


def consumer_args(hosts: str, root: str, cid: str, out: Path, *extra: str) -> list[str]:
    return ["--zk", hosts, "--root", root, "--id", cid, "--out", str(out), "--no-robots",
            "--domain-delay", "0", "--log-format", "json", "--allow-private-addresses",
            "--session-timeout", str(SESSION), "--zk-timeout", "5", *extra]


def heal(ens: Ensemble, timeout: float = 90.0) -> None:
    """Start every server of ``ens`` that a test stopped or killed; return once all serve."""
    for server in ens.servers:
        if server.proc is None or server.proc.poll() is not None:
            server.start(wait=0)
    wait_for(lambda: all(s.serving() for s in ens.servers), timeout, "the ensemble healed",
             interval=0.2)


def new_leader(ens: Ensemble, old: ZkServer, timeout: float = 60.0) -> float:
    """Seconds until a server other than ``old`` reports itself leader."""
    t0 = time.monotonic()
    wait_for(lambda: (lead := ens.leader()) is not None and lead is not old, timeout,
             "a new leader", interval=0.02)
    return time.monotonic() - t0


def written(outs: list[Path]) -> int:
    """Records so far (a line being written right now is not counted)."""
    return len(records(*outs, strict=False))


def resumed(outs: list[Path], timeout: float = 60.0) -> float:
    """Seconds until the consumers write a record they had not written when called."""
    t0, before = time.monotonic(), written(outs)
    wait_for(lambda: written(outs) > before, timeout, "records again", interval=0.02)
    return time.monotonic() - t0


def exited(proc: subprocess.Popen[bytes], err: Path, timeout: float) -> int:
    """``proc``'s exit code within ``timeout`` seconds; if it is still running, fail with the
    tail of its log and its threads' stacks (SIGUSR1) rather than a bare ``TimeoutExpired``."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        size = err.stat().st_size
        proc.send_signal(signal.SIGUSR1)  # every thread's stack into its log (zkcrawl.signals)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: err.stat().st_size > size, 10, "the stacks", interval=0.1)
        tail = err.read_text(errors="replace")[-12000:]
        pytest.fail(f"{err.stem} still running after {timeout:.0f} s; its log (ending with "
                    f"its threads' stacks) ends:\n{tail}")


def no_traceback(*errs: Path) -> None:
    for err in errs:
        text = err.read_text(errors="replace")
        assert "Traceback" not in text, text[-4000:]


@pytest.fixture
def ens(ensemble: Ensemble) -> Iterator[Ensemble]:
    """The module's ensemble, every server running (a test before may have killed some)."""
    heal(ensemble)
    yield ensemble
    heal(ensemble)


@pytest.fixture
def admin(ens: Ensemble) -> Iterator[ZkClient]:
    """A client of the test's own, to offer items and read the books."""
    zk = ZkClient(ens.hosts, zk_timeout=30, session_timeout=30).connect()
    yield zk
    zk.close()


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """A fast local site (its own process: its CPU is not the test's GIL): /a/<n>.html."""
    proc, base = start_benchsite(latency_ms=5, articles=60_000)
    yield base
    stop_benchsite(proc)



@pytest.fixture
def start_consumer(procs: list[subprocess.Popen[bytes]], tmp_path: Path
                   ) -> Callable[..., tuple[subprocess.Popen[bytes], Path, Path]]:
    """``start_consumer(hosts, root, id, *extra, prefix=[])`` -> (process, out, stderr file)."""

    def start(hosts: str, root: str, cid: str, *extra: str, prefix: list[str] | None = None,
              **kw: object) -> tuple[subprocess.Popen[bytes], Path, Path]:
        out, err = tmp_path / f"{cid}.jsonl", tmp_path / f"{cid}.err"
        proc = spawn(consumer_args(hosts, root, cid, out, *extra), err, **kw) \
            if prefix is None else _spawn_prefixed(prefix, consumer_args(hosts, root, cid, out,
                                                                         *extra), err)
        procs.append(proc)
        return proc, out, err

    return start


def _spawn_prefixed(prefix: list[str], args: list[str], err: Path
                    ) -> subprocess.Popen[bytes]:
    """A consumer run under ``prefix`` (``ip netns exec NS``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(err, "wb") as fh:
        return subprocess.Popen([*prefix, sys.executable, "-m", "zkcrawl.consumer.main", *args],
                                cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=fh)
