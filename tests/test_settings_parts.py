"""The one precedence rule of zkcrawl.settings, for one option of every command.

flag > environment (``ZKCRAWL_<COMMAND>_<FLAG>``, or ``ZKCRAWL_<FLAG>`` for a shared flag)
> TOML file > default, through the commands' own parsers and settings classes (in-process:
the parse functions, no process started); and the value decoders on hostile input.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import graphlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zkcrawl.settings
from zkcrawl.cli import COMMANDS
from zkcrawl.cli import build_parser as admin_parser
from zkcrawl.consumer.main import build_parser as consumer_parser
from zkcrawl.consumer.settings import ConsumerSettings
from zkcrawl.errors import UsageError
from zkcrawl.producer.main import build_parser as producer_parser
from zkcrawl.producer.settings import ProducerSettings
from zkcrawl.settings import resolve
from zkcrawl.settings.decode import MAX_FLOAT, MAX_INT, decode
from zkcrawl.settings.options import fields
from zkcrawl.settings.sources import gather


@dataclasses.dataclass(frozen=True)
class Case:
    """One option of one command, and a value for each source (flag, env, file)."""

    command: str  # zkcrawl-consumer, zkcrawl-producer, or an admin subcommand
    argv: tuple[str, ...]  # what the command needs besides the option (positionals...)
    field: str
    variable: str  # its environment name (SPEC §4), spelt out
    flag: tuple[str, ...]
    env: str
    toml: str  # the value as TOML source text
    expected: tuple[Any, Any, Any]  # from the flag, the environment, the file


CASES = [
    Case("zkcrawl-consumer", (), "threads", "ZKCRAWL_CONSUMER_THREADS",
         ("--threads", "5"), "6", "7", (5, 6, 7)),
    Case("zkcrawl-producer", ("--start", "http://127.0.0.1/"), "batch",
         "ZKCRAWL_PRODUCER_BATCH", ("--batch", "50"), "60", "70", (50, 60, 70)),
    Case("status", (), "watch", "ZKCRAWL_STATUS_WATCH", ("--watch", "2"), "3", "4.5",
         (2.0, 3.0, 4.5)),
    Case("pause", (), "wait", "ZKCRAWL_PAUSE_WAIT", ("--wait", "1"), "2", "3", (1.0, 2.0, 3.0)),
    Case("resume", (), "wait", "ZKCRAWL_RESUME_WAIT", ("--wait", "1"), "2", "3",
         (1.0, 2.0, 3.0)),
    Case("dead", ("list",), "json", "ZKCRAWL_DEAD_JSON", ("--json",), "off", "true",
         (True, False, True)),
    Case("queue", ("list",), "limit", "ZKCRAWL_QUEUE_LIMIT", ("--limit", "5"), "6", "7",
         (5, 6, 7)),
    Case("report", ("r.jsonl",), "html", "ZKCRAWL_REPORT_HTML", ("--html", "a.html"),
         "b.html", '"c.html"', ("a.html", "b.html", "c.html")),
    Case("local-zk", ("status",), "port", "ZKCRAWL_LOCAL_ZK_PORT", ("--port", "3000"),
         "3001", "3002", (3000, 3001, 3002)),
    Case("demo", (), "timeout", "ZKCRAWL_DEMO_TIMEOUT", ("--timeout", "30"), "40", "50",
         (30.0, 40.0, 50.0)),
    Case("bench", ("queue",), "threads", "ZKCRAWL_BENCH_THREADS", ("--threads", "8"), "9",
         "10", (8, 9, 10)),
    Case("try", ("http://127.0.0.1/",), "timeout", "ZKCRAWL_TRY_TIMEOUT",
         ("--timeout", "5"), "6", "7", (5.0, 6.0, 7.0)),
    Case("exporter", (), "refresh", "ZKCRAWL_EXPORTER_REFRESH", ("--refresh", "5"), "6", "7",
         (5.0, 6.0, 7.0)),
    # acl has no option of its own: a shared one, whose name has no command in it
    Case("acl", ("check",), "zk_timeout", "ZKCRAWL_ZK_TIMEOUT", ("--zk-timeout", "5"), "6",
         "7", (5.0, 6.0, 7.0)),
]


@functools.cache
def _admin() -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    return admin_parser()  # parsing does not change a parser: one for every case


def _admin_settings(name: str) -> type:
    return _admin()[1][name].Settings


def _parse(case: Case, argv: list[str]) -> tuple[type, argparse.Namespace]:
    if case.command == "zkcrawl-consumer":
        return ConsumerSettings, consumer_parser().parse_args([*case.argv, *argv])
    if case.command == "zkcrawl-producer":
        return ProducerSettings, producer_parser().parse_args([*case.argv, *argv])
    ns = _admin()[0].parse_args([case.command, *case.argv, *argv])
    return _admin_settings(case.command), ns


def _layers(case: Case, tmp_path: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """(the source that must win, argv, env) with one more source set at each step."""
    cfg = tmp_path / "settings.toml"
    cfg.write_text(f"{case.field.replace('_', '-')} = {case.toml}\n")
    return [("default", [], {}),
            ("file", ["--config", str(cfg)], {}),
            ("env", ["--config", str(cfg)], {case.variable: case.env}),
            ("flag", ["--config", str(cfg), *case.flag], {case.variable: case.env})]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.command)
def test_flag_beats_env_beats_file_beats_default(case: Case, tmp_path: Path) -> None:
    expected = dict(zip(("flag", "env", "file"), case.expected, strict=True))
    for winner, argv, env in _layers(case, tmp_path):
        cls, ns = _parse(case, argv)
        value = getattr(resolve(cls, ns, env), case.field)
        default = {f.name: f.default for f, _ in fields(cls)}[case.field]
        assert value == expected.get(winner, default), (winner, value)
        _values, sources = gather(cls, vars(ns), vars(ns)["zkcrawl_prog"], env)
        assert sources[case.field].kind == winner


def test_every_command_has_a_case() -> None:
    modules = _admin()[1]
    assert len(modules) == len(COMMANDS)
    admin = set(modules)
    assert {c.command for c in CASES} == admin | {"zkcrawl-consumer", "zkcrawl-producer"}


def test_a_flag_given_its_default_value_still_beats_the_environment() -> None:
    """"Not given" and "given the default" differ: the flag is a source even then."""
    ns = consumer_parser().parse_args(["--threads", "16"])
    assert resolve(ConsumerSettings, ns, {"ZKCRAWL_CONSUMER_THREADS": "6"}).threads == 16


def test_an_old_name_is_read_only_by_a_daemon_and_loses_to_the_new_one(capsys) -> None:
    ns = consumer_parser().parse_args([])
    old = {"ZKCRAWL_THREADS": "3"}
    assert resolve(ConsumerSettings, ns, old).threads == 3
    assert "$ZKCRAWL_THREADS is deprecated" in capsys.readouterr().err
    both = {**old, "ZKCRAWL_CONSUMER_THREADS": "4"}
    assert resolve(ConsumerSettings, ns, both).threads == 4
    assert capsys.readouterr().err == ""  # the new name wins, silently
    demo = _admin()[0].parse_args(["demo"])
    assert resolve(_admin_settings("demo"), demo, old).threads == 4  # its default


@given(st.sets(st.sampled_from(["flag", "env", "file"])))
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_highest_source_set_wins(tmp_path: Path, present: set[str]) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("threads = 7\n")
    argv = ["--config", str(cfg)] if "file" in present else []
    argv += ["--threads", "5"] if "flag" in present else []
    env = {"ZKCRAWL_CONSUMER_THREADS": "6"} if "env" in present else {}
    got = resolve(ConsumerSettings, consumer_parser().parse_args(argv), env).threads
    winner = next((s for s in ("flag", "env", "file") if s in present), "default")
    assert got == {"flag": 5, "env": 6, "file": 7, "default": 16}[winner]


# Any value a TOML file or the environment can hold, nested a little.
_SCALARS = (st.text() | st.integers() | st.floats() | st.booleans() | st.none()
            | st.integers(min_value=-(10**400), max_value=10**400))
HOSTILE = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)

_CHECKS: dict[str, Callable[[Any], bool]] = {
    "threads": lambda v: isinstance(v, int) and abs(v) <= MAX_INT,
    "timeout": lambda v: isinstance(v, float) and math.isfinite(v) and abs(v) <= MAX_FLOAT,
    "robots": lambda v: isinstance(v, bool),
    "out": lambda v: isinstance(v, str) and "\x00" not in v,
    "field": lambda v: isinstance(v, tuple) and all(isinstance(s, str) and "\x00" not in s
                                                     for s in v),
    "delivery": lambda v: v in ("at-least-once", "at-most-once"),
}
_FIELDS = {f.name: (f, tp) for f, tp in fields(ConsumerSettings) if f.name in _CHECKS}


@given(st.sampled_from(sorted(_CHECKS)), HOSTILE)
@settings(max_examples=300, deadline=None)
def test_decode_returns_the_type_or_one_usage_line(name: str, raw: Any) -> None:
    field, tp = _FIELDS[name]
    try:
        value = decode(field, tp, raw, "$ZKCRAWL_X")
    except UsageError as exc:
        line = str(exc)
        assert line.startswith(f"--{name.replace('_', '-')} from $ZKCRAWL_X: ")
        assert "\n" not in line
        return
    assert _CHECKS[name](value), value


def test_the_settings_modules_import_each_other_in_one_direction() -> None:
    """No circle among zkcrawl/settings/*.py, and none broken by an import in a function:
    each module imports only modules below it, never the package."""
    package = Path(zkcrawl.settings.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
        assert all(n in tree.body for n in imports), f"{path.name}: an import in a function"
        graph[path.stem] = {n.module.rpartition(".")[2] for n in imports
                            if isinstance(n, ast.ImportFrom) and n.module
                            and n.module.startswith("zkcrawl.settings.")}
        assert path.stem == "__init__" or not any(
            isinstance(n, ast.ImportFrom) and n.module == "zkcrawl.settings" for n in imports)
    assert len(graph) >= 10
    list(graphlib.TopologicalSorter(graph).static_order())  # CycleError on a circle
