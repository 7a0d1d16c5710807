"""Clean output whatever the input: records are strict UTF-8 JSON, ``zkcrawl report`` skips
and counts bad lines and values, and nothing hostile reaches a terminal raw (textsafe, console
logs, ``status``, ``dead list``, ``queue list``, the text and HTML reports)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import old_layout
from tests.test_admin_cli import common, run
from zkcrawl import logs
from zkcrawl.admin.report import load_records, parse_line, render_html, render_text, summarize
from zkcrawl.consumer.sinks import Sink
from zkcrawl.jsonclean import json_clean
from zkcrawl.queue.ingress import IngressQueue
from zkcrawl.queue.items import Item
from zkcrawl.textsafe import printable, scrub

ZKCRAWL = str(Path(sys.executable).with_name("zkcrawl"))

# Characters a terminal must never receive raw: C0, DEL, C1, bidi controls, surrogates.
RAW = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
                 "\ud800-\udfff]")
HOSTILE = "\x1b[31mRED\x1b]0;pwned\x07\x9b2J\u202egnp.exe\u2066\ud800\udfff\x00\t\n\r\x7f"

hostile_chars = st.sampled_from(list(HOSTILE))
surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
any_text = st.text(st.characters(exclude_categories=()) | surrogates | hostile_chars,
                   max_size=40)
ascii_printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12)
records = st.dictionaries(any_text, json_values, max_size=8)


def strict_json(data: str | bytes) -> Any:
    """Parse as RFC 8259 JSON: NaN/Infinity refused."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")
    return json.loads(data, parse_constant=refuse)


def assert_clean(text: str) -> None:
    """No raw control/ANSI/bidi character and valid UTF-8."""
    assert RAW.search(text.replace("\n", "")) is None, ascii(text)
    text.encode("utf-8")


# ---------------------------------------------------------------- textsafe --
@given(any_text, st.none() | st.integers(min_value=0, max_value=50))
def test_printable_never_leaves_a_raw_control_character(text: str, limit: int | None) -> None:
    out = printable(text, limit)
    assert RAW.search(out) is None, ascii(out)
    out.encode("utf-8")
    if limit is not None and len(text) > limit:
        assert out.endswith("\u2026")


@given(ascii_printable)
def test_printable_is_identity_on_printable_ascii(text: str) -> None:
    assert printable(text) == text


@given(any_text)
def test_scrub_is_utf8_and_only_touches_surrogates(text: str) -> None:
    out = scrub(text)
    out.encode("utf-8")
    if not any("\ud800" <= c <= "\udfff" for c in text):
        assert out == text


def test_printable_escapes_visibly() -> None:
    assert printable("\x1b[31mRED\x07") == "\\x1b[31mRED\\x07"
    assert printable("a\tb\nc\u202ed\ud800") == "a\\tb\\nc\\u202ed\\ud800"
    assert printable("héllo wörld 😀 <&>") == "héllo wörld 😀 <&>"
    assert printable("abcdef", 4) == "abc\u2026"


# -------------------------------------------------------------------- sink --
@given(records)
def test_sink_encode_is_always_one_strict_utf8_json_line(record: dict[str, Any]) -> None:
    line = Sink.encode(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = strict_json(line.decode("utf-8"))
    assert isinstance(doc, dict)


def test_sink_encode_replaces_surrogates_and_nulls_non_finite_floats() -> None:
    line = Sink.encode({"url": "http://x/\ud800", "title": "a\udc00b\ud83d\ude00",
                        "process_ms": float("nan"), "fields": {"w": [float("inf"), 1.5]}})
    doc = strict_json(line.decode("utf-8"))
    assert doc == {"url": "http://x/\ufffd", "title": "a\ufffdb\U0001f600",
                   "process_ms": None, "fields": {"w": [None, 1.5]}}
    clean = {"url": "http://x/é", "title": "\u2028", "n": 3, "f": 0.25, "e": None}
    assert json.loads(Sink.encode(clean)) == clean  # the fast path changes nothing


def _encode_as_before(record: Any) -> bytes:
    """The sink's encoding before its C encoder was built once: JSONEncoder.encode."""
    enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return (enc.encode(record) + "\n").encode("utf-8")
    except ValueError:
        return (enc.encode(json_clean(record)) + "\n").encode("utf-8")


odd_keys = st.one_of(any_text, st.integers(), st.floats(), st.booleans(), st.none())


@given(st.dictionaries(odd_keys, json_values | st.dictionaries(odd_keys, json_values),
                       max_size=8))
def test_sink_encode_writes_what_jsonencoder_wrote(record: dict[Any, Any]) -> None:
    """The C encoder built once gives the bytes JSONEncoder.encode gave, NaN, surrogates and
    non-string keys included."""
    assert Sink.encode(record) == _encode_as_before(record)


def test_sink_encode_refuses_what_jsonencoder_refused() -> None:
    """A cycle, a set, a key JSON has not: the error JSONEncoder raised (its message is
    the dead letter's reason), not the built-once encoder's."""
    cyclic: dict[str, Any] = {"url": "u"}
    cyclic["self"] = cyclic  # (cleaning it after the circular check overflows: as before)
    for record in (cyclic, {"fields": {1, 2}}, {("a",): 1}):
        with pytest.raises((TypeError, ValueError, RecursionError)) as before:
            _encode_as_before(record)
        with pytest.raises(type(before.value)) as now:
            Sink.encode(record)
        if not isinstance(before.value, RecursionError):
            assert str(now.value) == str(before.value)
    assert Sink.encode({"ok": [1, 2.5, None]}) == b'{"ok":[1,2.5,null]}\n'  # then fine


# ------------------------------------------------------------------ report --
def json_line(value: Any) -> bytes:
    try:
        return json.dumps(value).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True).encode("ascii")


@given(st.binary(max_size=60))
def test_parse_line_never_raises(line: bytes) -> None:
    doc = parse_line(line)
    assert doc is None or isinstance(doc, dict)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=40) | json_values.map(json_line) | records.map(json_line),
                max_size=12))
def test_report_over_arbitrary_lines_never_raises(lines: list[bytes]) -> None:
    lines = [line.replace(b"\n", b"") for line in lines]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.jsonl")
        with open(path, "wb") as fh:
            fh.write(b"\n".join(lines) + b"\n")
        recs, bad = load_records([path])
    assert len(recs) + bad == sum(1 for line in lines if line.strip())
    summary = summarize(recs, bad)
    assert summary["bad_lines"] == bad
    json.dumps(summary, ensure_ascii=False, allow_nan=False).encode("utf-8")
    assert_clean(render_text(summary))
    render_html(summary).encode("utf-8")


@settings(max_examples=50)
@given(st.lists(records, max_size=6))
def test_summarize_arbitrary_records(recs: list[dict[str, Any]]) -> None:
    summary = summarize(recs)
    strict_json(json.dumps(summary, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    assert_clean(render_text(summary))
    page = render_html(summary)
    page.encode("utf-8")
    assert "\x1b" not in page and "\u202e" not in page


BAD_FILE_LINES = [
    json.dumps({"url": "http://a.test/1", "consumer": "c1", "error": None, "process_ms": 10.0,
                "fetched_at": "2024-05-01T12:00:00Z"}).encode(),
    b'{"url": "http://a.test/2", "consumer": "c1", "process_ms": NaN}',  # bad value
    b'{"url": "http://a.test/3", "process_ms": 1e999}',  # bad value (overflow)
    b'{"url": "http://a.test/4", "bytes": ' + b"1" * 400 + b"}",  # bad value (10**400)
    b'{"fetched_at": "not a date"}',  # bad value
    b"[" * 6000 + b"]" * 6000,  # bad line (RecursionError)
    b"\xff\xfe not utf-8",  # bad line
    b'{"bytes": ' + b"9" * 5000 + b"}",  # bad line (past Python's int digit limit)
    b'"just a string"',  # bad line (not an object)
    json.dumps({"url": "http://a.test/5", "consumer": "\u202eevil\x1b[2J",
                "error": "\x1b[31mRED\ud800"}).encode(),
]


def run_report(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "PYTHONUTF8": "0"}
    return subprocess.run([ZKCRAWL, "report", *args, "--log-format", "json"],
                          capture_output=True, text=True, encoding="utf-8", env=env,
                          timeout=60, check=False)


def test_report_cli_skips_and_counts_bad_lines_and_values(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_bytes(b"\n".join(BAD_FILE_LINES) + b"\n")
    html = tmp_path / "report.html"

    proc = run_report(str(results), "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    assert "6 records, 4 bad lines skipped, 4 bad values ignored" in proc.stdout
    assert_clean(proc.stdout)
    assert "\\x1b[31mRED" in proc.stdout and "Traceback" not in proc.stderr
    page = html.read_text(encoding="utf-8")
    assert "4 bad lines, 4 bad values" in page
    assert "\x1b" not in page and "\u202e" not in page and "\\u202eevil" in page

    proc = run_report(str(results), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = strict_json(proc.stdout)
    assert (doc["records"], doc["bad_lines"], doc["bad_values"]) == (6, 4, 4)
    assert doc["timing"]["process_ms"]["n"] == 1


def test_report_of_only_bad_lines_is_exit_1_not_a_traceback(tmp_path: Path) -> None:
    results = tmp_path / "bad.jsonl"
    results.write_bytes(b"[" * 6000 + b"]" * 6000 + b"\n\xff\n")
    proc = run_report(str(results))
    assert proc.returncode == 1
    assert "no records" in proc.stderr and "2 bad lines skipped" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_report_of_a_corrupt_gzip_keeps_what_was_read(tmp_path: Path) -> None:
    import gzip
    good = b"".join(json.dumps({"url": f"http://a.test/{i}"}).encode() + b"\n"
                    for i in range(2000))
    data = bytearray(gzip.compress(good))
    data[len(data) // 2:len(data) // 2 + 16] = b"\x00" * 16  # a damaged deflate stream
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(bytes(data))
    recs, bad = load_records([str(path)])  # no zlib.error escapes
    assert bad >= 1 and len(recs) < 2000


# -------------------------------------------------------------------- logs --
@pytest.fixture
def log_stream():
    stream = io.StringIO()
    yield stream
    logs.flush()
    logs.configure("json", "info")  # back to stderr for the tests that follow


def test_console_log_escapes_ansi_in_values(log_stream: io.StringIO) -> None:
    logs.configure("console", "info", log_stream)
    log = logs.get_logger("test.clean")
    log.info("item.done", title="\x1b[31mRED", url="http://x/\ud800",
             error="\u202eexe.txt", n=5)
    import logging
    logging.getLogger("kazoo.test").warning("stdlib %s", "\x1b]0;pwned\x07")
    logs.flush()
    out = log_stream.getvalue()
    assert "title=\\x1b[31mRED" in out and "\\ud800" in out and "\\u202eexe.txt" in out
    assert "stdlib \\x1b]0;pwned\\x07" in out
    assert_clean(out)


def test_json_log_with_a_lone_surrogate_is_valid_utf8(log_stream: io.StringIO) -> None:
    logs.configure("json", "info", log_stream)
    logs.get_logger("test.clean.json").info("item.done", title="a\ud800\x1b[31m")
    logs.flush()
    [line] = [x for x in log_stream.getvalue().split("\n") if "item.done" in x]
    line.encode("utf-8")
    assert json.loads(line)["title"] == "a\ud800\x1b[31m"  # ASCII-escaped, not lost
    assert "\x1b" not in line


def test_log_writer_scrubs_a_line_a_strict_stream_refuses() -> None:
    raw = io.BytesIO()
    writer = logs._Writer()
    writer.stream = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    writer.put("before\n")
    writer.put("bad \ud800\n")
    writer.flush()
    assert raw.getvalue().decode("utf-8") == "before\nbad \ufffd\n"  # the batch is not lost


# ------------------------------------------------------ admin (real ZooKeeper) --


def test_dead_list_and_queue_list_escape_hostile_urls(zk, zk_hosts, zk_root, capsys) -> None:
    IngressQueue(zk, zk_root).offer_many([Item(url="http://127.0.0.1/\x1b]0;pwned\x07"),
                                          Item(url="http://127.0.0.1/\x1b[31mred\u202e"),
                                          Item(url="http://127.0.0.1/leased")])
    dead, *held = old_layout.oldest(zk, zk_root, 3)
    old_layout.dead_letter(zk, zk_root, dead, "\x1b[2Jhttp-503")
    old_layout.hold(zk, zk_root, held, "\x1b[31mevil")  # a hostile lease holder
    args = common(zk_hosts, zk_root)

    rc, out, err = run(capsys, "dead", "list", *args)
    assert rc == 0, err
    assert "url=http://127.0.0.1/\\x1b]0;pwned\\x07" in out and "\\x1b[2Jhttp-503" in out
    assert_clean(out)
    rc, out, err = run(capsys, "dead", "list", "--json", *args)
    assert rc == 0 and json.loads(out)[0]["url"] == "http://127.0.0.1/\x1b]0;pwned\x07"

    rc, out, err = run(capsys, "queue", "list", *args)
    assert rc == 0, err
    assert "http://127.0.0.1/\\x1b[31mred\\u202e" in out and "\\x1b[31mevil" in out
    assert_clean(out)


def test_status_escapes_what_consumers_publish(zk, zk_hosts, zk_root, capsys) -> None:
    zk.ensure_path(f"{zk_root}/consumers")
    doc = {"id": "\x1b[31mevil\u202e", "host": "\x1b]0;pwned\x07", "state": "running\x1b[2J",
           "processed": 1, "failed": 0, "in_flight": 0, "items_per_s": 1.5,
           "heartbeat_at": time.time()}
    zk.create(f"{zk_root}/consumers/c1", json.dumps(doc).encode(), ephemeral=True)
    rc, out, err = run(capsys, "status", *common(zk_hosts, zk_root))
    assert rc == 0, err
    assert "\\x1b[31mevil\\u202e" in out and "\\x1b]0;pwned\\x07" in out
    assert_clean(out)


def test_json_log_lines_stay_json_with_non_finite_numbers():
    from zkcrawl.logs import _json_line

    line = _json_line({"event": "x", "v": float("nan"), "w": [float("-inf"), 1.5]})
    assert json.loads(line) == {"event": "x", "v": None, "w": [None, 1.5]}


@pytest.mark.parametrize("url, shown", [
    ("https://user:secret@example.org/a", "https://***@example.org/a"),
    ("http://:secret@example.org/", "http://***@example.org/"),
    ("https://example.org/a?mail=x@y.test", "https://example.org/a?mail=x@y.test"),
    ("no url here@all", "no url here@all"),
])
def test_credentials_in_urls_are_redacted(url, shown):
    from zkcrawl.textsafe import redact_userinfo

    assert redact_userinfo(url) == shown


def test_log_lines_never_carry_url_credentials():
    import io

    from zkcrawl import logs

    buf = io.StringIO()
    logs.configure("json", "info", stream=buf)
    try:
        logs.get_logger("t").info("item.done", url="https://bob:hunter2@example.org/x")
        logs.flush()
    finally:
        logs.configure("json", "info")
    assert "hunter2" not in buf.getvalue() and "https://***@example.org/x" in buf.getvalue()


def test_html_report_is_written_atomically_without_following_a_planted_name(tmp_path):
    from zkcrawl.admin.commands.report import write_html
    from zkcrawl.admin.report import summarize

    target = tmp_path / "report.html"
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "report.html.tmp-1").symlink_to(victim)  # the old predictable name
    write_html(str(target), summarize([{"url": "http://a.test/", "error": None}]))
    assert victim.read_text() == "keep" and target.read_text().startswith("<!")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".zkcrawl-report")] == []
