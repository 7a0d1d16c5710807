"""The ZooKeeper core: the only package of zkcrawl that imports kazoo (ruff's banned-API
rule, TID251, enforces it).

* :mod:`.client`  :class:`ZkClient`, the typed session adapter (connection policy, calls,
  pipelined calls, watches);
* :mod:`.wire`    the hand-serialized multi requests (``multi``, ``multiRead``): the one
  module on kazoo's private API;
* :mod:`.errors`  kazoo's exceptions, re-exported (typed) for callers to catch;
* :mod:`.security` credentials, ACLs and TLS settings (plain data, no kazoo);
* :mod:`.acls`    reading and fixing the ACLs of a live tree (``zkcrawl acl``, ``--zk-acl``);
* :mod:`.kazoo_baseline` kazoo's own ``LockingQueue`` on a ``KazooClient`` of its own, for
  ``zkcrawl bench queue``'s baseline case only;
* :mod:`.types`   what crosses the boundary: :class:`Stat`, :class:`Pending`,
  :class:`WatchedEvent`, :class:`ZkState`, the callback and result aliases.

Callers write ``from zkcrawl.zk import ZkClient, NoNodeError``.
"""

from zkcrawl.zk import errors, types
from zkcrawl.zk.client import ZkClient, gather, tx_ok
from zkcrawl.zk.errors import *  # noqa: F403 -- the errors callers catch, as errors.__all__
from zkcrawl.zk.types import *  # noqa: F403 -- the boundary's types, as types.__all__
from zkcrawl.zk.wire import Multi

__all__ = ["Multi", "ZkClient", "gather", "tx_ok", *errors.__all__, *types.__all__]
