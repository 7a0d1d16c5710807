"""The ACLs of a live tree (``zkcrawl acl``, ``--zk-acl check|fix``): :func:`check_acls`
reads the ACLs of a root's nodes and finds those others may write or this identity may not;
:func:`fix_acls` replaces the open ones, below a node too; :func:`guarded_nodes` names what
the daemons' start check reads -- the root, its containers and every partition node
``<root>/partitions/<p>`` (one listing, then one pipelined read of all of them within
``--zk-timeout``, however many: 256 by default, at most ``MAX_PARTITIONS``). Pipelined, through a
:class:`~zkcrawl.zk.client.ZkClient`; the verdicts on each ACL are
:mod:`zkcrawl.zk.security`'s (plain data), which this module imports and never the reverse.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from zkcrawl.queue.partitions import MAX_PARTITIONS
from zkcrawl.zk.client import gather
from zkcrawl.zk.errors import NoAuthError, NoNodeError
from zkcrawl.zk.security import (
    Acl,
    access_warning,
    describe_acl,
    open_writers,
    relied_on,
    repaired_acl,
)

__all__ = ["AclCheck", "AclFix", "check_acls", "fix_acls", "guarded_nodes", "partition_nodes"]


def _names(paths: list[str], shown: int = 12) -> str:
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(paths[:shown]) + more


@dataclasses.dataclass
class AclCheck:
    """What :func:`check_acls` found: each node's ACL (None: no such node, or unreadable),
    the nodes others may write, the nodes this identity may not write (another identity
    made them), and the warnings to log (the root's)."""

    acls: dict[str, Acl | None]
    open: list[str]
    denied: list[str]
    warnings: list[str]

    def refusal(self, hosts: str, root: str) -> str:
        """The one line that names the open and the denied nodes and what fixes them."""
        parts = []
        if self.open:
            first = self.open[0]
            acl = self.acls[first] or []
            parts.append(f"{_names(self.open)}: {open_writers(acl)} may write it (ACL of "
                         f"{first}: {describe_acl(acl)}; created before credentials were "
                         f"used?): fix it with `zkcrawl acl fix --zk {hosts} --root {root}` "
                         "and these credentials, or start with --zk-acl fix")
        if self.denied:
            first = self.denied[0]
            parts.append(f"{_names(self.denied)}: its ACL ({describe_acl(self.acls[first] or [])}"
                         ") does not let this identity write (another identity made it: "
                         "items could be planted there, completions would fail): remove it as "
                         "its owner or ZooKeeper's superuser, or use another --root")
        return "refusing to work under " + f"{root or '/'}: " + "; ".join(parts)


def check_acls(zk: Any, paths: list[str]) -> AclCheck:
    """Read the ACL of each of ``paths`` (pipelined) with ``zk``'s credentials: the ones
    others may write, the ones this identity may not write (the root's: also a warning), a
    wrong password (:class:`ZkSecurityError`)."""
    results = gather([zk.get_acl_async(p) for p in paths], zk.zk_timeout)
    acls: dict[str, Acl | None] = {}
    for path, res in zip(paths, results, strict=True):
        acls[path] = None if isinstance(res, Exception) else res[0]
    denied: dict[str, str] = {}
    for path, acl in acls.items():
        warning = access_warning(zk.auth, acl, path) if zk.auth and acl is not None else None
        if warning:
            denied[path] = warning
    opened = [p for p in paths if acls[p] is not None and open_writers(acls[p] or [])]
    warnings = [denied[paths[0]]] if paths[0] in denied else []
    return AclCheck(acls, opened, list(denied), warnings)


def partition_nodes(zk: Any, partitions: str) -> list[str]:
    """The partition nodes under ``partitions`` (``<root>/partitions``): its children named
    as a partition (a plain decimal below ``MAX_PARTITIONS``; other names are no partition
    anything reads), by number. One read within ``--zk-timeout``; none there: ``[]``."""
    (names,) = gather([zk.get_children_async(partitions)], zk.zk_timeout)
    if isinstance(names, NoNodeError):
        return []
    if isinstance(names, Exception):
        raise names
    numbers = sorted(int(n) for n in names
                     if n.isdecimal() and n.isascii() and str(int(n)) == n
                     and int(n) < MAX_PARTITIONS)
    return [f"{partitions}/{p}" for p in numbers]


def guarded_nodes(zk: Any, layout: Any) -> list[str]:
    """What the daemons' start check reads: :func:`~zkcrawl.zk.security.relied_on` (the
    root first, then its containers) and the partition nodes (their owner and batch nodes
    are made by the consumers and producers themselves, with the configured ACL)."""
    return [*relied_on(layout), *partition_nodes(zk, layout.partitions)]


@dataclasses.dataclass
class AclFix:
    """What :func:`fix_acls` did: nodes read, nodes whose ACL was replaced, nodes it could
    not fix (path, why)."""

    checked: int = 0
    fixed: list[str] = dataclasses.field(default_factory=list)
    failed: list[tuple[str, str]] = dataclasses.field(default_factory=list)


_BATCH = 500


def fix_acls(zk: Any, tops: list[str], recursive: bool = True) -> AclFix:
    """Give every node of ``tops`` (and, ``recursive``, every node below them) that others
    may write :func:`repaired_acl` (this identity's creator ACL in front): breadth first,
    pipelined in batches of 500. A node gone meanwhile is skipped; one this identity may
    not change (no ADMIN on it) or not write (another identity's: not walked further) is
    reported in ``failed``."""
    out = AclFix()
    level = list(dict.fromkeys(tops))
    while level:
        batch, level = level[:_BATCH], level[_BATCH:]
        results = gather([zk.get_acl_async(p) for p in batch], zk.zk_timeout)
        parents, fixing = [], []
        for path, res in zip(batch, results, strict=True):
            if isinstance(res, NoNodeError):
                continue
            if isinstance(res, Exception):
                out.failed.append((path, type(res).__name__))
                continue
            out.checked += 1
            acl, stat = res
            if zk.auth is not None and access_warning(zk.auth, acl, path):
                out.failed.append((path, f"another identity's ({describe_acl(acl)}): remove it "
                                   "as its owner or ZooKeeper's superuser"))
                continue  # what is below it is that identity's too
            if open_writers(acl):
                fixing.append((path, zk.set_acl_async(path, repaired_acl(acl, zk.acl))))
            if recursive and stat.numChildren:
                parents.append(path)
        for (path, _), done in zip(fixing, gather([f for _, f in fixing], zk.zk_timeout),
                                   strict=True):
            if isinstance(done, NoAuthError):
                out.failed.append((path, "no ADMIN permission on it"))
            elif isinstance(done, Exception) and not isinstance(done, NoNodeError):
                out.failed.append((path, type(done).__name__))
            elif not isinstance(done, Exception):
                out.fixed.append(path)
        kids = gather([zk.get_children_async(p) for p in parents], zk.zk_timeout)
        for parent, names in zip(parents, kids, strict=True):
            if not isinstance(names, Exception):
                base = parent.rstrip("/")
                level.extend(f"{base}/{n}" for n in sorted(names))
    return out
