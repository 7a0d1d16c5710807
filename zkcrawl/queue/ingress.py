"""The ingress ``<root>/queue`` (SPEC §2): where any client may offer items, one znode each
(JSON, or a bare URL as Curator writes it); the owner of partition 0 moves them into their
partitions (:mod:`zkcrawl.queue.partition_queue`). :class:`IngressQueue` is zkcrawl's own
client of it (``zkcrawl dead requeue``, the benches, the tests): offers only -- nothing
here claims or settles an item (consumers own partitions: :mod:`zkcrawl.consumer.owned_queue`).

Guarantees:

* offers go in transactions of up to ``batch`` items and at most ``MAX_TX_BYTES`` (far below
  ZooKeeper's 1 MB request limit), two in flight on the session, so sequence order is offer
  order;
* an item over ``ITEM_LIMIT`` (64 KiB) is refused with a warning and not sent, the others go
  on (:attr:`IngressQueue.refused`);
* **protected creates**: each transaction also creates an ephemeral marker
  ``<root>/offers/<token>``, so a transaction retried after ConnectionLoss first asks whether
  its first try committed (Curator's ``withProtection`` idea): no silent double insert while
  the session lives, and a search by the items' ``batch`` token after a session loss;
  every wait is bounded by ``--zk-timeout`` (then :class:`~zkcrawl.queue.claims.QueueSuspended`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable
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
    ZkClient,
    ZkState,
    tx_ok,
)

MAX_TX_BYTES = 256 * 1024  # far below ZooKeeper's 1 MB jute.maxbuffer per request
_RECHECK_PAUSE = 0.05  # seconds between two asks whether a lost offer committed
_IN_FLIGHT = 2  # offer transactions in flight on the session

log = get_logger(__name__)

Offered: TypeAlias = Pending[list[str | Exception]]  # a batch's transaction in flight


class ItemRefused(UsageError):
    """An offered item is over the size limit (SPEC §2): nothing was sent."""


class IngressQueue:
    """Offers into ``<root>/queue`` (module docstring)."""

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
        """Offer items in transactions; returns the created znode names in order (encoding
        and sending the next transaction overlaps the server's work on the previous ones:
        ``_IN_FLIGHT`` at most, and one session applies them in order). Items over the
        size limit are refused (counted in :attr:`refused`, logged), not sent."""
        names: list[str] = []
        flight: deque[tuple[str, list[bytes], Offered]] = deque()
        for token, chunk in self._chunks(items):
            flight.append((token, chunk, self._offer_async(token, chunk)))
            if len(flight) > _IN_FLIGHT:
                names.extend(self._offer_result(*flight.popleft()))
        while flight:
            names.extend(self._offer_result(*flight.popleft()))
        return names

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
        """Delete a committed batch's marker without waiting for the answer: an ephemeral
        marker whose delete a lost connection swallowed goes with the session."""
        self.zk.delete_async(marker)

    def _names_with_token(self, token: str) -> list[str]:
        names = [n for _, n in item_codec.sort_names(self.zk.get_children(self.queue_path))]
        datas = self.zk.get_many([f"{self.queue_path}/{n}" for n in names])
        found = []
        for name, res in zip(names, datas, strict=True):
            if not isinstance(res, Exception) and item_codec.decode(res[0]).batch == token:
                found.append(name)
        return found
