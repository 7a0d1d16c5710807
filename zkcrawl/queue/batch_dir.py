"""Directories of batch nodes that consumers write and a producer drains:
``<root>/discovered/dn-N`` and ``<root>/fetched/fn-N`` (SPEC §2). One home for what both do.

* :class:`BatchWriter` -- commits nodes under ``<dir>/<prefix>`` in transactions of at most
  ``MAX_TX_BYTES``, each **protected**: an ephemeral marker ``<root>/offers/<token>`` is
  created in the same transaction, so after a ConnectionLoss the writer asks whether the
  marker exists before it writes again (no double batch while the session lives; after a
  session loss a duplicate batch, which both readers tolerate). ZooKeeper away for
  ``--zk-timeout`` is :class:`~zkcrawl.queue.claims.QueueSuspended`; ZooKeeper *answering
  no* (NoAuth, a node in the way) is :class:`WriteRefused` naming the server's error,
  never retried here: waiting changes nothing.
* :class:`BatchReader` -- lists the nodes oldest first (wrap-safe sequence order; other
  names ignored), reads a bounded batch through the directory's own decoder (which never
  raises) and deletes drained nodes. A malformed node is one warning and comes back with
  its error, for the caller to delete like a drained one: never read for ever.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from zkcrawl.errors import ZkCrawlError
from zkcrawl.logs import get_logger
from zkcrawl.queue.capped import DirBacklog
from zkcrawl.queue.claims import QueueSuspended
from zkcrawl.queue.ingress import MAX_TX_BYTES
from zkcrawl.queue.items import sort_names
from zkcrawl.queue.layout import Layout
from zkcrawl.zk import (
    ConnectionLoss,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
    ZkClient,
    tx_ok,
)
from zkcrawl.zk.client import ZkAccessDenied

__all__ = ["BatchReader", "BatchWriter", "Decodable", "ReadNode", "WriteRefused", "transactions"]

log = get_logger(__name__)

DELETE_CHUNK = 500  # drained nodes deleted per transaction
TRIES = 5  # a directory removed by an admin this many times in a row: refused


class WriteRefused(ZkCrawlError):
    """ZooKeeper refused to store a batch (not a connection problem). ``cause``: the
    server's error, as its class name (``NoAuthError``); the message has the details."""

    def __init__(self, cause: str, detail: str, what: str = "discovered links") -> None:
        super().__init__(f"writing {what} failed: {detail}")
        self.cause = cause


class BatchWriter:
    """The consumers' side of one directory (module docstring)."""

    what = "a batch"  # named in a refusal's message

    def __init__(self, zk: ZkClient, root: str, directory: str, prefix: str,
                 consumer_id: str) -> None:
        self.zk = zk
        self.layout = Layout.of(root)
        self.directory_path = directory
        self.consumer = consumer_id
        self.prefix = f"{directory}/{prefix}"
        self.nodes = 0  # nodes written (for tests and stats)

    def _ensure_paths(self) -> None:
        try:
            self.zk.ensure_path(self.directory_path)
            self.zk.ensure_path(self.layout.offers)
        except ZkAccessDenied as exc:  # the root's ACL: a refusal like any other
            raise WriteRefused("NoAuthError", str(exc), self.what) from None

    def commit(self, chunk: list[bytes]) -> int:
        """Create ``chunk``'s nodes in one protected transaction; returns how many."""
        token = uuid.uuid4().hex
        marker = f"{self.layout.offers}/{token}"
        session = self.zk.session_id
        started = time.monotonic()
        for _ in range(TRIES):
            try:
                results = self.zk.answer(self.zk.create_many_async(marker, self.prefix, chunk))
            except (ConnectionLoss, SessionExpiredError):
                if not self._wait_connected(started):
                    raise QueueSuspended(f"ZooKeeper unreachable while writing {self.what}"
                                         ) from None
                if self.zk.session_id == session and self.zk.exists(marker) is not None:
                    self.zk.delete_async(marker)
                    return len(chunk)  # the first try committed
                session = self.zk.session_id
                continue
            if tx_ok(results):
                self.zk.delete_async(marker)
                return len(chunk)
            cause = _cause(results)
            if isinstance(cause, NoNodeError):
                self._ensure_paths()  # removed by an admin meanwhile
                continue
            raise WriteRefused(type(cause).__name__, f"{cause!r} under {self.prefix}",
                               self.what)
        raise WriteRefused("NoNodeError", f"{self.directory_path} removed {TRIES} times in "
                           "a row", self.what)

    def _wait_connected(self, started: float) -> bool:
        # Bounded: --zk-timeout from the first try, as offers.
        while time.monotonic() - started < self.zk.zk_timeout:
            if self.zk.connected:
                return True
            time.sleep(0.05)
        return self.zk.connected


def _cause(results: Sequence[object]) -> Exception:
    """The error of the op that failed a transaction: the ops before it come back as
    ``RolledBackError`` (the marker's create, first), those after as ``RuntimeInconsistency``."""
    errors = [r for r in results if isinstance(r, Exception)]
    return next((e for e in errors if not isinstance(e, RolledBackError | RuntimeInconsistency)),
                errors[0])


def transactions(nodes: list[bytes]) -> Iterable[list[bytes]]:
    """``nodes`` in chunks of at most ``MAX_TX_BYTES`` (with 64 bytes a node of overhead)."""
    chunk: list[bytes] = []
    size = 0
    for data in nodes:
        if chunk and size + len(data) > MAX_TX_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(data)
        size += len(data) + 64
    if chunk:
        yield chunk


class Decodable(Protocol):
    """What a directory's decoder returns: ``error`` set when the whole node is malformed,
    ``dropped`` entries left out of a node otherwise kept."""

    @property
    def error(self) -> str | None: ...

    @property
    def dropped(self) -> int: ...

    @property
    def kept(self) -> int: ...


D = TypeVar("D", bound=Decodable)


@dataclass(frozen=True)
class ReadNode(Generic[D]):
    """One node as read: its name and what the directory's decoder made of it."""

    name: str
    decoded: D


class BatchReader(Generic[D]):
    """The producer's side of one directory (module docstring). ``event``: the prefix of
    its warnings (``discovered`` -> ``discovered.malformed``); ``dropped_event``: the event
    and reason for a node some of whose entries were dropped."""

    def __init__(self, zk: ZkClient, path: str, prefix: str, decode: Callable[[bytes], D],
                 backlog: DirBacklog, event: str, dropped_event: tuple[str, str]) -> None:
        self.zk = zk
        self.path = path
        self.node_prefix = prefix
        self.decode = decode
        self.backlog = backlog
        self.event = event
        self.dropped_event = dropped_event
        zk.ensure_path(path)

    def names(self) -> list[str]:
        """The nodes waiting, oldest first (other names ignored); a backlog of half the
        default cap or more is reported (at most every 30 s)."""
        children = self.zk.get_children(self.path)
        self.backlog.seen(len(children))
        n = len(self.node_prefix)
        mapped = {f"qn-{c[n:]}": c for c in children if c.startswith(self.node_prefix)}
        return [mapped[q] for _, q in sort_names(list(mapped))]

    def read(self, names: Sequence[str]) -> list[ReadNode[D]]:
        """The nodes' decoded data; a malformed node is one warning and comes back with its
        error (the caller deletes it like a drained one)."""
        nodes: list[ReadNode[D]] = []
        results = self.zk.get_many([f"{self.path}/{n}" for n in names])
        for name, res in zip(names, results, strict=True):
            if isinstance(res, NoNodeError):
                continue  # drained by another producer meanwhile
            if isinstance(res, Exception):
                raise res
            decoded = self.decode(res[0])
            if decoded.error is not None:
                log.warning(f"{self.event}.malformed", node=f"{self.path}/{name}",
                            reason=decoded.error, skipped=True)
            elif decoded.dropped:
                event, reason = self.dropped_event
                log.warning(event, node=f"{self.path}/{name}", dropped=decoded.dropped,
                            kept=decoded.kept, reason=reason)
            nodes.append(ReadNode(name, decoded))
        return nodes

    def delete(self, names: Sequence[str]) -> None:
        """Delete drained nodes, one transaction per :data:`DELETE_CHUNK` (gone already:
        fine)."""
        for i in range(0, len(names), DELETE_CHUNK):
            chunk = names[i:i + DELETE_CHUNK]
            tx = self.zk.transaction()
            for name in chunk:
                tx.delete(f"{self.path}/{name}")
            if not tx_ok(tx.commit()):  # one gone already fails the whole transaction
                for name in chunk:
                    try:
                        self.zk.delete(f"{self.path}/{name}")
                    except NoNodeError:
                        pass
