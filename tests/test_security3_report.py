"""Issue #27 weak spot: invisible characters and homograph hosts in ``zkcrawl report``.

A results file is untrusted (any process that wrote it, a hand-edited file). A record whose
URL holds a zero-width space (U+200B), a byte-order mark (U+FEFF) and a tag character
(U+E0041), on a homograph host (a Cyrillic U+0430 in ``p\\u0430ypal.com``), with such characters in
its reason and consumer too, is shown by ``zkcrawl report`` -- the text on stdout and the
``--html`` page -- as ``queue list`` shows it: each invisible character escaped (``\\u200b``,
``\\U000e0041``), the host as its punycode A-label (``xn--pypal-4ve.com``) in the failed URLs
and in the Hosts table alike, no raw invisible or Cyrillic character anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zkcrawl.cli import main as zkcrawl_main
from zkcrawl.textsafe import shown_url

HOMOGRAPH = "p\u0430ypal.com"  # Cyrillic a
PUNYCODE = "xn--pypal-4ve.com"
INVISIBLE = ("\u200b", "\ufeff", "\U000e0041")
RAW = (*INVISIBLE, "\u0430")


def _records(path: Path) -> None:
    recs = [{"url": f"http://{HOMOGRAPH}/log\u200bin\U000e0041", "status": None,
             "error": "timeout\u200b", "consumer": "c\ufeff1", "attempt": 1,
             "fetched_at": "2026-12-01T10:00:00Z"},
            {"url": f"http://{HOMOGRAPH}:8080/ok\ufeff", "status": 200, "error": None,
             "consumer": "c\ufeff1", "fetched_at": "2026-12-01T10:00:01Z"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")


def test_report_escapes_invisible_characters_and_shows_homograph_hosts_as_punycode(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results, page = tmp_path / "r.jsonl", tmp_path / "r.html"
    _records(results)
    capsys.readouterr()
    rc = int(zkcrawl_main(["report", str(results), "--html", str(page)], {}))
    text, err = capsys.readouterr()
    assert rc == 0, err
    doc = page.read_text(encoding="utf-8")
    for shown in (text, doc):
        assert not [c for c in RAW if c in shown], [hex(ord(c)) for c in RAW if c in shown]
        assert f"http://{PUNYCODE}/log\\u200bin\\U000e0041" in shown  # the failed URL
        assert "timeout\\u200b" in shown and "c\\ufeff1" in shown  # reason, consumer
    hosts = text.split("\nHosts (")[1].split("\n\n")[0]
    assert PUNYCODE in hosts and f"{PUNYCODE}:8080" in hosts, hosts  # the Hosts table too
    assert f"<td>{PUNYCODE}</td>" in doc and f"<td>{PUNYCODE}:8080</td>" in doc
    # As the other outputs do: queue list shows the same URL the same way.
    assert shown_url(f"http://{HOMOGRAPH}/log\u200bin\U000e0041") == (
        f"http://{PUNYCODE}/log\\u200bin\\U000e0041")
