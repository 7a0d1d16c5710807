"""The PostgreSQL sink: one transaction per group, one row per item, effectively once
(``--out postgresql://...``; the URL and the table's columns: :mod:`zkcrawl.postgres`).

* **Durable first**: :meth:`PostgresSink.write_batch` returns once the group's transaction
  is committed; only then are the items completed in ZooKeeper.
* **Effectively once**: the key ``(root, item, item_created)`` with ``ON CONFLICT DO
  NOTHING``: a redelivered item stores nothing (``sink.duplicate``) and is completed.
* **One bad record does not poison the group**: a failed insert is retried row by row in
  savepoints; the failing rows' items become dead letters with the database's reason.
* **Database down**: :class:`~zkcrawl.consumer.sinks.base.SinkUnavailable` (the consumer stops
  claiming); :meth:`PostgresSink.between_groups` reconnects with jittered backoff
  (``sink.down``, ``sink.still_down``, ``sink.up``).
* Text is stored as valid UTF-8 without NUL; non-finite floats in ``jsonb`` become null.
  Only the committer thread uses the one connection.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
import structlog
from psycopg import sql
from psycopg.types.json import Jsonb

from zkcrawl.backoff import RECONNECT
from zkcrawl.consumer.sinks.base import Entry, SinkUnavailable
from zkcrawl.errors import UsageError, ZkCrawlError
from zkcrawl.jsonclean import json_clean
from zkcrawl.postgres import (
    COLUMNS,
    KEY,
    SINK_STATEMENT_TIMEOUT_MS,
    PgTarget,
    connect,
    create_table,
    first_line,
    parse_url,
    qualified,
)
from zkcrawl.textsafe import printable, scrub
from zkcrawl.web.urls import host_of

__all__ = ["PostgresSink"]

log = structlog.get_logger(__name__)

LOG_EVERY = 60.0  # at most one sink.still_down line per this many seconds
ROWS_PER_INSERT = 500  # rows per INSERT statement (20 parameters each: PostgreSQL takes 65535)
REASON_LIMIT = 200  # characters of the database's reason kept for a dead letter

_NAMES = tuple(name for name, _ in COLUMNS)
_TYPED = tuple((name, kind.removesuffix(" NOT NULL")) for name, kind in COLUMNS)
#: What each column takes from a record (bool is no number: True is not 1 in a record).
_ACCEPTS: dict[str, tuple[type, ...]] = {
    "text": (str,), "integer": (int,), "bigint": (int,), "double precision": (int, float),
    "timestamptz": (str, datetime)}
_KNOWN = frozenset(_NAMES)
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_UNSAFE = re.compile("[\x00\ud800-\udfff]")  # what PostgreSQL text cannot hold
_FIRST = ("root", "item_created", "host", "outcome", "extra")  # then the record's columns
_ITEM = len(_FIRST) + _NAMES.index("item")  # the item's place in a row


class PostgresSink:
    """A :class:`~zkcrawl.consumer.sinks.base.ResultSink` writing rows to a PostgreSQL table."""

    def __init__(self, url: str, root: str) -> None:
        self.target: PgTarget = parse_url(url)
        self.describe = self.target.shown
        self.root = root
        self.records = self.batches = self.duplicates = self.refused = 0
        self._conn: psycopg.Connection[Any] | None = self._open()  # failure: exit 2 or 75
        self._insert = _insert_sql(self.target)
        self._check()
        self._up = threading.Event()
        self._up.set()
        self._reopen = False
        self._why = ""
        self._down_since = 0.0
        self._attempts = 0
        self._retry_at = 0.0
        self._next_log = 0.0

    def _open(self) -> psycopg.Connection[Any]:
        conn = connect(self.target, "zkcrawl-consumer", SINK_STATEMENT_TIMEOUT_MS)
        try:
            create_table(conn, self.target)
        except psycopg.Error as exc:  # no privilege to create it, say: the operator's to fix
            conn.close()
            raise UsageError(f"--out {self.target.shown}: cannot create table "
                             f"{self.target.table_name}: {first_line(exc)}") from None
        return conn

    def _check(self) -> None:
        """The table has our columns and key (a table made by someone else may not):
        planning the insert (EXPLAIN runs nothing) says so now, in one line, not at the
        first group."""
        assert self._conn is not None
        try:
            self._conn.execute(sql.SQL("EXPLAIN ") + self._insert,
                               [None] * (len(_FIRST) + len(_NAMES)))
        except psycopg.Error as exc:
            self._conn.close()
            raise UsageError(f"--out {self.target.shown}: table {self.target.table_name} "
                             f"does not fit: {first_line(exc)}") from None

    # -- ResultSink -----------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self._up.is_set()

    def wait_available(self, timeout: float) -> bool:
        return self._up.wait(timeout)

    def request_reopen(self) -> None:
        self._reopen = True  # signal handler: a flag only

    @property
    def reopen_requested(self) -> bool:
        return self._reopen

    def write_batch(self, entries: Sequence[Entry]) -> list[str | None]:
        conn = self._conn
        if conn is None:
            raise SinkUnavailable(f"{self.describe}: unavailable: {self._why}")
        built = [self._row(e) for e in entries]
        rows = [r for r in built if not isinstance(r, str)]
        try:
            try:
                inserted = self._insert_all(conn, rows)
                sent: list[str | None] = [None] * len(rows)
            except psycopg.Error as exc:
                if conn.broken or not _record_fault(exc):
                    raise
                sent, inserted = self._insert_each(conn, rows)
        except psycopg.Error as exc:
            self._lost(exc)
            raise SinkUnavailable(f"{self.describe}: {first_line(exc)}") from None
        self._attempts = 0  # written: the next outage starts its backoff afresh
        answers = iter(sent)
        refused = [r if isinstance(r, str) else next(answers) for r in built]
        self._count(entries, refused, inserted)
        return refused

    def between_groups(self) -> None:
        if self._reopen:
            self._reopen = False
            log.info("sink.reopen_ignored", out=self.describe, reason="a database, no file")
        if self._conn is None and time.monotonic() >= self._retry_at:
            self._reconnect()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._up.clear()

    # -- writing ----------------------------------------------------------------------------
    def _row(self, e: Entry) -> list[Any] | str:
        """The row's values, or why the record cannot be one. A record is the consumer's and
        the page processor's (result pipelines may return anything): each value is checked
        against its column here, so a wrong type is that record's reason, never an error
        of the batch or a type the server would take for a broken database."""
        rec = e.record
        url = rec.get("url")
        extra = {k: v for k, v in rec.items() if k not in _KNOWN}
        try:
            values: list[Any] = [self.root, datetime.fromtimestamp(e.created_ms / 1000, UTC),
                                 host_of(url) if isinstance(url, str) else None,
                                 str(e.outcome), _jsonb(extra) if extra else None]
            for name, kind in _TYPED:
                value = e.item if name == "item" else rec.get(name)
                values.append(_value(name, kind, value))
        except (TypeError, ValueError, RecursionError, OverflowError) as exc:
            return printable(str(exc) or type(exc).__name__, REASON_LIMIT)
        return values

    def _insert_all(self, conn: psycopg.Connection[Any], rows: list[list[Any]]) -> set[str]:
        """The group in one transaction, one multi-row INSERT per :data:`ROWS_PER_INSERT`
        rows (one round trip each; a value the driver cannot send fails before anything
        is sent); the items whose rows were new."""
        inserted: set[str] = set()
        with conn.transaction(), conn.cursor() as cur:
            for at in range(0, len(rows), ROWS_PER_INSERT):
                chunk = rows[at:at + ROWS_PER_INSERT]
                cur.execute(_insert_sql(self.target, len(chunk)),
                            [v for row in chunk for v in row], prepare=False)
                inserted.update(r[0] for r in cur.fetchall())
        return inserted

    def _insert_each(self, conn: psycopg.Connection[Any], rows: list[list[Any]]
                     ) -> tuple[list[str | None], set[str]]:
        """Row by row, each in a savepoint, in one transaction: a row the database refuses
        gets its reason, the others are committed together."""
        refused: list[str | None] = []
        inserted: set[str] = set()
        with conn.transaction(), conn.cursor() as cur:
            for row in rows:
                try:
                    with conn.transaction():
                        cur.execute(self._insert, row)
                        if cur.fetchone() is not None:
                            inserted.add(row[_ITEM])
                    refused.append(None)
                except psycopg.Error as exc:
                    if conn.broken or not _record_fault(exc):
                        raise
                    refused.append(_reason(exc))
        return refused, inserted

    def _count(self, entries: Sequence[Entry], refused: list[str | None],
               inserted: set[str]) -> None:
        stored = [e for e, why in zip(entries, refused, strict=True) if why is None]
        again = [e.item for e in stored if e.item not in inserted]
        self.batches += 1
        self.records += len(stored) - len(again)
        self.refused += len(entries) - len(stored)
        if again:
            self.duplicates += len(again)
            log.info("sink.duplicate", items=again[:20], count=len(again),
                     note="already stored (delivered again after a crash or a lost "
                          "session): kept once by the unique key")

    # -- losing and finding the database ----------------------------------------------------
    def _lost(self, exc: psycopg.Error) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None
        self._up.clear()
        now = time.monotonic()
        self._why = first_line(exc)
        self._down_since = now
        # A database that takes connections but fails every write (no privilege, read-only)
        # keeps its backoff growing: _attempts is reset by a successful write only.
        self._retry_at = now + _delay(self._attempts)
        if now >= self._next_log:
            self._next_log = now + LOG_EVERY
            log.error("sink.down", out=self.describe, error=self._why, note="claiming "
                      "stops, held items are released; reconnecting with backoff")

    def _reconnect(self) -> None:
        now = time.monotonic()
        try:
            conn = self._open()
        except (ZkCrawlError, psycopg.Error) as exc:
            self._attempts += 1
            self._retry_at = time.monotonic() + _delay(self._attempts)
            self._why = first_line(exc)
            if now >= self._next_log:
                self._next_log = now + LOG_EVERY
                log.warning("sink.still_down", out=self.describe, error=self._why,
                            attempts=self._attempts, down_s=round(now - self._down_since, 1))
            return
        self._conn = conn
        self._attempts += 1
        self._next_log = 0.0  # the next outage is news again
        self._up.set()
        log.info("sink.up", out=self.describe, attempts=self._attempts,
                 down_s=round(time.monotonic() - self._down_since, 3))


def _delay(attempts: int) -> float:
    """Seconds before the next connection attempt: :data:`zkcrawl.backoff.RECONNECT`
    (jittered: consumers that lost one database do not return in step)."""
    return RECONNECT.delay(attempts)


def _insert_sql(target: PgTarget, rows: int = 1) -> sql.Composed:
    names = (*_FIRST, *_NAMES)
    one = sql.SQL("({})").format(sql.SQL(", ").join(sql.Placeholder() * len(names)))
    return sql.SQL("INSERT INTO {} ({}) VALUES {} ON CONFLICT ({}) DO NOTHING "
                   "RETURNING item").format(
        qualified(target), sql.SQL(", ").join(sql.Identifier(n) for n in names),
        sql.SQL(", ").join([one] * rows), sql.SQL(", ").join(sql.Identifier(n) for n in KEY))


def _record_fault(exc: psycopg.Error) -> bool:
    """Is it this record's fault (a data or constraint error, a trigger's exception, a value
    the driver could not send), rather than the database's?"""
    if isinstance(exc, psycopg.DataError | psycopg.IntegrityError):
        return True
    if exc.sqlstate is None:  # raised by the driver before sending: a value it cannot adapt
        return isinstance(exc, psycopg.ProgrammingError)
    return exc.sqlstate.startswith(("22", "23", "P0"))


def _reason(exc: psycopg.Error) -> str:
    primary = exc.diag.message_primary if exc.sqlstate is not None else None
    return printable(primary or first_line(exc), REASON_LIMIT)


def _value(name: str, kind: str, value: Any) -> Any:
    """``value`` for column ``name`` of type ``kind``; TypeError names what does not fit."""
    if value is None:
        return None
    if kind == "jsonb":
        return _jsonb(value)
    if isinstance(value, bool) or not isinstance(value, _ACCEPTS[kind]):
        raise TypeError(f"{name}: a {type(value).__name__} where {kind} belongs")
    return _clean_text(value) if isinstance(value, str) else value


def _jsonb(value: Any) -> Jsonb:
    """Serialized here (TypeError/ValueError: not JSON), so the driver sends it as is."""
    text = _JSON.encode(json_clean(value, _clean_text))  # strings as for text columns
    return Jsonb(text, dumps=_as_is)


def _as_is(text: Any) -> str:
    return str(text)


def _clean_text(value: str) -> str:
    if _UNSAFE.search(value) is None:
        return value
    return scrub(value).replace("\x00", "\ufffd")


