"""Fetch outcomes: ``<root>/fetched/fn-NNNNNNNNNN`` (SPEC §2), consumer -> producer: what each
fetch of a URL a ``--recrawl`` producer offered returned (only items whose ``meta.recrawl``
is an object are reported), for the producer's per-URL schedule (``zkcrawl.producer.recrawl``).

* **A report is not the page**: :class:`FetchedBuffer` gathers reports across groups and
  writes them on its own thread, so a report never holds an item back; ZooKeeper refusing
  is one ``fetched.refused`` warning, ZooKeeper away keeps them for a later try (bounded).
  A lost report only means the URL is offered again when its interval has passed.
* **Batched, protected, bounded**: few nodes of at most :data:`NODE_BYTES`, written with
  :class:`~zkcrawl.queue.batch_dir.BatchWriter`'s protected transactions; the directory is
  capped by ``--fetched-max-nodes`` / ``--fetched-max-bytes`` (a full one drops reports
  after ``--fetched-wait`` with :data:`FETCHED_FULL`, never pages).
* **Untrusted on the way back**: :func:`decode` never raises.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from zkcrawl.logs import get_logger
from zkcrawl.queue import batches, untrusted
from zkcrawl.queue import discovered as links
from zkcrawl.queue.batch_dir import BatchReader, BatchWriter, WriteRefused, transactions
from zkcrawl.queue.capped import CappedDir, DirBacklog, DirLimits
from zkcrawl.queue.claims import QueueSuspended
from zkcrawl.queue.layout import FETCHED_PREFIX, Layout
from zkcrawl.queue.untrusted import NODE_LIMIT, URL_LIMIT
from zkcrawl.web.validators import (
    EARLIEST,
    clean_etag,
    clean_last_modified,
    clean_signature,
)
from zkcrawl.zk import ConnectionLoss, SessionExpiredError, ZkClient

__all__ = ["FETCHED_FULL", "MAX_BYTES", "MAX_NODES", "NODE_BYTES", "WAIT", "Decoded", "Fetched",
           "FetchedBuffer", "FetchedReader",
           "FetchedWriter", "close_reports", "decode", "encode", "report_outcomes"]

log = get_logger(__name__)

NODE_BYTES = NODE_LIMIT
FLUSH_S = 1.0  # a report waits at most this long for others to share its node
QUIET_S = 0.2  # ... or this long after the last report came (the crawl went quiet)
FLUSH_ENTRIES = 400  # ~50 KB: about one full node
BUFFER_MAX = 50_000  # reports kept while ZooKeeper is away; the oldest dropped past it
FUTURE_S = 86_400.0  # an ``at`` later than now + this is clamped to it
# The defaults of the consumer's --fetched-max-* flags (consumer/settings.py): discovered/'s,
# but a quarter of its bytes (reports are small; docs/operations/security-limits.md sizes
# the ensemble's heap for every cap full at once: 512 MiB, as deploy/kubernetes ships).
MAX_NODES = links.MAX_NODES  # nodes fetched/ may hold ...
MAX_BYTES = 16 * 1024 * 1024  # ... and bytes: 256 nodes of at most 64 KiB
WAIT = links.WAIT  # seconds a flush waits for room before its reports are dropped
FETCHED_FULL = "fetched-full"  # why reports were dropped: the directory stayed full
PACK_S = 30.0  # ... or this long, while fetched/ holds half its cap or more (full nodes)
CLOSE_S = 1.0  # the shutdown flush waits this long for a flush in progress


@dataclass(frozen=True, slots=True)
class Fetched:
    """One fetch's outcome: ``status`` None when no answer came; ``changed`` None on a first
    fetch (nothing to compare with)."""

    url: str
    status: int | None
    changed: bool | None
    etag: str | None
    last_modified: str | None
    signature: str | None
    at: float

    def doc(self) -> dict[str, Any]:
        return {"url": self.url, "status": self.status, "changed": self.changed,
                "etag": self.etag, "last_modified": self.last_modified,
                "signature": self.signature, "at": round(self.at, 3)}


def encode(entries: Iterable[Fetched], consumer: str) -> list[bytes]:
    """The nodes' data for ``entries``, each at most :data:`NODE_BYTES`."""
    return batches.pack((entry.doc() for entry in entries), "fetched", consumer,
                        too_large=lambda doc, n: log.warning(
                            "fetched.entry_too_large", url=str(doc.get("url", ""))[:200],
                            bytes=n),
                        limit=NODE_BYTES)


@dataclass(frozen=True)
class Decoded:
    """A node's entries, the entries dropped as malformed, or why the whole node is."""

    entries: tuple[Fetched, ...]
    consumer: str | None
    dropped: int = 0
    error: str | None = None

    @property
    def kept(self) -> int:
        return len(self.entries)


def decode(data: bytes | None, now: float | None = None) -> Decoded:
    """SPEC §2's fetched node, with the untrusted-data limits; never raises. A node that is
    not such an object or is larger than :data:`NODE_BYTES` is skipped with its reason; an
    entry without a string ``url`` of at most ``URL_LIMIT`` bytes or with a ``status``
    outside 100..599 is dropped and counted; ``etag``, ``last_modified`` and ``signature`` go
    through :mod:`zkcrawl.web.validators` (a bad one becomes null); ``at`` is clamped to
    [1995, now + 1 day]."""
    doc, why = untrusted.load_object(data, {"fetched": list, "consumer": str}, limit=NODE_BYTES)
    if doc is None:
        return Decoded((), None, error=why)
    if "fetched" not in doc:
        return Decoded((), None, error="no 'fetched' list")
    now = time.time() if now is None else now
    entries: list[Fetched] = []
    dropped = 0
    for raw in doc["fetched"]:
        entry = _entry(raw, now)
        if entry is None:
            dropped += 1
        else:
            entries.append(entry)
    return Decoded(tuple(entries), doc.get("consumer"), dropped)


def _url(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        size = len(value.encode("utf-8"))  # a lone surrogate (\\ud800) is not a URL
    except UnicodeEncodeError:
        return None
    return value if size <= URL_LIMIT else None


def _entry(raw: Any, now: float) -> Fetched | None:
    if not isinstance(raw, dict):
        return None
    url, status, changed, at = (raw.get("url"), raw.get("status"), raw.get("changed"),
                                raw.get("at"))
    if (url := _url(url)) is None:
        return None
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)
                               or not 100 <= status <= 599):
        return None
    if not isinstance(changed, bool):
        changed = None
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        at = now
    at = min(max(float(at), EARLIEST), now + FUTURE_S)
    return Fetched(url, status, changed, clean_etag(raw.get("etag")),
                   clean_last_modified(raw.get("last_modified"), now),
                   clean_signature(raw.get("signature")), at)


class FetchedWriter(BatchWriter):
    """The consumer side: :meth:`report` outcomes (protected transactions:
    :class:`~zkcrawl.queue.batch_dir.BatchWriter`; the cap is
    :class:`~zkcrawl.queue.capped.CappedDir`, as discovered/'s)."""

    what = "re-crawl reports"

    def __init__(self, zk: ZkClient, root: str, consumer_id: str, max_nodes: int = MAX_NODES,
                 max_bytes: int = MAX_BYTES, wait: float = WAIT) -> None:
        super().__init__(zk, root, Layout.of(root).fetched, FETCHED_PREFIX, consumer_id)
        self.directory = CappedDir(zk, self.layout.fetched,
                                   DirLimits(max_nodes, max_bytes, NODE_BYTES), wait)
        self.refused = 0  # entries ZooKeeper refused (warned, not retried)
        self.full = 0  # entries dropped: the directory stayed full (FETCHED_FULL)
        self._full_warned = False  # one fetched.full warning per episode
        try:
            self._ensure_paths()
        except WriteRefused as exc:  # commit's NoNode path asks again, and refuses then
            self._warn(exc, 0)

    def report(self, entries: Sequence[Fetched], wait: float | None = None,
               stop: threading.Event | None = None) -> int:
        """Commit ``entries``; returns the nodes created (0 when ZooKeeper refused, or the
        directory stayed full for ``wait`` seconds, default ``--fetched-wait``, or until
        ``stop`` was set: warned). Raises :class:`~zkcrawl.queue.claims.QueueSuspended`
        while ZooKeeper is away."""
        nodes = encode(entries, self.consumer) if entries else []
        if not nodes:
            return 0
        try:
            room = self.directory.room(len(nodes), wait, stop)
        except (ConnectionLoss, SessionExpiredError):
            raise QueueSuspended("ZooKeeper unreachable while checking the room in "
                                 f"{self.layout.fetched}") from None
        if not room:
            self._stayed_full(len(entries))
            return 0
        self._full_warned = False
        created = 0
        for chunk in transactions(nodes):
            try:
                created += self.commit(chunk)
            except WriteRefused as exc:
                self._warn(exc, len(entries))
                return created
        self.nodes += created
        return created

    def _stayed_full(self, n: int) -> None:
        self.full += n
        if self._full_warned:
            return
        self._full_warned = True
        limits = self.directory.limits
        log.warning("fetched.full", reason=FETCHED_FULL, path=self.layout.fetched,
                    entries=n, cap_nodes=limits.node_cap, waited_s=self.directory.wait,
                    hint="re-crawl reports dropped until the producer (--recrawl) drains "
                    "it: the items completed; their URLs keep their old schedule "
                    "(raise --fetched-max-nodes/--fetched-max-bytes, or drain faster)")

    def _warn(self, exc: WriteRefused, n: int) -> None:
        self.refused += n
        log.warning("fetched.refused", cause=exc.cause, error=str(exc)[:300], entries=n,
                    hint="the items complete; the producer's --recrawl state keeps their "
                    "old schedule")


class FetchedReader(BatchReader[Decoded]):
    """The producer side: list, read (a bounded batch, oldest first), delete."""

    def __init__(self, zk: ZkClient, root: str) -> None:
        path = Layout.of(root).fetched
        backlog = DirBacklog("fetched.backlog", path,
                             DirLimits(MAX_NODES, MAX_BYTES, NODE_BYTES),  # the default's
                             note="consumers' re-crawl reports wait (--fetched-wait) when "
                             "the cap is reached, then are dropped (fetched-full)")
        super().__init__(zk, path, FETCHED_PREFIX, decode, backlog, "fetched",
                         ("fetched.entries_dropped", "not an outcome: a string url of at "
                          "most 8 KiB, a status in 100..599 or null"))


class FetchedBuffer:
    """The consumer's reports, gathered across committer groups into few large nodes: a
    node per :data:`FLUSH_S` or per :data:`FLUSH_ENTRIES` reports instead of one per group
    (~0.003 ZooKeeper writes per page); full nodes
    only (or one per :data:`PACK_S`) while ``<root>/fetched/`` holds half its cap.

    :meth:`add` never waits for ZooKeeper and never raises: the buffer's daemon thread
    writes (a full buffer wakes it), so a flush waiting for room in a full directory
    (``--fetched-wait``) holds no committer. A flush that meets ZooKeeper away keeps the
    reports (at most :data:`BUFFER_MAX`, the oldest dropped with one warning) and tries
    again later; an idle consumer's last reports go out too. What is lost -- the last
    :data:`FLUSH_S` of reports of a consumer killed or stopped, the reports dropped over
    the buffer's cap or because the directory stayed full -- is never a page:
    the producer offers those URLs again when their interval has passed, with the
    validators it had."""

    def __init__(self, writer: FetchedWriter) -> None:
        self.writer = writer
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one flush at a time: the order kept
        self._entries: list[Fetched] = []
        self._since = self._last = 0.0
        self.dropped = 0
        self._stop = threading.Event()
        self._due = threading.Event()  # a full node waits: flush now
        self._thread = threading.Thread(target=self._loop, name="fetched-flush", daemon=True)
        self._thread.start()

    def add(self, entries: Sequence[Fetched]) -> None:
        with self._lock:
            self._last = time.monotonic()
            if not self._entries:
                self._since = self._last
            self._entries.extend(entries)
            over = len(self._entries) - BUFFER_MAX
            if over > 0:
                del self._entries[:over]
                self.dropped += over
                log.warning("fetched.dropped", reports=over, reason="ZooKeeper away, or "
                            "<root>/fetched full, for long: the oldest reports dropped "
                            "(their URLs keep their schedule)")
            full = len(self._entries) >= FLUSH_ENTRIES
        if full:
            self._due.set()

    def flush(self, wait: float | None = None, lock_timeout: float = -1) -> None:
        """Write what waits (ZooKeeper away: kept for the next try); ``wait``: for room in
        a full directory (default ``--fetched-wait``); ``lock_timeout``: for a flush in
        progress (then this one is skipped: what waits stays for the next)."""
        if not self._flushing.acquire(timeout=lock_timeout):
            return
        try:
            with self._lock:
                batch, self._entries = self._entries, []
            if not batch:
                return
            try:
                self.writer.report(batch, wait, self._stop)
            except QueueSuspended:
                with self._lock:
                    self._entries[:0] = batch
                    self._since = time.monotonic()
        finally:
            self._flushing.release()

    def close(self) -> None:
        """The shutdown flush: no wait for room (a flush waiting for it gives up), at most
        :data:`CLOSE_S` for a flush in progress (what is not written then is lost, as a
        killed consumer's)."""
        self._stop.set()
        self._due.set()
        self.flush(wait=0.0, lock_timeout=CLOSE_S)
        with self._lock:
            left = len(self._entries)
        if left:
            log.warning("fetched.not_flushed", reports=left, reason="still waiting at "
                        "shutdown (ZooKeeper away or <root>/fetched full): their URLs keep "
                        "their schedule")

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._due.wait(QUIET_S / 2)
            self._due.clear()
            if self._stop.is_set():
                return
            now = time.monotonic()
            packing = self.writer.directory.filling()
            with self._lock:
                due = bool(self._entries) and (
                    len(self._entries) >= FLUSH_ENTRIES or now - self._since >= PACK_S
                    or (not packing and (now - self._since >= FLUSH_S
                                         or now - self._last >= QUIET_S)))
            if due:
                try:
                    self.flush()
                except Exception:  # a bug must not end the flushing; logged
                    log.error("fetched.flush_failed", exc_info=True)


def close_reports(worker: Any) -> None:
    """The consumer's shutdown, after its committer closed: the reports that wait go out
    (ZooKeeper away: they are lost, see :class:`FetchedBuffer`)."""
    buffer = getattr(worker, "_fetched_buffer", None)
    if buffer is not None:
        buffer.close()


def report_outcomes(worker: Any, tasks: Sequence[Any]) -> None:
    """The consumer's committer hook (``Worker._links``): the re-crawl reports of
    ``tasks``' outcomes go to ``<root>/fetched/`` through one :class:`FetchedBuffer` kept
    on ``worker`` (made on the first report). Never raises for ZooKeeper trouble."""
    entries = [t.outcome.fetched for t in tasks
               if t.outcome is not None and t.outcome.fetched is not None]
    if not entries:
        return
    buffer = getattr(worker, "_fetched_buffer", None)
    if buffer is None:
        s = worker.s
        writer = FetchedWriter(worker.zk, s.root, worker.id, s.fetched_max_nodes,
                               s.fetched_max_bytes, s.fetched_wait)
        buffer = worker._fetched_buffer = FetchedBuffer(writer)
    buffer.add(entries)
