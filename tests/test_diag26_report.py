"""``zkcrawl report`` on the failures of one's own code (issue #26 review, gap 2), through a
real consumer (a real ZooKeeper, a real HTTP server, ``--processor myproc:parse`` from the
user's directory) and the real ``zkcrawl report``: one processor bug on one line, raising
with a different message per page, is one reason ``processor: ValueError (myproc.py:5)``
with one example message -- in the outcomes, the failures and the verdict -- and the text
report never cuts the place off, however long the message."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.httpd import TestServer, html
from tests.test_consumer_support import ROOT, offer, records
from zkcrawl.admin import report
from zkcrawl.consumer.processors import failure_text

MYPROC = '''"""A processor with a bug on line 5: its message differs per page."""


def parse(page):
    raise ValueError(f"cannot read the price of {page.url} " + "because " * 12)
'''
REASON = "processor: ValueError (myproc.py:5)"


def run(module: str, *argv: str, cwd: Path) -> tuple[int, str, str]:
    """``python -m module ARGV`` from ``cwd`` (the user's directory, where myproc.py is)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZKCRAWL_")}
    proc = subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd,
                          env={**env, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.slow
def test_one_processor_bug_is_one_reason_with_its_place(zk, zk_hosts, zk_root, tmp_path):
    (tmp_path / "myproc.py").write_text(MYPROC)
    out = tmp_path / "results.jsonl"
    with TestServer({"/p/*": html("<title>t</title>")}) as srv:
        offer(zk, zk_root, [srv.url(f"/p/{i}") for i in range(3)])
        rc, _, err = run("zkcrawl.consumer.main", "--zk", zk_hosts, "--root", zk_root, "--out",
                         str(out), "--exit-when-idle", "1", "--domain-delay", "0",
                         "--no-robots", "--allow-private-addresses", "--log-format", "json",
                         "--processor", "myproc:parse", cwd=tmp_path)
    assert rc == 0, err[-3000:]
    [traced] = [json.loads(x) for x in err.splitlines()
                if x.startswith("{") and '"processor.failed"' in x]  # one key: one traceback
    assert traced["note"].startswith("the traceback of your code, logged once per callable")
    errors = [r["error"] for r in records(out)]
    assert len(set(errors)) == 3 and all(e.endswith(" (myproc.py:5)") for e in errors), errors

    rc, text, err = run("zkcrawl.cli", "report", str(out), cwd=tmp_path)
    assert rc == 0, err
    print(text)
    assert "Failures (3 items, 1 reason)" in text, text
    assert f"\n  {REASON}: 3 items, 3 URLs\n" in text, text
    [example] = re.findall(r"\n    e\.g\. (.*)\n", text)
    assert example.startswith("processor: ValueError: cannot read the price of http://")
    assert example.endswith(" (myproc.py:5) (2 other messages)"), example
    assert re.search(rf"\n  {re.escape(REASON)}\s+3\s+100\.0%\n", text), text  # outcomes
    assert f"Pace: 100 % of items failed: {REASON} -- your --processor raised" in text, text

    rc, doc_text, err = run("zkcrawl.cli", "report", str(out), "--json", cwd=tmp_path)
    assert rc == 0, err
    doc = json.loads(doc_text)
    [failure] = doc["failures"]
    assert (failure["reason"], failure["count"], failure["messages"]) == (REASON, 3, 3)
    assert failure["example"] in errors  # one whole message, as the record has it
    assert doc["outcomes"] == {REASON: 3}


@given(st.text(max_size=300), st.sampled_from(["processor", "pipeline my.Stage"]),
       st.integers(1, 99999))
def test_any_message_groups_by_kind_type_and_place(message, prefix, line):
    error = failure_text(prefix, ValueError(message), ("myproc.py", line))
    assert report.failure_reason(error) == f"{prefix}: ValueError (myproc.py:{line})"


def test_the_text_report_never_cuts_the_place_off():
    long_type = "pipeline shop.stages.NormalizePricesAndCurrenciesStage: " + "E" * 60
    recs = [{"url": f"http://a.example/{i}", "error": error}
            for i, error in enumerate([f"{long_type}: boom {'x' * 90} (stages.py:123)",
                                       "processor: ValueError: " + "y" * 190 + " (p.py:7)"])]
    text = report.render_text(report.summarize(recs))
    reasons = [x for x in text.splitlines() if x.startswith("  pipeline ")]
    assert len(reasons) == 2 and all("(stages.py:123)" in x for x in reasons), text
    assert "(stages.py:123): 1 item, 1 URL" in text, text
    assert "\n  processor: ValueError (p.py:7): 1 item, 1 URL\n" in text, text
    assert re.search(r"\n    e\.g\. processor: ValueError: y+… \(p\.py:7\)\n", text), text
