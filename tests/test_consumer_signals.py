"""Signals and faults with real consumer processes, a real ZooKeeper and real HTTP servers."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.httpd import TestServer, delayed
from tests.queue_view import held, queued_urls
from tests.test_consumer_support import Running, offer, records, settings_for, spawn, stats_held
from zkcrawl.consumer.main import main
from zkcrawl.signals import StopSignals


def page(h):  # type: ignore[no-untyped-def]
    return 200, {"Content-Type": "text/html"}, f"<title>T{h.path}</title>".encode()


def args(zk_hosts: str, zk_root: str, out: Path, *extra: str) -> list[str]:
    return ["--zk", zk_hosts, "--root", zk_root, "--out", str(out), "--no-robots",
            "--domain-delay", "0", "--log-format", "json", "--session-timeout", "3",
            "--allow-private-addresses", *extra]


def no_traceback(text: str) -> bool:
    return "Traceback" not in text


def test_sigterm_finishes_running_fetches_releases_the_rest_and_exits_0(zk, zk_hosts, zk_root,
                                                                        tmp_path):
    with TestServer({"/s/*": delayed(0.8, page)}) as srv:
        urls = [srv.url(f"/s/{i}") for i in range(20)]
        offer(zk, zk_root, urls)
        out, err = tmp_path / "o.jsonl", tmp_path / "err.log"
        proc = spawn(args(zk_hosts, zk_root, out, "--threads", "2", "--backlog", "4",
                          "--grace", "10", "--stats-interval", "0.2"), err)
        srv.wait_for_requests(2, timeout=20)
        wait_for(lambda: stats_held(err) == 6, what="6 items held: 2 running, 4 waiting")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - t0 < 5  # the two running fetches (0.8 s), not the grace
    done = {r["url"] for r in records(out)}
    assert len(done) >= 2  # the fetches running at SIGTERM were finished and recorded
    assert held(zk, zk_root) == []
    assert sorted(queued_urls(zk, zk_root)) == sorted(set(urls) - done)  # nothing lost
    assert no_traceback(err.read_text())


def test_a_second_signal_releases_everything_and_exits_at_once(zk, zk_hosts, zk_root,
                                                               tmp_path):
    with TestServer({"/h/*": delayed(30, page)}) as srv:
        urls = [srv.url(f"/h/{i}") for i in range(8)]
        offer(zk, zk_root, urls)
        out, err = tmp_path / "o.jsonl", tmp_path / "err.log"
        proc = spawn(args(zk_hosts, zk_root, out, "--id", "hang", "--threads", "2",
                          "--backlog", "2", "--grace", "60"), err)
        srv.wait_for_requests(2, timeout=20)
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: b'"draining"' in zk.get(f"{zk_root}/consumers/hang")[0],
                 what="draining")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 3
    assert held(zk, zk_root) == []
    assert sorted(queued_urls(zk, zk_root)) == sorted(urls) and records(out) == []
    assert no_traceback(err.read_text())


def test_sigkill_mid_crawl_every_url_is_still_recorded_at_least_once(zk, zk_hosts, zk_root,
                                                                     tmp_path):
    with TestServer({"/k/*": delayed(0.1, page)}) as srv:
        urls = [srv.url(f"/k/{i}") for i in range(40)]
        offer(zk, zk_root, urls)
        out_a, out_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
        a = spawn(args(zk_hosts, zk_root, out_a, "--id", "a", "--threads", "4", "--backlog",
                       "4"), tmp_path / "a.log")
        wait_for(lambda: len(records(out_a, strict=False)) >= 8, what="a under way")
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
        # b starts while a still owns the partitions; they pass to b when a's session expires (3 s).
        b = spawn(args(zk_hosts, zk_root, out_b, "--id", "b", "--threads", "4",
                       "--exit-when-idle", "5"), tmp_path / "b.log")
        assert b.wait(timeout=60) == 0
    got = [r["url"] for r in records(out_a, strict=False) + records(out_b)]
    assert set(got) == set(urls)
    assert len(got) - len(urls) <= 8  # duplicates only from a's 8 items held at the kill
    assert queued_urls(zk, zk_root) == [] == held(zk, zk_root)


def test_a_sink_failure_stops_releases_and_exits_1_losing_nothing(zk, zk_hosts, zk_root,
                                                                  tmp_path):
    def small_files() -> None:  # the disk is "full" after ~3 KB: a real EFBIG on write
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))

    with TestServer({"/f/*": delayed(0.02, page)}) as srv:
        urls = [srv.url(f"/f/{i}") for i in range(40)]
        offer(zk, zk_root, urls)
        out = tmp_path / "o.jsonl"
        proc = spawn(args(zk_hosts, zk_root, out, "--threads", "4", "--exit-when-idle", "3"),
                     subprocess.PIPE, preexec_fn=small_files)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    lines = err.decode().strip().splitlines()
    assert lines[-1].startswith("zkcrawl-consumer: error: cannot write results to")
    assert no_traceback(err.decode())
    recorded = [r["url"] for r in records(out)]  # only whole lines: the partial one was cut
    assert 0 < len(recorded) < len(urls)
    assert held(zk, zk_root) == []
    assert set(recorded) | set(queued_urls(zk, zk_root)) == set(urls)  # nothing lost


@pytest.mark.parametrize(("extra", "message"), [
    (["--field", "bad=//a[", "--zk", "127.0.0.1:1"], "--field: invalid XPath"),
    (["--threads", "0"], "--threads must be at least 1"),
    (["--out", "/nonexistent/dir/o.jsonl", "--zk", "127.0.0.1:1"], "--out: cannot open"),
])
def test_bad_usage_is_one_line_and_exit_2(capsys, extra: list[str], message: str):
    assert main(["--log-format", "json", *extra], {}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("zkcrawl-consumer: error:")


def test_unreachable_zookeeper_is_one_line_and_exit_75(capsys):
    # EX_TEMPFAIL (SPEC §4): temporary, so a supervisor restarts it, unlike a 2.
    assert main(["--log-format", "json", "--zk", "127.0.0.1:1", "--zk-timeout", "1"], {}) == 75
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach ZooKeeper" in err[0]
    assert err[0].startswith("zkcrawl-consumer: error:")


def test_config_file_and_environment_follow_the_precedence(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text('threads = 0\nzk = "127.0.0.1:1"\n')
    assert main(["--config", str(cfg)], {}) == 2  # from the file
    assert "--threads" in capsys.readouterr().err
    env = {"ZKCRAWL_CONSUMER_CONFIG": str(cfg), "ZKCRAWL_CONSUMER_THREADS": "2",
           "ZKCRAWL_ZK_TIMEOUT": "0.5"}
    assert main(["--log-format", "json"], env) == 75  # env beats the file: now ZK is the issue
    assert "cannot reach ZooKeeper" in capsys.readouterr().err


def test_out_dash_writes_only_records_to_stdout(zk, zk_hosts, zk_root, tmp_path):
    with TestServer({"/o/*": page}) as srv:
        urls = [srv.url(f"/o/{i}") for i in range(5)]
        offer(zk, zk_root, urls)
        proc = spawn(args(zk_hosts, zk_root, Path("-"), "--exit-when-idle", "1"),
                     tmp_path / "err.log", stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    got = [json.loads(line) for line in out.decode().splitlines()]  # nothing but records
    assert sorted(r["url"] for r in got) == sorted(urls)


def test_an_id_held_by_a_live_consumer_is_a_usage_error(zk, zk_hosts, zk_root, tmp_path,
                                                        capsys):
    first = Running(settings_for(zk_hosts, zk_root, tmp_path / "a.jsonl", "--id", "dup"))
    try:
        wait_for(lambda: zk.exists(f"{zk_root}/consumers/dup"), what="first registered")
        rc = main(args(zk_hosts, zk_root, tmp_path / "b.jsonl", "--id", "dup",
                       "--session-timeout", "1"), {})
        assert zk.exists(f"{zk_root}/consumers/dup") is not None  # the first one's, intact
    finally:
        first.stop()
    err = capsys.readouterr().err.splitlines()  # the first consumer's logs are there too
    assert rc == 2 and any(line.startswith("zkcrawl-consumer: error:")
                           and "held by another live process" in line for line in err)


# -- zkcrawl.signals, in this process (pytest runs tests in the main thread) ------------------

def test_stop_signals_first_drains_second_forces_then_restores():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    calls: list[bool] = []
    with StopSignals(calls.append) as sigs:
        assert not sigs.stopping
        signal.raise_signal(signal.SIGTERM)
        assert calls == [False] and sigs.stopping and not sigs.forced
        assert sigs.signum == signal.SIGTERM
        signal.raise_signal(signal.SIGINT)  # the other one counts as the second too
        assert calls == [False, True] and sigs.forced and sigs.signum == signal.SIGTERM
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_stop_signals_hard_second_gives_the_default_action_back():
    with StopSignals(hard_second=True) as sigs:
        signal.raise_signal(signal.SIGINT)
        assert sigs.stopping and sigs.signum == signal.SIGINT
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second one ends us
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_stop_signals_join_runs_on_stop_outside_the_handler_once():
    release = threading.Event()
    worker = threading.Thread(target=release.wait, args=(10,), daemon=True)
    stops: list[tuple[int, str]] = []

    def on_stop(signum: int) -> None:
        stops.append((signum, threading.current_thread().name))
        release.set()

    with StopSignals(hard_second=True) as sigs:
        worker.start()
        threading.Timer(0.05, signal.raise_signal, (signal.SIGTERM,)).start()
        # raise_signal from the timer thread still runs the handler in the main thread
        t0 = time.monotonic()
        sigs.join(worker, on_stop, poll=0.02)
    assert stops == [(signal.SIGTERM, threading.main_thread().name)]
    assert not worker.is_alive() and time.monotonic() - t0 < 5


def test_stop_signals_off_the_main_thread_install_nothing():
    seen: list[object] = []

    def body() -> None:
        with StopSignals(seen.append) as sigs:
            seen.append(sigs.stopping)

    before = signal.getsignal(signal.SIGTERM)
    t = threading.Thread(target=body)
    t.start()
    t.join(5)
    assert seen == [False] and signal.getsignal(signal.SIGTERM) == before


def test_a_lingering_stop_absorbs_a_late_signal_until_restored():
    """The consumer's teardown after its run: a second SIGTERM arriving then is counted,
    not the default action (CI: the process died with -15 instead of exiting 0)."""
    import os

    before = signal.getsignal(signal.SIGTERM)
    calls: list[bool] = []
    signals = StopSignals(calls.append, linger=True)
    with signals:
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: calls == [False], 5, "the first signal handled")
    os.kill(os.getpid(), signal.SIGTERM)  # after the block: absorbed, this process lives
    wait_for(lambda: signals.received == 2, 5, "the late signal counted")
    assert calls == [False]  # nothing more asked of the worker
    signals.restore()
    assert signal.getsignal(signal.SIGTERM) == before


def test_sigusr1_writes_every_threads_stack_and_the_consumer_goes_on(zk, zk_hosts, zk_root,
                                                                     tmp_path):
    """kill -USR1: every thread's stack on stderr (where a stuck consumer is, without a
    debugger -- the fault tests ask for one before they give up on a process); the consumer
    keeps crawling and still drains and exits 0 on SIGTERM."""
    with TestServer({"/u/*": page}) as srv:
        out, err = tmp_path / "o.jsonl", tmp_path / "err.log"
        proc = spawn(args(zk_hosts, zk_root, out, "--threads", "2"), err)
        try:
            wait_for(lambda: '"consumer.started"' in err.read_text(), 30, "started")
            proc.send_signal(signal.SIGUSR1)
            # every thread, whole: the claim loop's (the main thread's) among them
            wait_for(lambda: 'File "' in (dump := err.read_text()) and "worker.py" in dump
                     and dump.count("most recent call first") >= 8, 10, "the stacks")
            offer(zk, zk_root, [srv.url("/u/1")])
            wait_for(lambda: len(records(out, strict=False)) == 1, 30, "still crawling")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert "Traceback" not in err.read_text()
