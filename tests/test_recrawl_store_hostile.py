"""The ``--recrawl`` store against hostile files (issue #23: "a store file that is corrupt or
from a newer version: one line and exit 2, never a silent reset"): a store truncated to 0
bytes is refused, not reset; a row whose values have the wrong type or range (written with
the sqlite3 module into an otherwise valid store) is damage -- one line naming the file and
the row, exit 2 -- in every read path (learn, due, offered, counts), never a traceback."""

from __future__ import annotations

import random
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.producer.main import main as producer_main
from zkcrawl.producer.recrawl import (
    APPLICATION_ID,
    MAX_SECONDS,
    VERSION,
    RecrawlStore,
    Schedule,
    url_id,
)
from zkcrawl.queue.fetched import Fetched
from zkcrawl.zk.client import ZkClient

HOUR, DAY = 3600.0, 86400.0
NOW = 1_000_000_000.0
URL = "https://h/a"


def _sched() -> Schedule:
    return Schedule(HOUR, 30 * DAY, random.Random(5))


def _one_line_usage(info: pytest.ExceptionInfo[UsageError]) -> str:
    text = str(info.value)
    assert "\n" not in text and "\r" not in text
    assert info.value.exit_status == ExitStatus.USAGE
    return text


# -- a store truncated to nothing ---------------------------------------------------------

def test_an_empty_store_file_is_refused_not_reset(tmp_path: Path) -> None:
    path = tmp_path / "s.recrawl"
    path.write_bytes(b"")
    wal = tmp_path / "s.recrawl-wal"
    wal.write_bytes(b"w" * 100)  # what is left of it must stay for the operator, too
    with pytest.raises(UsageError) as info:
        RecrawlStore(str(path), _sched())
    text = _one_line_usage(info)
    assert str(path) in text and "empty" in text and "delete" in text
    assert path.read_bytes() == b"" and wal.read_bytes() == b"w" * 100  # never reset
    path.unlink()  # what the line says: deleting it starts afresh
    store = RecrawlStore(str(path), _sched())
    store.add_new([URL], NOW)
    assert store.counts()["urls"] == 1
    store.close()


def test_a_missing_store_is_created_fresh_and_reopened(tmp_path: Path) -> None:
    path = tmp_path / "new.recrawl"
    store = RecrawlStore(str(path), _sched())
    store.add_new([URL], NOW)
    store.close()
    assert path.stat().st_size > 0
    store = RecrawlStore(str(path), _sched())
    assert store.counts()["urls"] == 1
    store.close()


def test_producer_cli_refuses_an_empty_store(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "seen.recrawl").write_bytes(b"")
    code = producer_main(["--recrawl", "--seen", str(tmp_path / "seen"), "--zk",
                          "127.0.0.1:1", "--log-format", "json"], {})
    assert code == ExitStatus.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "empty" in err[0] and "seen.recrawl" in err[0], err
    assert (tmp_path / "seen.recrawl").read_bytes() == b""


# -- rows with bad values -----------------------------------------------------------------

_COLUMNS = ("id INTEGER PRIMARY KEY, url, due, interval, etag, last_modified, signature, "
            "errors, gone, retired, changes, fetches")


def _loose_store(path: Path) -> sqlite3.Connection:
    """A store that passes every check of the opening (ours: id, version, columns) but whose
    table has no NOT NULL and no types: what a damaged or hand-edited file can hold."""
    db = sqlite3.connect(path)
    db.execute(f"CREATE TABLE urls ({_COLUMNS})")
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute(f"PRAGMA user_version = {VERSION}")
    db.commit()
    return db


def _row(db: sqlite3.Connection, url: object = URL, **values: object) -> None:
    row: dict[str, object] = {"id": url_id(URL), "url": url, "due": NOW - 10,
                              "interval": HOUR, "etag": None, "last_modified": None,
                              "signature": None, "errors": 0, "gone": 0, "retired": 0,
                              "changes": 0, "fetches": 1} | values
    db.execute(f"INSERT OR REPLACE INTO urls ({', '.join(row)}) VALUES "
               f"({', '.join('?' * len(row))})", tuple(row.values()))
    db.commit()


BAD = [("interval", "soon"), ("interval", None), ("interval", b"\x01"), ("interval", -5),
       ("interval", float("inf")), ("interval", 1e300), ("interval", MAX_SECONDS * 2),
       ("gone", "x"), ("gone", None), ("gone", 2**63 - 1), ("gone", -1), ("gone", 1.5),
       ("fetches", "x"), ("fetches", None), ("fetches", b""), ("retired", "no"),
       ("retired", None), ("url", None), ("url", b"https://h/a"), ("due", float("-inf"))]


@pytest.mark.parametrize(("column", "value"), BAD, ids=[f"{c}={v!r}" for c, v in BAD])
def test_a_row_with_a_bad_value_is_one_line_naming_the_file_and_row(
        tmp_path: Path, column: str, value: object) -> None:
    path = tmp_path / "s.recrawl"
    db = _loose_store(path)
    _row(db, **{column: value})
    db.close()
    store = RecrawlStore(str(path), _sched())
    uses = {"learn": lambda: store.learn([Fetched(URL, 200, False, None, None, None, NOW)]),
            "gone": lambda: store.learn([Fetched(URL, 404, None, None, None, None, NOW)]),
            "due": lambda: store.due(NOW)}
    reads = {"due": ("due",), "gone": ("learn", "gone"), "fetches": ("learn", "gone"),
             "retired": ("learn", "gone")}.get(column, tuple(uses))  # what reads the column
    uses = {k: v for k, v in uses.items() if k in reads}
    for name, use in uses.items():
        with pytest.raises(UsageError) as info:
            use()
        text = _one_line_usage(info)
        assert str(path) in text and column in text, (name, text)
        assert URL in text or str(url_id(URL)) in text, (name, text)
    store.close()


def test_a_typed_store_with_text_in_a_number_column_is_refused(tmp_path: Path) -> None:
    """The real schema (INTEGER affinity keeps a text that is not a number as text)."""
    path = tmp_path / "s.recrawl"
    store = RecrawlStore(str(path), _sched())
    store.add_new([URL, "https://h/b"], NOW)
    store.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE urls SET interval = 'a week', due = ? WHERE url = ?", (NOW - 1, URL))
    db.commit()
    db.close()
    store = RecrawlStore(str(path), _sched())
    for use in (lambda: store.due(NOW + DAY),
                lambda: store.learn([Fetched(URL, 200, True, None, None, None, NOW)])):
        with pytest.raises(UsageError, match="interval") as info:
            use()
        assert URL in _one_line_usage(info)
    assert store.learn([Fetched("https://h/b", 200, True, None, None, None, NOW)]).kinds \
        == {"changed": 1}  # the other rows still read
    store.close()


def test_counts_of_a_store_with_odd_retired_values_are_integers(tmp_path: Path) -> None:
    path = tmp_path / "s.recrawl"
    db = _loose_store(path)
    _row(db)
    _row(db, url="https://h/b", id=url_id("https://h/b"), retired=float("inf"))
    _row(db, url="https://h/c", id=url_id("https://h/c"), retired="yes")
    db.close()
    store = RecrawlStore(str(path), _sched())
    counts = store.counts()
    assert all(type(v) is int for v in counts.values()), counts
    assert counts["urls"] == 3 and counts["retired"] == 2
    store.close()


_VALUES = st.one_of(st.none(), st.integers(-2**63, 2**63 - 1),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=6), st.binary(max_size=6), st.sampled_from([URL]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({c: _VALUES for c in ("url", "due", "interval", "gone",
                                                    "retired", "fetches")}),
       st.sampled_from([200, 304, 404, None]), st.sampled_from([None, True, False]))
def test_any_row_is_read_or_refused_in_one_line(values: dict[str, object], status: int | None,
                                                changed: bool | None) -> None:
    """Whatever a row holds: every read path works or raises one UsageError line."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.recrawl"
        db = _loose_store(path)
        _row(db, **values)
        db.close()
        store = RecrawlStore(str(path), _sched())
        try:
            for use in (lambda: store.due(NOW + 400 * DAY),
                        lambda: store.learn([Fetched(URL, status, changed, None, None,
                                                     None, NOW)]),
                        lambda: store.offered([url_id(URL)], NOW),
                        lambda: store.due(NOW + 400 * DAY),
                        store.counts):
                try:
                    use()
                except UsageError as exc:
                    assert "\n" not in str(exc) and str(path) in str(exc)
                    assert exc.exit_status == ExitStatus.USAGE
        finally:
            store.close()


def test_producer_cli_refuses_a_store_with_a_bad_row(zk: ZkClient, zk_hosts: str,
                                                     zk_root: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    seen = tmp_path / "seen"
    store = RecrawlStore(f"{seen}.recrawl", _sched())
    store.add_new([URL], NOW)
    store.close()
    db = sqlite3.connect(f"{seen}.recrawl")
    db.execute("UPDATE urls SET interval = 'often', due = ?", (time.time() - 60,))
    db.commit()
    db.close()
    code = producer_main(["--zk", zk_hosts, "--root", zk_root, "--seen", str(seen),
                          "--recrawl", "--log-format", "json"], {})
    err = capsys.readouterr().err.strip().splitlines()
    assert code == ExitStatus.USAGE, err
    lines = [e for e in err if not e.startswith("{")]  # the JSON log lines aside
    assert len(lines) == 1 and "interval" in lines[0] and URL in lines[0], err
    assert "Traceback" not in "\n".join(err)
