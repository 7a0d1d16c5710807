"""``zkcrawl report``'s re-crawl section (issue #23 item 5): new / changed / unchanged /
gone per pass, passes split by a gap in ``fetched_at``; hostile records never break it."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from zkcrawl.admin.report import recrawl_passes, render_html, render_text, summarize


def _rec(at: str, **kw: Any) -> dict[str, Any]:
    return {"url": "https://h/x", "fetched_at": at, "error": None, "status": 200, **kw}


def test_passes_count_each_kind() -> None:
    recs = [_rec("2026-12-01T10:00:00Z"), _rec("2026-12-01T10:00:05Z"),
            _rec("2026-12-01T10:01:00Z", error="http-404", status=404),
            _rec("2026-12-02T10:00:00Z", changed=False, status=304),
            _rec("2026-12-02T10:00:01Z", changed=True),
            _rec("2026-12-02T10:00:02Z", error="http-410", status=410),
            _rec("2026-12-02T10:00:03Z", error="timeout", status=None)]
    section = recrawl_passes(recs)
    assert section is not None
    first, second = section["passes"]
    assert (first["new"], first["gone"], first["start"]) == (2, 1, "2026-12-01T10:00:00.000Z")
    assert [second[k] for k in ("new", "changed", "unchanged", "gone", "failed")] == [
        0, 1, 1, 1, 1]
    summary = summarize(recs)
    assert summary["recrawl"] == section
    text = render_text(summary)
    assert "Re-crawl passes" in text and "2026-12-02T10:00:00.000Z" in text
    assert "<h2>Re-crawl passes</h2>" in render_html(summary)
    json.dumps(summary, allow_nan=False)


def test_no_section_without_a_recrawl() -> None:
    summary = summarize([_rec("2026-12-01T10:00:00Z")])
    assert summary["recrawl"] is None and "Re-crawl" not in render_text(summary)


values = st.none() | st.booleans() | st.integers() | st.text(max_size=30) | st.floats()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.fixed_dictionaries({"fetched_at": values | st.sampled_from(
    ["2026-12-01T10:00:00Z", "9999-01-01T00:00:00Z"]), "changed": values, "error": values}),
    max_size=20))
def test_hostile_records_never_break_the_section(recs: list[dict[str, Any]]) -> None:
    section = recrawl_passes(recs)
    if section is not None:
        assert sum(section["total"].values()) <= len(recs)
        render_text(summarize(recs))
