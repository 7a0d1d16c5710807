"""Issue 27, item 5 and the ``local-zk`` files: a real ``zkcrawl local-zk`` server.

* ``stop`` signals only its own server: a PID file naming an unrelated live process (its
  PID alone, or with that process's real start time) leaves it alone -- before, ``stop``
  killed it; ``start`` does not answer "already running" for it -- before, it did.
* its data directory and ``data/`` (the transaction log holds each digest's SHA-1) are 0700,
  its config, log and PID file 0600, even where an older version left them world-readable.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from zkcrawl.admin.localzk import free_port, pid_alive, process_start, read_pid
from zkcrawl.cli import main


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_local_zk_stops_only_its_own_server_and_keeps_its_files_private(tmp_path, capsys,
                                                                       procs) -> None:
    data = tmp_path / "zk"
    data.mkdir(mode=0o755)
    (data / "zookeeper.log").write_text("an older, world-readable log\n")
    (data / "zookeeper.log").chmod(0o644)
    bystander = subprocess.Popen(["sleep", "120"])
    procs.append(bystander)
    (data / "zookeeper.pid").write_text(f"{bystander.pid}\n")  # stale file, PID reused
    args = ["--port", str(free_port()), "--data-dir", str(data)]
    old = os.umask(0o022)
    server_pid = None
    try:
        capsys.readouterr()
        assert main(["local-zk", "start", *args], {}) == 0
        out = capsys.readouterr().out
        assert "already running" not in out and "started pid=" in out, out
        server_pid = read_pid(data)
        assert server_pid not in (None, bystander.pid) and pid_alive(server_pid)
        assert mode(data) == 0o700 and mode(data / "data") == 0o700
        for name in ("zoo.cfg", "zookeeper.log", "zookeeper.pid"):
            assert mode(data / name) == 0o600, name

        pid_file = (data / "zookeeper.pid").read_text()
        for forged in (f"{bystander.pid}\n", f"{bystander.pid} {process_start(bystander.pid)}\n"):
            (data / "zookeeper.pid").write_text(forged)
            assert main(["local-zk", "stop", *args], {}) == 0
            assert "another process: left alone" in capsys.readouterr().out
            assert bystander.poll() is None  # not signalled
            assert main(["local-zk", "status", *args], {}) == 1  # not ours: not running
            capsys.readouterr()
        (data / "zookeeper.pid").write_text(pid_file)
        assert main(["local-zk", "stop", *args], {}) == 0
        assert f"stopped pid={server_pid}" in capsys.readouterr().out
        assert not pid_alive(server_pid) and bystander.poll() is None
    finally:
        os.umask(old)
        if server_pid is not None and pid_alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
