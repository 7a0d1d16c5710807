"""The types that cross the ZooKeeper adapter's boundary (kazoo itself ships no type hints).

Structural types, so kazoo's own objects pass through unwrapped -- no per-call wrapper on
the hot path: a :class:`Stat` *is* kazoo's ``ZnodeStat``, a :class:`Pending` *is* kazoo's
``AsyncResult``, a :class:`WatchedEvent` *is* kazoo's ``WatchedEvent``; the protocols only
say which of their parts zkcrawl may use.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Protocol, TypeAlias, TypeVar

__all__ = ["ChildrenWatcher", "DataWatcher", "Pending", "ReadResult", "Stat", "StateListener",
           "TxResult", "WatchedEvent", "Watcher", "ZkState"]

T_co = TypeVar("T_co", covariant=True)


class Stat(Protocol):
    """A znode's stat (kazoo's ``ZnodeStat``, a namedtuple: read-only fields)."""

    @property
    def czxid(self) -> int: ...
    @property
    def mzxid(self) -> int: ...
    @property
    def ctime(self) -> int:
        """Creation time, milliseconds since the epoch (server clock)."""
    @property
    def mtime(self) -> int: ...
    @property
    def version(self) -> int: ...
    @property
    def cversion(self) -> int: ...
    @property
    def aversion(self) -> int: ...
    @property
    def ephemeralOwner(self) -> int: ...
    @property
    def dataLength(self) -> int: ...
    @property
    def numChildren(self) -> int: ...
    @property
    def pzxid(self) -> int: ...


class WatchedEvent(Protocol):
    """What a one-shot watch is called with (kazoo's ``WatchedEvent``)."""

    @property
    def type(self) -> str: ...  # CREATED, DELETED, CHANGED, CHILD, NONE
    @property
    def state(self) -> str: ...
    @property
    def path(self) -> str: ...


class Pending(Protocol[T_co]):
    """A request in flight (kazoo's ``AsyncResult``): ``get()`` waits for its value or
    raises its error (``NoNodeError``, ``ConnectionLoss``...)."""

    def get(self, block: bool = True, timeout: float | None = None) -> T_co: ...


class ZkState(StrEnum):
    """Session states a listener is told (kazoo's ``KazooState`` strings: equal to these)."""

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"


#: ``watch=`` of exists/get/get_children: called once, on kazoo's thread (never block).
Watcher: TypeAlias = Callable[[WatchedEvent], object]
#: ``listener(state)``, state one of :class:`ZkState`'s values; returning True removes it.
StateListener: TypeAlias = Callable[[str], bool | None]
#: ``func(data, stat)`` of :meth:`ZkClient.watch_data`; ``stat`` None: no node. False: stop.
DataWatcher: TypeAlias = Callable[[bytes | None, Stat | None], bool | None]
#: ``func(children)`` of :meth:`ZkClient.watch_children`. False: stop watching.
ChildrenWatcher: TypeAlias = Callable[[list[str]], bool | None]
#: One op's result in a committed multi: the created path (create), the new stat
#: (setData), ``True`` (delete, check), or the op's error (``RolledBackError`` for the
#: ops a failed transaction undid, ``RuntimeInconsistency`` for those it did not try).
TxResult: TypeAlias = str | bool | Stat | Exception
#: One path's result in a multiRead: ``(data, stat)``, or the error (``NoNodeError``...).
ReadResult: TypeAlias = tuple[bytes, Stat] | Exception
