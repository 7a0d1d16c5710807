"""``zkcrawl local-zk`` with a real server, and the settings precedence rule."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from zkcrawl.admin.localzk import four_letter, free_port, pid_alive, read_pid
from zkcrawl.cli import main
from zkcrawl.errors import UsageError
from zkcrawl.settings import ArgumentParser, CommonSettings, add_options, opt, parse


def test_local_zk_start_status_stop(tmp_path: Path, capsys):
    port = free_port()
    args = ["--port", str(port), "--data-dir", str(tmp_path / "zk")]
    try:
        assert main(["local-zk", "start", *args], {}) == 0
        pid = read_pid(tmp_path / "zk")
        assert pid is not None and pid_alive(pid)
        assert "Mode: standalone" in four_letter(port, "srvr")
        assert main(["local-zk", "status", *args], {}) == 0
        assert main(["local-zk", "start", *args], {}) == 0  # idempotent: already running
        assert "already running" in capsys.readouterr().out
    finally:
        assert main(["local-zk", "stop", *args], {}) == 0
    assert not pid_alive(pid)
    assert main(["local-zk", "status", *args], {}) == 1


def test_local_zk_without_an_installation_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ZOOKEEPER_HOME", str(tmp_path))  # a home with no jars
    status = main(["local-zk", "start", "--port", str(free_port()), "--data-dir",
                   str(tmp_path / "d")], dict(os.environ))
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "apt-get install zookeeper" in err[0]


@dataclasses.dataclass(frozen=True)
class Demo(CommonSettings):
    threads: int = opt(16, "threads")
    start: tuple[str, ...] = opt((), "start", repeat=True)
    robots: bool = opt(True, "robots")


def load(argv: list[str], env: dict[str, str]) -> Demo:
    parser = ArgumentParser(prog="zkcrawl")  # no command prefix: ZKCRAWL_<FLAG>
    add_options(parser, Demo)
    return parse(Demo, parser, argv, env)[0]


def test_precedence_flag_env_file_default(tmp_path: Path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('threads = 4\nzk-timeout = 3\nstart = ["http://a/", "http://b/"]\n')
    assert load([], {}).threads == 16
    assert load(["--config", str(cfg)], {}).threads == 4
    from_env = load(["--config", str(cfg)], {"ZKCRAWL_THREADS": "8",
                                            "ZKCRAWL_START": "http://c/\nhttp://d/"})
    assert (from_env.threads, from_env.start, from_env.zk_timeout) == (
        8, ("http://c/", "http://d/"), 3.0)
    flag = load(["--config", str(cfg), "--threads", "2", "--no-robots"],
                {"ZKCRAWL_THREADS": "8", "ZKCRAWL_ROBOTS": "yes"})
    assert (flag.threads, flag.robots) == (2, False)
    assert load([], {"ZKCRAWL_CONFIG": str(cfg)}).threads == 4


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--threads", "x"], {}, "invalid literal"),
    ([], {"ZKCRAWL_THREADS": "many"}, "ZKCRAWL_THREADS"),
    ([], {"ZKCRAWL_ROBOTS": "perhaps"}, "not a boolean"),
    (["--config", "/nonexistent.toml"], {}, "no such file"),
    (["--root", "relative"], {}, "absolute"),
])
def test_bad_settings_are_usage_errors(argv, env, needle):
    with pytest.raises(UsageError, match=needle):
        load(argv, env)


def test_unknown_or_malformed_config_file(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text("threads = \n")
    with pytest.raises(UsageError, match="not valid TOML"):
        load(["--config", str(bad)], {})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("thread = 3\n")
    with pytest.raises(UsageError, match="unknown key 'thread'"):
        load(["--config", str(unknown)], {})


def test_local_zk_start_on_a_busy_port_names_the_port_and_the_cause(tmp_path: Path, capsys):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        status = main(["local-zk", "start", "--port", str(port), "--data-dir",
                       str(tmp_path / "zk")], {})
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert f"127.0.0.1:{port}" in err[0] and "Address already in use" in err[0]
    assert read_pid(tmp_path / "zk") is None  # refused before any JVM was started
