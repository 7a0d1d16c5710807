"""The baseline of ``zkcrawl bench queue``'s ``kazoo_locking`` case: kazoo's own
:class:`~kazoo.recipe.queue.LockingQueue` recipe -- the only reason a bench touches kazoo
(:mod:`zkcrawl.bench.drain` uses this module, never kazoo itself).

The recipe is measured as kazoo ships it, so it runs on a plain
:class:`~kazoo.client.KazooClient` of its own (no connection policy, kazoo's default handler;
:class:`~zkcrawl.zk.client.ZkClient` keeps its kazoo client private), on the same server as
the other cases. Nothing else in zkcrawl uses it.

* :class:`KazooBaseline`  the plain client: ``start``, ``locking_queue``, ``close``;
* :class:`BaselineQueue`  the recipe at one path: ``put_all``, ``get``, ``consume``.
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.recipe.queue import LockingQueue

__all__ = ["BaselineQueue", "KazooBaseline"]


class BaselineQueue:
    """kazoo's :class:`~kazoo.recipe.queue.LockingQueue` at ``path``, unchanged: a take is
    :meth:`get` then :meth:`consume`."""

    def __init__(self, client: KazooBaseline, path: str) -> None:
        self._queue = LockingQueue(client._kazoo, path)

    def put_all(self, values: list[bytes]) -> None:
        """All of ``values`` in one transaction (kazoo's default priority)."""
        self._queue.put_all(values)

    def get(self, timeout: float | None = None) -> bytes | None:
        """Lock the head entry and return it; ``None`` when none came within ``timeout``."""
        value: bytes | None = self._queue.get(timeout=timeout)
        return value

    def consume(self) -> bool:
        """Remove the entry :meth:`get` locked; ``False`` when there was none."""
        done: bool = self._queue.consume()
        return done


class KazooBaseline:
    """A plain :class:`~kazoo.client.KazooClient` on ``hosts`` (``session_timeout``:
    kazoo's ``timeout``, in seconds); :meth:`close` stops and closes it."""

    def __init__(self, hosts: str, *, session_timeout: float = 30.0) -> None:
        self._kazoo = KazooClient(hosts=hosts, timeout=session_timeout)

    def start(self, timeout: float) -> None:
        """Connect within ``timeout`` seconds (kazoo's ``start``: raises on a timeout)."""
        self._kazoo.start(timeout=timeout)

    def locking_queue(self, path: str) -> BaselineQueue:
        """kazoo's LockingQueue recipe at ``path`` on this client."""
        return BaselineQueue(self, path)

    def close(self) -> None:
        """Stop the session and free the client's resources."""
        self._kazoo.stop()
        self._kazoo.close()
