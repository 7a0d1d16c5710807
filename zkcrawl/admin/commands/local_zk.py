"""``zkcrawl local-zk start|stop|status``: a throwaway standalone ZooKeeper on 127.0.0.1."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from zkcrawl.admin.localzk import ZkServer, four_letter, server_pid, stop_pid
from zkcrawl.errors import ExitStatus, LocalZkError, UsageError
from zkcrawl.settings import CommonSettings, opt

NAME = "local-zk"
HELP = "start, stop or show a throwaway local ZooKeeper bound to 127.0.0.1"
EXAMPLES = """
    zkcrawl local-zk start         # 127.0.0.1:2181, data under ~/.local/state/zkcrawl
    zkcrawl local-zk start --port 2182 --data-dir /tmp/zk2
    zkcrawl local-zk status
    zkcrawl local-zk stop
"""


def default_dir(env: Mapping[str, str]) -> str:
    """``$XDG_STATE_HOME/zkcrawl/local-zk``, else ``~/.local/state/zkcrawl/local-zk``."""
    state = env.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, "zkcrawl", "local-zk")


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    port: int = opt(2181, "client port on 127.0.0.1", metavar="PORT")
    data_dir: str | None = opt(None, "where the server keeps its data, log and PID file "
                               "(default: $XDG_STATE_HOME/zkcrawl/local-zk, else "
                               "~/.local/state/zkcrawl/local-zk)", metavar="DIR")


    def validate(self) -> None:
        super().validate()
        if not 1 <= self.port <= 65535:
            raise UsageError(f"--port must be 1..65535, got {self.port}")
        if self.data_dir is not None:
            if not self.data_dir.strip():
                raise UsageError("--data-dir must not be empty")
            if os.path.exists(self.data_dir) and not os.path.isdir(self.data_dir):
                raise UsageError(f"--data-dir {self.data_dir}: exists and is not a directory")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "stop", "status"))


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    data_dir = Path(settings.data_dir or default_dir(env))
    pid, state = server_pid(data_dir)  # a PID file naming another process: not running
    running = state == "running"
    if ns.action == "status":
        mode = four_letter(settings.port, "srvr")
        if running and "Mode:" in mode:
            print(f"running pid={pid} 127.0.0.1:{settings.port} data-dir={data_dir}")
            return ExitStatus.OK
        print(f"not running (data-dir={data_dir})")
        return ExitStatus.FAILURE
    if ns.action == "stop":
        if stop_pid(data_dir):
            print(f"stopped pid={pid}")
        elif state == "other":
            print(f"not running (the PID file named pid={pid}, another process: left alone)")
        else:
            print("not running")
        return ExitStatus.OK
    if running:
        print(f"already running pid={pid} 127.0.0.1:{settings.port}")
        return ExitStatus.OK
    if "Mode:" in four_letter(settings.port, "srvr"):
        raise LocalZkError(f"port {settings.port} already serves a ZooKeeper not started "
                           "here; use --port")
    try:
        server = ZkServer(data_dir, settings.port).start(wait=settings.zk_timeout * 3,
                                                         detach=True)
    except OSError as exc:  # the data directory: not writable, a file on its path...
        raise LocalZkError(f"--data-dir {data_dir}: {exc.strerror or exc}") from None
    print(f"started pid={server.proc.pid if server.proc else '?'} 127.0.0.1:{server.port} "
          f"log={server.log_path}")
    print(f"use: --zk 127.0.0.1:{server.port}   stop: zkcrawl local-zk stop "
          f"--data-dir {data_dir}")
    return ExitStatus.OK
