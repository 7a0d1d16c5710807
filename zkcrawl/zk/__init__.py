"""The ZooKeeper core: the only package of zkcrawl that imports kazoo (ruff's banned-API
rule enforces it). :mod:`.client` is the typed session adapter, :mod:`.wire` the
hand-serialized multi requests. Re-exported here so callers write ``from zkcrawl.zk import
ZkClient``."""

from zkcrawl.zk.client import (
    KazooException,
    KazooState,
    NodeExistsError,
    NoNodeError,
    ZkClient,
    ZnodeStat,
    gather,
    tx_ok,
)

__all__ = ["KazooException", "KazooState", "NoNodeError", "NodeExistsError", "ZkClient",
           "ZnodeStat", "gather", "tx_ok"]
