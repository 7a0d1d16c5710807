"""``zkcrawl-producer --dry-run``: the whole producer run -- the listing walk (or the
``--from-file`` list), the filters, the de-duplication -- with its offers printed instead
of made.

Guarantees: no ZooKeeper connection is opened, and the ``--seen`` state is read (so URLs
offered by earlier runs count as duplicates, as they would) but never written. Each URL that
would be offered is printed once, normalized, one per line on stdout -- in the form
``--from-file`` reads, so the output can be reviewed and then fed to a real run -- and a
one-line summary goes to stderr (with the pages on which the links selector selected
nothing). The exit status is the real run's: 1 when a listing page could not be read or when
pages were read and nothing would be offered (one more line naming the selector).
"""

from __future__ import annotations

import sys
import threading
from typing import IO

import structlog

from zkcrawl import logs
from zkcrawl.producer.summary import Counts, no_links_note
from zkcrawl.queue.untrusted import url_too_long
from zkcrawl.seen import SeenSet
from zkcrawl.textsafe import printable

log = structlog.get_logger(__name__)  # lazy: bound after logs.configure()


class DryOfferer:
    """The :class:`~zkcrawl.producer.offerer.Offerer`'s interface (``add``, ``flush``, ``pending``,
    ``close``) and its accept rules (too long, seen before, already taken in this run),
    writing each accepted URL to ``out`` instead of offering it."""

    def __init__(self, seen: SeenSet, counts: Counts, out: IO[str]) -> None:
        self.seen = seen
        self.counts = counts
        self.out = out
        self._taken: set[str] = set()
        self._lock = threading.Lock()

    @property
    def pending(self) -> int:
        return 0  # nothing is ever buffered

    def add(self, url: str, source: str) -> bool:
        if url_too_long(url):
            self.counts.dropped["too-long"] += 1
            return False
        with self._lock:
            if url in self._taken or url in self.seen:
                self.counts.duplicates += 1
                return False
            self._taken.add(url)
            self.counts.offered += 1
        self.out.write(url + "\n")  # normalized: no control character survives normalization
        return True

    def flush(self) -> None:
        self.out.flush()

    push = flush  # nothing is ever buffered: nothing to commit later

    def close(self) -> None:
        self.flush()


def summary_line(c: Counts, from_file: bool) -> str:
    """``zkcrawl-producer --dry-run: N URLs would be offered (...)``, for stderr."""
    read = (f"{c.lines_read} lines read, {c.rejected} rejected" if from_file else
            f"{c.pages_read} pages read, {len(c.pages_failed)} failed, "
            f"{sum(c.pages_skipped.values())} skipped, {c.links_found} links found")
    dropped = ", ".join(f"{k} {v}" for k, v in c.dropped.most_common())
    failed = "".join(f"; failed: {printable(u, 200)} ({e})" for u, e in c.pages_failed[:5])
    note = no_links_note(c)
    return (f"zkcrawl-producer --dry-run: {c.offered} URLs would be offered ({read}, "
            f"{c.duplicates} duplicates, {sum(c.dropped.values())} dropped"
            f"{': ' + dropped if dropped else ''}){failed}"
            f"{'; ' + printable(note, 300) if note else ''}; nothing was offered")


def finish(c: Counts, from_file: bool, err: IO[str] | None = None) -> None:
    event = c.as_event()
    (log.warning if event["problem"] else log.info)("producer.summary", dry_run=True, **event)
    logs.flush()  # the page events first, then the line
    print(summary_line(c, from_file), file=err or sys.stderr, flush=True)
