"""``zkcrawl dead list|requeue|purge --error REASON --host HOST --older-than AGE`` against a
real ZooKeeper: the filters select, combine with AND, and the books balance (every letter is
requeued, purged or still there)."""

from __future__ import annotations

import argparse
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.admin.commands.dead import parse_age
from zkcrawl.cli import main
from zkcrawl.queue.layout import Layout

LETTERS = {  # name -> (url, error, dead how many seconds ago)
    "A": ("http://shop.example/a", "http-503", 7200),
    "B": ("http://shop.example:8080/b", "http-502", 10),
    "C": ("http://blog.example/c", "timeout", 7200),
    "D": ("http://shop.example/d", "robots", 7200),
}


@pytest.fixture
def letters(zk, zk_root) -> dict[str, str]:
    """The four letters above: name -> dead-letter id."""
    dead = Layout.of(zk_root).dead
    zk.ensure_path(dead)
    ids = {}
    for name, (url, error, ago) in LETTERS.items():
        doc = {"item": f"qn-{name}", "url": url, "error": error, "attempts": 3,
               "dead_at": time.time() - ago, "data": None}
        path = zk.create(f"{dead}/dl-", json.dumps(doc).encode(), sequence=True)
        ids[name] = path.rsplit("/", 1)[1]
    return ids


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv), {})
    out, err = capsys.readouterr()
    return int(rc), out, err


def listed(capsys, args: list[str], *filters: str) -> set[str]:
    rc, out, err = run(capsys, "dead", "list", "--json", *filters, *args)
    assert rc == 0, err
    return {d["url"].rsplit("/", 1)[1].upper() for d in json.loads(out)}


def test_filters_select_and_combine(zk, zk_hosts, zk_root, letters, capsys):
    args = ["--zk", zk_hosts, "--root", zk_root, "--log-format", "json"]
    assert listed(capsys, args, "--error", "http-5*") == {"A", "B"}
    assert listed(capsys, args, "--error", "timeout") == {"C"}
    assert listed(capsys, args, "--host", "shop.example") == {"A", "B", "D"}  # any port
    assert listed(capsys, args, "--host", "SHOP.example:8080") == {"B"}
    assert listed(capsys, args, "--older-than", "1h") == {"A", "C", "D"}
    assert listed(capsys, args, "--older-than", "3h") == set()
    assert listed(capsys, args, "--error", "http-5*", "--host", "shop.example",
                  "--older-than", "30m") == {"A"}

    rc, out, err = run(capsys, "dead", "requeue", "--error", "http-5*", "--host",
                       "shop.example", "--older-than", "1h", *args)
    assert rc == 0 and "1 requeued, 0 skipped" in out, err
    queue = Layout.of(zk_root).queue
    [item] = [json.loads(zk.get(f"{queue}/{n}")[0]) for n in zk.get_children(queue)]
    assert item["url"] == LETTERS["A"][0] and item["attempt"] == 0
    assert item["meta"]["last_error"] == "http-503"

    rc, out, err = run(capsys, "dead", "purge", "--error", "timeout", *args)
    assert rc == 2 and "--yes" in err  # a filter does not confirm a deletion
    rc, out, err = run(capsys, "dead", "purge", "--error", "timeout", "--yes", *args)
    assert rc == 0 and f"{letters['C']} purged" in out
    # the books: A requeued, C purged, B and D still dead letters
    assert sorted(zk.get_children(Layout.of(zk_root).dead)) == sorted(
        [letters["B"], letters["D"]])
    # an ID and a filter: the filter narrows what the IDs name
    rc, out, _ = run(capsys, "dead", "requeue", letters["B"], letters["D"], "--error",
                     "robots", *args)
    assert rc == 0 and f"{letters['D']} requeued" in out and letters["B"] not in out


@pytest.mark.parametrize("argv, needle", [
    (["requeue"], "--error/--host/--older-than"),
    (["requeue", "--older-than", "soon"], "--older-than: not an age"),
    (["requeue", "--older-than", "-5"], "--older-than: not an age"),
    (["list", "--all"], "dead list takes no ID, --all or --yes"),
])
def test_bad_selections_are_one_line_exit_2(argv, needle, capsys):
    rc, _out, err = run(capsys, "dead", *argv, "--zk", "127.0.0.1:1", "--zk-timeout", "0.2")
    assert rc == 2 and err.count("\n") == 1 and needle in err, err


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=20),
                 st.tuples(st.integers(0, 10**6), st.sampled_from(["", "s", "m", "h", "d"]))
                 .map(lambda t: f"{t[0]}{t[1]}")))
def test_parse_age_is_seconds_or_a_usage_error(text):
    try:
        value = parse_age(text)
    except argparse.ArgumentTypeError:
        return
    assert value >= 0 and value == value  # finite, never negative
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(text.strip()[-1:], 1)
    assert value == pytest.approx(float(text.strip().rstrip("smhd").strip()) * unit)
