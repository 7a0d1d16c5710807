"""``--follow``: drain ``<root>/discovered/`` into offers (SPEC §2, §4). Links the consumers'
page processors found pass the producer's normalization and filters (``--allow``,
``--deny``, ``--same-host``, ``--strip-param``, ``--max-link-depth``), then the
:class:`~zkcrawl.producer.offerer.Offerer`, with the depth in the new item's ``meta.depth``.

* **No link lost**: a node is deleted only after every link it gave is committed; a crash
  before the delete drains it again (duplicates the seen state drops); a malformed node is
  one warning and is deleted.
* **Bounded**: at most :data:`NODES_PER_ROUND` nodes are read at a time.
* **Ends when the crawl does**: after a round with no node, the queue is empty and
  ``discovered/`` still empty, in that order (consumers write links before completing the
  item that found them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from zkcrawl.producer.offerer import Offerer
from zkcrawl.producer.summary import Counts
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
        self._open: dict[str, list[str]] = {}  # node read -> its links, until all committed

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
        """One round: read up to :data:`NODES_PER_ROUND` nodes not read yet, offer their new
        links, and delete every node whose links are all committed. Returns the nodes read
        (0: none new; those whose links were still on their way may have gone)."""
        names = [n for n in self.reader.names() if n not in self._open][:NODES_PER_ROUND]
        if not names:
            self._settle()
            return 0
        nodes = self.reader.read(names)
        self.offerer.flush()  # anything else accepted before goes first
        offered, unoffered = self.counts.offered, self.counts.unoffered
        found = 0
        for node in nodes:
            found += len(node.decoded.links)
            self._open[node.name] = [u for link in node.decoded.links
                                     if (u := self._take(link)) is not None]
        for name in set(names) - {node.name for node in nodes}:
            self._open[name] = []  # gone since the listing: nothing to wait for
        self.offerer.flush()  # committed (or held back for a full partition, or raised)
        self.counts.links_found += found
        if self.counts.unoffered > unoffered:
            # Stopped while the queue was full: the nodes stay for the next run (the links
            # that were offered are in the seen state by now and will be skipped then).
            log.info("producer.discovered_kept", nodes=len(names))
            return 0
        settled = self._settle()
        log.info("producer.discovered", nodes=len(names), links=found,
                 new=self.counts.offered - offered, deleted=settled, waiting=len(self._open))
        return len(names)

    def _settle(self) -> int:
        """Delete the nodes none of whose links is still on its way (held back for a full
        partition, or in flight): those links are in the queue and the seen state now."""
        on_its_way = self.offerer.on_its_way
        done = [n for n, urls in self._open.items() if not any(on_its_way(u) for u in urls)]
        if done:
            self.reader.delete(done)
            for name in done:
                del self._open[name]
            self.counts.discovered += len(done)
        return len(done)

    def _take(self, link: Link) -> str | None:
        """The link's normalized URL once accepted (or a duplicate), None when dropped."""
        if link.depth > self.max_link_depth:
            self.counts.dropped["depth"] += 1
            return None
        source = link.source or link.url
        norm, reason = self.filter.check(link.url, source)
        if norm is None:
            if reason == "scheme":
                reason = drop_reason(link.url, source) or "scheme"
            self.counts.dropped[reason or "invalid"] += 1
            return None
        self.offerer.add(norm, link.source, link.depth)
        return norm
