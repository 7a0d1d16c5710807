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


# -- help that teaches ------------------------------------------------------------------------

def _help_of(main, argv, capsys) -> str:
    assert main([*argv, "--help"], {}) == 0
    return capsys.readouterr().out


ADMIN = ["status", "pause", "resume", "dead", "queue", "report", "local-zk", "demo", "bench"]
ALL_HELP = [("zkcrawl-consumer", consumer_main, []), ("zkcrawl-producer", producer_main, []),
            *[(f"zkcrawl {c}", admin_main, [c]) for c in ADMIN]]


@pytest.mark.parametrize("prog, main, argv", ALL_HELP, ids=[p for p, _, _ in ALL_HELP])
def test_help_lists_own_options_first_then_shared_groups_then_examples(prog, main, argv,
                                                                       capsys):
    text = _help_of(main, argv, capsys)
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":")
                and not line.startswith(" ")]
    shared = ["ZooKeeper", "ZooKeeper security", "logging", "configuration", "general",
              "examples"]
    assert headings[-len(shared):] == shared, headings
    own = headings[:-len(shared)]
    assert own and own[0] != "ZooKeeper", headings  # the command's own options come first
    examples = text.split("\nexamples:\n", 1)[1]
    assert examples.count(prog) >= 2, examples  # at least two worked command lines


def test_consumer_and_producer_help_are_grouped_by_topic(capsys):
    consumer = _help_of(consumer_main, [], capsys)
    for heading in ("workers:", "fetching:", "politeness:", "output:", "delivery:",
                    "operations:"):
        assert f"\n{heading}\n" in consumer, heading
    section = consumer.split("\noutput:\n", 1)[1].split("\n\n", 1)[0]
    assert "--out" in section and "--field" in section and "--threads" not in section
    producer = _help_of(producer_main, [], capsys)
    section = producer.split("\ninput:\n", 1)[1].split("\n\n", 1)[0]
    assert "--start" in section and "--links-css" in section and "--batch" not in section


def test_one_keyword_puts_a_new_flag_under_its_heading():
    import argparse
    import dataclasses

    from zkcrawl.settings import OUTPUT, ArgumentParser, CommonSettings, add_options, opt

    @dataclasses.dataclass(frozen=True)
    class Extended(CommonSettings):
        sink_url: str | None = opt(None, "where records go", group=OUTPUT)
        knob: int = opt(1, "a knob of a brand-new kind", group="tuning")
        plain: int = opt(2, "no group: the command's own options")

    parser = ArgumentParser(prog="x")
    add_options(parser, Extended, "x --knob 3")
    text = parser.format_help()
    titles = [g.title for g in parser._action_groups]
    assert titles.index("options") < titles.index(OUTPUT) < titles.index("tuning") \
        < titles.index("ZooKeeper")
    assert "output:\n  --sink-url" in text and "tuning:\n  --knob" in text
    assert text.rstrip().endswith("examples:\n  x --knob 3")
    assert isinstance(parser.parse_args(["--knob", "3"]), argparse.Namespace)
