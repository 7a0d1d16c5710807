"""The sink seam: what the committer hands a result sink, and what a sink promises back (SPEC
§3, durable first). The implementations, :mod:`.jsonl` and :mod:`.postgres`, import this
module; :func:`zkcrawl.consumer.sinks.open_sink` picks one from ``--out``.

* **Write and commit in one call**: when :meth:`ResultSink.write_batch` returns, every
  record it did not refuse is durable (fsynced or committed); only then are the items
  completed. A refused record (with its reason) makes its item a dead letter; the group
  goes on.
* **Failure**: :class:`SinkUnavailable` for a passing failure (the consumer stops claiming
  and waits for :attr:`ResultSink.available`), a plain :class:`SinkError` for good (exit 1).
* **At least once, effectively once**: a crash between write and completion stores a record
  twice in a file, once in PostgreSQL (its key).
* **One owner thread**: only the committer writes, so a sink needs no lock for its writes;
  :meth:`~ResultSink.request_reopen` is signal-safe (a flag).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from zkcrawl.errors import SinkError

__all__ = ["Entry", "Record", "ResultSink", "SinkError", "SinkUnavailable"]

Record = dict[str, Any]  # one result record (SPEC §4 "Output record")


@dataclass(frozen=True, slots=True)
class Entry:
    """A record on its way to the sink, with the identity of the item it is for: the
    item's znode name and creation time (ms, ZooKeeper's clock). A redelivered item has
    both unchanged; a queue recreated from scratch reuses names, never both."""

    item: str
    created_ms: int
    record: Record
    outcome: str = "complete"  # what the committer does next: complete, or dead (a letter)


class SinkUnavailable(SinkError):
    """The sink cannot take records for now (its database is unreachable): the consumer
    stops claiming, releases what it holds and waits for :attr:`ResultSink.available`."""


class ResultSink(Protocol):
    """What the committer needs of a sink (see the module docstring for who calls what)."""

    #: ``--out`` as it may be shown in logs (no credentials).
    describe: str

    def write_batch(self, entries: Sequence[Entry]) -> list[str | None]:
        """Store the records durably; per entry None (stored) or the reason it was refused
        (that item becomes a dead letter with it). Raises :class:`SinkError` when nothing
        was stored: :class:`SinkUnavailable` for a passing failure, else for good."""
        ...

    def between_groups(self) -> None:
        """Housekeeping between two groups: reopen a file when asked (SIGHUP), reconnect a
        database when its backoff is due. Never raises."""
        ...

    def request_reopen(self) -> None:
        """SIGHUP: reopen at the next group boundary. Sets a flag, nothing else."""
        ...

    @property
    def reopen_requested(self) -> bool: ...

    @property
    def available(self) -> bool:
        """Takes records now (False: unreachable, reconnecting)."""
        ...

    def wait_available(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for :attr:`available`."""
        ...

    def close(self) -> None:
        """Release the file or the connection. Records never written are dropped: their
        items were not completed, so they will be fetched again."""
        ...
