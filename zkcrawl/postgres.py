"""The PostgreSQL results table: its URL, its schema, connecting, reading it back.

Used by the consumer's sink (:mod:`zkcrawl.consumer.sinks.postgres`), ``zkcrawl report`` and
``zkcrawl demo``. The driver, psycopg 3, is the optional extra ``postgres``: it is imported
only when a ``postgresql://`` URL is used.

URL: ``postgresql://[user@]host[:port]/dbname[?table=NAME&PARAM=VALUE...]`` (``postgres://``
too). ``table`` (default ``pages``, ``schema.name`` allowed) is ours; every other parameter
is libpq's (``sslmode``, ``connect_timeout``, ``application_name``, ``passfile``...).
**No password in it**: a command line shows in ``ps`` and in unit files, so a URL with a
password (``user:secret@``, ``password=``, ``sslpassword=``) is refused with one line (exit 2);
libpq reads it from ``PGPASSWORD``, ``PGPASSFILE``/``~/.pgpass`` or a service file. So no
message ever needs to redact one; :attr:`PgTarget.shown` is still what messages print.

:func:`parse_url` decodes the URL as untrusted input: it raises :class:`UsageError` and
nothing else, whatever the string.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from zkcrawl.errors import ExitStatus, UsageError, ZkCrawlError
from zkcrawl.textsafe import printable, redact_userinfo

if TYPE_CHECKING:
    import psycopg

__all__ = ["COLUMNS", "DEFAULT_TABLE", "KEY", "SCHEMES", "DatabaseRefused",
           "DatabaseUnavailable", "PgTarget", "connect", "create_table", "first_line",
           "is_database_url", "load_rows", "parse_url", "qualified", "refusal"]

SCHEMES = ("postgresql", "postgres")
DEFAULT_TABLE = "pages"
#: libpq parameters that carry a secret: never on a command line.
_SECRET_PARAMS = frozenset({"password", "sslpassword"})
#: A table or schema name we quote ourselves: plain identifiers only.
_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
_TABLE = re.compile(rf"{_IDENT}(?:\.{_IDENT})?")
CONNECT_TIMEOUT_S = 5  # libpq connect_timeout unless the URL sets one
#: libpq defaults unless the URL sets them: a peer gone without a word (a host powered off,
#: a partition) is noticed in ~25 s when idle and 30 s with data unacknowledged, instead of
#: the kernel's hours.
NETWORK_DEFAULTS = {"keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
                    "tcp_user_timeout": 30_000}
#: The sink's statements: an insert waiting longer than this for a lock (an ALTER TABLE, a
#: LOCK held by someone) is cancelled and handled as a failing database.
SINK_STATEMENT_TIMEOUT_MS = 60_000

#: The columns of a record, in SPEC §4 order, with their SQL types.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("url", "text"), ("final_url", "text"), ("status", "integer"), ("title", "text"),
    ("fields", "jsonb"), ("bytes", "bigint"), ("item", "text NOT NULL"),
    ("attempt", "integer"), ("consumer", "text"), ("fetched_at", "timestamptz"),
    ("queue_ms", "double precision"), ("dispatch_ms", "double precision"),
    ("wait_ms", "double precision"), ("process_ms", "double precision"), ("error", "text"))
#: The unique key: one row per item, however often it is delivered (docs/guide/postgresql.md).
KEY = ("root", "item", "item_created")


class DatabaseUnavailable(ZkCrawlError):
    """The database could not be reached: exit 75 (EX_TEMPFAIL), worth a restart."""

    exit_status = ExitStatus.TEMPFAIL


class DatabaseRefused(UsageError):
    """The server refused this configuration for good (a database or role that does not
    exist, a wrong password, no pg_hba.conf entry): exit 2, so a supervisor does not restart
    a typo for ever (SPEC §4)."""


#: The server's FATAL lines at connection time that a restart cannot cure, with the SQLSTATE
#: each stands for. libpq keeps a failed connection's SQLSTATE to itself (psycopg's
#: ``sqlstate`` is None), so its message is matched: the server's English texts, and libpq's
#: own for a password the server asked for and nobody gave.
_REFUSALS: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(pattern), code, what) for pattern, code, what in (
        (r'database "[^"]*" does not exist', "3D000", "no such database"),
        (r'role "[^"]*" does not exist', "28000", "no such role"),
        (r"no pg_hba\.conf entry|pg_hba\.conf rejects connection", "28000",
         "pg_hba.conf refuses this connection"),
        (r"(?:Peer|Ident|GSSAPI|SSPI|LDAP|RADIUS|certificate) authentication failed",
         "28000", "authentication refused"),
        (r"password authentication failed for user", "28P01", "wrong password"),
        (r"fe_sendauth: no password supplied", "28P01",
         "the server asks for a password (PGPASSWORD or ~/.pgpass)"),
    ))


def refusal(message: str) -> tuple[str, str] | None:
    """``(SQLSTATE, what)`` when a failed connection's ``message`` is a refusal for good
    (:data:`_REFUSALS`), else None (an outage: worth a restart)."""
    for pattern, code, what in _REFUSALS:
        if pattern.search(message):
            return code, what
    return None


def connection_error(target: PgTarget, exc: BaseException) -> ZkCrawlError:
    """A failed connection as the error it is: :class:`DatabaseRefused` (exit 2) for a
    refusal for good, else :class:`DatabaseUnavailable` (exit 75)."""
    line = first_line(exc)
    refused = refusal(str(exc))
    if refused is None:
        return DatabaseUnavailable(f"{target.shown}: {line}")
    code, what = refused
    return DatabaseRefused(f"{target.shown}: {line} (SQLSTATE {code}, {what}: a "
                           "configuration error, not retried)")


@dataclass(frozen=True)
class PgTarget:
    """A decoded ``postgresql://`` URL."""

    conninfo: str  # for libpq: the URL without ``table``
    table: tuple[str, ...]  # (name,) or (schema, name)
    shown: str  # for messages: printable, no credentials

    @property
    def table_name(self) -> str:
        return ".".join(self.table)


def is_database_url(text: str) -> bool:
    return text.startswith(tuple(f"{s}://" for s in SCHEMES))


def parse_url(url: str, flag: str = "--out") -> PgTarget:
    """Decode a results-database URL; :class:`UsageError` (one line) for anything wrong."""
    masked = printable(redact_userinfo(url), 300)  # before the password check: masked
    try:
        url.encode("utf-8")
        if "\x00" in url:
            raise ValueError("NUL")
        parts = urlsplit(url)
        params = parse_qsl(parts.query, keep_blank_values=True, errors="strict")
    except (ValueError, UnicodeError):
        raise UsageError(f"{flag}: not a valid PostgreSQL URL: {masked}") from None
    if not is_database_url(url):  # urlsplit lower-cases the scheme: compare the text
        raise UsageError(f"{flag}: not a postgresql:// URL: {masked}")
    userinfo, at, _ = parts.netloc.rpartition("@")
    if (at and ":" in userinfo) or _SECRET_PARAMS & {k for k, _ in params}:
        raise UsageError(f"{flag}: no password in the URL (it would show in ps, logs and "
                         "unit files): use PGPASSWORD, PGPASSFILE or ~/.pgpass")
    shown = printable(url, 300)  # no password in it: the user name may be shown
    if parts.fragment:
        raise UsageError(f"{flag}: a PostgreSQL URL has no #fragment: {shown}")
    tables = [v for k, v in params if k == "table"]
    if len(tables) > 1:
        raise UsageError(f"{flag}: table= given twice: {shown}")
    table = tables[0] if tables else DEFAULT_TABLE
    if not _TABLE.fullmatch(table):
        raise UsageError(f"{flag}: table must be NAME or SCHEMA.NAME (letters, digits, _; "
                         f"at most 63 each), got {printable(table, 80)!r}")
    rest = urlencode([(k, v) for k, v in params if k != "table"], quote_via=quote)
    # Built by hand: urlunsplit drops an empty "//" (postgresql:// = libpq's defaults).
    conninfo = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{rest}" if rest else "")
    return PgTarget(conninfo, tuple(table.split(".")), shown)


def qualified(target: PgTarget) -> Any:
    """The table as a quoted SQL identifier (psycopg.sql.Identifier)."""
    from psycopg import sql

    return sql.Identifier(*target.table)


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An error's first line, printable and bounded (libpq's messages span lines)."""
    text = str(exc).strip().splitlines()
    return printable(text[0] if text else type(exc).__name__, limit)


def connect(target: PgTarget, application_name: str, statement_timeout_ms: int = 0
            ) -> psycopg.Connection[Any]:
    """An autocommit connection (transactions are explicit). A failure is
    :class:`DatabaseRefused` (exit 2) when the server refused the configuration for good (a
    missing database or role, a wrong password: :func:`refusal`), else
    :class:`DatabaseUnavailable` (exit 75: the server down or starting up, too many
    connections), with the server's reason either way."""
    import psycopg

    given = {k for k, _ in parse_qsl(urlsplit(target.conninfo).query)}
    extra: dict[str, Any] = {}
    if "connect_timeout" not in given:
        extra["connect_timeout"] = CONNECT_TIMEOUT_S
    if "application_name" not in given:
        extra["application_name"] = application_name
    extra.update({k: v for k, v in NETWORK_DEFAULTS.items() if k not in given})
    if statement_timeout_ms and "options" not in given:
        extra["options"] = f"-c statement_timeout={statement_timeout_ms}"
    try:
        return psycopg.connect(target.conninfo, autocommit=True, **extra)
    except psycopg.Error as exc:
        raise connection_error(target, exc) from None


def create_table(conn: psycopg.Connection[Any], target: PgTarget) -> None:
    """Create the table if missing (an advisory lock keeps consumers starting together
    from racing on the catalog), then check it has our columns and key."""
    from psycopg import sql

    table = qualified(target)
    columns = sql.SQL(", ").join(sql.SQL(f"{name} {kind}") for name, kind in COLUMNS)
    ddl = sql.SQL("CREATE TABLE IF NOT EXISTS {} (root text NOT NULL, "
                  "item_created timestamptz NOT NULL, {}, host text, outcome text, extra jsonb, "
                  "stored_at timestamptz NOT NULL DEFAULT now(), "
                  "PRIMARY KEY (root, item, item_created))").format(table, columns)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                    (f"zkcrawl:{target.table_name}",))
        cur.execute(ddl)


def load_rows(target: PgTarget, root: str | None = None) -> list[dict[str, Any]]:
    """Every record of the table (of one crawl ``root`` if given), as the dicts a JSON
    Lines file holds (times as ISO 8601 UTC strings), for ``zkcrawl report``."""
    import psycopg
    from psycopg import sql

    names = [name for name, _ in COLUMNS]
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(n) for n in names), qualified(target))
    args: tuple[Any, ...] = ()
    if root is not None:
        query = query + sql.SQL(" WHERE root = %s")
        args = (root,)
    with connect(target, "zkcrawl-report") as conn, conn.cursor() as cur:
        try:
            cur.execute(query, args)
            rows = cur.fetchall()
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"{target.shown}: {first_line(exc)}") from None
        except psycopg.Error as exc:
            raise UsageError(f"{target.shown}: {first_line(exc)}") from None
    return [row_record(names, row) for row in rows]


def row_record(names: Sequence[str], row: Sequence[Any]) -> dict[str, Any]:
    """One row as a record: times as ISO strings, decimals as floats; anything else as the
    driver gave it (the report counts what it cannot use). Never raises."""
    return {name: _plain(value) for name, value in zip(names, row, strict=False)}


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        try:
            value = value.astimezone(UTC)
        except OverflowError:  # year 1 at +14:00: no such UTC time
            return None
        return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(value, Decimal):
        return float(value) if value.is_finite() else None
    return value
