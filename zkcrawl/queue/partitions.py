"""Partitions of the frontier, the pure part (no ZooKeeper, no clock): which partition a host
is in, which consumer owns it (SPEC §2, §3; docs/concepts/frontier.md).

* :func:`partition_of` -- ``host -> p``: BLAKE2b-64 of the host key
  (:func:`zkcrawl.web.urls.host_key`) as a big-endian integer, mod ``P``. Stable across
  processes, machines and releases; documented so another language can route the same way.
* :func:`assign` -- ``(P, members) -> {member: [p...]}``: rendezvous hashing. **Sticky**: a
  join takes only what the joiner wins, a leave hands over only the leaver's; every member
  computes the same answer from the member list alone (no leader, no assignment round).
* :func:`decode_root` -- the root's ``{"partitions": P}``, untrusted: a bad P is a reason.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zkcrawl.queue import untrusted

MAX_PARTITIONS = 4096
DEFAULT_PARTITIONS = 256  # >> consumers, so that load spreads (docs/concepts/frontier.md)


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def partition_of(host: str, partitions: int) -> int:
    """The partition of ``host`` (a :func:`~zkcrawl.web.urls.host_key`) among ``partitions``."""
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be 1..{MAX_PARTITIONS}, got {partitions}")
    return _h64(host.encode("utf-8", "surrogatepass")) % partitions


def owner_of(partition: int, members: Sequence[str]) -> str | None:
    """The member that owns ``partition`` (None without members): rendezvous hashing."""
    best: tuple[int, str] | None = None
    for m in members:
        w = (_h64(f"{m}\0{partition}".encode("utf-8", "surrogatepass")), m)
        if best is None or w > best:
            best = w
    return None if best is None else best[1]


def assign(partitions: int, members: Iterable[str]) -> dict[str, list[int]]:
    """Every member's partitions, ascending (a member with none has an empty list)."""
    ms = sorted(set(members))
    out: dict[str, list[int]] = {m: [] for m in ms}
    if not ms:
        return out
    for p in range(partitions):
        owner = owner_of(p, ms)
        assert owner is not None
        out[owner].append(p)
    return out


def moved(before: Mapping[str, Sequence[int]], after: Mapping[str, Sequence[int]]) -> int:
    """How many partitions changed owner between two assignments."""
    was = {p: m for m, ps in before.items() for p in ps}
    now = {p: m for m, ps in after.items() for p in ps}
    return sum(1 for p, m in now.items() if was.get(p) != m)


def decode_root(data: bytes | None) -> tuple[int | None, str | None]:
    """``(P, None)`` from the root's data, ``(None, None)`` when it records no partitions
    (a root made before them), or ``(None, reason)`` when the data is not to be trusted."""
    if not data:
        return None, None
    doc, error = untrusted.load_json(data)
    if error is not None:
        return None, error
    if not isinstance(doc, dict):
        return None, "root data is not a JSON object"
    value: Any = doc.get("partitions")
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int):
        return None, "partitions is not an integer"
    if not 1 <= value <= MAX_PARTITIONS:
        return None, f"partitions {value} outside 1..{MAX_PARTITIONS}"
    return value, None
