"""A thin typed adapter around kazoo (which ships no type hints).

It owns the connection policy:

* **connect** waits at most ``zk_timeout`` seconds; an unreachable ensemble is a
  :class:`~zkcrawl.errors.ZkUnavailable` (exit 2), never a hang.
* **reconnect** (kazoo's ``connection_retry``) goes on while the process runs,
  with capped exponential delays, and is interrupted by :meth:`ZkClient.close`.
* **commands** (kazoo's ``command_retry``, used by :meth:`ZkClient.retry`) are
  retried a bounded number of times within a deadline; kazoo's default would
  retry forever with growing delays, and a shutdown would hang in it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import ParamSpec, TypeVar

from kazoo.client import KazooClient
from kazoo.recipe.watchers import ChildrenWatch, DataWatch
from kazoo.retry import KazooRetry

from zkcrawl.errors import ZkUnavailable
from zkcrawl.zk.errors import (
    KazooException,
    KazooTimeoutError,
    MarshallingError,
    NodeExistsError,
    NoNodeError,
    UnimplementedError,
)
from zkcrawl.zk.types import (
    ChildrenWatcher,
    DataWatcher,
    Pending,
    ReadResult,
    Stat,
    StateListener,
    WatchedEvent,
    Watcher,
)
from zkcrawl.zk.wire import Multi, Wire

T = TypeVar("T")
P = ParamSpec("P")

__all__ = ["KazooException", "NoNodeError", "NodeExistsError", "ZkClient", "gather", "tx_ok"]


class _QuietUntilConnected(logging.Filter):
    """Drop kazoo's per-attempt connection warnings before the first connect:
    an unreachable ZooKeeper must be exactly one line on stderr (ours)."""

    def __init__(self) -> None:
        super().__init__()
        self.connected = False

    def filter(self, record: logging.LogRecord) -> bool:
        return self.connected or record.levelno >= logging.ERROR


class ZkClient:
    """One ZooKeeper session and the typed calls zkcrawl makes on it.

    The kazoo client is private (``_kazoo``): what callers need of it is a method here,
    typed with :mod:`zkcrawl.zk.types`. Results are kazoo's own objects (a ``ZnodeStat``
    is a :class:`~zkcrawl.zk.types.Stat`, an ``AsyncResult`` a
    :class:`~zkcrawl.zk.types.Pending`), never wrapped: these calls sit on the queue's
    hot path.
    """

    def __init__(self, hosts: str, *, zk_timeout: float = 10.0,
                 session_timeout: float = 10.0, read_only: bool = False) -> None:
        self.hosts = hosts
        self.zk_timeout = zk_timeout
        self._stopped = threading.Event()
        conn_retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0,
                                max_jitter=0.3)
        cmd_retry = KazooRetry(max_tries=5, delay=0.05, backoff=2, max_delay=1.0,
                               deadline=max(zk_timeout, 2.0), ignore_expire=False,
                               interrupt=self._stopped.is_set)
        self._multiread = True
        self._quiet = _QuietUntilConnected()
        logger = logging.getLogger("kazoo.client")
        logger.addFilter(self._quiet)
        self._kazoo = KazooClient(hosts=hosts, timeout=session_timeout,
                                  connection_retry=conn_retry, command_retry=cmd_retry,
                                  read_only=read_only, logger=logger)
        self._wire = Wire(self._kazoo)

    # -- lifecycle -------------------------------------------------------
    def connect(self) -> ZkClient:
        """Connect within ``zk_timeout`` or raise :class:`ZkUnavailable`."""
        try:
            self._kazoo.start(timeout=self.zk_timeout)
            self._quiet.connected = True
        except (KazooTimeoutError, KazooException, OSError, ValueError) as exc:
            self._stop_quietly()
            why = "timed out" if isinstance(exc, KazooTimeoutError) else str(exc) or type(exc)
            raise ZkUnavailable(f"cannot reach ZooKeeper at {self.hosts} within "
                                f"{self.zk_timeout:g}s ({why}); check --zk / ZKCRAWL_ZK "
                                "(start a local one with `zkcrawl local-zk start`)") from None
        return self

    def close(self) -> None:
        """End the session (ephemeral nodes vanish now) and stop all retries."""
        self._stopped.set()
        self._stop_quietly()

    def _stop_quietly(self) -> None:
        try:
            self._kazoo.stop()
            self._kazoo.close()
        except Exception:  # closing must never raise to the operator
            pass
        # Removed only now: stopping a never-connected client logs its last attempts too.
        logging.getLogger("kazoo.client").removeFilter(self._quiet)

    def __enter__(self) -> ZkClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state -----------------------------------------------------------
    @property
    def connected(self) -> bool:
        return bool(self._kazoo.connected)

    @property
    def state(self) -> str:
        """One of :class:`~zkcrawl.zk.types.ZkState`'s values."""
        return str(self._kazoo.state)

    @property
    def session_id(self) -> int | None:
        cid = self._kazoo.client_id
        return int(cid[0]) if cid else None

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """``(session id, session password)`` of the current session, None before one."""
        cid = self._kazoo.client_id
        return (int(cid[0]), bytes(cid[1])) if cid else None

    def add_listener(self, listener: StateListener) -> None:
        """``listener(state)`` runs on kazoo's thread: it must not block."""
        self._kazoo.add_listener(listener)

    def remove_listener(self, listener: StateListener) -> None:
        self._kazoo.remove_listener(listener)

    # -- calls -----------------------------------------------------------
    def retry(self, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``func`` with the bounded command-retry policy."""
        result: T = self._kazoo.retry(func, *args, **kwargs)
        return result

    def ensure_path(self, path: str) -> None:
        self._kazoo.retry(self._kazoo.ensure_path, path)

    def exists(self, path: str, watch: Watcher | None = None) -> Stat | None:
        stat: Stat | None = self._kazoo.exists(path, watch=watch)
        return stat

    def exists_async(self, path: str, watch: Watcher | None = None) -> Pending[Stat | None]:
        pending: Pending[Stat | None] = self._kazoo.exists_async(path, watch=watch)
        return pending

    def get(self, path: str, watch: Watcher | None = None) -> tuple[bytes, Stat]:
        """The node's data (``b""`` when it has none) and stat; NoNodeError if missing."""
        data, stat = self._kazoo.get(path, watch=watch)
        return bytes(data or b""), stat

    def get_async(self, path: str, watch: Watcher | None = None
                  ) -> Pending[tuple[bytes | None, Stat]]:
        """Pipelined :meth:`get`; the data is None for a node created with null data."""
        pending: Pending[tuple[bytes | None, Stat]] = self._kazoo.get_async(path, watch=watch)
        return pending

    def get_children(self, path: str, watch: Watcher | None = None) -> list[str]:
        return list(self._kazoo.get_children(path, watch=watch))

    def get_children_async(self, path: str, watch: Watcher | None = None
                           ) -> Pending[list[str]]:
        pending: Pending[list[str]] = self._kazoo.get_children_async(path, watch=watch)
        return pending

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = False) -> str:
        """Create the node; returns its path (with the sequence number, if sequential)."""
        return str(self._kazoo.create(path, value, ephemeral=ephemeral, sequence=sequence,
                                      makepath=makepath))

    def set(self, path: str, value: bytes, version: int = -1) -> Stat:
        """Set the data (only at ``version``, unless -1: else BadVersionError)."""
        stat: Stat = self._kazoo.set(path, value, version=version)
        return stat

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        self._kazoo.delete(path, version=version, recursive=recursive)

    def delete_async(self, path: str, version: int = -1) -> Pending[bool]:
        """Pipelined delete (True, or NoNodeError/BadVersionError/NotEmptyError...)."""
        pending: Pending[bool] = self._kazoo.delete_async(path, version=version)
        return pending

    def get_many(self, paths: Sequence[str]) -> list[ReadResult]:
        """Data of many znodes in one round trip (:class:`~zkcrawl.zk.wire.MultiRead`): per
        path ``(bytes, stat)`` or the error (NoNodeError...). Falls back to pipelined gets
        on servers < 3.6."""
        if not paths:
            return []
        if self._multiread:
            try:
                return list(self._wire.multi_read(paths).get())
            except (UnimplementedError, MarshallingError):
                self._multiread = False  # an old server: pipelined gets from now on
        return [r if isinstance(r, Exception) else (r[0] or b"", r[1])
                for r in gather([self.get_async(p) for p in paths])]

    def create_many_async(self, marker: str, prefix: str, datas: Sequence[bytes]
                          ) -> Pending[list[str | Exception]]:
        """Commit :class:`~zkcrawl.zk.wire.CreateMany`: an ephemeral ``marker``, then a
        sequential create under ``prefix`` per data; results like a transaction's."""
        return self._wire.create_many(marker, prefix, datas)

    def transaction(self) -> Multi:
        """A transaction of creates, deletes and setData (:class:`~zkcrawl.zk.wire.Multi`);
        ``commit()`` returns per-op results or errors, like kazoo's."""
        return Multi(self._wire)

    # -- watches ---------------------------------------------------------
    def watch_data(self, path: str, func: DataWatcher) -> None:
        """Call ``func(data, stat)`` now and on every change of ``path``, creation and
        deletion included (``stat`` None: no node); re-armed by itself (kazoo's
        ``DataWatch``) until ``func`` returns False. Runs on kazoo's thread: never block."""
        def call(data: bytes | None, stat: Stat | None,
                 _event: WatchedEvent | None = None) -> bool | None:
            return func(data, stat)

        DataWatch(self._kazoo, path, call)

    def watch_children(self, path: str, func: ChildrenWatcher) -> None:
        """Call ``func(children)`` now and on every change of ``path``'s children; re-armed
        by itself (kazoo's ``ChildrenWatch``) until ``func`` returns False. kazoo's thread."""
        ChildrenWatch(self._kazoo, path, func)


def gather(asyncs: Iterable[Pending[T]], timeout: float | None = None) -> list[T | Exception]:
    """Wait for pipelined requests; each slot is a value or the exception."""
    out: list[T | Exception] = []
    for res in asyncs:
        try:
            out.append(res.get(timeout=timeout))
        except Exception as exc:
            out.append(exc)
    return out


def tx_ok(results: Sequence[object]) -> bool:
    """True when a committed transaction's results hold no exception."""
    return not any(isinstance(r, Exception) for r in results)
