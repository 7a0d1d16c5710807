"""Discovered links: ``<root>/discovered/dn-NNNNNNNNNN`` (SPEC §2), consumer -> producer. The
consumer's committer writes the links a page processor returns here; a producer run with
``--follow`` drains them through its normalization, seen state and back-pressure.

* **Before completion** (at-least-once): :meth:`DiscoveredWriter.write` returns once the
  links are committed, and the committer calls it before it completes the group's items;
  a crash in between writes them again (duplicates the seen state drops).
* **Protected and bounded**: nodes of at most :data:`NODE_BYTES`, written in protected
  transactions (:class:`~zkcrawl.queue.batch_dir.BatchWriter`: no double batch while the
  session lives); a page's links and the directory are capped (:class:`LinkBounds`).
* **An outage is not a refusal**: ZooKeeper away is
  :class:`~zkcrawl.queue.claims.QueueSuspended`; ZooKeeper answering no is
  :class:`~zkcrawl.queue.batch_dir.WriteRefused` (a failed attempt of the items, never
  retried here).
* **Untrusted on the way back**: :func:`decode` never raises; a bad node is one
  ``discovered.malformed`` warning and is skipped, a bad entry dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from zkcrawl.logs import get_logger
from zkcrawl.queue import batches, untrusted
from zkcrawl.queue.batch_dir import BatchReader, BatchWriter, WriteRefused, transactions
from zkcrawl.queue.capped import CappedDir, DirBacklog, DirLimits
from zkcrawl.queue.claims import Claimed, QueueSuspended
from zkcrawl.queue.layout import DISCOVERED_PREFIX, Layout
from zkcrawl.queue.untrusted import NODE_LIMIT, url_too_long
from zkcrawl.zk import ZkClient

__all__ = ["DISCOVERED_FULL", "MAX_DEPTH", "NODE_BYTES", "Decoded", "DiscoveredReader",
           "DiscoveredWriter", "Link", "LinkBounds", "QueueSuspended", "WriteRefused",
           "cap_page", "decode", "encode", "link_depth"]

log = get_logger(__name__)

NODE_BYTES = NODE_LIMIT  # one node's data, written and read (64 KiB)
MAX_DEPTH = 1_000_000  # a hostile depth is clamped to "too deep", never an overflow
# The defaults of the consumer's flags (consumer/settings.py).
MAX_PAGE_LINKS = 1000  # links kept from one page
MAX_PAGE_LINK_BYTES = 256 * 1024  # bytes of them (UTF-8)
MAX_NODES = 10_000  # nodes discovered/ may hold ...
MAX_BYTES = 64 * 1024 * 1024  # ... and bytes: min(10,000, 64 MiB / 64 KiB) = 1,024 nodes
WAIT = 30.0  # seconds a page waits for room before its item is retried
DISCOVERED_FULL = "discovered-full"  # the item's reason when the directory stayed full


def cap_page(links: Sequence[str], max_links: int, max_bytes: int) -> tuple[tuple[str, ...], int]:
    """The first links of a page within ``max_links`` links and ``max_bytes`` UTF-8 bytes
    (each counted with one byte more, its separator), and how many were dropped. A link
    that alone is over ``max_bytes`` is dropped, the ones after it may still fit."""
    kept: list[str] = []
    size = 0
    for url in links:
        if len(kept) >= max_links:
            break
        n = len(url.encode("utf-8", "surrogatepass")) + 1
        if size + n > max_bytes:
            continue
        kept.append(url)
        size += n
    return tuple(kept), len(links) - len(kept)


class LinkBounds:
    """Per page and per directory bounds on the links a consumer hands over (ZooKeeper keeps
    every node in RAM). :meth:`bound` runs on the worker threads; thread-safe.

    A page gives at most ``--max-page-links`` links and ``--max-page-link-bytes`` bytes of
    them (:func:`cap_page`; the rest dropped with one ``discovered.page_capped`` event), and
    the directory holds at most ``--discovered-max-nodes`` nodes and
    ``--discovered-max-bytes`` bytes (:class:`~zkcrawl.queue.capped.CappedDir`, node count
    times :data:`NODE_BYTES`). A full directory makes the page wait (bounded by
    ``--discovered-wait``), then the item is retried with the reason :data:`DISCOVERED_FULL`
    (a dead letter with it after ``--max-attempts``: ``zkcrawl dead requeue --error
    discovered-full`` once the producer has caught up) -- its links are never dropped
    silently."""

    def __init__(self, zk: ZkClient, root: str, max_links: int = MAX_PAGE_LINKS,
                 max_bytes: int = MAX_PAGE_LINK_BYTES, max_nodes: int = MAX_NODES,
                 dir_bytes: int = MAX_BYTES, wait: float = WAIT) -> None:
        self.max_links, self.max_bytes = max_links, max_bytes
        self.directory = CappedDir(zk, Layout.of(root).discovered,
                                   DirLimits(max_nodes, dir_bytes, NODE_BYTES), wait)

    def bound(self, url: str, links: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
        """``links`` capped for the page ``url``, and None -- or :data:`DISCOVERED_FULL`
        when the directory stayed full for ``wait`` seconds (nothing may be written)."""
        kept, dropped = cap_page(links, self.max_links, self.max_bytes)
        if dropped:
            log.info("discovered.page_capped", url=url[:200], kept=len(kept), dropped=dropped,
                     reason=f"more than {self.max_links} links or {self.max_bytes} bytes "
                     "of them on one page")
        if not kept:
            return kept, None
        size = sum(len(u) + len(url) + 40 for u in kept)  # the entries: url, from, depth
        if not self.directory.room(max(1, -(-size // NODE_BYTES))):
            return kept, DISCOVERED_FULL
        return kept, None


@dataclass(frozen=True)
class Link:
    """A link found on page ``source`` (the item's URL) at crawl depth ``depth``."""

    url: str
    source: str
    depth: int

    def doc(self) -> dict[str, Any]:
        return {"url": self.url, "from": self.source, "depth": self.depth}


def encode(links: Iterable[Link], consumer: str) -> list[bytes]:
    """The nodes' data for ``links``, each at most :data:`NODE_BYTES` (a link that alone
    would not fit is left out: the consumer never hands over one over ``untrusted.URL_LIMIT``)."""
    return batches.pack((link.doc() for link in links), "links", consumer,
                        too_large=lambda doc, n: log.warning(
                            "discovered.link_too_large", url=str(doc.get("url", ""))[:200],
                            bytes=n),
                        limit=NODE_BYTES)


@dataclass(frozen=True)
class Decoded:
    """A node's links, the entries dropped as malformed, or why the whole node is."""

    links: tuple[Link, ...]
    consumer: str | None
    dropped: int = 0
    error: str | None = None

    @property
    def kept(self) -> int:
        return len(self.links)


def decode(data: bytes | None) -> Decoded:
    """SPEC §2's discovered node, with the untrusted-data limits; never raises."""
    doc, why = untrusted.load_object(data, {"links": list, "consumer": str}, limit=NODE_BYTES)
    if doc is None:
        return Decoded((), None, error=why)
    if "links" not in doc:
        return Decoded((), None, error="no 'links' list")
    links: list[Link] = []
    dropped = 0
    for entry in doc["links"]:
        link = _link(entry)
        if link is None:
            dropped += 1
        else:
            links.append(link)
    return Decoded(tuple(links), doc.get("consumer"), dropped)


def _link(entry: Any) -> Link | None:
    if not isinstance(entry, dict):
        return None
    url, source, depth = entry.get("url"), entry.get("from", ""), entry.get("depth", 0)
    if not isinstance(url, str) or not url or not isinstance(source, str):
        return None
    if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= MAX_DEPTH:
        return None
    for text in (url, source):
        if url_too_long(text):
            return None
    try:
        url.encode("utf-8")  # a \\u escape can carry a lone surrogate: not a URL
        source.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return Link(url, source, depth)


def link_depth(claimed: Claimed) -> int:
    """Depth of the links found on ``claimed``'s page: its ``meta.depth`` (untrusted: an
    integer in 0..MAX_DEPTH, else 0) plus one."""
    depth = claimed.item.meta.get("depth", 0) if claimed.item is not None else 0
    if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth < MAX_DEPTH:
        depth = 0
    return depth + 1


class DiscoveredWriter(BatchWriter):
    """The consumer side: :meth:`write` a group's links, protected, before its completion."""

    what = "discovered links"

    def __init__(self, zk: ZkClient, root: str, consumer_id: str) -> None:
        super().__init__(zk, root, Layout.of(root).discovered, DISCOVERED_PREFIX, consumer_id)
        self._ensure_paths()

    def write(self, links: Sequence[Link]) -> int:
        """Commit ``links``; returns the nodes created. Raises :class:`QueueSuspended` when
        ZooKeeper stays away for ``--zk-timeout`` (the caller keeps the group and asks
        again), :class:`WriteRefused` when ZooKeeper refuses the write (the caller retries
        the items, a dead letter after ``--max-attempts``: never completed without their
        links). Links of several transactions: those committed before a refusal stay (a
        second write of them is a duplicate the producer's seen state drops)."""
        if not links:
            return 0
        created = 0
        for chunk in transactions(encode(links, self.consumer)):
            created += self.commit(chunk)
        self.nodes += created
        return created


class DiscoveredReader(BatchReader[Decoded]):
    """The producer side: list, read (in sequence order, a bounded batch), delete."""

    def __init__(self, zk: ZkClient, root: str) -> None:
        path = Layout.of(root).discovered
        backlog = DirBacklog("discovered.backlog", path,
                             DirLimits(MAX_NODES, MAX_BYTES, NODE_BYTES),  # the default's
                             note="consumers wait (--discovered-wait) when the cap is "
                             "reached; drain faster or stop the hostile source")
        super().__init__(zk, path, DISCOVERED_PREFIX, decode, backlog, "discovered",
                         ("discovered.links_dropped",
                          "not a link: a string url of at most 8 KiB, a depth >= 0"))
        self.cap = backlog.cap
