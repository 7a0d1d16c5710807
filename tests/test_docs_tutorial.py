"""The tutorial (docs/tutorial.md) is run as written: its shell blocks, in order, in one bash.

Guarantees: every ``sh`` block of the page runs, except the one marked
``<!-- tutorial:setup -->`` (replaced by the test's own: the sample site on a free port, the
session's ZooKeeper, a PostgreSQL server) and those marked ``<!-- tutorial:skip -->`` (clean-up
of what the set-up started). A command that fails fails the test with the block it was in;
then what the tutorial promises is checked: the planned URLs, one record per URL with its
outcome in the consumers' files, the dead letter, the report, one row per URL in the table.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from zkcrawl.admin.localpg import PgServer
from zkcrawl.admin.samplesite import SampleSite, expected_articles
from zkcrawl.postgres import load_rows, parse_url

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "tutorial.md"
FENCE = re.compile(r"^(<!-- tutorial:(?P<mark>\w+) -->\n)?```sh\n(?P<code>.*?)^```$", re.M | re.S)
pytestmark = pytest.mark.slow


def blocks(text: str) -> list[tuple[str, str]]:
    """(mark, code) of every ``sh`` block; mark is '' for a block the test runs."""
    return [(m.group("mark") or "", m.group("code")) for m in FENCE.finditer(text)]


def script(text: str) -> str:
    """One bash script of the runnable blocks, each announced on stderr by its number."""
    parts = ["set -eo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for n, (mark, code) in enumerate(blocks(text), 1):
        if mark == "":
            parts.append(f"echo '### tutorial block {n}' >&2\n{code}")
    return "\n".join(parts) + "\n"


def test_blocks_are_found_and_marked() -> None:
    found = blocks(PAGE.read_text(encoding="utf-8"))
    marks = [mark for mark, _code in found]
    assert marks.count("setup") == 1 and set(marks) <= {"", "setup", "skip"}, marks
    assert marks.count("") >= 10
    setup = next(code for mark, code in found if mark == "setup")
    # What the test replaces must be what the set-up block starts.
    for needed in ("zkcrawl local-zk start", "zkcrawl.admin.samplesite", "export SITE=",
                   "export PG="):
        assert needed in setup, needed


@pytest.fixture
def site() -> Iterator[SampleSite]:
    with SampleSite(slow_s=0.5) as s:
        yield s


def run_tutorial(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "tutorial.sh"
    path.write_text(script(PAGE.read_text(encoding="utf-8")), encoding="utf-8")
    return subprocess.run(["bash", str(path)], cwd=tmp_path, env=env, text=True,
                          capture_output=True, stdin=subprocess.DEVNULL, timeout=240)


def tutorial_env(zk_hosts: str, zk_root: str, site: SampleSite, pg: PgServer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZKCRAWL_", "PG"))}
    bindir = str(Path(sys.executable).parent)  # zkcrawl, zkcrawl-producer, zkcrawl-consumer
    env.update(PATH=f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}", PYTHONPATH=str(REPO),
               ZKCRAWL_ZK=zk_hosts, ZKCRAWL_ROOT=zk_root, SITE=site.base_url,
               PG=pg.conninfo())
    return env


def outcomes(paths: list[Path]) -> dict[str, set[str]]:
    import json

    seen: dict[str, set[str]] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            seen.setdefault(record["url"], set()).add(record["error"] or "ok")
    return seen


def test_tutorial_runs_as_written(tmp_path: Path, zk_hosts: str, zk_root: str,
                                  site: SampleSite, pg_server: PgServer) -> None:
    proc = run_tutorial(tmp_path, tutorial_env(zk_hosts, zk_root, site, pg_server))
    (tmp_path / "stdout.txt").write_text(proc.stdout, encoding="utf-8")  # for a failure
    (tmp_path / "stderr.txt").write_text(proc.stderr, encoding="utf-8")
    assert proc.returncode == 0, (f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}"
                                  f"\n--- stderr\n{proc.stderr[-4000:]}")
    expected = expected_articles(site.base_url)
    planned = (tmp_path / "planned.txt").read_text(encoding="utf-8").split()
    assert sorted(planned) == sorted(expected)
    # Step 5: c1 killed, nothing lost; each URL has exactly its expected outcome.
    got = outcomes([tmp_path / "results-c1.jsonl", tmp_path / "results-c2.jsonl"])
    assert {url: {want} for url, want in expected.items()} == got
    # Step 6: the dead letter was listed, then purged.
    assert re.search(r"attempts=2 .*error=connection .*url=http://127\.0\.0\.1:9/gone\.html",
                     proc.stdout), proc.stdout[-3000:]
    assert "1 purged" in proc.stdout
    # Step 7: the report counted the outcomes and wrote its page.
    assert "http-404" in proc.stdout and (tmp_path / "report.html").stat().st_size > 1000
    # Step 8: the processor's field, in try's output and in one row per URL of the table.
    assert re.search(r"^  words: \d+$", proc.stdout, re.M), proc.stdout[-3000:]
    rows = load_rows(parse_url(f"{pg_server.conninfo()}?table=blog"))
    assert sorted(r["url"] for r in rows) == sorted(expected)
    article = next(r for r in rows if r["url"].endswith("/blog/posts/3.html"))
    assert article["fields"]["author"] and article["fields"]["words"] > 10
