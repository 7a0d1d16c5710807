"""Every entry point: a malformed ``--zk`` is one line and exit 2 (never a traceback),
``--version`` answers, and flags are never abbreviated."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.cli import build_parser
from zkcrawl.cli import main as admin_main
from zkcrawl.consumer.main import main as consumer_main
from zkcrawl.errors import UsageError
from zkcrawl.producer.main import main as producer_main
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
    from zkcrawl.bench import command as bench

    settings = bench.Settings()
    settings.validate()  # "" is allowed here, and only here
    with pytest.raises(UsageError):
        bench.Settings(zk="host:notaport").validate()


# -- help that teaches ------------------------------------------------------------------------

def _help_of(main, argv, capsys) -> str:
    assert main([*argv, "--help"], {}) == 0
    return capsys.readouterr().out


ADMIN = list(build_parser()[1])  # every admin command, as registered
ALL_HELP = [("zkcrawl-consumer", consumer_main, []), ("zkcrawl-producer", producer_main, []),
            *[(f"zkcrawl {c}", admin_main, [c]) for c in ADMIN]]


@pytest.mark.parametrize("prog, main, argv", ALL_HELP, ids=[p for p, _, _ in ALL_HELP])
def test_help_lists_own_options_first_then_shared_groups_then_examples(prog, main, argv,
                                                                       capsys):
    text = _help_of(main, argv, capsys)
    assert text.startswith(f"usage: {prog} [options]")  # the options are below, grouped
    assert "--zk" not in text.split("\n\n", 1)[0]
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


# -- environment names and --print-config ---------------------------------------------------

def test_each_command_has_its_own_environment_names(capsys):
    """ZKCRAWL_TIMEOUT once meant a fetch timeout, a listing timeout and the demo's deadline."""
    env = {"ZKCRAWL_CONSUMER_TIMEOUT": "20", "ZKCRAWL_PRODUCER_TIMEOUT": "7",
           "ZKCRAWL_DEMO_TIMEOUT": "300", "ZKCRAWL_ZK": "zk9:2181", "ZKCRAWL_ROOT": "/c"}
    assert consumer_main(["--print-config"], env) == 0
    out = capsys.readouterr().out
    assert "timeout = 20.0" in out and "# env ZKCRAWL_CONSUMER_TIMEOUT" in out
    assert 'zk = "zk9:2181"' in out and "# env ZKCRAWL_ZK\n" in out  # shared by every command
    assert producer_main(["--print-config", "--start", "http://x.test/"], env) == 0
    assert "timeout = 7.0" in capsys.readouterr().out
    assert admin_main(["demo", "--print-config"], env) == 0
    assert "timeout = 300.0" in capsys.readouterr().out
    assert admin_main(["bench", "queue", "--print-config"], env) == 0
    out = capsys.readouterr().out  # a benchmark never inherits the cluster's ZooKeeper
    assert 'zk = ""' in out and "ZKCRAWL_ZK" not in out


def test_old_names_work_for_the_daemons_with_one_deprecation_line(capsys):
    env = {"ZKCRAWL_TIMEOUT": "2", "ZKCRAWL_THREADS": "3"}
    assert consumer_main(["--print-config"], env) == 0
    out, err = capsys.readouterr()
    assert "timeout = 2.0" in out and "threads = 3" in out
    lines = err.splitlines()
    assert len(lines) == 2 and all("deprecated" in line for line in lines), err
    assert any("ZKCRAWL_TIMEOUT" in x and "ZKCRAWL_CONSUMER_TIMEOUT" in x for x in lines)
    # the new name wins, silently; an admin command never reads the old one
    assert consumer_main(["--print-config"], {**env, "ZKCRAWL_CONSUMER_TIMEOUT": "9",
                                              "ZKCRAWL_CONSUMER_THREADS": "4"}) == 0
    out, err = capsys.readouterr()
    assert "timeout = 9.0" in out and err == ""
    assert admin_main(["demo", "--print-config"], env) == 0
    out, err = capsys.readouterr()
    assert "timeout = 90.0" in out and "# default" in out and err == ""


def test_print_config_names_every_source_and_hides_secrets(tmp_path, capsys):
    cfg = tmp_path / "consumer.toml"
    cfg.write_text('threads = 5\nuser-agent = "bot/1"\n')
    env = {"ZKCRAWL_CONSUMER_CONFIG": str(cfg), "ZKCRAWL_CONSUMER_BACKLOG": "6",
           "ZKCRAWL_ZK_AUTH": "digest:alice:s3cret"}
    # nothing listens on port 1: --print-config must not connect (else exit 75)
    assert consumer_main(["--print-config", "--grace", "4", "--zk", "127.0.0.1:1"], env) == 0
    out, err = capsys.readouterr()
    rows = dict(line.split("  # ", 1) for line in out.splitlines()[1:])
    rows = {k.rstrip(): v for k, v in rows.items()}
    assert rows["grace = 4.0"] == "flag --grace"
    assert rows["backlog = 6"] == "env ZKCRAWL_CONSUMER_BACKLOG"
    assert rows["threads = 5"] == f"file {cfg}"
    assert rows["max-attempts = 3"] == "default"
    assert rows['zk-auth = "***"'] == "env ZKCRAWL_ZK_AUTH"
    assert "s3cret" not in out + err
    # the output is a config file the command accepts
    again = tmp_path / "again.toml"
    again.write_text(out.replace('zk-auth = "***"', "# "))
    assert consumer_main(["--print-config", "--config", str(again)], {}) == 0
    assert "threads = 5" in capsys.readouterr().out


def test_print_config_of_an_invalid_value_is_exit_2(capsys):
    assert admin_main(["status", "--print-config", "--watch", "-1"], {}) == 2
    out, err = capsys.readouterr()
    assert "watch = -1.0" in out and err.count("\n") == 1 and "--watch" in err


#: What each command needs besides flags, to get as far as its settings.
REQUIRED = {"zkcrawl-producer": ["--start", "http://x.test/"], "zkcrawl dead": ["list"],
            "zkcrawl queue": ["list"], "zkcrawl report": ["r.jsonl"],
            "zkcrawl local-zk": ["status"], "zkcrawl bench": ["queue"],
            "zkcrawl try": ["http://x.test/"], "zkcrawl acl": ["check"]}


@pytest.mark.parametrize("prog, main, argv", ALL_HELP, ids=[p for p, _, _ in ALL_HELP])
def test_print_config_on_every_command(prog, main, argv, capsys):
    assert main([*argv, *REQUIRED.get(prog, []), "--print-config"], {}) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# {prog}: effective settings") and "# default" in out


# -- every value validated at start ----------------------------------------------------------

NO_ZK = ["--zk", "127.0.0.1:1", "--zk-timeout", "0.2"]  # a value that passes would try to connect
BAD_FORMS = [
    (consumer_main, ["--user-agent", "bot\r\nX-Injected: 1"], "--user-agent: control"),
    (consumer_main, ["--user-agent", " "], "--user-agent: it is empty"),
    (consumer_main, ["--field", "x=//["], "--field: invalid XPath"),
    (consumer_main, ["--threads", "0"], "--threads"),
    (producer_main, ["--start", "http://x.test/", "--user-agent", "é"], "non-ASCII"),
    (producer_main, ["--from-file", "/"], "is a directory"),
    (producer_main, ["--start", "http://x.test/", "--allow", "("], "--allow: invalid regex"),
    (producer_main, ["--start", "nota url"], "--start: not an absolute"),
    (producer_main, ["--pages", "http://x.test/{pag}", "--page-range", "1-2"], "--pages"),
    (producer_main, ["--pages", "http://x.test/{page}", "--page-range", "3-1"], "--page-range"),
    (admin_main, ["local-zk", "status", "--port", "70000"], "--port must be 1..65535"),
    (admin_main, ["local-zk", "start", "--data-dir", "/etc/hostname"], "not a directory"),
    (admin_main, ["demo", "--out-dir", ""], "--out-dir must not be empty"),
    (admin_main, ["report", "--html", "", "r.jsonl"], "--html needs a file name"),
    (admin_main, ["bench", "crawl", "--threads", "0"], "--threads must be 1..1024"),
    (admin_main, ["bench", "queue", "--items", "-1"], "--items must be >= 0"),
    (admin_main, ["status", "--watch", "0.001"], "--watch must be 0"),
    (admin_main, ["pause", "--wait", "-1"], "--wait must be >= 0"),
]


@pytest.mark.parametrize("main, argv, needle", BAD_FORMS, ids=[" ".join(a)[:40] for _, a, _ in
                                                                BAD_FORMS])
def test_a_bad_value_is_one_line_and_exit_2_before_connecting(main, argv, needle, capsys):
    assert main([*argv, *NO_ZK], {}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err
    assert err.startswith("zkcrawl")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_an_accepted_user_agent_is_one_header_value(text):
    from zkcrawl.settings import header_value_problem

    if header_value_problem(text) is None:
        encoded = text.encode("ascii")
        assert b"\r" not in encoded and b"\n" not in encoded and text.strip()


@pytest.mark.parametrize("prog, main, argv", ALL_HELP, ids=[p for p, _, _ in ALL_HELP])
def test_no_command_takes_an_abbreviated_flag(prog, main, argv, capsys):
    assert main([*argv, *REQUIRED.get(prog, []), "--log-lev", "debug"], {}) == 2
    assert "unrecognized arguments: --log-lev" in capsys.readouterr().err


def test_helper_entry_points_take_no_abbreviation_either():
    import subprocess
    import sys

    for module in ("zkcrawl.admin.samplesite", "zkcrawl.bench.site", "zkcrawl.bench.offer"):
        proc = subprocess.run([sys.executable, "-m", module, "--hos", "127.0.0.1"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "unrecognized arguments: --hos" in proc.stderr, module


def test_an_invalid_value_from_the_environment_or_a_file_names_its_source(tmp_path, capsys):
    assert consumer_main([], {"ZKCRAWL_CONSUMER_THREADS": "0"}) == 2
    assert capsys.readouterr().err == ("zkcrawl-consumer: error: --threads must be at least 1, "
                                       "got 0 (from env ZKCRAWL_CONSUMER_THREADS)\n")
    cfg = tmp_path / "status.toml"
    cfg.write_text("watch = -1\n")
    assert admin_main(["status", "--config", str(cfg)], {}) == 2
    assert capsys.readouterr().err.rstrip().endswith(f"(from file {cfg})")
