"""The ZooKeeper core: the only package of zkcrawl that imports kazoo (ruff's banned-API
rule, TID251, enforces it).

* :mod:`.client`  :class:`ZkClient`, the typed session adapter (connection policy, calls,
  pipelined calls, watches);
* :mod:`.wire`    the hand-serialized multi requests (``multi``, ``multiRead``): the one
  module on kazoo's private API;
* :mod:`.errors`  kazoo's exceptions, re-exported (typed) for callers to catch;
* :mod:`.security` credentials, ACLs and TLS settings (plain data, no kazoo);
* :mod:`.types`   what crosses the boundary: :class:`Stat`, :class:`Pending`,
  :class:`WatchedEvent`, :class:`ZkState`, the callback and result aliases.

Callers write ``from zkcrawl.zk import ZkClient, NoNodeError``.
"""

from zkcrawl.zk.client import ZkClient, gather, tx_ok
from zkcrawl.zk.errors import (
    AuthFailedError,
    BadVersionError,
    CancelledError,
    ConnectionClosedError,
    ConnectionDropped,
    ConnectionLoss,
    InvalidACLError,
    KazooException,
    KazooTimeoutError,
    MarshallingError,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
    UnimplementedError,
    ZookeeperError,
    ZookeeperStoppedError,
)
from zkcrawl.zk.types import (
    ChildrenWatcher,
    DataWatcher,
    Pending,
    ReadResult,
    Stat,
    StateListener,
    TxResult,
    WatchedEvent,
    Watcher,
    ZkState,
)
from zkcrawl.zk.wire import Multi

__all__ = [
    "AuthFailedError",
    "BadVersionError",
    "CancelledError",
    "ChildrenWatcher",
    "ConnectionClosedError",
    "ConnectionDropped",
    "ConnectionLoss",
    "DataWatcher",
    "InvalidACLError",
    "KazooException",
    "KazooTimeoutError",
    "MarshallingError",
    "Multi",
    "NoAuthError",
    "NoNodeError",
    "NodeExistsError",
    "NotEmptyError",
    "OperationTimeoutError",
    "Pending",
    "ReadResult",
    "RolledBackError",
    "RuntimeInconsistency",
    "SessionExpiredError",
    "Stat",
    "StateListener",
    "TxResult",
    "UnimplementedError",
    "WatchedEvent",
    "Watcher",
    "ZkClient",
    "ZkState",
    "ZookeeperError",
    "ZookeeperStoppedError",
    "gather",
    "tx_ok",
]
