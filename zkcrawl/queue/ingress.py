"""The ingress ``<root>/queue`` (SPEC §2): where any client may offer items, one znode each
(JSON, or a bare URL as Curator writes it); the owner of partition 0 moves them into their
partitions (:mod:`zkcrawl.queue.partition_queue`). :class:`IngressQueue` is zkcrawl's own
client of it -- offers, the offer window and the depth for back-pressure; nothing here
claims or settles an item (consumers own partitions: :mod:`consumer.owned_queue`). Named
for its one role now: the per-item leases of the previous layout are gone.

Guarantees:

* offers go in transactions of up to ``batch`` items and at most ``MAX_TX_BYTES`` (far below
  ZooKeeper's 1 MB request limit), pipelined through one :class:`OfferWindow`, so sequence
  order is offer order;
* an item over ``ITEM_LIMIT`` (64 KiB) is refused with a warning and not sent, the others go
  on (:attr:`IngressQueue.refused`);
* **protected creates**: each transaction also creates an ephemeral marker
  ``<root>/offers/<token>``, so a transaction retried after ConnectionLoss first asks whether
  its first try committed (Curator's ``withProtection`` idea): no silent double insert while
  the session lives, and a search by the items' ``batch`` token after a session loss;
  every wait is bounded by ``--zk-timeout`` (then :class:`~zkcrawl.queue.claims.QueueSuspended`);
* **depth** is O(1) (the parent's stat), and :meth:`IngressQueue.wait_depth_below` blocks on
  a watch, never polls.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias, cast

from zkcrawl.errors import UsageError, ZkCrawlError
from zkcrawl.logs import get_logger
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.claims import QueueSuspended
from zkcrawl.queue.items import Item
from zkcrawl.queue.layout import Layout
from zkcrawl.zk import (
    ConnectionLoss,
    NoNodeError,
    Pending,
    SessionExpiredError,
    WatchedEvent,
    ZkClient,
    ZkState,
    tx_ok,
)

MAX_TX_BYTES = 256 * 1024  # far below ZooKeeper's 1 MB jute.maxbuffer per request
_RECHECK_PAUSE = 0.05  # seconds between two asks whether a lost offer committed

log = get_logger(__name__)

Offered: TypeAlias = Pending[list[str | Exception]]  # a batch's transaction in flight


class ItemRefused(UsageError):
    """An offered item is over the size limit (SPEC §2): nothing was sent."""


@dataclass(eq=False)
class _Group:
    """One :meth:`OfferWindow.submit`: its names so far and what to call when it settles."""

    done: Callable[[list[str]], object]
    lost: Callable[[], object] | None
    names: list[str] = field(default_factory=list)
    left: int = 0  # transactions in flight
    sealed: bool = False  # all its transactions sent


class OfferWindow:
    """The one place offer transactions are pipelined.

    At most ``depth`` transactions are in flight on the session (ZooKeeper applies one
    session's requests in order, so the sequence order is kept): encoding and sending the
    next group overlaps the server's work on the previous ones. Each submitted group's
    names are handed to its ``done`` callback once all its transactions committed, groups
    in submission order; :meth:`drain` waits for all. Not thread-safe: one caller thread.
    A failure (raised by :meth:`submit` or :meth:`drain`) leaves the groups still in flight
    unsettled: :meth:`abandon` calls their ``lost`` callbacks, so the caller can count them.
    """

    def __init__(self, offers: IngressQueue, depth: int = 2) -> None:
        self._offers = offers
        self.depth = max(1, depth)
        self._flight: deque[tuple[str, list[bytes], Offered, _Group]] = deque()
        self._open: list[_Group] = []  # groups whose done was not called yet

    def submit(self, items: Iterable[Item], done: Callable[[list[str]], object],
               lost: Callable[[], object] | None = None) -> None:
        """Send ``items`` (one transaction per chunk); may first wait for older ones."""
        group = _Group(done, lost)
        self._open.append(group)
        for token, chunk in self._offers._chunks(items):
            group.left += 1
            self._flight.append((token, chunk, self._offers._offer_async(token, chunk), group))
            while len(self._flight) > self.depth:
                self._settle_one()
        group.sealed = True
        self._finish(group)

    def drain(self) -> None:
        """Wait until every submitted group settled (its ``done`` called)."""
        while self._flight:
            self._settle_one()

    @property
    def in_flight(self) -> int:
        return len(self._flight)

    def abandon(self) -> int:
        """After a failure: forget what is in flight; ``lost()`` for each unsettled group."""
        open_groups, self._open = self._open, []
        self._flight.clear()
        for group in open_groups:
            if group.lost is not None:
                group.lost()
        return len(open_groups)

    def _settle_one(self) -> None:
        token, chunk, pending, group = self._flight[0]
        names = self._offers._offer_result(token, chunk, pending)
        self._flight.popleft()
        group.names.extend(names)
        group.left -= 1
        self._finish(group)

    def _finish(self, group: _Group) -> None:
        if group.sealed and group.left == 0 and group in self._open:
            self._open.remove(group)
            group.done(group.names)


def _answered(pending: Pending[bool]) -> tuple[bool, bool]:
    """(answered, went through) of a marker delete: kazoo's ``AsyncResult.ready`` and
    ``exception`` (not in the :class:`Pending` protocol); a missing marker went too."""
    ready = getattr(pending, "ready", None)
    if ready is None or not ready():
        return False, False
    exc = getattr(pending, "exception", None)
    return True, exc is None or isinstance(exc, NoNodeError)


class IngressQueue:
    """Offers into ``<root>/queue`` and its depth (module docstring)."""

    def __init__(self, zk: ZkClient, root: str, *, batch: int = 500) -> None:
        layout = Layout.of(root)
        self.zk = zk
        self.queue_path = layout.queue
        self.offer_path = layout.offers
        self.batch = max(1, batch)
        self.refused = 0  # items over the size limit, never sent (SPEC §2)
        self._connected = threading.Event()
        if zk.connected:
            self._connected.set()
        self._sent_in: dict[str, int | None] = {}  # token -> session its last try went in
        # Marker deletes are pipelined (no round trip waited for); the ones not known to
        # have gone through are kept here and settled by :meth:`settle_markers`.
        self._marker_deletes: deque[tuple[str, Pending[bool]]] = deque()
        self._marker_failed: list[tuple[str, Pending[bool]]] = []
        self._marker_lock = threading.Lock()
        for path in (self.queue_path, self.offer_path):
            zk.ensure_path(path)
        zk.add_listener(self._on_state)

    def _on_state(self, state: str) -> bool:
        """kazoo's thread: a flag only."""
        if state == ZkState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        return False

    def close(self) -> None:
        self.zk.remove_listener(self._on_state)

    def offer(self, url: str, *, meta: dict[str, Any] | None = None,
              producer: str | None = None) -> str:
        """Offer one URL; its znode name. :class:`ItemRefused` if over the size limit."""
        names = self.offer_many([Item(url=url, producer=producer, meta=meta or {})])
        if not names:
            raise ItemRefused(f"item for {url[:80]!r} is larger than {item_codec.ITEM_LIMIT} bytes")
        return names[0]

    def offer_many(self, items: Iterable[Item]) -> list[str]:
        """Offer items in transactions; returns the created znode names in order (two
        transactions in flight, through an :class:`OfferWindow`). Items over the size limit
        are refused (counted in :attr:`refused`, logged), not sent."""
        names: list[str] = []
        window = OfferWindow(self)
        window.submit(items, names.extend)
        window.drain()
        return names

    def offer_window(self, depth: int = 2) -> OfferWindow:
        """A pipeline of offer transactions for a caller that offers group after group and
        settles each as it commits."""
        return OfferWindow(self, depth)

    def _chunks(self, items: Iterable[Item]) -> Iterable[tuple[str, list[bytes]]]:
        chunk: list[bytes] = []
        size = 0
        token = uuid.uuid4().hex
        for item in items:
            data = item.encode(batch=token)
            if len(data) > item_codec.ITEM_LIMIT:
                self._refuse(item, len(data))
                continue
            if chunk and (len(chunk) >= self.batch or size + len(data) > MAX_TX_BYTES):
                yield token, chunk
                token = uuid.uuid4().hex
                chunk, size = [], 0
                data = item.encode(batch=token)
            chunk.append(data)
            size += len(data) + 64
        if chunk:
            yield token, chunk

    def _refuse(self, item: Item, size: int) -> None:
        """SPEC §2: an item over the limit is refused with a reason; the offer goes on."""
        self.refused += 1
        log.warning("queue.offer_refused", url=item.url[:200], bytes=size,
                    reason=f"item larger than {item_codec.ITEM_LIMIT} bytes")

    def _offer_async(self, token: str, chunk: list[bytes]) -> Offered:
        """[create marker (ephemeral), create item (sequential) x n] as one transaction."""
        self._sent_in[token] = self.zk.session_id  # the session its marker lives in
        return self.zk.create_many_async(f"{self.offer_path}/{token}",
                                         f"{self.queue_path}/{item_codec.PREFIX}", chunk)

    def _offer_result(self, token: str, chunk: list[bytes], pending: Offered) -> list[str]:
        """The names ``pending`` created, after asking again what a lost answer did."""
        try:
            return self._answer(token, chunk, pending)
        finally:
            self._sent_in.pop(token, None)

    def _answer(self, token: str, chunk: list[bytes], pending: Offered) -> list[str]:
        marker = f"{self.offer_path}/{token}"
        started = time.monotonic()
        for attempt in range(5):
            try:
                results = self.zk.answer(pending)
            except (ConnectionLoss, SessionExpiredError) as exc:
                log.warning("queue.offer_retry", error=type(exc).__name__, attempt=attempt)
                committed = self._after_loss(marker, token, len(chunk), started)
                if committed is not None:
                    return committed
                pending = self._offer_async(token, chunk)
                continue
            if tx_ok(results):
                self._drop_marker(marker)  # pipelined: no round trip waited for
                paths = cast("list[str]", results)  # no error: every result is a path
                return [r.rsplit("/", 1)[1] for r in paths[1:]]
            if any(isinstance(r, NoNodeError) for r in results):
                self.zk.ensure_path(self.queue_path)  # a CONTAINER queue path was reaped
                self.zk.ensure_path(self.offer_path)
                pending = self._offer_async(token, chunk)
                continue
            first = next(r for r in results if isinstance(r, Exception))
            raise ZkCrawlError(f"offer failed: {first!r}")
        raise ZkCrawlError("offer failed after 5 attempts")

    def _after_loss(self, marker: str, token: str, n: int, started: float
                    ) -> list[str] | None:
        """An offer's answer was lost: once connected, did it commit? (:meth:`find_committed`;
        None: it did not, send it again). The connection may go again while asking -- the
        leader killed twice in a row, or the connected flag not cleared yet when the lost
        answer came -- and then it is asked again. --zk-timeout in all, counted from the
        offer's first try: a stop while ZooKeeper is away ends within it (SPEC §4)."""
        while True:
            left = self.zk.zk_timeout - (time.monotonic() - started)
            if left <= 0 or not self._connected.wait(left):
                raise QueueSuspended("ZooKeeper unreachable while offering")
            try:
                return self.find_committed(marker, token, n)
            except (ConnectionLoss, SessionExpiredError) as exc:
                log.warning("queue.offer_check_retry", error=type(exc).__name__)
                # the flag may still say "connected" for a moment: a short pause, not a
                # tight loop (bounded by the deadline above)
                time.sleep(min(_RECHECK_PAUSE, max(0.0, left)))

    def find_committed(self, marker: str, token: str, n: int) -> list[str] | None:
        """After ConnectionLoss: did the transaction commit? Exact while the session lives."""
        if self.zk.exists(marker) is not None:
            names = self._names_with_token(token)
            self._drop_marker(marker)
            return names if len(names) == n else names + ["?"] * (n - len(names))
        if self.zk.session_id == self._sent_in.get(token):
            return None  # same session and no marker: the transaction did not commit
        # New session: the marker died with the old one; fall back to the data token.
        names = self._names_with_token(token)
        return names or None

    # -- markers ---------------------------------------------------------
    def _drop_marker(self, marker: str) -> None:
        """Delete a committed batch's marker without waiting; the answers are looked at
        as more come (the settled ones leave the list: it stays short)."""
        pending = self.zk.delete_async(marker)
        with self._marker_lock:
            self._marker_deletes.append((marker, pending))
            while self._marker_deletes:
                answered, done = _answered(self._marker_deletes[0][1])
                if not answered:
                    break
                first = self._marker_deletes.popleft()
                if not done:  # lost with a connection: sent again by settle_markers
                    self._marker_failed.append(first)

    def settle_markers(self) -> int:
        """Before the session ends: every marker delete answered, the ones a lost
        connection swallowed sent again while connected (--zk-timeout in all). A marker is
        ephemeral, so one left over still goes with the session; this makes a clean stop
        leave none even when the session's close does not reach the server. Returns the
        markers left."""
        deadline = time.monotonic() + self.zk.zk_timeout
        with self._marker_lock:
            todo = self._marker_failed + list(self._marker_deletes)
            self._marker_failed, self._marker_deletes = [], deque()
        left = 0
        for marker, pending in todo:
            if self._settle_marker(marker, pending, deadline):
                continue
            left += 1
        if left:
            log.warning("queue.offer_markers_left", markers=left,
                        reason="ZooKeeper unreachable: they go with the session")
        return left

    def _settle_marker(self, marker: str, pending: Pending[bool], deadline: float) -> bool:
        for _ in range(3):
            try:
                pending.get(timeout=max(0.0, deadline - time.monotonic()))
                return True
            except NoNodeError:
                return True
            except Exception:  # lost with the connection (or no answer in time): again
                # Not connected now: no wait for ZooKeeper here (a stop while it is away
                # ends within --zk-timeout, SPEC §4); the marker goes with the session.
                if deadline <= time.monotonic() or not self._connected.is_set():
                    return False
                pending = self.zk.delete_async(marker)
        return False

    def _names_with_token(self, token: str) -> list[str]:
        names = [n for _, n in item_codec.sort_names(self.zk.get_children(self.queue_path))]
        datas = self.zk.get_many([f"{self.queue_path}/{n}" for n in names])
        found = []
        for name, res in zip(names, datas, strict=True):
            if not isinstance(res, Exception) and item_codec.decode(res[0]).batch == token:
                found.append(name)
        return found

    # -- depth -----------------------------------------------------------
    def depth(self) -> int:
        """Items in the queue (leased ones included), from the parent's stat: O(1)."""
        stat = self.zk.exists(self.queue_path)
        return int(stat.numChildren) if stat else 0

    def wait_depth_below(self, low: int, timeout: float) -> int:
        """Block until fewer than ``low`` items are queued, or ``timeout``; returns depth.

        A children watch would fire on every completion and cost a full listing to
        re-arm (O(n) per deletion); instead we watch the one item whose deletion
        brings the depth to ``low`` (items leave roughly in sequence order) and
        re-check the O(1) depth when it goes.
        """
        deadline = time.monotonic() + timeout
        while (depth := self.depth()) >= low:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return depth
            names = item_codec.sort_names(self.zk.get_children(self.queue_path))
            if len(names) < low:
                continue
            gone = threading.Event()
            target = f"{self.queue_path}/{names[len(names) - low][1]}"
            if self.zk.exists(target, watch=_setter(gone)) is None:
                continue
            gone.wait(min(remaining, 5.0))
        return depth


def _setter(event: threading.Event) -> Callable[[WatchedEvent], None]:
    """A watch that sets ``event`` (kazoo's thread: nothing else)."""
    def watch(_event: WatchedEvent) -> None:
        event.set()
    return watch
