"""``zkcrawl report RESULTS.jsonl|postgresql://...  [--html PATH] [--json]``: what happened in
a crawl (the summary: :mod:`zkcrawl.admin.report`).

Reads result files (``-`` for stdin, ``.gz`` accepted) or a PostgreSQL results table, and
prints outcomes by reason, what broke (top URLs, per host), each consumer's share and where
the time went, with the verdict. ``--html PATH`` also writes one self-contained page,
``--json`` prints the summary document, ``--latest`` counts each URL once by its final
outcome, ``--dead`` adds ``--root``'s dead letters. Bad lines and values are counted, never
fatal: exit 2 only for an unreadable input or unwritable ``--html``, 1 for no record at all.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Mapping

from zkcrawl import postgres
from zkcrawl.admin import report
from zkcrawl.admin.cluster import DeadLetter, list_dead
from zkcrawl.admin.cluster import session as zk_session
from zkcrawl.errors import ExitStatus, UsageError
from zkcrawl.runner import setup_logging
from zkcrawl.settings import CommonSettings, opt
from zkcrawl.textsafe import printable

NAME = "report"
HELP = "summarize result files: outcomes, consumers, hosts, timings (text, JSON or HTML)"
EXAMPLES = """
    zkcrawl report results-*.jsonl
    zkcrawl report results.jsonl.gz --html report.html
    zkcrawl-consumer --out - --exit-when-idle 5 | zkcrawl report - --json
"""


@dataclasses.dataclass(frozen=True)
class Settings(CommonSettings):
    html: str | None = opt(None, "also write a self-contained HTML report to PATH",
                           metavar="PATH")
    json: bool = opt(False, "print the summary as one JSON object instead of text")
    latest: bool = opt(False, "count each URL once, by its final outcome (a requeued item "
                       "that failed, then succeeded, counts as ok)")
    dead: bool = opt(False, "also count the dead letters of --root (reads ZooKeeper --zk): "
                     "those without a failed record join the failure totals")

    def validate(self) -> None:
        super().validate()
        if self.html is not None and not self.html.strip():
            raise UsageError("--html needs a file name (it was empty)")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="RESULTS.jsonl|URL",
                        help="consumer result files (JSON Lines; - = stdin) or PostgreSQL "
                        "results tables (postgresql://USER@HOST/DB?table=NAME)")


def write_html(path: str, summary: dict[str, object]) -> None:
    """Write the page atomically through a private temporary file (``mkstemp``: an
    unpredictable name, created exclusively, mode 0600, in the target's directory, so
    nobody can plant a symlink there first); a half-written report is never left behind.
    The report gets the usual mode for a new file (0666 less the umask)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".zkcrawl-report-", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise UsageError(f"--html: cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(report.render_html(summary))
            os.fchmod(fh.fileno(), 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UsageError(f"--html: cannot write {path}: {exc.strerror or exc}") from None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def load_table(url: str) -> list[dict[str, object]]:
    """Every row of a results table, as records (exit 2 for a bad URL or table, 75 when
    the server cannot be reached)."""
    target = postgres.parse_url(url, flag="report")
    try:
        import psycopg  # noqa: F401 - the optional extra: say so in one line
    except ImportError:
        raise UsageError("report postgresql://...: the PostgreSQL driver is not installed: "
                         "pip install 'zkcrawl[postgres]'") from None
    return postgres.load_rows(target)


def execute(settings: Settings, ns: argparse.Namespace, env: Mapping[str, str]) -> ExitStatus:
    setup_logging(settings)
    tables = [f for f in ns.files if postgres.is_database_url(f)]
    records, bad = report.load_records([f for f in ns.files if f not in tables])
    for url in tables:
        records += load_table(url)
    dead: list[DeadLetter] = []
    if settings.dead:
        with zk_session(settings) as zk:
            dead = list(list_dead(zk, settings.root))
    summary = report.summarize(records, bad, latest=settings.latest, dead=dead)
    if settings.html:
        write_html(settings.html, summary)
    if settings.json:
        print(json.dumps(summary, ensure_ascii=False, sort_keys=True))
    else:
        sys.stdout.write(report.render_text(summary))
        if settings.html:
            print(f"\nHTML report: {printable(settings.html)}")
    if not records:
        names = ", ".join(printable(f) for f in ns.files)
        print(f"zkcrawl report: no records in {names}{report.skipped_note(summary)}",
              file=sys.stderr)
        return ExitStatus.FAILURE
    return ExitStatus.OK
