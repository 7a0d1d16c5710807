"""How items get into the queue: batched, protected offers and back-pressure.

The producer side of :class:`zkcrawl.queue.leases.LeaseQueue` (which delegates here), kept
apart from the claim side so each reads on its own. Guarantees: offers go in
transactions of up to ``batch`` items and at most ``MAX_TX_BYTES`` (far below ZooKeeper's
1 MB request limit); an item over ``ITEM_LIMIT`` (64 KiB, SPEC §2) is refused with a
warning and not sent, the others go on; each transaction also creates an ephemeral marker
``<root>/offers/<token>``, so a transaction retried after ConnectionLoss first asks
whether its first try committed (Curator's ``withProtection`` idea): no silent double
insert while the session lives, and a search by the items' ``batch`` token after a
session loss.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeAlias, cast

from zkcrawl.errors import ZkCrawlError
from zkcrawl.logs import get_logger
from zkcrawl.queue import items as item_codec
from zkcrawl.queue.items import Item
from zkcrawl.zk import (
    ConnectionLoss,
    NoNodeError,
    Pending,
    SessionExpiredError,
    WatchedEvent,
    ZkClient,
    tx_ok,
)

MAX_TX_BYTES = 256 * 1024  # far below ZooKeeper's 1 MB jute.maxbuffer per request
_RECHECK_PAUSE = 0.05  # seconds between two asks whether a lost offer committed

log = get_logger(__name__)

Offered: TypeAlias = Pending[list[str | Exception]]  # a batch's transaction in flight


class QueueSuspended(ZkCrawlError):
    """Not connected to ZooKeeper right now: hold completions and try again later."""


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

    def __init__(self, offers: BatchOffers, depth: int = 2) -> None:
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


class BatchOffers:
    """Offers and depth for one queue path."""

    def __init__(self, zk: ZkClient, queue_path: str, offer_path: str, batch: int,
                 connected: threading.Event, session: Callable[[], int | None]) -> None:
        self.zk = zk
        self.queue_path = queue_path
        self.offer_path = offer_path
        self.batch = max(1, batch)
        self._connected = connected
        self._session = session
        self.refused = 0  # items over the size limit, never sent (SPEC §2)
        # Marker deletes are pipelined (no round trip waited for); the ones not known to
        # have gone through are kept here and settled by :meth:`settle_markers`.
        self._marker_deletes: deque[tuple[str, Pending[bool]]] = deque()
        self._marker_failed: list[tuple[str, Pending[bool]]] = []
        self._marker_lock = threading.Lock()

    def offer_many(self, items: Iterable[Item]) -> list[str]:
        """Offer items in transactions; returns the created znode names in order (two
        transactions in flight, through an :class:`OfferWindow`)."""
        names: list[str] = []
        window = OfferWindow(self)
        window.submit(items, names.extend)
        window.drain()
        return names

    def window(self, depth: int = 2) -> OfferWindow:
        """Pipelined offer transactions for a caller that offers group after group."""
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
        return self.zk.create_many_async(f"{self.offer_path}/{token}",
                                         f"{self.queue_path}/{item_codec.PREFIX}", chunk)

    def _offer_result(self, token: str, chunk: list[bytes], pending: Offered) -> list[str]:
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
        if self.zk.session_id == self._session():
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
