"""Result sinks: the interface in :mod:`.base`, the implementations beside it --
:mod:`.jsonl` (a file or stdout) and :mod:`.postgres` (a PostgreSQL table) -- and
:func:`open_sink`, the one place that picks one from ``--out``.

Imports go one way: the implementations import :mod:`.base`, this module imports them; the
PostgreSQL one only when ``--out`` names a database (psycopg is the optional ``postgres``
extra, and a file sink never loads it). ``tests/test_structure_imports.py`` checks that no
import, at the top or inside a function, closes a circle.
"""

from __future__ import annotations

from zkcrawl.consumer.sinks.base import Entry, Record, ResultSink, SinkUnavailable
from zkcrawl.consumer.sinks.jsonl import JsonLinesSink, Sink
from zkcrawl.errors import UsageError
from zkcrawl.postgres import is_database_url

__all__ = ["Entry", "JsonLinesSink", "Record", "ResultSink", "Sink", "SinkUnavailable",
           "open_sink"]


def open_sink(out: str, root: str) -> ResultSink:
    """The sink ``--out`` names: a PostgreSQL URL (rows keyed by ``root`` and item), else a
    JSON Lines path or ``-``. A bad value is a :class:`UsageError` (exit 2)."""
    if not is_database_url(out):
        return JsonLinesSink(out)
    try:  # the optional extra: loaded only for a database
        from zkcrawl.consumer.sinks.postgres import PostgresSink
    except ImportError:  # psycopg missing
        raise UsageError("--out postgresql://...: the PostgreSQL driver is not installed:"
                         " pip install 'zkcrawl[postgres]'") from None
    return PostgresSink(out, root)
