"""zkcrawl.admin.report: loading, summary numbers, text and HTML rendering (and a real browser)."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from zkcrawl.admin import report
from zkcrawl.admin.report import load_records, render_html, render_text, summarize
from zkcrawl.errors import UsageError


def make_records() -> list[dict[str, Any]]:
    """10 records with numbers chosen so every summary value is easy to check by hand."""
    recs = []
    errors = [None] * 7 + ["http-404", "http-404", "timeout"]
    for i in range(10):
        recs.append({
            "url": f"http://{'a.test' if i < 7 else 'b.test:8080'}/p/{i}.html",
            "final_url": None, "status": 404 if errors[i] == "http-404" else 200,
            "title": f"T{i}", "fields": {}, "bytes": 1000, "item": f"qn-{i:010d}",
            "attempt": 1 if i == 9 else 0, "consumer": "c1" if i < 6 else "c2",
            "fetched_at": f"2024-05-01T12:{i * 10 // 60:02d}:{i * 10 % 60:02d}.000Z",
            "queue_ms": None if i == 0 else 100.0 * i,
            "dispatch_ms": round(0.1 * (i + 1), 1), "wait_ms": 5.0, "polite_ms": 4.0,
            "process_ms": 10.0 * (i + 1), "error": errors[i],
        })
    recs[9]["fetched_at"] = "not a time"
    return recs


@pytest.fixture()
def results_files(tmp_path: Path) -> list[str]:
    recs = make_records()
    a = tmp_path / "a.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in recs[:6]) + "\n")  # + a blank line
    b = tmp_path / "b.jsonl.gz"
    with gzip.open(b, "wb") as fh:
        fh.write(b"".join(json.dumps(r).encode() + b"\n" for r in recs[6:]))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"url": "http://a.test/trunc'  # killed mid-write
                    b"\n[1, 2, 3]\n\xff\xfe not utf-8\n")
    return [str(a), str(b), str(bad)]


def test_load_records_counts_bad_lines(results_files: list[str]) -> None:
    records, bad = load_records(results_files)
    assert len(records) == 10
    assert bad == 3


def test_load_records_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"nope\.jsonl"):
        load_records([str(tmp_path / "nope.jsonl")])


def test_summary_numbers() -> None:
    s = summarize(make_records(), bad_lines=3)
    assert s["records"] == 10 and s["bad_lines"] == 3
    assert s["ok"] == 7 and s["failed"] == 3
    assert s["outcomes"] == {"ok": 7, "http-404": 2, "timeout": 1}
    assert s["statuses"] == {"200": 8, "404": 2}
    assert [(c["id"], c["count"], c["pct"], c["ok"], c["failed"]) for c in s["consumers"]] == [
        ("c1", 6, 60.0, 6, 0), ("c2", 4, 40.0, 1, 3)]
    assert [(h["host"], h["count"]) for h in s["hosts"]] == [("a.test", 7), ("b.test:8080", 3)]
    t = s["timing"]
    # Nearest rank: p50 of 10 values is the 5th, p95 the 10th.
    assert (t["process_ms"]["p50"], t["process_ms"]["p95"], t["process_ms"]["max"]) == (
        50.0, 100.0, 100.0)
    assert t["queue_ms"]["n"] == 9 and t["queue_ms"]["p50"] == 500.0
    assert t["queue_ms"]["max"] == 900.0
    assert t["dispatch_ms"]["p95"] == 1.0 and t["wait_ms"]["p50"] == 5.0
    assert s["first_fetched_at"] == "2024-05-01T12:00:00.000Z"
    assert s["last_fetched_at"] == "2024-05-01T12:01:20.000Z"
    assert s["duration_s"] == 80.0 and s["undated"] == 1
    assert s["items_per_s"] == round(9 / 80, 3)
    assert s["bytes"] == 10_000 and s["retried"] == 1
    tp = s["throughput"]
    assert tp["bucket_s"] == 2 and tp["times"][0] == "2024-05-01T12:00:00.000Z"
    assert len(tp["times"]) == 41
    assert sum(tp["series"]["c1"]) == 6 and sum(tp["series"]["c2"]) == 3
    assert tp["series"]["c1"][5] == 1  # 12:00:10 is bucket 5
    assert s["ratio"]["value"] == 0.02
    assert s["ratio"]["verdict"] == "queue-not-bottleneck"
    assert s["ratio"]["interpretation"].startswith("queue is not the bottleneck")
    # Fetches (mean 55 ms) dwarf the waits (4 ms for a host's turn, 1 ms for a thread).
    assert s["pace"]["pace"] == "site" and s["pace"]["figure_ms"] == 55.0
    assert sum(s["histograms"]["process_ms"]["counts"]) == 10
    json.dumps(s)  # JSON-serializable, for a --json output


@pytest.mark.parametrize(("dispatch", "wait", "verdict"), [
    (1.0, 5.0, "queue-not-bottleneck"),
    (10.0, 5.0, "queue-noticeable"),
    (80.0, 5.0, "queue-bottleneck"),
    (80.0, 400.0, "workers-saturated"),
])
def test_ratio_verdicts(dispatch: float, wait: float, verdict: str) -> None:
    timing = {"dispatch_ms": {"p95": dispatch}, "process_ms": {"p50": 100.0},
              "wait_ms": {"p50": wait}}
    r = report._ratio(timing)
    assert r["verdict"] == verdict and "\n" not in r["interpretation"]


def test_empty_and_odd_records() -> None:
    s = summarize([{}, {"error": "robots", "process_ms": "12", "fetched_at": 5}])
    assert s["outcomes"] == {"ok": 1, "robots": 1}
    assert s["timing"]["process_ms"]["n"] == 0
    assert s["ratio"]["verdict"] == "unknown"
    assert s["throughput"]["bucket_s"] is None
    assert "no data" in render_html(s)
    assert "Outcomes" in render_text(s)
    empty = summarize([])
    render_text(empty)
    render_html(empty)


def test_render_text() -> None:
    text = render_text(summarize(make_records(), bad_lines=3))
    assert "10 records, 3 bad lines skipped" in text
    assert re.search(r"c1\s+6\s+60\.0%", text)
    assert re.search(r"process_ms\s+10\s+50\s+100\s+100", text)
    assert "queue is not the bottleneck" in text
    assert "b.test:8080" in text


def test_long_tail_goes_to_overflow_bin() -> None:
    recs = [{"process_ms": float(v)} for v in [*range(1, 200), 60_000]]
    hist = summarize(recs)["histograms"]["process_ms"]
    # p99 (nearest rank) is 198: 199 and 60000 overflow, the bins stay readable.
    assert hist["overflow"] == 2 and hist["edges"][-1] == 198.0
    assert sum(hist["counts"]) == 198


def _svg_charts(dom: str) -> dict[str, str]:
    return dict(re.findall(r'<svg[^>]*class="chart"[^>]*data-chart="([^"]+)"[^>]*>(.*?)</svg>',
                           dom, re.S))


def test_render_html_charts() -> None:
    page = render_html(summarize(make_records()))
    charts = _svg_charts(page)
    for key in report.TIMINGS:
        assert charts[f"hist-{key}"].count("<rect") >= 1
    for chart in ("throughput-all", "throughput-c1", "throughput-c2"):
        assert "<polyline" in charts[chart]
    # Self-contained: nothing to fetch, nothing to run.
    assert "<script" not in page and "src=" not in page and "<link" not in page
    assert "url(" not in page and "@import" not in page


CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium"
                                         if Path("/usr/bin/chromium").exists() else None)
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def html_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "report.html"
    path.write_text(render_html(summarize(make_records())), encoding="utf-8")
    return path


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           *args], capture_output=True, text=True, timeout=18, check=False)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (CI installs Debian's "
                    "'chromium' package); the headless-browser rendering check is skipped")
def test_chromium_renders_charts(html_file: Path, tmp_path: Path) -> None:
    out = _chromium(tmp_path, "--dump-dom", html_file.as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    charts = _svg_charts(out.stdout)
    assert {f"hist-{k}" for k in report.TIMINGS} <= set(charts)
    assert all("<rect" in charts[f"hist-{k}"] for k in report.TIMINGS)
    assert "<polyline" in charts["throughput-all"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (CI installs Debian's "
                    "'chromium' package); the headless-browser screenshot check is skipped")
def test_chromium_screenshot(html_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "report.png"
    out = _chromium(tmp_path, f"--screenshot={png}", "--window-size=1280,1800",
                    "--hide-scrollbars", html_file.as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 20_000  # a blank 1280x1800 page compresses to a few KB
