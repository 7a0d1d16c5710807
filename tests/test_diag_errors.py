"""Error polish (issue #26, item 7), each through the real command and what a person reads:
a PostgreSQL refusal for good is exit 2 (SPEC §4), "did you mean" for flags and TOML keys, a
refused loopback ZooKeeper port fails at once on a terminal (a supervised process keeps
trying for ``--zk-timeout``), ``dead``/``queue`` on a root that does not exist say so."""

from __future__ import annotations

import os
import pty
import select
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zkcrawl.admin.localzk import free_port
from zkcrawl.cli import main as cli_main
from zkcrawl.consumer.main import main as consumer_main
from zkcrawl.errors import ExitStatus, ZkUnavailable
from zkcrawl.postgres import refusal
from zkcrawl.producer.main import main as producer_main
from zkcrawl.settings import did_you_mean
from zkcrawl.zk.client import ZkClient, refused_on_loopback

ROOT = Path(__file__).resolve().parent.parent


def run(module: str, *argv: str, env_extra: dict[str, str] | None = None,
        timeout: float = 120) -> tuple[int, str, str]:
    """``python -m module argv`` as a process of its own: (exit status, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZKCRAWL_", "PG"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-m", module, *argv], env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def consumer(zk_hosts: str, zk_root: str, out: str, **env: str) -> tuple[int, str]:
    status, _out, err = run("zkcrawl.consumer.main", "--zk", zk_hosts, "--root", zk_root, "--out",
                            out, "--log-format", "json", "--exit-when-idle", "1",
                            env_extra=env)
    return status, err


# -- PostgreSQL: a refusal for good is exit 2 ----------------------------------------------

@pytest.mark.slow
def test_a_missing_database_or_role_and_a_wrong_password_are_exit_2(pg_server, zk_hosts,
                                                                     zk_root):
    base = f"postgresql://{{role}}@127.0.0.1:{pg_server.port}/{{db}}?table=t_{uuid.uuid4().hex[:8]}"
    status, err = consumer(zk_hosts, zk_root, base.format(role="postgres", db="nosuchdb"))
    assert status == ExitStatus.USAGE, err
    assert 'database "nosuchdb" does not exist (SQLSTATE 3D000' in err, err
    assert len(err.strip().splitlines()) == 1, err
    status, err = consumer(zk_hosts, zk_root, base.format(role="nosuchrole", db="postgres"))
    assert status == ExitStatus.USAGE and "SQLSTATE 28000" in err, err
    role = f"r_{uuid.uuid4().hex[:8]}"
    pg_server.add_password_role(role, "right-password")
    pg_server.query(f"GRANT CREATE ON SCHEMA public TO {role}")
    status, err = consumer(zk_hosts, zk_root, base.format(role=role, db="postgres"),
                           PGPASSWORD="wrong-password")
    assert status == ExitStatus.USAGE and "SQLSTATE 28P01, wrong password" in err, err
    assert "wrong-password" not in err and len(err.strip().splitlines()) == 1, err
    # The right password from the environment: the consumer runs and exits when idle.
    status, err = consumer(zk_hosts, zk_root, base.format(role=role, db="postgres"),
                           PGPASSWORD="right-password")
    assert status == ExitStatus.OK, err


def test_no_server_is_still_exit_75():
    status, _out, err = run("zkcrawl.cli", "report",
                            f"postgresql://postgres@127.0.0.1:{free_port()}/postgres")
    assert status == ExitStatus.TEMPFAIL and len(err.strip().splitlines()) == 1, err


@given(st.text(max_size=300))
def test_refusal_decodes_any_message(text):
    found = refusal(text)
    assert found is None or (len(found[0]) == 5 and found[1])


# -- "did you mean" for flags, choices and TOML keys ----------------------------------------

def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(("argv", "suggestion"), [
    (["--treads", "4"], "unrecognized arguments: --treads 4; did you mean --threads?"),
    (["--zk-timout=3"], "did you mean --zk-timeout?"),
    (["--xyzzy"], "unrecognized arguments: --xyzzy"),
])
def test_a_misspelt_consumer_flag_gets_the_nearest(capsys, argv, suggestion):
    assert consumer_main(argv, {}) == ExitStatus.USAGE
    line = one_line(capsys)
    assert line.startswith("zkcrawl-consumer: error: ") and line.endswith(suggestion), line
    if argv == ["--xyzzy"]:
        assert "did you mean" not in line  # nothing near: no guess


def test_a_misspelt_command_choice_and_producer_flag(capsys):
    assert cli_main(["stauts"], {}) == ExitStatus.USAGE
    assert one_line(capsys).endswith("; did you mean status?")
    assert cli_main(["dead", "lst"], {}) == ExitStatus.USAGE
    assert one_line(capsys).endswith("; did you mean list?")
    assert producer_main(["--link-css", "a"], {}) == ExitStatus.USAGE
    assert one_line(capsys).endswith("; did you mean --links-css?")


def test_a_misspelt_toml_key_gets_the_nearest(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("treads = 4\n")
    assert consumer_main(["--config", str(cfg)], {}) == ExitStatus.USAGE
    assert one_line(capsys).endswith(f"unknown key 'treads' in {cfg}; did you mean threads?")


@given(st.text(max_size=40), st.lists(st.text(max_size=20), max_size=5))
def test_did_you_mean_takes_any_text(given_name, known):
    hint = did_you_mean(given_name, known)
    assert hint == "" or (hint.startswith("; did you mean ") and hint.endswith("?"))


# -- ZooKeeper: a refused loopback port fails at once; a slow one says it waits -------------

def test_a_refused_loopback_port_fails_at_once_on_a_terminal():
    started = time.monotonic()
    rc, screen = on_terminal("status", "--zk", f"127.0.0.1:{free_port()}", "--zk-timeout",
                             "60")
    elapsed = time.monotonic() - started
    assert rc == ExitStatus.TEMPFAIL
    [line] = [x for x in screen.replace("\r", "").splitlines() if x.strip()]
    assert line.startswith("zkcrawl status: error: cannot reach ZooKeeper at 127.0.0.1:")
    assert "(connection refused: nothing listens there)" in line, line
    assert "within" not in line and elapsed < 60, (line, elapsed)  # did not wait it out


def test_a_supervised_process_keeps_trying_for_the_timeout():
    """Without a terminal (systemd, Kubernetes) a refused port is an outage like any other:
    the restart arithmetic of deploy/systemd counts on each start taking --zk-timeout."""
    hosts = f"127.0.0.1:{free_port()}"
    with pytest.raises(ZkUnavailable, match=r"within 1s \(timed out\)"):
        ZkClient(hosts, zk_timeout=1).connect()
    with pytest.raises(ZkUnavailable, match=r"\(connection refused: nothing listens there\)"):
        ZkClient(hosts, zk_timeout=60).connect(refused_fails=True)


@given(st.text(max_size=60))
def test_refused_on_loopback_takes_any_connection_string(hosts):
    assert refused_on_loopback(hosts, timeout=0.2) in (True, False)


def test_remote_or_listening_servers_are_not_refused():
    assert not refused_on_loopback("zk.example.invalid:2181")  # not ours to judge: no probe
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        assert not refused_on_loopback(f"127.0.0.1:{port}")
        assert not refused_on_loopback(f"127.0.0.1:{free_port()},127.0.0.1:{port}")
    assert refused_on_loopback(f"127.0.0.1:{free_port()},localhost:{free_port()}/chroot")


def test_a_terminal_hears_what_the_connection_waits_for():
    """A server that accepts and never answers: on a TTY one line says what is awaited and
    for how long, then the usual one line and exit 75 after --zk-timeout."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never answers
        port = silent.getsockname()[1]
        rc, screen = on_terminal("status", "--zk", f"127.0.0.1:{port}", "--zk-timeout", "3")
    assert rc == ExitStatus.TEMPFAIL
    lines = [x for x in screen.replace("\r", "").splitlines() if x.strip()]
    assert lines[0] == f"connecting to ZooKeeper at 127.0.0.1:{port} (up to 3 s)...", lines
    assert len(lines) == 2 and "within 3s (timed out)" in lines[1], lines


def on_terminal(*argv: str, timeout: float = 60) -> tuple[int, str]:
    """``zkcrawl ARGV`` with stdout and stderr on a pseudo-terminal: (exit status, screen)."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZKCRAWL_")}
    proc = subprocess.Popen([sys.executable, "-m", "zkcrawl.cli", *argv], cwd=ROOT,
                            env={**env, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave)
    os.close(slave)
    try:
        screen = read_all(master, proc, timeout)
    finally:
        os.close(master)
    return proc.wait(10), screen


def read_all(master: int, proc: subprocess.Popen[bytes], timeout: float) -> str:
    """Everything the process writes to its terminal until it exits (bounded)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the other end is closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    else:
        proc.kill()
        raise AssertionError("the command did not exit in time")
    return b"".join(chunks).decode("utf-8", "replace")


# -- dead / queue on a root that does not exist ---------------------------------------------

def test_dead_and_queue_say_the_root_does_not_exist(zk_hosts, zk_root, capsys):
    base = ["--zk", zk_hosts, "--root", zk_root]
    note = f"root {zk_root} does not exist yet: nothing ran here (check --root)"
    for argv, shown in ((["dead", "list"], f"no dead letters: {note}"),
                        (["queue", "list"], f"0 queued: {note}")):
        assert cli_main([*argv, *base], {}) == ExitStatus.OK
        assert capsys.readouterr().out.strip() == shown
        assert cli_main([*argv, *base, "--json"], {}) == ExitStatus.OK
        assert capsys.readouterr().out.strip() == "[]"
    for argv in (["dead", "requeue", "--all"], ["dead", "purge", "--all", "--yes"],
                 ["queue", "purge", "--yes"]):
        assert cli_main([*argv, *base], {}) == ExitStatus.FAILURE
        assert one_line(capsys) == f"zkcrawl {argv[0]}: error: {note}"
