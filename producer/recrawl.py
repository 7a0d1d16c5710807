"""``--recrawl``: the producer's durable per-URL re-crawl schedule (SPEC §4), in SQLite next to
``--seen`` (``<seen>.recrawl`` unless ``--recrawl-store``). It learns from the consumers'
``<root>/fetched/`` reports (:mod:`zkcrawl.queue.fetched`) and re-offers each URL when due,
with its validators in ``meta.recrawl`` so the fetch is conditional.

* Schedule (:func:`next_interval`): unchanged x 1.4, changed x 0.8, within
  [``--recrawl-min``, ``--recrawl-max``], jittered; a 404/410 twice in a row retires a URL.
* **Durable, never reset silently**: a file that is not such a store, an empty one
  (truncated?), a row holding a value of the wrong type or range (:func:`_decode`), or a
  database error, is one line and exit 2.
* A report for a URL not in the store is counted as ``unknown`` and changes nothing.
* **At-least-once re-offers**: a URL's next time moves on only after its offer committed.
* **Bounded**: due URLs are read page by page through an index. Rows are keyed by a 63-bit
  hash of the URL, and the URL is compared on lookup: a collision unschedules, never mixes.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from zkcrawl.errors import UsageError
from zkcrawl.producer import watch
from zkcrawl.queue.fetched import Fetched, FetchedReader
from zkcrawl.web.validators import Validators

__all__ = ["APPLICATION_ID", "GROW", "JITTER", "SHRINK", "VERSION", "Due", "Learnt",
           "RecrawlStore", "Schedule", "next_interval", "parse_duration", "store_path"]

log = structlog.get_logger(__name__)

APPLICATION_ID = 0x7A6B6372  # "zkcr": PRAGMA application_id of a store
VERSION = 1  # PRAGMA user_version; a newer one is refused
GROW = 1.4  # unchanged: interval x this
SHRINK = 0.8  # changed: interval x this
JITTER = 0.1  # +- share of the interval
GONE_STATUSES = frozenset({404, 410})
GONE_RETIRE = 2  # gone answers in a row that retire a URL
MAX_SECONDS = 10 * 365 * 86400  # a duration over ten years is a typo
CACHE_KIB = 64 * 1024  # SQLite page cache: random-key inserts stay in memory longer

_SCHEMA = """
CREATE TABLE urls (
    id INTEGER PRIMARY KEY,      -- 63-bit BLAKE2b of the URL
    url TEXT NOT NULL,
    due INTEGER NOT NULL,        -- next fetch, Unix seconds (REAL with a fraction)
    interval INTEGER NOT NULL,   -- seconds
    etag TEXT, last_modified TEXT, signature TEXT,
    errors INTEGER NOT NULL DEFAULT 0,
    gone INTEGER NOT NULL DEFAULT 0,
    retired INTEGER NOT NULL DEFAULT 0,
    changes INTEGER NOT NULL DEFAULT 0, fetches INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX urls_due ON urls(due) WHERE retired = 0;
"""


def parse_duration(text: str, flag: str) -> float:
    """Seconds of ``90``, ``30s``, ``15m``, ``1h``, ``30d``, ``2w``, 1 s to 3650 days;
    UsageError otherwise (the producer's one parser, :func:`~zkcrawl.producer.watch.
    parse_duration`, with this bound)."""
    return watch.parse_duration(text, flag, max_seconds=MAX_SECONDS)


def store_path(seen: str | None, explicit: str | None) -> str | None:
    """Where the store lives: ``--recrawl-store``, else next to ``--seen``."""
    return explicit or (f"{seen}.recrawl" if seen else None)


@dataclass(frozen=True)
class Schedule:
    """The adaptive schedule's bounds (seconds) and randomness (seedable for tests)."""

    min_s: float = 3600.0
    max_s: float = 30 * 86400.0
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def clamp(self, seconds: float) -> int:
        return int(min(max(seconds, self.min_s), self.max_s))

    def jittered(self, at: float, interval: int) -> float:
        """The next due time, to the fraction of a second: a whole-second due time, cut
        down, made a URL learnt at x.95 s due 0.05 s later under a 1 s interval (CI: the
        first pass re-offered a URL it had just added)."""
        return at + interval * (1 + self.rng.uniform(-JITTER, JITTER))


def next_interval(interval: float, changed: bool | None, schedule: Schedule) -> int:
    """The interval after an outcome: unchanged x :data:`GROW`, changed x :data:`SHRINK`,
    unknown kept; clamped to the schedule's bounds (a hostile stored value too)."""
    if not math.isfinite(interval):
        interval = schedule.min_s
    if changed is False:
        interval *= GROW
    elif changed is True:
        interval *= SHRINK
    return schedule.clamp(interval)


def url_id(url: str) -> int:
    digest = hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # 63 bits: a positive SQLite integer


@dataclass(frozen=True)
class Due:
    """A URL to offer again, with what its last answer returned."""

    id: int
    url: str
    validators: Validators
    due: float = 0.0  # when it came due (the order of :meth:`RecrawlStore.due`)


@dataclass
class Learnt:
    """What one drain taught: outcomes by kind (``new`` first fetch, ``changed``,
    ``unchanged``, ``gone``, ``error``), URLs retired, reports for unknown URLs."""

    kinds: Counter[str] = field(default_factory=Counter)
    retired: int = 0
    unknown: int = 0


class RecrawlStore:
    """The SQLite store; see the module docstring. Thread-safe (one lock; the offerer's
    committer thread adds new URLs while the producer thread reads due ones)."""

    def __init__(self, path: str, schedule: Schedule) -> None:
        self.path = path
        self.schedule = schedule
        self._lock = threading.Lock()
        self._db = _open(path)

    # -- URLs offered for the first time (the offerer's committer thread) ----------------
    def add_new(self, urls: Sequence[str], now: float | None = None) -> None:
        """Schedule URLs just offered for their first fetch (known ones are left alone)."""
        now = time.time() if now is None else now
        first = self.schedule.clamp(self.schedule.min_s)
        rows = sorted((url_id(u), u, self.schedule.jittered(now, first), first) for u in urls)
        self._write("INSERT OR IGNORE INTO urls (id, url, due, interval) VALUES (?,?,?,?)",
                    rows)

    # -- outcomes ------------------------------------------------------------------------
    def learn(self, entries: Iterable[Fetched]) -> Learnt:
        """Fold consumers' reports into the schedule (one transaction)."""
        learnt = Learnt()
        with self._lock, self._guard():
            cur = self._db.cursor()
            for e in entries:
                self._learn_one(cur, e, learnt)
            self._db.commit()
        return learnt

    def _learn_one(self, cur: sqlite3.Cursor, e: Fetched, learnt: Learnt) -> None:
        row = cur.execute("SELECT id, url, interval, gone, retired, fetches FROM urls "
                          "WHERE id = ?", (url_id(e.url),)).fetchone()
        if row is None:
            learnt.unknown += 1
            return
        _id, url, interval, gone, retired, fetches = _decode(self.path, row, _LEARN)
        if url != e.url or retired:
            learnt.unknown += url != e.url
            return
        kind = _kind(e, fetches)
        learnt.kinds[kind] += 1
        sid = url_id(e.url)
        if kind in ("gone", "error"):
            gone = gone + 1 if kind == "gone" else 0
            retire = int(gone >= GONE_RETIRE)
            learnt.retired += retire
            cur.execute("UPDATE urls SET gone = ?, retired = ?, errors = errors + ?, due = ? "
                        "WHERE id = ?", (gone, retire, int(kind == "error"),
                                         self.schedule.jittered(e.at, interval), sid))
            return
        new = next_interval(interval, e.changed, self.schedule)
        cur.execute("UPDATE urls SET interval = ?, due = ?, etag = ?, last_modified = ?, "
                    "signature = ?, errors = 0, gone = 0, fetches = fetches + 1, "
                    "changes = changes + ? WHERE id = ?",
                    (new, self.schedule.jittered(e.at, new), e.etag, e.last_modified,
                     e.signature, int(e.changed is True), sid))

    # -- due URLs ------------------------------------------------------------------------
    def due(self, now: float | None = None, limit: int = 500,
            after: tuple[float, int] | None = None) -> list[Due]:
        """Up to ``limit`` URLs due at ``now``, earliest first (then by id); ``after``: only
        those after this ``(due, id)`` -- a cursor, for a pass that leaves some due."""
        now = time.time() if now is None else now
        low, last = after if after is not None else (-math.inf, -1)
        with self._lock, self._guard():
            rows = self._db.execute(
                "SELECT id, url, etag, last_modified, signature, due, interval FROM urls "
                "WHERE retired = 0 AND due <= ? AND (due > ? OR (due = ? AND id > ?)) "
                "ORDER BY due, id LIMIT ?", (now, low, low, last, limit)
            ).fetchall()
        # the interval is checked too: offered() computes the next due time from it
        return [Due(i, u, Validators.from_meta({"etag": et, "last_modified": lm,
                                                "signature": sig}) or Validators(), float(d))
                for i, u, et, lm, sig, d, _interval in
                (_decode(self.path, r, _DUE) for r in rows)]

    def offered(self, ids: Sequence[int], now: float | None = None) -> None:
        """Their offer committed: next due one interval from now (no report needed)."""
        now = time.time() if now is None else now
        jit = self.schedule.rng.uniform
        with self._lock, self._guard():
            self._db.executemany(
                "UPDATE urls SET due = ? + MAX(1, interval * ?) WHERE id = ?",
                [(now, 1 + jit(-JITTER, JITTER), i) for i in ids])
            self._db.commit()

    def counts(self) -> dict[str, int]:
        """``urls``, ``retired``, ``due`` (now): for the summary and status."""
        with self._lock, self._guard():
            total, retired = self._db.execute(
                "SELECT count(*), coalesce(sum(retired != 0), 0) FROM urls").fetchone()
            due = self._db.execute("SELECT count(*) FROM urls WHERE retired = 0 AND due <= ?",
                                   (time.time(),)).fetchone()[0]
        return {"urls": total, "retired": retired, "due": due}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- internals -----------------------------------------------------------------------
    def _write(self, sql: str, rows: Sequence[tuple[object, ...]]) -> None:
        with self._lock, self._guard():
            self._db.executemany(sql, rows)
            self._db.commit()

    def _guard(self) -> _DbErrors:
        return _DbErrors(self.path)


def _kind(e: Fetched, fetches: int) -> str:
    if e.status in GONE_STATUSES:
        return "gone"
    if e.status is None or not (200 <= e.status < 300 or e.status == 304):
        return "error"
    if e.changed is None:
        return "new" if fetches == 0 else "changed"  # no previous signature known
    return "changed" if e.changed else "unchanged"


_DAMAGED = ("the file is damaged: restore it or move it away (a new one starts every URL at "
            "--recrawl-min)")
_MAX_COUNT = 2**53  # a counter above this was not written by zkcrawl
_LEARN = ("id", "url", "interval", "gone", "retired", "fetches")  # what each read selects
_DUE = ("id", "url", "etag", "last_modified", "signature", "due", "interval")


def _decode(path: str, row: Sequence[object], columns: Sequence[str]) -> tuple[Any, ...]:
    """A row as read, each value checked against what zkcrawl writes: a value of another
    type or out of range (a damaged or hand-edited file: the schema's column types do not
    bind a SQLite value) is damage -- one line naming the file and the row, exit 2 -- never
    a TypeError further on nor a row silently rescheduled."""
    for column, value in zip(columns, row, strict=True):
        if _fits(column, value):
            continue
        url = row[columns.index("url")]
        who = f"row {row[0]!r}" + (f" ({url[:200]!r})" if isinstance(url, str) else "")
        raise UsageError(f"--recrawl-store {path}: {who} has a bad {column} "
                         f"({repr(value)[:40]}); {_DAMAGED}")
    return tuple(row)


def _fits(column: str, value: object) -> bool:
    if column == "url":
        return isinstance(value, str)
    if column in ("etag", "last_modified", "signature"):
        return True  # cleaned by Validators.from_meta: a bad one is dropped
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if column == "due":
        return math.isfinite(value)
    if column == "interval":
        return 0 <= value <= MAX_SECONDS  # no NaN, no infinity
    return isinstance(value, int) and (column == "id" or 0 <= value <= _MAX_COUNT)


class _DbErrors:
    """A database error met while running: the store is damaged -- one line, exit 2."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, sqlite3.DatabaseError):
            raise UsageError(f"--recrawl-store {self.path}: database error ({exc}); "
                             f"{_DAMAGED}") from None


def _open(path: str) -> sqlite3.Connection:
    """Open or create the store; refuse a foreign, damaged, empty or newer file (UsageError).
    Only a path that does not exist makes a new store: checked before connecting, which
    creates the file (and would drop a ``-wal`` left next to an empty one)."""
    try:
        fresh = not os.path.exists(path)
        if not fresh and os.path.getsize(path) == 0:
            raise UsageError(f"--recrawl-store {path}: the file is empty (truncated?); "
                             "restore it, or delete it to start the store afresh (the "
                             "re-crawl schedule is lost: every URL starts at --recrawl-min)")
        db = sqlite3.connect(path, check_same_thread=False, isolation_level="DEFERRED")
        app, version = (db.execute("PRAGMA application_id").fetchone()[0],
                        db.execute("PRAGMA user_version").fetchone()[0])
        if fresh:
            db.execute("PRAGMA journal_mode = WAL")
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute(f"PRAGMA user_version = {VERSION}")
            db.commit()
        elif app != APPLICATION_ID:
            raise UsageError(f"--recrawl-store {path}: not a zkcrawl re-crawl store "
                             "(another SQLite database?); give another path")
        elif version > VERSION:
            raise UsageError(f"--recrawl-store {path}: written by a newer zkcrawl (store "
                             f"version {version}, this one reads {VERSION}); upgrade")
        else:
            db.execute("SELECT id, url, due, interval, etag, last_modified, signature, "
                       "errors, gone, retired, changes, fetches FROM urls LIMIT 1").fetchall()
        db.execute("PRAGMA synchronous = NORMAL")  # WAL: a crash keeps every commit but the last
        db.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
    except sqlite3.DatabaseError as exc:
        raise UsageError(f"--recrawl-store {path}: not a readable re-crawl store ({exc}); "
                         "restore it or move it away") from None
    except OSError as exc:
        raise UsageError(f"--recrawl-store {path}: {exc.strerror or exc}") from None
    return db


# -- the producer's re-crawl pass ---------------------------------------------------------
class ItemOfferer(Protocol):
    """What a pass needs of the producer's :class:`~zkcrawl.producer.offerer.Offerer`: items with
    their own meta, a callback with their keys once committed, a wait for the held ones."""

    def offer_item(self, url: str, meta: dict[str, object], key: object,
                   on_committed: Callable[[list[object]], None]) -> bool: ...

    def drain(self) -> None: ...


NODES_PER_ROUND = 100  # fetched/ nodes read, learnt and deleted together


@dataclass
class PassCounts:
    """One re-crawl pass, for the summary, the log and the status node."""

    reports: int = 0
    nodes: int = 0
    reoffered: int = 0
    learnt: Learnt = field(default_factory=Learnt)

    def doc(self) -> dict[str, object]:
        return {"reports": self.reports, "nodes": self.nodes, "reoffered": self.reoffered,
                "retired": self.learnt.retired, "unknown": self.learnt.unknown,
                **{k: self.learnt.kinds.get(k, 0)
                   for k in ("new", "changed", "unchanged", "gone", "error")}}


class Recrawler:
    """Drain ``<root>/fetched/`` into the store, then offer what is due; one thread.

    ``reader``: a :class:`~zkcrawl.queue.fetched.FetchedReader`; ``offerer``: the producer's
    (its back-pressure holds the pass); the store is read ``batch`` URLs at a time."""

    def __init__(self, store: RecrawlStore, reader: FetchedReader, offerer: ItemOfferer, *,
                 batch: int, stop: threading.Event) -> None:
        self.store, self.reader, self.offerer = store, reader, offerer
        self.batch = batch
        self.stop = stop
        self.counts = PassCounts()

    def run_pass(self, now: float | None = None) -> PassCounts:
        """Learn every report waiting, then offer every URL due at ``now``."""
        self.counts = PassCounts()
        while not self.stop.is_set() and self.drain_once():
            pass
        self.offer_due(now)
        while not self.stop.is_set() and self.drain_once():
            pass  # reports that came meanwhile: learnt now, not a pass later
        log.info("recrawl.pass", **self.counts.doc(), store=self.store.counts())
        return self.counts

    def drain_once(self) -> int:
        """Read up to :data:`NODES_PER_ROUND` nodes, learn them, delete them (after the
        store committed: a crash in between learns them twice, harmless)."""
        names = self.reader.names()[:NODES_PER_ROUND]
        if not names:
            return 0
        nodes = self.reader.read(names)
        entries = [e for n in nodes for e in n.decoded.entries]
        learnt = self.store.learn(entries)
        self.reader.delete(names)
        c = self.counts
        c.nodes += len(names)
        c.reports += len(entries)
        c.learnt.kinds.update(learnt.kinds)
        c.learnt.retired += learnt.retired
        c.learnt.unknown += learnt.unknown
        if learnt.unknown:
            log.warning("recrawl.unknown_urls", reports=learnt.unknown,
                        reason="reported in <root>/fetched/ but never offered by this "
                        "store's producer: ignored")
        return len(names)

    def offer_due(self, now: float | None = None) -> int:
        """Offer every URL due at ``now`` through the offerer, its validators in
        ``meta.recrawl`` (per-partition back-pressure: a full partition's URLs are held
        while the others go on), read with a cursor so a held one is not read again; ends
        once the held ones committed too. A URL's next time moves on when its batch
        committed (the callback)."""
        now = time.time() if now is None else now
        before = self.counts.reoffered
        cursor: tuple[float, int] | None = None

        def committed(ids: list[object]) -> None:  # the offerer's committer thread
            self.store.offered([int(str(i)) for i in ids], now)
            self.counts.reoffered += len(ids)

        while not self.stop.is_set():
            due = self.store.due(now, self.batch, after=cursor)
            if not due:
                break
            cursor = (due[-1].due, due[-1].id)
            for d in due:
                self.offerer.offer_item(d.url, {"source": "recrawl",
                                                "recrawl": d.validators.doc()},
                                        d.id, committed)
        self.offerer.drain()
        return self.counts.reoffered - before
