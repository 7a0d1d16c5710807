"""Every entry point: a malformed ``--zk`` is one line and exit 2 (never a traceback),
``--version`` answers, and flags are never abbreviated."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.main import main as consumer_main
from producer.main import main as producer_main
from zkcrawl.cli import main as admin_main
from zkcrawl.errors import UsageError
from zkcrawl.settings import version, zk_hosts_problem

BAD_ZK = ["127.0.0.1:notaport", ":99999", "", "127.0.0.1:99999", "zk 1:2181", "zk:2181/a//b"]
ENTRY_POINTS = [
    ("zkcrawl", admin_main, ["status"]),
    ("zkcrawl-producer", producer_main, ["--start", "http://x.test/"]),
    ("zkcrawl-consumer", consumer_main, []),
]


@pytest.mark.parametrize("bad", BAD_ZK)
@pytest.mark.parametrize("prog, main, argv", ENTRY_POINTS, ids=[p for p, _, _ in ENTRY_POINTS])
def test_a_malformed_zk_is_one_line_and_exit_2(prog, main, argv, bad, capsys):
    assert main([*argv, "--zk", bad, "--log-format", "json"], {}) == 2
    _out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "--zk:" in err and "Traceback" not in err, err
    assert err.startswith(f"{prog}")


@pytest.mark.parametrize("prog, main, argv", ENTRY_POINTS, ids=[p for p, _, _ in ENTRY_POINTS])
def test_version_on_every_command(prog, main, argv, capsys):
    assert main([*argv[:1], "--version"] if argv[:1] == ["status"] else ["--version"], {}) == 0
    out = capsys.readouterr().out
    assert version() in out and prog in out


def test_flags_are_never_abbreviated(capsys):
    assert producer_main(["--star", "http://x.test/"], {}) == 2
    assert "unrecognized arguments: --star" in capsys.readouterr().err


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_zk_hosts_check_never_raises(text):
    assert zk_hosts_problem(text) is None or isinstance(zk_hosts_problem(text), str)


def test_bench_without_zk_means_a_throwaway_server_not_a_bad_zk():
    from zkcrawl.admin.commands import bench

    settings = bench.Settings()
    settings.validate()  # "" is allowed here, and only here
    with pytest.raises(UsageError):
        bench.Settings(zk="host:notaport").validate()
