"""``--follow``: drain ``<root>/discovered/`` into offers (SPEC §2, §4; issue #17).

Consumers' page processors find links; only a producer holds the seen state, so they come
back through here: each node's links pass the producer's normalization and filters
(``--allow``, ``--deny``, ``--same-host`` against the page that linked, ``--strip-param``),
``--max-link-depth`` (a link deeper is dropped, counted as ``depth``), then the
:class:`~producer.offerer.Offerer` -- seen state, batches, back-pressure -- with the depth
in the new item's ``meta.depth``.

Guarantees:

* **no link lost**: a batch of nodes is deleted only after every offer it gave committed
  (``Offerer.flush``); a crash before the delete drains them again (duplicates, dropped by
  the seen state). A malformed node is one warning (:mod:`zkcrawl.queue.discovered`) and is
  deleted with the batch: it can never be drained.
* **bounded**: at most :data:`NODES_PER_ROUND` nodes (64 KiB each) are read at a time.
* **ends when the crawl does**: after a round that found no node, the queue is empty (leased
  items included) and ``discovered/`` is still empty, in that order. Consumers write the
  links of an item before completing it, so an empty queue means every link found so far
  is in ``discovered/``; reading it afterwards misses none. A paused or stalled cluster
  keeps the producer waiting (SIGTERM stops it: what was drained and offered is kept).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from producer.offerer import Offerer
from producer.summary import Counts
from zkcrawl.queue.discovered import DiscoveredReader, Link
from zkcrawl.web.urls import LinkFilter, drop_reason

log = structlog.get_logger(__name__)  # lazy: bound after logs.configure()

NODES_PER_ROUND = 100  # nodes read, offered and deleted together (<= 6.4 MB of links)
POLL_S = 0.2  # pause between two empty looks at discovered/ (a bound, not a sync)


class Follower:
    """Drains ``discovered/`` through the producer's filters and offerer; one thread."""

    def __init__(self, reader: DiscoveredReader, offerer: Offerer, link_filter: LinkFilter,
                 counts: Counts, *, max_link_depth: int, queue_depth: Callable[[], int],
                 stop: threading.Event) -> None:
        self.reader = reader
        self.offerer = offerer
        self.filter = link_filter
        self.counts = counts
        self.max_link_depth = max_link_depth
        self.queue_depth = queue_depth
        self.stop = stop

    def run(self) -> None:
        """Drain until the crawl is over (see the module docstring) or stopped."""
        log.info("producer.following", max_link_depth=self.max_link_depth)
        while not self.stop.is_set():
            if self.drain_once():
                continue
            if self.queue_depth() == 0 and not self.reader.names():
                log.info("producer.follow_done", nodes=self.counts.discovered)
                return
            self.stop.wait(POLL_S)

    def drain_once(self) -> int:
        """One round: read up to :data:`NODES_PER_ROUND` nodes, offer their new links, and
        once those committed delete the nodes. Returns the nodes drained."""
        names = self.reader.names()[:NODES_PER_ROUND]
        if not names:
            return 0
        nodes = self.reader.read(names)
        self.offerer.flush()  # anything else accepted before goes first
        offered, unoffered = self.counts.offered, self.counts.unoffered
        found = 0
        for node in nodes:
            found += len(node.decoded.links)
            for link in node.decoded.links:
                self._take(link)
        self.offerer.flush()  # committed (or raised) before the nodes go
        self.counts.links_found += found
        if self.counts.unoffered > unoffered:
            # Stopped while the queue was full: the nodes stay for the next run (the links
            # that were offered are in the seen state by now and will be skipped then).
            log.info("producer.discovered_kept", nodes=len(names))
            return 0
        self.reader.delete(names)
        self.counts.discovered += len(names)
        log.info("producer.discovered", nodes=len(names), links=found,
                 new=self.counts.offered - offered)
        return len(names)

    def _take(self, link: Link) -> None:
        if link.depth > self.max_link_depth:
            self.counts.dropped["depth"] += 1
            return
        source = link.source or link.url
        norm, reason = self.filter.check(link.url, source)
        if norm is None:
            if reason == "scheme":
                reason = drop_reason(link.url, source) or "scheme"
            self.counts.dropped[reason or "invalid"] += 1
            return
        self.offerer.add(norm, link.source, link.depth)
